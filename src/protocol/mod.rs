//! The wire protocol's request and response shapes, and the rules that validate them, used by
//! more than one route: push bodies ([`push`]), ack objects and their results ([`ack`]), the
//! name rule ([`Name`]) and the timestamp formats ([`time`]).
//!
//! Knows nothing about HTTP status codes, the application state or the auth gate: a broken rule
//! is a [`ProtocolError`] holding the protocol's text, which the HTTP layer answers as a 400.

pub mod ack;
pub mod name;
pub mod params;
pub mod push;
pub mod time;

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
