//! Whether the client of a request is still there: a long-poll pop looks before each claim
//! after a wait, so a consumer that hung up does not take a message it will never receive
//! (leased to nobody, its partition blocked for the lease time).
//!
//! `on_connect` keeps each TCP connection's socket number in the connection's data (under
//! HTTPS, the socket the TLS stream runs on); a peek at the socket (`recv` with
//! `MSG_PEEK | MSG_DONTWAIT`) reads 0 bytes once the client closed it, and "would block" while
//! it waits for the answer. (A TLS client's close_notify alert, sent before its end of stream,
//! is read off the socket by the connection's TLS reader, so the peek sees the end there too:
//! tests/it/tls.rs.) It never reads data (a pipelined request stays where it is) and never
//! closes anything.

use std::os::fd::{AsRawFd, RawFd};

use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;
use actix_web::HttpRequest;

/// The socket of a request's connection.
#[derive(Debug, Clone, Copy)]
pub struct PeerSocket(RawFd);

impl PeerSocket {
    /// For `HttpServer::on_connect`: remembers the socket of a TCP connection, plain or TLS.
    pub fn on_connect(conn: &dyn std::any::Any, data: &mut Extensions) {
        type Tls = actix_tls::accept::rustls_0_23::TlsStream<TcpStream>;
        if let Some(tcp) = conn.downcast_ref::<TcpStream>() {
            data.insert(Self(tcp.as_raw_fd()));
        } else if let Some(tls) = conn.downcast_ref::<Tls>() {
            data.insert(Self(tls.get_ref().0.as_raw_fd()));
        }
    }

    /// The socket of `req`'s connection, when it is a TCP connection.
    pub fn of(req: &HttpRequest) -> Option<Self> {
        req.conn_data::<Self>().copied()
    }

    /// Whether the client closed the connection (its end of the stream arrived, or the
    /// socket is in error).
    pub fn gone(self) -> bool {
        let mut byte = 0u8;
        #[expect(
            unsafe_code,
            reason = "recv on the socket of the connection this request runs on: the connection \
                      (and so the socket) lives as long as the request's future; MSG_PEEK reads \
                      nothing out and MSG_DONTWAIT never blocks"
        )]
        let n = unsafe {
            libc::recv(
                self.0,
                (&raw mut byte).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return true;
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            );
        }
        false
    }
}
