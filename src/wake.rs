//! Long-poll wake-ups: pops waiting for messages, keyed by queue and partition, woken the moment
//! a push makes something visible.
//!
//! Two sources ring the same [`WakeHub`]: the push handler of this broker (right after its `queued`
//! verdicts) and `listen_loop`, which LISTENs on `queen_push` on a connection of its own and relays
//! what other brokers' commits announce (every commit sends a NOTIFY naming its partitions, and a
//! second when they do not all fit, see `storage::push::commit`). A wake-up is only a hint: the woken pop
//! re-reads PostgreSQL, so a spurious or lost wake-up costs latency, never correctness. This module
//! never decides what a consumer gets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use broker_actors::PartitionKey;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Acquire, Connection};
use tokio::sync::Notify;

/// The channel every commit notifies.
pub const CHANNEL: &str = "queen_push";

/// Largest NOTIFY payload we send (PostgreSQL's limit is 8000 bytes).
const MAX_PAYLOAD: usize = 7_900;

/// What a waiting pop waits for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WakeKey {
    /// Any partition of a queue, queue mode (queue-level pop without a consumer group).
    Queue(String),
    /// Any partition of a queue, for one named consumer group.
    Group(String, String),
    /// One partition (partition pop).
    Partition(String, String),
    /// Any queue (namespace/task pop).
    Any,
}

/// What is told of every partition a commit wrote, by queue name and partition id, before its
/// waiting pops are woken (the broker offers it to them: `storage::consume::handoff`).
pub type WrittenHook = Box<dyn Fn(&str, i64) + Send + Sync>;

/// Waiting pops by key; cheap to share.
#[derive(Default)]
pub struct WakeHub {
    waiters: Mutex<Waiters>,
    listening: AtomicBool,
    written: OnceLock<WrittenHook>,
}

/// The registrations, with the named groups waiting on each queue, so a wake-up finds the
/// keys it rings by lookups, however many pops wait.
#[derive(Default)]
struct Waiters {
    by_key: HashMap<WakeKey, Arc<Notify>>,
    groups: HashMap<String, Vec<String>>,
}

impl Waiters {
    fn remove(&mut self, key: &WakeKey) {
        self.by_key.remove(key);
        if let WakeKey::Group(queue, group) = key {
            if let Some(groups) = self.groups.get_mut(queue) {
                groups.retain(|g| g != group);
                if groups.is_empty() {
                    self.groups.remove(queue);
                }
            }
        }
    }
}

/// One pop's registration; dropping it unregisters.
pub struct Waiter {
    hub: Arc<WakeHub>,
    key: WakeKey,
    notify: Arc<Notify>,
}

impl Waiter {
    /// The notification to await. Create it (and `enable` it) *before* checking PostgreSQL, so
    /// a push that commits between the check and the wait is not missed.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut waiters = self.hub.waiters.lock().expect("wake hub lock poisoned");
        // Clones are only made under this lock: two references left = the map's and ours.
        if Arc::strong_count(&self.notify) == 2 {
            waiters.remove(&self.key);
        }
    }
}

impl WakeHub {
    /// A new, empty hub.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Registers interest in `key`.
    pub fn subscribe(self: &Arc<Self>, key: WakeKey) -> Waiter {
        let mut waiters = self.waiters.lock().expect("wake hub lock poisoned");
        let waiters = &mut *waiters;
        let notify = match waiters.by_key.get(&key) {
            Some(n) => n.clone(),
            None => {
                if let WakeKey::Group(queue, group) = &key {
                    waiters
                        .groups
                        .entry(queue.clone())
                        .or_default()
                        .push(group.clone());
                }
                waiters.by_key.entry(key.clone()).or_default().clone()
            }
        };
        Waiter {
            hub: self.clone(),
            key,
            notify,
        }
    }

    /// Sets what is told of each partition a commit wrote (once; later calls are ignored).
    pub fn on_written(&self, hook: WrittenHook) {
        let _ = self.written.set(hook);
    }

