//! Reading request bodies: at most `QUEEN_MAX_BODY_BYTES` each (413), within
//! `QUEEN_BODY_TIMEOUT_MS` (408, and the connection is closed), and at most
//! `QUEEN_MAX_READING_BYTES` being received over all connections at once (503 + `Retry-After`):
//! bytes are counted against that cap before they are read (the declared length up front, each
//! chunk of a body without one as it comes), so stalled uploads cannot pile up memory.
//! `Content-Encoding: gzip` (or `deflate`) is decoded, and the limit applies to the decoded
//! bytes; any other encoding but `identity` is a 415.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix_web::dev::Decompress;
use actix_web::http::header;
use actix_web::{web, HttpRequest};
use bytes::BytesMut;
use futures_util::StreamExt;

use crate::http::error::ApiError;
use crate::state::AppState;

/// Bytes held by bodies being received, released when the guard drops.
struct Reading {
    counter: Arc<AtomicUsize>,
    held: usize,
    cap: usize,
}

impl Reading {
    /// Counts `n` more bytes; refuses when the cap would be passed (a body alone larger than
    /// the cap is still read when nothing else is).
    fn take(&mut self, n: usize) -> Result<(), ApiError> {
        let before = self.counter.fetch_add(n, Ordering::AcqRel);
        self.held += n;
        if before > 0 && before + n > self.cap {
            return Err(ApiError::Overloaded {
                retry_after_secs: 1,
            });
        }
        Ok(())
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.held, Ordering::AcqRel);
    }
}

/// The encodings a body may come in.
fn decodable(req: &HttpRequest) -> Result<bool, ApiError> {
    let Some(value) = req.headers().get(header::CONTENT_ENCODING) else {
        return Ok(false);
    };
    let text = value.to_str().unwrap_or("").trim().to_ascii_lowercase();
    match text.as_str() {
        "" | "identity" => Ok(false),
        "gzip" | "x-gzip" | "deflate" => Ok(true),
        _ => Err(ApiError::UnsupportedEncoding(
            value.to_str().unwrap_or("(not text)").to_string(),
        )),
    }
}

/// Reads the whole body, refusing more than `limit` (decoded) bytes.
///
/// # Errors
///
/// [`ApiError::TooLarge`] above the limit; [`ApiError::UnsupportedEncoding`] for an encoding
/// other than gzip, deflate or identity; [`ApiError::BodyTimeout`] when the body does not
/// arrive in time; [`ApiError::Overloaded`] when too many body bytes are being received;
/// [`ApiError::BadRequest`] when the stream breaks or does not decode.
pub async fn read_body(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<bytes::Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let decode = decodable(req)?;
    if !decode && declared.is_some_and(|n| n > limit) {
        return Err(ApiError::TooLarge { limit });
    }
    let state = req.app_data::<web::Data<AppState>>();
    let (counter, cap, timeout) = match state {
        Some(s) => (
            s.reading.clone(),
            s.settings.max_reading_bytes,
            s.settings.body_timeout,
        ),
        None => (
            Arc::new(AtomicUsize::new(0)),
            usize::MAX,
            std::time::Duration::from_secs(30),
        ),
    };
    let mut reading = Reading {
        counter,
        held: 0,
        cap,
    };
    // The declared length is counted before a byte of it is read.
    let upfront = declared.unwrap_or(0).min(limit);
    reading.take(upfront)?;
    let read = async {
        let mut body = BytesMut::with_capacity(upfront);
        let mut stream: std::pin::Pin<Box<dyn futures_util::Stream<Item = _>>> = if decode {
            Box::pin(Decompress::from_headers(
                payload.into_inner(),
                req.headers(),
            ))
        } else {
            Box::pin(payload.into_inner())
        };
        while let Some(chunk) = stream.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::BadRequest(format!("could not read request body: {e}")))?;
            if body.len() + chunk.len() > limit {
                return Err(ApiError::TooLarge { limit });
            }
            let past = (body.len() + chunk.len()).saturating_sub(reading.held);
            if past > 0 {
                reading.take(past)?;
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(ApiError::BodyTimeout(timeout)),
    }
}

/// Parses a whole body as one JSON value, with the protocol's texts for an empty body
/// (`Empty request body`) and a broken one (`Invalid JSON: ...`).
///
/// # Errors
///
/// [`ApiError::BadRequest`] with one of those texts.
pub fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("Empty request body".into()));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::BadRequest(format!("Invalid JSON: {e}")))
}
