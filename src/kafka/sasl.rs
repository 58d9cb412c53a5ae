//! SASL on the Kafka listener (docs/kafka.md, "Authentication"): SaslHandshake and
//! SaslAuthenticate with PLAIN (the JWT as the password) and OAUTHBEARER (RFC 7628, the JWT as
//! the bearer token), checked by the HTTP gate's verifier, and where one connection stands: not
//! yet authenticated, between a handshake and its token, or authenticated until the token's
//! `exp` (KIP-368: the client is told the remaining lifetime and re-authenticates before it).
//!
//! Both exchange styles are served: after a SaslHandshake v0 the client's token comes as a raw
//! size-prefixed frame (no Kafka header) and is answered the same way; after a v1 handshake it
//! comes in a SaslAuthenticate request. Never decides what a caller may do beyond "who": the
//! roles are applied by `kafka::access`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::auth::jwt::Verifier;
use crate::auth::roles::Capability;
use crate::auth::{AuthError, Caller};
use crate::kafka::code;

/// The mechanisms served, in the order the handshake's answer lists them.
pub const MECHANISMS: [&str; 2] = ["PLAIN", "OAUTHBEARER"];

/// A mechanism a handshake chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// RFC 4616: `authzid NUL authcid NUL password`; the password is the JWT.
    Plain,
    /// RFC 7628: `n,[a=authzid],` `\x01auth=Bearer <jwt>\x01` … `\x01`.
    OAuthBearer,
}

impl Mechanism {
    fn named(name: &str) -> Option<Mechanism> {
        match name {
            "PLAIN" => Some(Mechanism::Plain),
            "OAUTHBEARER" => Some(Mechanism::OAuthBearer),
            _ => None,
        }
    }
}

/// Where the exchange of one connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// No handshake pending.
    Idle,
    /// A handshake chose `mechanism`; the next message is the client's token: a raw frame
    /// after a v0 handshake (`raw`), a SaslAuthenticate after v1.
    Handshaken { mechanism: Mechanism, raw: bool },
}

/// Why a request closes its connection (the caller logs it at warn).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// JWT auth is on and the client has not authenticated.
    #[error("{0:?} before SASL authentication (JWT_ENABLED=true)")]
    Unauthenticated(ApiKey),
    /// The token's lifetime ran out and the client did not re-authenticate.
    #[error("the SASL session ended at the token's expiry and was not re-authenticated")]
    Expired,
    /// A SASL message out of turn.
    #[error("{0}")]
    IllegalState(&'static str),
    /// The handshake named a mechanism not served.
    #[error("SASL mechanism {0:?} is not served (PLAIN, OAUTHBEARER)")]
    Mechanism(String),
    /// The token was refused.
    #[error("SASL authentication failed: {0}")]
    Failed(String),
}

/// The SASL state of one connection.
pub struct Session {
    /// Whether tokens are checked (`JWT_ENABLED=true`).
    checked: bool,
    stage: Stage,
    /// The authenticated caller; `None` before authentication (and always with auth off).
    caller: Option<Caller>,
    /// Whether an exchange completed (with auth off: any well-formed token).
    authenticated: bool,
    /// When the session ends unless the client re-authenticates (the token's `exp`).
    ends_at: Option<Instant>,
}

impl Session {
    /// A new connection's session; `checked` when JWT auth is on.
    pub fn new(checked: bool) -> Self {
        Self {
            checked,
            stage: Stage::Idle,
            caller: None,
            authenticated: false,
            ends_at: None,
        }
    }

    /// Whether the next frame is a raw SASL token (after a v0 handshake), not a request.
    pub fn expects_raw_token(&self) -> bool {
        matches!(self.stage, Stage::Handshaken { raw: true, .. })
    }