    /// Whether the LISTEN connection is up (other brokers' pushes reach this one).
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// How many pops are registered for `key` (tests wait for this before pushing).
    pub fn waiting(&self, key: &WakeKey) -> usize {
        self.waiters
            .lock()
            .expect("wake hub lock poisoned")
            .by_key
            .get(key)
            .map_or(0, |n| Arc::strong_count(n) - 1)
    }

    /// Wakes pops waiting on this partition or any queue, and **one** queue-level pop of each
    /// consumer group of the queue: a written partition can be leased by one consumer of a
    /// group only, so waking them all would send the others to PostgreSQL for nothing. A pop
    /// that fills its batch passes the wake on ([`WakeHub::pass_on`]), so a write larger than
    /// one batch still reaches further waiters; an ack that ends a lease with messages left
    /// behind rings this too (`http/ack.rs`).
    pub fn wake(&self, queue: &str, partition: &str) {
        let waiters = self.waiters.lock().expect("wake hub lock poisoned");
        if waiters.by_key.is_empty() {
            return;
        }
        let ring_all = [
            WakeKey::Partition(queue.to_string(), partition.to_string()),
            WakeKey::Any,
        ];
        for key in &ring_all {
            if let Some(n) = waiters.by_key.get(key) {
                n.notify_waiters();
            }
        }
        if let Some(n) = waiters.by_key.get(&WakeKey::Queue(queue.to_string())) {
            n.notify_one();
        }
        for group in waiters.groups.get(queue).into_iter().flatten() {
            let key = WakeKey::Group(queue.to_string(), group.clone());
            if let Some(n) = waiters.by_key.get(&key) {
                n.notify_one();
            }
        }
    }

    /// Wakes one more queue-level pop waiting on `key`, if another one is registered: the
    /// caller filled its batch, so there may be more for the next waiter.
    pub fn pass_on(&self, key: &WakeKey) {
        if !matches!(key, WakeKey::Queue(_) | WakeKey::Group(..)) {
            return;
        }
        let waiters = self.waiters.lock().expect("wake hub lock poisoned");
        if let Some(n) = waiters.by_key.get(key) {
            // The map's reference and the caller's own: anyone beyond is another waiter.
            if Arc::strong_count(n) > 2 {
                n.notify_one();
            }
        }
    }

    /// Wakes one queue-level pop waiting on `key` (a queue or a named group of it), if any: a
    /// lease was just claimed ahead for the next pop of that group (`storage::consume::ahead`).
    pub fn wake_one(&self, key: &WakeKey) {
        let waiters = self.waiters.lock().expect("wake hub lock poisoned");
        if let Some(n) = waiters.by_key.get(key) {
            n.notify_one();
        }
    }

    /// Wakes pops waiting on any partition of `queue` (or any queue).
    pub fn wake_queue(&self, queue: &str) {
        let waiters = self.waiters.lock().expect("wake hub lock poisoned");
        for (key, n) in waiters.by_key.iter() {
            let hit = match key {
                WakeKey::Queue(q) | WakeKey::Group(q, _) | WakeKey::Partition(q, _) => q == queue,
                WakeKey::Any => true,
            };
            if hit {
                n.notify_waiters();
            }
        }
    }

    /// Wakes every waiting pop (notifications may have been lost).
    pub fn wake_all(&self) {
        let waiters = self.waiters.lock().expect("wake hub lock poisoned");
        for n in waiters.by_key.values() {
            n.notify_waiters();
        }
    }

    /// Applies a `queen_push` payload (see [`notify_payloads`]): each written partition is
    /// told to the written hook (when the payload names its id), then its pops are woken.
    pub fn apply_payload(&self, payload: &str) {
        if let Ok(written) = serde_json::from_str::<Vec<Written>>(payload) {
            for w in written {
                let (queue, partition, id) = match w {
                    Written::WithId(queue, partition, id) => (queue, partition, Some(id)),
                    Written::Named(queue, partition) => (queue, partition, None),
                };
                if let (Some(id), Some(hook)) = (id, self.written.get()) {
                    hook(&queue, id);
                }
                self.wake(&queue, &partition);
            }
        } else if let Ok(queues) = serde_json::from_str::<Vec<String>>(payload) {
            for queue in queues {
                self.wake_queue(&queue);
            }
        } else {
            self.wake_all();
        }
    }
}

