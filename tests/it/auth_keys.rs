//! RS256 and EdDSA with keys generated here (reference §10.2): a PEM in `JWT_PUBLIC_KEY`, and a
//! JWKS served from 127.0.0.1 with `kid` selection, rotation and caching; tokens of another
//! algorithm are refused, whatever key they were made with; and no start without usable keys.

use std::collections::HashMap;

use crate::support::auth::{
    call, claims, closed_url, sign, unsigned, EdPair, JwksServer, RsaPair, SECRET,
};
use crate::support::{fresh_db, spawn_app_with, test_settings, TestApp};
use jsonwebtoken::{Algorithm, EncodingKey};
use queen_broker::settings::Settings;
use serde_json::{json, Value};

fn push_body() -> Value {
    json!({"items": [{"queue": "keys", "payload": {"k": true}}]})
}

/// The status and `error` text of a push with `token`.
async fn push(app: &TestApp, token: &str) -> (u16, Value) {
    let reply = call(app, "POST", "/api/v1/push", Some(token), Some(&push_body())).await;
    (reply.status, reply.body)
}

async fn refused(app: &TestApp, token: &str) -> String {
    let (status, body) = push(app, token).await;
    assert_eq!(status, 401, "{body}");
    body["error"].as_str().expect("error text").to_string()
}

#[actix_web::test]
async fn rs256_with_a_pem_key_refuses_other_algorithms_and_other_keys() {
    let rsa = RsaPair::generate();
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_ALGORITHM", "RS256"),
            ("JWT_PUBLIC_KEY", &rsa.public_pem),
        ],
    ))
    .await;
    let c = claims("rsa-user", "write-only");
    let (status, body) = push(&app, &sign(Algorithm::RS256, None, &c, &rsa.signing)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        db.stored("keys", "Default").await[0]
            .producer_sub
            .as_deref(),
        Some("rsa-user")
    );
    // RS384 and RS512 are accepted under RS256 (as in 0.15), each checked with its own hash.
    for alg in [Algorithm::RS384, Algorithm::RS512] {
        let (status, body) = push(&app, &sign(alg, Some("ignored"), &c, &rsa.signing)).await;
        assert_eq!(status, 201, "{alg:?}: {body}");
    }
    // The classic confusion: the public key text used as an HMAC secret.
    let confused = sign(
        Algorithm::HS256,
        None,
        &c,
        &EncodingKey::from_secret(rsa.public_pem.as_bytes()).unwrap(),
    );
    assert_eq!(
        refused(&app, &confused).await,
        "Token uses HS256, expected RS256"
    );
    assert_eq!(
        refused(&app, &unsigned("none", &c)).await,
        "Token uses none, expected RS256"
    );
    let ed = EdPair::generate();
    assert_eq!(
        refused(&app, &sign(Algorithm::EdDSA, None, &c, &ed.signing)).await,
        "Token uses EdDSA, expected RS256"
    );
    let other = RsaPair::generate();
    assert_eq!(
        refused(&app, &sign(Algorithm::RS256, None, &c, &other.signing)).await,
        "Invalid token signature"
    );
}

#[actix_web::test]
async fn eddsa_with_a_pem_key_written_on_one_line() {
    let ed = EdPair::generate();
    let rsa = RsaPair::generate();
    let db = fresh_db().await;
    // Env files often carry a PEM on one line with literal \n.
    let one_line = ed.public_pem.trim_end().replace('\n', "\\n");
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_ALGORITHM", "EdDSA"),
            ("JWT_PUBLIC_KEY", &one_line),
            ("JWT_SECRET", SECRET), // present but unused in EdDSA mode
        ],
    ))
    .await;
    let c = claims("ed-user", "read-write");
    let (status, body) = push(&app, &sign(Algorithm::EdDSA, None, &c, &ed.signing)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        refused(&app, &sign(Algorithm::RS256, None, &c, &rsa.signing)).await,
        "Token uses RS256, expected EdDSA"
    );
    let hs = sign(
        Algorithm::HS256,
        None,
        &c,
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    );
    assert_eq!(refused(&app, &hs).await, "Token uses HS256, expected EdDSA");
    let other = EdPair::generate();
    assert_eq!(
        refused(&app, &sign(Algorithm::EdDSA, None, &c, &other.signing)).await,
        "Invalid token signature"
    );
}