    /// How long until the session ends (`None`: it does not end on its own).
    pub fn remaining(&self) -> Option<Duration> {
        self.ends_at
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// Whether a request of API `key` may be served now (ApiVersions and the SASL APIs are
    /// let through here; their own handlers check the stage).
    ///
    /// # Errors
    ///
    /// [`Refusal`]: the connection is closed.
    pub fn admit(&self, key: ApiKey) -> Result<(), Refusal> {
        if matches!(
            key,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        ) {
            return Ok(());
        }
        if self.checked && !self.authenticated {
            return Err(Refusal::Unauthenticated(key));
        }
        if self.remaining().is_some_and(|left| left.is_zero()) {
            return Err(Refusal::Expired);
        }
        Ok(())
    }

    /// The authenticated caller's `sub` (stamped on produced records as `producerSub`).
    pub fn sub(&self) -> Option<&str> {
        self.caller.as_ref().and_then(|c| c.sub.as_deref())
    }

    /// Whether the caller may use an API requiring `capability` (always with auth off).
    pub fn allows(&self, capability: Capability) -> bool {
        if !self.checked {
            return true;
        }
        self.caller
            .as_ref()
            .is_some_and(|caller| caller.roles.allow(capability))
    }

    /// Answers a SaslHandshake; `Err` when the connection must close after the answer.
    pub fn handshake(
        &mut self,
        request: &SaslHandshakeRequest,
        version: i16,
    ) -> (SaslHandshakeResponse, Result<(), Refusal>) {
        let mut response = SaslHandshakeResponse::default();
        response.mechanisms = MECHANISMS
            .iter()
            .map(|m| StrBytes::from_static_str(m))
            .collect();
        let refusal = if self.stage != Stage::Idle {
            Some((
                code::ILLEGAL_SASL_STATE,
                Refusal::IllegalState("a second SaslHandshake before the token"),
            ))
        } else if self.authenticated && version == 0 {
            // KIP-368: re-authentication only with SaslAuthenticate (handshake v1).
            Some((
                code::ILLEGAL_SASL_STATE,
                Refusal::IllegalState("re-authentication with a v0 SaslHandshake"),
            ))
        } else {
            match Mechanism::named(request.mechanism.as_str()) {
                Some(mechanism) => {
                    self.stage = Stage::Handshaken {
                        mechanism,
                        raw: version == 0,
                    };
                    None
                }
                None => Some((
                    code::UNSUPPORTED_SASL_MECHANISM,
                    Refusal::Mechanism(request.mechanism.to_string()),
                )),
            }
        };
        match refusal {
            None => (response, Ok(())),
            Some((error, refusal)) => {
                response.error_code = error;
                (response, Err(refusal))
            }
        }
    }

    /// Answers a SaslAuthenticate (after a v1 handshake); `Err` when the connection must close
    /// after the answer.
    pub async fn authenticate(
        &mut self,
        verifier: Option<&Verifier>,
        request: &SaslAuthenticateRequest,
    ) -> (SaslAuthenticateResponse, Result<(), Refusal>) {
        let mut response = SaslAuthenticateResponse::default();
        let outcome = match self.stage {
            Stage::Handshaken { raw: false, .. } => {
                self.complete(verifier, &request.auth_bytes).await
            }
            _ => Err((
                code::ILLEGAL_SASL_STATE,
                Refusal::IllegalState("SaslAuthenticate without a v1 SaslHandshake before it"),
            )),
        };
        match outcome {
            Ok(lifetime_ms) => {
                response.session_lifetime_ms = lifetime_ms;
                (response, Ok(()))
            }
            Err((error, refusal)) => {
                response.error_code = error;
                response.error_message = Some(StrBytes::from_string(refusal.to_string()));
                (response, Err(refusal))
            }
        }
    }

    /// Takes the raw token that follows a v0 handshake; the answer is an empty raw frame (the
    /// server's last message of both mechanisms is empty).
    ///
    /// # Errors
    ///
    /// [`Refusal`]: the connection is closed without an answer (as Kafka does in this style).
    pub async fn raw_token(
        &mut self,
        verifier: Option<&Verifier>,
        token: &[u8],
    ) -> Result<(), Refusal> {
        self.complete(verifier, token)
            .await
            .map(|_| ())
            .map_err(|(_, refusal)| refusal)
    }

    /// Checks the client's message for the handshaken mechanism; the session's lifetime in ms
    /// (0: no end) or the error code and reason.
    async fn complete(
        &mut self,
        verifier: Option<&Verifier>,
        message: &[u8],
    ) -> Result<i64, (i16, Refusal)> {
        let Stage::Handshaken { mechanism, .. } = self.stage else {
            return Err((
                code::ILLEGAL_SASL_STATE,
                Refusal::IllegalState("a SASL token without a handshake"),
            ));
        };
        self.stage = Stage::Idle;
        let failed = |why: String| (code::SASL_AUTHENTICATION_FAILED, Refusal::Failed(why));
        let credentials = match mechanism {
            Mechanism::Plain => plain(message),
            Mechanism::OAuthBearer => oauth_bearer(message),
        }
        .map_err(|why| failed(why.to_string()))?;
        let Some(verifier) = verifier.filter(|_| self.checked) else {
            // Auth off: a well-formed exchange is enough; nothing is verified (docs/kafka.md).
            self.authenticated = true;
            return Ok(0);
        };
        let caller = verifier
            .verify(credentials.token)
            .await
            .map_err(|e| match e {
                AuthError::Unauthenticated(why) | AuthError::Unavailable(why) => failed(why),
                AuthError::Forbidden => failed(e.to_string()),
            })?;
        if let Some(authzid) = credentials.authzid.filter(|a| !a.is_empty()) {
            if caller.sub.as_deref() != Some(authzid) {
                return Err(failed(format!(
                    "the authorization id {authzid:?} is not the token's sub"
                )));
            }
        }
        if let Some(previous) = self.caller.as_ref().filter(|_| self.authenticated) {
            if previous.sub != caller.sub {
                return Err(failed(
                    "re-authentication must be for the same sub as before".into(),
                ));
            }
        }
        let lifetime_ms = match caller.expires_at {
            None => 0,
            Some(exp) => {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                // Accepted within the clock-skew leeway but already past `exp`: a moment,
                // never 0 (which would mean "no end").
                (exp as i64)
                    .saturating_mul(1000)
                    .saturating_sub(now_ms)
                    .max(1)
            }
        };
        self.ends_at =
            (lifetime_ms > 0).then(|| Instant::now() + Duration::from_millis(lifetime_ms as u64));
        self.caller = Some(caller);
        self.authenticated = true;
        Ok(lifetime_ms)
    }
}

/// What a client's first message carries.
struct Credentials<'a> {
    authzid: Option<&'a str>,
    token: &'a str,
}

