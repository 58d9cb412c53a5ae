//! Support for the auth tests: tokens, key pairs generated per run (RSA 2048 and Ed25519), a
//! JWKS served from 127.0.0.1:0, and requests carrying an `Authorization` header.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::pkcs8::{EncodePublicKey, LineEnding};
use rsa::traits::PublicKeyParts;
use serde_json::{json, Value};

use crate::support::{Reply, TestApp};

/// The HS256 secret of the tests.
pub const SECRET: &str = "test-secret-of-at-least-32-bytes!!";
/// `JWT_ISSUER` of the tests.
pub const ISSUER: &str = "https://idp.test";
/// `JWT_AUDIENCE` of the tests.
pub const AUDIENCE: &str = "queen-broker";

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    jsonwebtoken::get_current_timestamp() as i64
}

/// Claims with `sub`, `role`, `iss`, `aud`, `iat` and an `exp` a minute ahead.
pub fn claims(sub: &str, role: &str) -> Value {
    json!({"sub": sub, "role": role, "iss": ISSUER, "aud": AUDIENCE, "iat": now(), "exp": now() + 60})
}

/// A token signed with `key` under `alg`, with an optional `kid`.
pub fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    encode(&header, claims, key).expect("token encodes")
}

/// An HS256 token with [`SECRET`].
pub fn hs256(claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        None,
        claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
}

/// A token whose header says `alg` with no signature at all.
pub fn unsigned(alg: &str, claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": alg, "typ": "JWT"}).to_string());
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    format!("{header}.{body}.")
}

/// An RSA 2048 key pair.
pub struct RsaPair {
    /// Signs tokens.
    pub signing: EncodingKey,
    /// The public key, SPKI PEM (`-----BEGIN PUBLIC KEY-----`).
    pub public_pem: String,
    /// JWK `n`.
    pub n: String,
    /// JWK `e`.
    pub e: String,
}

impl RsaPair {
    /// A fresh key pair.
    pub fn generate() -> Self {
        let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).expect("RSA keygen");
        let der = key.to_pkcs1_der().expect("PKCS#1 DER");
        let public = key.to_public_key();
        Self {
            signing: EncodingKey::from_rsa_der(der.as_bytes()),
            public_pem: public
                .to_public_key_pem(LineEnding::LF)
                .expect("public PEM"),
            n: URL_SAFE_NO_PAD.encode(public.n().to_bytes_be()),
            e: URL_SAFE_NO_PAD.encode(public.e().to_bytes_be()),
        }
    }

    /// Its JWK.
    pub fn jwk(&self, kid: &str) -> Value {
        json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": self.n, "e": self.e})
    }
}

/// An Ed25519 key pair.
pub struct EdPair {
    /// Signs tokens.
    pub signing: EncodingKey,
    /// The public key, SPKI PEM.
    pub public_pem: String,
    /// JWK `x`.
    pub x: String,
}

impl EdPair {
    /// A fresh key pair.
    pub fn generate() -> Self {
        use ring::signature::KeyPair;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("Ed25519 keygen");
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("key pair");
        let public = pair.public_key().as_ref().to_vec();
        // SubjectPublicKeyInfo for Ed25519 (RFC 8410): a fixed prefix, then the 32 key bytes.
        let mut spki = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        spki.extend_from_slice(&public);
        Self {
            signing: EncodingKey::from_ed_der(pkcs8.as_ref()),
            public_pem: format!(
                "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
                STANDARD.encode(&spki)
            ),
            x: URL_SAFE_NO_PAD.encode(&public),
        }
    }

    /// Its JWK.
    pub fn jwk(&self, kid: &str) -> Value {
        json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": self.x})
    }
}

/// A JWKS served on 127.0.0.1:0; the set can be replaced and fetches are counted.
pub struct JwksServer {
    /// Its URL.
    pub url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    hits: Arc<AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

impl JwksServer {
    /// Serves `keys` at `/.well-known/jwks.json`.
    pub async fn start(keys: Vec<Value>) -> Self {
        let keys = Arc::new(Mutex::new(keys));
        let hits = Arc::new(AtomicUsize::new(0));
        let (served, counted) = (keys.clone(), hits.clone());
        let server = HttpServer::new(move || {
            let (served, counted) = (served.clone(), counted.clone());
            App::new().route(
                "/.well-known/jwks.json",
                web::get().to(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let body = json!({ "keys": *served.lock().expect("keys") });
                    async move { HttpResponse::Ok().json(body) }
                }),
            )
        })
        .workers(1)
        .bind(("127.0.0.1", 0))
        .expect("JWKS server binds 127.0.0.1:0");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Self {
            url: format!("http://127.0.0.1:{port}/.well-known/jwks.json"),
            keys,
            hits,
            handle,
        }
    }

    /// Replaces the served keys (a key rotation at the identity provider).
    pub fn rotate(&self, keys: Vec<Value>) {
        *self.keys.lock().expect("keys") = keys;
    }

    /// How many times the set was fetched.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

/// A 127.0.0.1 URL where nothing listens (the port was free a moment ago).
pub fn closed_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    format!("http://127.0.0.1:{port}/jwks")
}

/// Sends a request with an optional `Authorization: Bearer` token and JSON body.
pub async fn call(
    app: &TestApp,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Reply {
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish();
    let method = awc::http::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = client.request(method, format!("{}{path}", app.base));
    if let Some(token) = token {
        req = req.insert_header(("authorization", format!("Bearer {token}")));
    }
    let sent = match body {
        Some(body) => req.send_json(body).await,
        None => req.send().await,
    };
    let mut res = sent.expect("request sent");
    let bytes = res.body().limit(64 * 1024 * 1024).await.expect("body read");
    Reply {
        status: res.status().as_u16(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers: res.headers().clone(),
    }
}
