//! The wire protocol's request and response shapes, and the rules that validate them, used by
//! more than one route: push bodies ([`push`], and the binary ones in [`push_binary`]), ack objects and their results ([`ack`]), the
//! name rule ([`Name`]), the timestamp formats ([`time`]) and the nesting limit of payloads
//! ([`depth`]).
//!
//! Knows nothing about HTTP status codes, the application state or the auth gate: a broken rule
//! is a [`ProtocolError`] holding the protocol's text, which the HTTP layer answers as a 400.

pub mod ack;
pub mod depth;
pub mod kv;
pub mod name;
pub mod params;
pub mod pop_framed;
pub mod push;
pub mod push_binary;
pub mod streams;
pub mod time;
pub mod timers;

pub use name::{Name, NameError, MAX_NAME_CHARS};

/// A request that breaks a rule of the protocol; the text is what the client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolError(pub String);

impl ProtocolError {
    /// An error with this text.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }
}
