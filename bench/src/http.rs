//! A minimal HTTP/1.1 keep-alive client: one request at a time per connection, sized or chunked
//! responses. Hand-rolled so the load generator spends as little CPU as possible on the machine
//! it shares with the broker and PostgreSQL. Only ever used against 127.0.0.1.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response: status and body bytes.
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

/// One keep-alive connection to `127.0.0.1:port`.
pub struct HttpConn {
    port: u16,
    stream: Option<TcpStream>,
    out: Vec<u8>,
    buf: Vec<u8>,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl HttpConn {
    /// A connection that connects on first use (and again after the server closed it).
    pub fn new(port: u16) -> Self {
        Self {
            port,
            stream: None,
            out: Vec::with_capacity(64 * 1024),
            buf: Vec::with_capacity(64 * 1024),
        }
    }

    /// Sends one request and reads the whole response.
    ///
    /// # Errors
    ///
    /// I/O errors and malformed responses; the connection is dropped then.
    pub async fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<Response> {
        self.request_as(method, path, "application/json", body)
            .await
    }

    /// [`HttpConn::request`] with a body of another `Content-Type` (the binary push bodies).
    ///
    /// # Errors
    ///
    /// As [`HttpConn::request`].
    pub async fn request_as(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> io::Result<Response> {
        let result = self.exchange(method, path, content_type, body).await;
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> io::Result<Response> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(("127.0.0.1", self.port)).await?;
            stream.set_nodelay(true)?;
            self.stream = Some(stream);
        }
        let stream = self.stream.as_mut().expect("connected above");
        self.out.clear();
        self.out.extend_from_slice(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
                self.port,
                body.len()
            )
            .as_bytes(),
        );
        self.out.extend_from_slice(body);
        stream.write_all(&self.out).await?;

        self.buf.clear();
        let head_end = loop {
            if let Some(at) = find(&self.buf, b"\r\n\r\n") {
                break at + 4;
            }
            read_more(stream, &mut self.buf).await?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(|_| bad("bad header"))?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let mut length = None;
        let mut chunked = false;
        let mut close = false;
        for line in head.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.parse::<usize>().map_err(|_| bad("bad length"))?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            }
        }
        let body = if chunked {
            read_chunked(stream, &mut self.buf, head_end).await?
        } else {
            let length = length.unwrap_or(0);
            while self.buf.len() < head_end + length {
                read_more(stream, &mut self.buf).await?;
            }
            self.buf[head_end..head_end + length].to_vec()
        };
        if close {
            self.stream = None;
        }
        Ok(Response { status, body })
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 16 * 1024];
    let n = stream.read(&mut chunk).await?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "server closed the connection",
        ));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

async fn read_chunked(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    mut at: usize,
) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(end) = find(&buf[at..], b"\r\n") {
                break at + end;
            }
            read_more(stream, buf).await?;
        };
        let size_text = std::str::from_utf8(&buf[at..line_end]).map_err(|_| bad("chunk size"))?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("chunk size"))?;
        let data_start = line_end + 2;
        while buf.len() < data_start + size + 2 {
            read_more(stream, buf).await?;
        }
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&buf[data_start..data_start + size]);
        at = data_start + size + 2;
    }
}
