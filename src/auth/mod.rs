//! Authentication and access (reference §10): who the caller is (a verified JWT) and whether
//! the caller's roles grant the capability of the route called.
//!
//! - [`jwt`]: key material (secret, PEM, JWKS) and token verification → [`Caller`].
//! - [`jwks`]: the JWKS cache.
//! - [`roles`]: role sets and the capability each role grants (§10.4).
//! - the gate that applies these to every request is HTTP middleware: `http::gate` (auth never
//!   imports `http`; the route table names a [`roles::Capability`] per route).
//! - [`extractor`]: [`Caller`] as a handler argument (the push stamps its `sub`).
//!
//! Never trusts anything in a request body: `producerSub` comes from [`Caller::sub`] only.

pub mod extractor;
pub mod jwks;
pub mod jwt;
pub mod roles;

use crate::auth::roles::Roles;

/// A verified caller. Absent from a request when auth is off or the path needs no token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The token's `sub` claim: stamped on pushed messages as `producerSub`.
    pub sub: Option<String>,
    /// The token's roles.
    pub roles: Roles,
    /// The token's `exp` (seconds since 1970), when it has one: a Kafka SASL session ends then
    /// unless the client re-authenticates (docs/kafka.md).
    pub expires_at: Option<u64>,
}

/// Why a request is refused (the texts are reference §10.3's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// 401: no token, or one that fails a check.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403: a valid token whose roles lack the route's capability.
    #[error("Insufficient permissions")]
    Forbidden,
    /// 500: the key needed cannot be had (JWKS unreachable, algorithm without key material).
    #[error("{0}")]
    Unavailable(String),
}

impl AuthError {
    /// A 401 with this text.
    pub fn invalid(text: impl Into<String>) -> Self {
        Self::Unauthenticated(text.into())
    }
}

/// Auth settings that cannot be used: the start stops with this.
#[derive(Debug, thiserror::Error)]
#[error("invalid {name}: {reason}")]
pub struct ConfigError {
    /// The variable at fault.
    pub name: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    /// An error about variable `name`.
    pub fn new(name: &'static str, reason: String) -> Self {
        Self { name, reason }
    }
}
