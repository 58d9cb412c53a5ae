//! The JWKS cache of `JWT_JWKS_URL`: fetched on first use, used for `JWT_JWKS_REFRESH_INTERVAL`,
//! refetched once when a token names a `kid` the set lacks (key rotation), at most once per
//! [`UNKNOWN_KID_COOLDOWN`] so tokens with made-up `kid`s cannot hammer the identity provider.
//! One fetch at a time; a failed refresh keeps serving the keys it had. Never verifies tokens.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::DecodingKey;

/// Least time between two refetches caused by unknown `kid`s.
pub const UNKNOWN_KID_COOLDOWN: Duration = Duration::from_secs(10);

/// Largest key set accepted.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Which keys of a set may verify a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// `kty: RSA` (`n`, `e`).
    Rsa,
    /// `kty: OKP`, `crv: Ed25519` (`x`).
    Ed25519,
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyKind::Rsa => "RSA",
            KeyKind::Ed25519 => "Ed25519",
        })
    }
}

/// One usable key of a set.
#[derive(Clone)]
struct Entry {
    kid: Option<String>,
    kind: KeyKind,
    key: DecodingKey,
}

/// A fetched set.
struct KeySet {
    entries: Vec<Entry>,
    fetched_at: Instant,
}

impl KeySet {
    /// The key named `kid`, or without a `kid` the first key of the right kind.
    fn find(&self, kid: Option<&str>, kind: KeyKind) -> Option<&Entry> {
        match kid {
            Some(kid) => self.entries.iter().find(|e| e.kid.as_deref() == Some(kid)),
            None => self.entries.iter().find(|e| e.kind == kind),
        }
    }
}

/// Why no key could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    /// The set could not be fetched and none is cached.
    #[error("Failed to fetch JWKS")]
    Unavailable,
    /// Neither the cached nor a refetched set has this `kid`.
    #[error("Unknown key ID: {0}")]
    UnknownKid(String),
    /// The `kid` names a key of another type than the token's algorithm.
    #[error("Key {kid} is not an {kind} key")]
    WrongKind {
        /// The key id.
        kid: String,
        /// The kind the token's algorithm needs.
        kind: KeyKind,
    },
    /// No `kid` in the token and no key of the needed kind in the set.
    #[error("No {0} key in the JWKS")]
    NoKeyOfKind(KeyKind),
}

/// The cache. Shared by every HTTP worker.
pub struct JwksCache {
    url: String,
    refresh_every: Duration,
    timeout: Duration,
    unknown_kid_cooldown: Duration,
    current: RwLock<Option<Arc<KeySet>>>,
    last_unknown_kid_refetch: Mutex<Option<Instant>>,
    /// Held while fetching, so concurrent misses share one fetch.
    fetching: tokio::sync::Mutex<()>,
}