/// PLAIN (RFC 4616): `[authzid] NUL authcid NUL passwd`. The authcid (username) is not
/// checked; the password is the token.
fn plain(message: &[u8]) -> Result<Credentials<'_>, &'static str> {
    let text = std::str::from_utf8(message).map_err(|_| "the PLAIN message is not UTF-8")?;
    let mut parts = text.split('\0');
    let (Some(authzid), Some(_authcid), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the PLAIN message is not authzid NUL username NUL password");
    };
    if password.is_empty() {
        return Err("the PLAIN password (the token) is empty");
    }
    Ok(Credentials {
        authzid: Some(authzid),
        token: password,
    })
}

/// OAUTHBEARER (RFC 7628 §3.1): `gs2-header \x01 auth=Bearer <token> \x01 [key=value \x01]* \x01`.
fn oauth_bearer(message: &[u8]) -> Result<Credentials<'_>, &'static str> {
    let text = std::str::from_utf8(message).map_err(|_| "the OAUTHBEARER message is not UTF-8")?;
    let Some((gs2, rest)) = text.split_once('\x01') else {
        return Err("the OAUTHBEARER message has no \\x01 after its gs2 header");
    };
    // gs2-header: cbind flag ("n" or "y"; "p=" asks for channel binding, not served), then
    // an optional "a=authzid", each followed by a comma.
    let mut fields = gs2.splitn(3, ',');
    let (Some(flag), Some(authz), Some("")) = (fields.next(), fields.next(), fields.next()) else {
        return Err("the OAUTHBEARER gs2 header is not n,[a=authzid],");
    };
    if flag != "n" && flag != "y" {
        return Err("OAUTHBEARER channel binding is not served");
    }
    let authzid = match authz {
        "" => None,
        a => Some(
            a.strip_prefix("a=")
                .ok_or("the OAUTHBEARER gs2 header is not n,[a=authzid],")?,
        ),
    };
    let Some(pairs) = rest.strip_suffix("\x01\x01") else {
        return Err("the OAUTHBEARER message does not end with \\x01\\x01");
    };
    let auth = pairs
        .split('\x01')
        .find_map(|kv| kv.strip_prefix("auth="))
        .ok_or("the OAUTHBEARER message has no auth=")?;
    let token = match auth.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("bearer ") => auth[7..].trim(),
        _ => return Err("the OAUTHBEARER auth value is not \"Bearer <token>\""),
    };
    if token.is_empty() {
        return Err("the OAUTHBEARER token is empty");
    }
    // authzid escapes (RFC 5801: "=2C" is ',', "=3D" is '='); a sub with these characters is
    // compared escaped, so it fails closed rather than open.
    Ok(Credentials { authzid, token })
}