/// A written partition as a payload names it: `[queue, partition, id]`, or `[queue,
/// partition]` as brokers before the id was added send it.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Written {
    WithId(String, String, i64),
    Named(String, String),
}

/// The NOTIFY payloads naming the partitions a commit wrote: a JSON array of `[queue,
/// partition, id]` triples with as many as fit under PostgreSQL's limit, and when some do not
/// fit, a second one with the names of their queues (or `*` when even those do not fit), which
/// wakes those queues' pops without handing them a partition. One commit costs at most two
/// notices however many partitions it writes; a queue-level pop holds at most a few hundred
/// hand-offs anyway (`storage::consume::handoff::MAX_PER_GROUP`). [`WakeHub::apply_payload`] also reads
/// the pairs of brokers of earlier versions.
pub fn notify_payloads(written: &[(&PartitionKey, i64)]) -> Vec<String> {
    let mut named = String::from("[");
    let mut rest: Vec<&str> = Vec::new();
    for (key, id) in written {
        let triple =
            serde_json::to_string(&(&*key.queue, &*key.partition, id)).expect("strings serialise");
        if rest.is_empty() && named.len() + triple.len() + 2 <= MAX_PAYLOAD {
            if named.len() > 1 {
                named.push(',');
            }
            named.push_str(&triple);
        } else {
            rest.push(&key.queue);
        }
    }
    named.push(']');
    let mut payloads = Vec::with_capacity(2);
    if named.len() > 2 {
        payloads.push(named);
    }
    if !rest.is_empty() {
        rest.sort_unstable();
        rest.dedup();
        let queues = serde_json::to_string(&rest).expect("strings serialise");
        payloads.push(if queues.len() <= MAX_PAYLOAD {
            queues
        } else {
            "*".into()
        });
    }
    payloads
}

/// Stops the LISTEN thread when told to (or when dropped).
pub struct ListenerHandle {
    stop: tokio::sync::watch::Sender<bool>,
}

impl ListenerHandle {
    /// Asks the LISTEN thread to close its connection and end.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the relay of other brokers' commits to `hub` on a thread of its own (with its own
/// runtime, so its connection is closed inside a runtime however the broker stops).
///
/// # Panics
///
/// When the thread cannot be created (out of resources at start-up).
pub fn spawn_listener(options: PgConnectOptions, hub: Arc<WakeHub>) -> ListenerHandle {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    std::thread::Builder::new()
        .name("queen-listen".into())
        .spawn(move || listen_loop(&options, &hub, stopped))
        .expect("the LISTEN thread starts");
    ListenerHandle { stop }
}

/// A LISTEN connection silent for this long is probed with a round trip (a `Sync`).
const PROBE_AFTER: Duration = Duration::from_secs(2);

/// A probe not answered within this gives the connection up: its peer went silent without a
/// reset (half-open), so no notification would ever come again, and no error either.
const PROBE_BOUND: Duration = Duration::from_secs(1);

/// How long to wait before connecting again after a failure.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// How a LISTEN session ended.
#[derive(PartialEq, Eq)]
enum Ended {
    /// The connection failed or was given up: connect again.
    Lost,
    /// The broker asked the thread to stop.
    Stopped,
}

/// LISTENs on [`CHANNEL`] on a connection of its own (not from the shared pool), reconnecting
/// after failures; after a reconnect every waiter is woken, since notifications sent meanwhile
/// are lost. Ends when `stopped` turns true or its sender is gone.
///
/// Each connection lives in a runtime of its own, dropped when the connection is given up:
/// sqlx sends `UNLISTEN *` when a listener is dropped, in a task of its own with no time
/// limit, and on a half-open connection that task would hold the connection, and the slot of
/// its pool, for good. Dropping the runtime ends it and closes the socket.
fn listen_loop(
    options: &PgConnectOptions,
    hub: &WakeHub,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    while !stop_asked(&stopped) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::warn!(error = %e, "the LISTEN thread's runtime did not start; retrying");
                std::thread::sleep(RECONNECT_AFTER);
                continue;
            }
        };
        let ended = runtime.block_on(session(options, hub, &mut stopped));
        drop(runtime);
        if ended == Ended::Stopped {
            break;
        }
    }
}