impl JwksCache {
    /// A cache of `url`; nothing is fetched until the first token needs a key.
    pub fn new(
        url: String,
        refresh_every: Duration,
        timeout: Duration,
        unknown_kid_cooldown: Duration,
    ) -> Self {
        Self {
            url,
            refresh_every,
            timeout,
            unknown_kid_cooldown,
            current: RwLock::new(None),
            last_unknown_kid_refetch: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// The key to verify a token with header `kid` and an algorithm of `kind`.
    ///
    /// # Errors
    ///
    /// [`JwksError`]: nothing fetched, or no matching key after the one allowed refetch.
    pub async fn key(&self, kid: Option<&str>, kind: KeyKind) -> Result<DecodingKey, JwksError> {
        let cached = self.cached();
        let fresh = cached
            .as_ref()
            .filter(|set| set.fetched_at.elapsed() < self.refresh_every);
        let (set, fetched_now) = match fresh {
            Some(set) => (set.clone(), false),
            None => (self.refetch(cached.as_ref()).await?, true),
        };
        if let Some(found) = pick(&set, kid, kind)? {
            return Ok(found);
        }
        let Some(kid) = kid else {
            return Err(JwksError::NoKeyOfKind(kind));
        };
        // A kid we do not know: maybe the provider rotated keys. Refetch once, unless this call
        // just fetched or another unknown kid caused a refetch a moment ago.
        if fetched_now || !self.may_refetch_for_unknown_kid() {
            return Err(JwksError::UnknownKid(kid.to_string()));
        }
        let set = self.refetch(Some(&set)).await?;
        pick(&set, Some(kid), kind)?.ok_or_else(|| JwksError::UnknownKid(kid.to_string()))
    }

    fn cached(&self) -> Option<Arc<KeySet>> {
        self.current
            .read()
            .expect("the JWKS lock is never poisoned: no code panics while holding it")
            .clone()
    }

    fn may_refetch_for_unknown_kid(&self) -> bool {
        let mut last = self
            .last_unknown_kid_refetch
            .lock()
            .expect("the JWKS lock is never poisoned: no code panics while holding it");
        if last.is_some_and(|at| at.elapsed() < self.unknown_kid_cooldown) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// Fetches a new set, unless another caller replaced `seen` while we waited for the fetch
    /// lock. On failure the old set stays in use; with no old set the caller gets `Unavailable`.
    async fn refetch(&self, seen: Option<&Arc<KeySet>>) -> Result<Arc<KeySet>, JwksError> {
        let _one_at_a_time = self.fetching.lock().await;
        let now = self.cached();
        let replaced = match (&now, seen) {
            (Some(now), Some(seen)) => !Arc::ptr_eq(now, seen),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if let (true, Some(now)) = (replaced, &now) {
            return Ok(now.clone());
        }
        match fetch(&self.url, self.timeout).await {
            Ok(entries) => {
                tracing::debug!(url = %self.url, keys = entries.len(), "JWKS fetched");
                let set = Arc::new(KeySet {
                    entries,
                    fetched_at: Instant::now(),
                });
                *self
                    .current
                    .write()
                    .expect("the JWKS lock is never poisoned: no code panics while holding it") =
                    Some(set.clone());
                Ok(set)
            }
            Err(reason) => {
                tracing::warn!(url = %self.url, %reason, "cannot fetch JWT_JWKS_URL");
                now.ok_or(JwksError::Unavailable)
            }
        }
    }
}

fn pick(set: &KeySet, kid: Option<&str>, kind: KeyKind) -> Result<Option<DecodingKey>, JwksError> {
    match set.find(kid, kind) {
        Some(entry) if entry.kind == kind => Ok(Some(entry.key.clone())),
        Some(entry) => Err(JwksError::WrongKind {
            kid: entry.kid.clone().unwrap_or_default(),
            kind,
        }),
        None => Ok(None),
    }
}

/// Downloads and parses a key set.
async fn fetch(url: &str, timeout: Duration) -> Result<Vec<Entry>, String> {
    let client = awc::Client::builder()
        .timeout(timeout)
        .connector(awc::Connector::new().timeout(timeout))
        .finish();
    let mut res = client
        .get(url)
        .insert_header(("accept", "application/json"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !res.status().is_success() {
        return Err(format!("HTTP {}", res.status()));
    }
    let body = res
        .body()
        .limit(MAX_JWKS_BYTES)
        .await
        .map_err(|e| e.to_string())?;
    parse(&body)
}

/// Keeps the keys that can verify signatures: RSA and Ed25519, not marked for encryption.
/// Other keys (EC, symmetric, unknown types) are skipped, not fatal.
fn parse(body: &[u8]) -> Result<Vec<Entry>, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("not a JWKS: {e}"))?;
    let mut entries = Vec::new();
    for value in set.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
            continue;
        }
        let kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => KeyKind::Rsa,
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                KeyKind::Ed25519
            }
            _ => continue,
        };
        let Ok(key) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        entries.push(Entry {
            kid: jwk.common.key_id.clone(),
            kind,
            key,
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use actix_web::{web, App, HttpResponse, HttpServer};

    use super::*;

    /// A syntactically valid modulus (these tests never verify signatures).
    fn rsa_n() -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xab_u8; 256])
    }
    const ED_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

    /// Serves `body()` on 127.0.0.1:0 and counts requests.
    async fn serve(body: Arc<Mutex<String>>, hits: Arc<AtomicUsize>) -> String {
        let server = HttpServer::new(move || {
            let body = body.clone();
            let hits = hits.clone();
            App::new().route(
                "/jwks",
                web::get().to(move || {
                    let body = body.lock().unwrap().clone();
                    hits.fetch_add(1, Ordering::SeqCst);
                    async move {
                        HttpResponse::Ok()
                            .content_type("application/json")
                            .body(body)
                    }
                }),
            )
        })
        .workers(1)
        .bind(("127.0.0.1", 0))
        .unwrap();
        let port = server.addrs()[0].port();
        actix_web::rt::spawn(server.run());
        format!("http://127.0.0.1:{port}/jwks")
    }

    fn set(keys: &[(&str, &str)]) -> String {
        let keys: Vec<serde_json::Value> = keys
            .iter()
            .map(|(kid, kty)| match *kty {
                "RSA" => serde_json::json!({"kty": "RSA", "kid": kid, "n": rsa_n(), "e": "AQAB"}),
                "OKP" => serde_json::json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": ED_X}),
                _ => {
                    serde_json::json!({"kty": "EC", "crv": "P-256", "kid": kid, "x": "x", "y": "y"})
                }
            })
            .collect();
        serde_json::json!({ "keys": keys }).to_string()
    }