#[actix_web::test]
async fn auto_with_a_jwks_selects_by_kid_caches_and_follows_a_rotation() {
    let (r1, r2, stranger) = (
        RsaPair::generate(),
        RsaPair::generate(),
        RsaPair::generate(),
    );
    let e1 = EdPair::generate();
    let jwks = JwksServer::start(vec![r1.jwk("r1"), e1.jwk("e1")]).await;
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_ALGORITHM", "auto"),
            ("JWT_JWKS_URL", &jwks.url),
            ("JWT_SECRET", SECRET),
        ],
    ))
    .await;
    assert_eq!(jwks.hits(), 0, "fetched on first use, not at start");
    let c = claims("jwks-user", "write-only");
    let ok = [
        sign(Algorithm::RS256, Some("r1"), &c, &r1.signing),
        sign(Algorithm::EdDSA, Some("e1"), &c, &e1.signing),
        sign(Algorithm::RS256, None, &c, &r1.signing), // no kid: the first RSA key
        sign(Algorithm::EdDSA, None, &c, &e1.signing), // no kid: the first Ed25519 key
        sign(
            Algorithm::HS256,
            None,
            &c,
            &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        ),
    ];
    for token in &ok {
        let (status, body) = push(&app, token).await;
        assert_eq!(status, 201, "{body}");
    }
    assert_eq!(jwks.hits(), 1, "one fetch serves every worker and token");
    assert_eq!(
        refused(
            &app,
            &sign(Algorithm::RS256, Some("r1"), &c, &stranger.signing)
        )
        .await,
        "Invalid token signature"
    );
    assert_eq!(
        refused(&app, &sign(Algorithm::RS256, Some("e1"), &c, &r1.signing)).await,
        "Key e1 is not an RSA key"
    );
    assert_eq!(
        refused(&app, &unsigned("PS256", &c)).await,
        "Unsupported algorithm: PS256"
    );

    // The provider rotates to r2: the first token naming it causes exactly one refetch.
    jwks.rotate(vec![r2.jwk("r2"), e1.jwk("e1")]);
    let (status, body) = push(&app, &sign(Algorithm::RS256, Some("r2"), &c, &r2.signing)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(jwks.hits(), 2);
    // r1 is gone from the set now.
    assert_eq!(
        refused(&app, &sign(Algorithm::RS256, Some("r1"), &c, &r1.signing)).await,
        "Unknown key ID: r1"
    );
    // Made-up kids right after a refetch do not reach the provider again.
    assert_eq!(
        refused(&app, &sign(Algorithm::RS256, Some("zz"), &c, &r2.signing)).await,
        "Unknown key ID: zz"
    );
    assert_eq!(jwks.hits(), 2);
}

#[actix_web::test]
async fn an_unreachable_jwks_answers_500() {
    let rsa = RsaPair::generate();
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_ALGORITHM", "RS256"),
            ("JWT_JWKS_URL", &closed_url()),
            ("JWT_JWKS_TIMEOUT_MS", "2000"),
        ],
    ))
    .await;
    let token = sign(
        Algorithm::RS256,
        Some("k"),
        &claims("u", "admin"),
        &rsa.signing,
    );
    let (status, body) = push(&app, &token).await;
    assert_eq!(
        (status, body),
        (500, json!({"error": "Failed to fetch JWKS"}))
    );
}

fn settings(pairs: &[(&str, &str)]) -> Result<Settings, String> {
    let mut env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert("QUEEN_CONFIG".into(), String::new());
    // Never reached: the start stops before it connects.
    env.insert(
        "DATABASE_URL".into(),
        "postgres://nobody@127.0.0.1:1/none".into(),
    );
    Settings::from_map(env).map_err(|e| e.to_string())
}

async fn start_error(pairs: &[(&str, &str)]) -> String {
    let settings = settings(pairs).expect("settings parse");
    match queen_broker::app::start(settings).await {
        Ok(_) => panic!("started without usable key material: {pairs:?}"),
        Err(e) => e.to_string(),
    }
}

#[actix_web::test]
async fn the_start_fails_clearly_without_usable_key_material() {
    let err = settings(&[("JWT_ENABLED", "true")]).unwrap_err();
    assert!(err.contains("JWT_SECRET"), "{err}");
    let err = settings(&[("JWT_ENABLED", "true"), ("JWT_ALGORITHM", "RS256")]).unwrap_err();
    assert!(err.contains("JWT_PUBLIC_KEY or JWT_JWKS_URL"), "{err}");

    let ed = EdPair::generate();
    let err = start_error(&[
        ("JWT_ENABLED", "true"),
        ("JWT_ALGORITHM", "RS256"),
        ("JWT_PUBLIC_KEY", &ed.public_pem),
    ])
    .await;
    assert!(
        err.contains("JWT_PUBLIC_KEY") && err.contains("Ed25519"),
        "{err}"
    );
    let err = start_error(&[
        ("JWT_ENABLED", "true"),
        ("JWT_ALGORITHM", "EdDSA"),
        (
            "JWT_PUBLIC_KEY",
            "-----BEGIN PUBLIC KEY-----\nbm9wZQ==\n-----END PUBLIC KEY-----",
        ),
    ])
    .await;
    assert!(err.contains("JWT_PUBLIC_KEY"), "{err}");
    // HS256 with only a key set would refuse every token: not a usable configuration.
    let err = settings(&[
        ("JWT_ENABLED", "true"),
        ("JWT_ALGORITHM", "HS256"),
        ("JWT_JWKS_URL", "http://127.0.0.1:1/jwks"),
    ])
    .unwrap_err();
    assert!(err.contains("JWT_SECRET"), "{err}");
}