fn stop_asked(stopped: &tokio::sync::watch::Receiver<bool>) -> bool {
    *stopped.borrow() || stopped.has_changed().is_err()
}

/// One LISTEN connection, from its connect to its failure (then after [`RECONNECT_AFTER`]) or
/// to the stop.
async fn session(
    options: &PgConnectOptions,
    hub: &WakeHub,
    stopped: &mut tokio::sync::watch::Receiver<bool>,
) -> Ended {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with(options.clone());
    let connected = async {
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        listener.listen(CHANNEL).await?;
        Ok::<_, sqlx::Error>(listener)
    };
    let mut listener = tokio::select! {
        l = connected => match l {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "LISTEN connection failed; retrying");
                return pause(stopped).await;
            }
        },
        _ = stopped.changed() => return Ended::Stopped,
    };
    hub.listening.store(true, Ordering::Relaxed);
    hub.wake_all();
    loop {
        let received = tokio::select! {
            r = tokio::time::timeout(PROBE_AFTER, listener.try_recv()) => r,
            _ = stopped.changed() => {
                // Closed in good order (`UNLISTEN`, then `Terminate`), if the link allows.
                drop(listener);
                let _ = tokio::time::timeout(PROBE_BOUND, pool.close()).await;
                return Ended::Stopped;
            }
        };
        match received {
            Ok(Ok(Some(n))) => hub.apply_payload(n.payload()),
            // The connection dropped and was re-established: anything may have been missed.
            Ok(Ok(None)) => hub.wake_all(),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "LISTEN connection lost; reconnecting");
                break;
            }
            // Silence: a round trip tells an idle connection from a dead one. Notifications
            // that arrive meanwhile are kept for the next `try_recv`.
            Err(_) => {
                let probe = async { (&mut listener).acquire().await?.ping().await };
                match tokio::time::timeout(PROBE_BOUND, probe).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "LISTEN connection lost; reconnecting");
                        break;
                    }
                    Err(_) => {
                        tracing::warn!(
                            "LISTEN connection did not answer within {PROBE_BOUND:?} \
                             (half-open?); reconnecting"
                        );
                        break;
                    }
                }
            }
        }
    }
    // Until a new connection listens, this broker's pushes wake its pops themselves.
    hub.listening.store(false, Ordering::Relaxed);
    hub.wake_all();
    drop(listener);
    pause(stopped).await
}