/// The raw answer to a v0-style token: a size-prefixed empty message.
pub fn raw_success() -> Bytes {
    Bytes::from_static(&[0, 0, 0, 0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_takes_the_password_as_the_token() {
        let c = plain(b"\0user\0a.b.c").expect("well formed");
        assert_eq!((c.authzid, c.token), (Some(""), "a.b.c"));
        let c = plain(b"me\0user\0t").expect("well formed");
        assert_eq!(c.authzid, Some("me"));
        assert!(plain(b"user\0t").is_err());
        assert!(plain(b"\0user\0").is_err());
        assert!(plain(b"\0u\0t\0x").is_err());
    }

    #[test]
    fn oauth_bearer_reads_the_rfc_7628_client_message() {
        let c = oauth_bearer(b"n,,\x01auth=Bearer a.b.c\x01\x01").expect("well formed");
        assert_eq!((c.authzid, c.token), (None, "a.b.c"));
        let c = oauth_bearer(b"n,a=alice,\x01host=x\x01auth=bearer t\x01ext=1\x01\x01")
            .expect("extensions are skipped");
        assert_eq!((c.authzid, c.token), (Some("alice"), "t"));
        for bad in [
            &b"n,,\x01auth=Bearer t\x01"[..],
            b"p=tls-unique,,\x01auth=Bearer t\x01\x01",
            b"n,,\x01auth=Basic t\x01\x01",
            b"n,,\x01host=x\x01\x01",
            b"\x01",
            b"n,,\x01auth=Bearer \x01\x01",
        ] {
            assert!(oauth_bearer(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn before_authentication_only_the_sasl_apis_and_api_versions_pass_when_checked() {
        let open = Session::new(false);
        assert!(open.admit(ApiKey::Metadata).is_ok());
        assert!(open.allows(Capability::Admin));
        let checked = Session::new(true);
        assert!(checked.admit(ApiKey::ApiVersions).is_ok());
        assert!(checked.admit(ApiKey::SaslHandshake).is_ok());
        assert_eq!(
            checked.admit(ApiKey::Metadata),
            Err(Refusal::Unauthenticated(ApiKey::Metadata))
        );
        assert!(!checked.allows(Capability::Produce));
    }
}
