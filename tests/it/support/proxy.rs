//! A TCP proxy between the broker and PostgreSQL on 127.0.0.1 that tests can cut, restore, or
//! make drop a connection right after it forwarded a COMMIT (an outcome-unknown commit); delay
//! every forwarded chunk; or black-hole (half-open): every connection open at that moment, and
//! every new one while it lasts, stays open but never forwards another byte, as when a peer or a
//! NAT between them vanished without a reset.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; see the module docs.
pub struct Proxy {
    /// Port the proxy listens on.
    pub port: u16,
    cut: Arc<AtomicBool>,
    drop_commit: Arc<AtomicBool>,
    commits_dropped: Arc<std::sync::atomic::AtomicUsize>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    faults: Arc<Faults>,
    accept: JoinHandle<()>,
}

/// The delay and black-hole switches, shared by every link.
#[derive(Default)]
struct Faults {
    delay_ms: std::sync::atomic::AtomicU64,
    black_hole: AtomicBool,
    /// One flag per link; a set flag never clears (the link is dead but open).
    frozen: Mutex<Vec<Arc<AtomicBool>>>,
}

impl Proxy {
    /// Starts forwarding 127.0.0.1:<port> to 127.0.0.1:`target`.
    pub async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let drop_commit = Arc::new(AtomicBool::new(false));
        let commits_dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let faults: Arc<Faults> = Arc::default();
        let (c, d, n, l, f) = (
            cut.clone(),
            drop_commit.clone(),
            commits_dropped.clone(),
            links.clone(),
            faults.clone(),
        );
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if c.load(Ordering::SeqCst) {
                    drop(client); // refused: the peer sees the connection close at once
                    continue;
                }
                let (d, n, f) = (d.clone(), n.clone(), f.clone());
                let frozen = Arc::new(AtomicBool::new(f.black_hole.load(Ordering::SeqCst)));
                f.frozen.lock().unwrap().push(frozen.clone());
                let link = tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await {
                        forward(client, server, d, n, f, frozen).await;
                    }
                });
                l.lock().unwrap().push(link);
            }
        });
        Proxy {
            port,
            cut,
            drop_commit,
            commits_dropped,
            links,
            faults,
            accept,
        }
    }

    /// Delays every chunk forwarded from now on (either way) by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.faults.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Half-open: every open connection stops forwarding for good (its sockets stay open), and
    /// so does every connection accepted until [`Proxy::heal`].
    pub fn black_hole(&self) {
        self.faults.black_hole.store(true, Ordering::SeqCst);
        for link in self.faults.frozen.lock().unwrap().iter() {
            link.store(true, Ordering::SeqCst);
        }
    }

    /// New connections forward again; the black-holed ones stay dead (and open).
    pub fn heal(&self) {
        self.faults.black_hole.store(false, Ordering::SeqCst);
    }

    /// Cuts every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// The next COMMIT is forwarded to PostgreSQL, but its connection is then dropped before
    /// the answer reaches the broker.
    pub fn drop_next_commit(&self) {
        self.drop_commit.store(true, Ordering::SeqCst);
    }

    /// How many commits were dropped so far.
    pub fn commits_dropped(&self) -> usize {
        self.commits_dropped.load(Ordering::SeqCst)
    }

    /// The URL of `db` through the proxy: its own URL with the proxy's host and port.
    pub fn url(&self, db: &super::TestDb) -> String {
        let (head, tail) = db.url.rsplit_once('@').expect("a URL with user@host");
        let name = tail.split_once('/').expect("a URL with a database").1;
        format!("{head}@127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn forward(
    mut client: TcpStream,
    mut server: TcpStream,
    drop_commit: Arc<AtomicBool>,
    dropped: Arc<std::sync::atomic::AtomicUsize>,
    faults: Arc<Faults>,
    frozen: Arc<AtomicBool>,
) {
    // Before each forwarded chunk: the delay, and a black hole holds the link here for good.
    let gate = || async {
        let ms = faults.delay_ms.load(Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if frozen.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    };
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let swallow = AtomicBool::new(false);
    let answered = tokio::sync::Notify::new();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let is_commit = chunk.windows(7).any(|w| w == b"COMMIT\0");
            if is_commit && drop_commit.swap(false, Ordering::SeqCst) {
                swallow.store(true, Ordering::SeqCst);
                let _ = sw.write_all(chunk).await;
                // Let PostgreSQL commit (its answer arriving is the event), then vanish before
                // that answer is forwarded.
                let _ = tokio::time::timeout(Duration::from_secs(10), answered.notified()).await;
                dropped.fetch_add(1, Ordering::SeqCst);
                return;
            }
            gate().await;
            if sw.write_all(chunk).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if swallow.load(Ordering::SeqCst) {
                answered.notify_one();
                continue;
            }
            gate().await;
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {},
        () = down => {},
    }
}