    #[test]
    fn parse_keeps_rsa_and_ed25519_and_skips_the_rest() {
        let body = serde_json::json!({"keys": [
            {"kty": "EC", "crv": "P-256", "kid": "ec", "x": "AA", "y": "AA"},
            {"kty": "oct", "kid": "sym", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": rsa_n(), "e": "AQAB"},
            {"kty": "weird"},
            {"kty": "RSA", "kid": "r", "n": rsa_n(), "e": "AQAB"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "e", "x": ED_X},
        ]});
        let entries = parse(body.to_string().as_bytes()).unwrap();
        let kids: Vec<_> = entries.iter().map(|e| (e.kid.as_deref(), e.kind)).collect();
        assert_eq!(
            kids,
            [(Some("r"), KeyKind::Rsa), (Some("e"), KeyKind::Ed25519)]
        );
        assert!(parse(b"[]").is_err());
    }

    #[actix_web::test]
    async fn an_unknown_kid_refetches_once_then_cools_down() {
        let body = Arc::new(Mutex::new(set(&[("a", "RSA")])));
        let hits = Arc::new(AtomicUsize::new(0));
        let url = serve(body.clone(), hits.clone()).await;
        let cache = JwksCache::new(
            url,
            Duration::from_secs(3600),
            Duration::from_secs(5),
            Duration::from_secs(3600),
        );
        assert!(cache.key(Some("a"), KeyKind::Rsa).await.is_ok());
        assert!(cache.key(None, KeyKind::Rsa).await.is_ok());
        assert_eq!(hits.load(Ordering::SeqCst), 1, "cached");
        // The provider rotates: the first token with the new kid causes one refetch.
        *body.lock().unwrap() = set(&[("a", "RSA"), ("b", "OKP")]);
        assert!(cache.key(Some("b"), KeyKind::Ed25519).await.is_ok());
        assert_eq!(hits.load(Ordering::SeqCst), 2);
        // Another unknown kid within the cooldown does not fetch again.
        assert_eq!(
            cache.key(Some("zz"), KeyKind::Rsa).await.err(),
            Some(JwksError::UnknownKid("zz".into()))
        );
        assert_eq!(hits.load(Ordering::SeqCst), 2);
        assert_eq!(
            cache.key(Some("b"), KeyKind::Rsa).await.err(),
            Some(JwksError::WrongKind {
                kid: "b".into(),
                kind: KeyKind::Rsa
            })
        );
    }

    #[actix_web::test]
    async fn without_cooldown_each_unknown_kid_refetches_once() {
        let body = Arc::new(Mutex::new(set(&[("a", "RSA")])));
        let hits = Arc::new(AtomicUsize::new(0));
        let url = serve(body, hits.clone()).await;
        let cache = JwksCache::new(
            url,
            Duration::from_secs(3600),
            Duration::from_secs(5),
            Duration::ZERO,
        );
        // The first fetch already happens for this call: no second one for the same miss.
        assert!(cache.key(Some("x"), KeyKind::Rsa).await.is_err());
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        assert!(cache.key(Some("y"), KeyKind::Rsa).await.is_err());
        assert_eq!(hits.load(Ordering::SeqCst), 2);
    }

    #[actix_web::test]
    async fn a_stale_set_is_refreshed_and_kept_when_the_refresh_fails() {
        let body = Arc::new(Mutex::new(set(&[("a", "RSA")])));
        let hits = Arc::new(AtomicUsize::new(0));
        let url = serve(body.clone(), hits.clone()).await;
        // A refresh interval of zero: every use finds the set stale.
        let cache = JwksCache::new(url, Duration::ZERO, Duration::from_secs(5), Duration::ZERO);
        assert!(cache.key(Some("a"), KeyKind::Rsa).await.is_ok());
        assert!(cache.key(Some("a"), KeyKind::Rsa).await.is_ok());
        assert_eq!(hits.load(Ordering::SeqCst), 2);
        *body.lock().unwrap() = "not json".into();
        assert!(
            cache.key(Some("a"), KeyKind::Rsa).await.is_ok(),
            "old keys stay in use"
        );
        assert_eq!(hits.load(Ordering::SeqCst), 3);
    }

    /// https works (rustls with ring, webpki roots): a server that does not speak TLS is a
    /// failed fetch, not a panic over a missing crypto provider.
    #[actix_web::test]
    async fn an_https_url_is_fetched_over_tls() {
        let body = Arc::new(Mutex::new(set(&[("a", "RSA")])));
        let hits = Arc::new(AtomicUsize::new(0));
        let url = serve(body, hits).await.replace("http://", "https://");
        let reason = fetch(&url, Duration::from_secs(5)).await.err().unwrap();
        // Without TLS support awc answers "SSL is not supported" before connecting.
        assert!(!reason.to_lowercase().contains("not supported"), "{reason}");
        let cache = JwksCache::new(
            url,
            Duration::from_secs(3600),
            Duration::from_secs(5),
            Duration::ZERO,
        );
        assert_eq!(
            cache.key(None, KeyKind::Rsa).await.err(),
            Some(JwksError::Unavailable)
        );
    }

    #[actix_web::test]
    async fn an_unreachable_set_is_unavailable() {
        // A port that was free a moment ago; nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cache = JwksCache::new(
            format!("http://127.0.0.1:{port}/jwks"),
            Duration::from_secs(3600),
            Duration::from_secs(2),
            Duration::ZERO,
        );
        assert_eq!(
            cache.key(None, KeyKind::Rsa).await.err(),
            Some(JwksError::Unavailable)
        );
    }
}