/// Waits [`RECONNECT_AFTER`], or less when the stop is asked.
async fn pause(stopped: &mut tokio::sync::watch::Receiver<bool>) -> Ended {
    tokio::select! {
        _ = tokio::time::sleep(RECONNECT_AFTER) => Ended::Lost,
        _ = stopped.changed() => Ended::Stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_name_partitions_with_ids_then_the_rest_by_queue_in_two_notices_at_most() {
        let small = [PartitionKey::new("q", "p")];
        let refs: Vec<(&PartitionKey, i64)> = small.iter().map(|k| (k, 42)).collect();
        assert_eq!(
            notify_payloads(&refs),
            vec![r#"[["q","p",42]]"#.to_string()]
        );
        assert!(notify_payloads(&[]).is_empty());

        let many: Vec<PartitionKey> = (0..1000)
            .map(|n| PartitionKey::new(&format!("orders-{}", n % 2), &format!("partition-{n}")))
            .collect();
        let refs: Vec<(&PartitionKey, i64)> = many.iter().zip(0..).collect();
        let payloads = notify_payloads(&refs);
        assert_eq!(payloads.len(), 2);
        assert!(
            payloads[0].len() <= MAX_PAYLOAD,
            "{} bytes",
            payloads[0].len()
        );
        let triples: Vec<(String, String, i64)> = serde_json::from_str(&payloads[0]).unwrap();
        let ids: Vec<i64> = triples.iter().map(|t| t.2).collect();
        assert_eq!(ids, (0..triples.len() as i64).collect::<Vec<_>>());
        assert!(triples.len() > 100 && triples.len() < 1000);
        assert_eq!(payloads[1], r#"["orders-0","orders-1"]"#);

        let huge: Vec<PartitionKey> = (0..3000)
            .map(|n| PartitionKey::new(&format!("queue-{n:020}"), "p"))
            .collect();
        let refs: Vec<(&PartitionKey, i64)> = huge.iter().zip(0..).collect();
        let payloads = notify_payloads(&refs);
        assert_eq!(payloads.len(), 2);
        assert_eq!(payloads[1], "*");
    }

    #[tokio::test]
    async fn a_written_partition_wakes_one_waiter_of_each_group() {
        let hub = WakeHub::new();
        let keys = [
            WakeKey::Queue("q".into()),
            WakeKey::Group("q".into(), "a".into()),
            WakeKey::Group("q".into(), "b".into()),
            WakeKey::Group("other".into(), "a".into()),
        ];
        // Two waiters on each key.
        let waiters: Vec<Waiter> = keys
            .iter()
            .flat_map(|k| [hub.subscribe(k.clone()), hub.subscribe(k.clone())])
            .collect();
        let mut pending: Vec<_> = waiters
            .iter()
            .map(|w| Box::pin(w.notify().notified()))
            .collect();
        for n in &mut pending {
            n.as_mut().enable();
        }
        hub.wake("q", "p");
        let woken: Vec<bool> = pending
            .iter_mut()
            .map(|n| futures_util::FutureExt::now_or_never(n.as_mut()).is_some())
            .collect();
        // One of the two on each of q's keys; none on the other queue's group.
        assert_eq!(
            woken,
            vec![true, false, true, false, true, false, false, false]
        );
        drop(pending);
        drop(waiters);
        assert!(hub.waiters.lock().unwrap().by_key.is_empty());
        assert!(hub.waiters.lock().unwrap().groups.is_empty());
    }

    #[tokio::test]
    async fn a_wake_reaches_an_enabled_waiter_and_unused_keys_are_dropped() {
        let hub = WakeHub::new();
        let waiter = hub.subscribe(WakeKey::Queue("q".into()));
        {
            let notified = waiter.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            hub.apply_payload(r#"[["q","p"]]"#);
            tokio::time::timeout(Duration::from_secs(1), notified)
                .await
                .expect("woken");
        }
        drop(waiter);
        assert!(hub.waiters.lock().unwrap().by_key.is_empty());
        assert!(hub.waiters.lock().unwrap().groups.is_empty());
    }

    #[tokio::test]
    async fn a_payload_tells_the_written_ids_before_it_wakes_and_old_payloads_tell_nothing() {
        let hub = WakeHub::new();
        let told = Arc::new(Mutex::new(Vec::new()));
        {
            let told = told.clone();
            hub.on_written(Box::new(move |queue: &str, id: i64| {
                told.lock().unwrap().push((queue.to_string(), id));
            }));
        }
        let waiter = hub.subscribe(WakeKey::Group("q".into(), "g".into()));
        let notified = waiter.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        hub.apply_payload(r#"[["q","p",7],["r","s",8]]"#);
        assert_eq!(
            *told.lock().unwrap(),
            vec![("q".to_string(), 7), ("r".to_string(), 8)]
        );
        tokio::time::timeout(Duration::from_secs(1), notified.as_mut())
            .await
            .expect("woken");

        // A payload without ids (a broker of an earlier version) tells nothing; that it
        // wakes is the test above.
        hub.apply_payload(r#"[["q","p"]]"#);
        assert_eq!(told.lock().unwrap().len(), 2);
    }
}
