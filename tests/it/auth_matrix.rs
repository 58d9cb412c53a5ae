//! Route × caller matrix (reference §10.3, §10.4): every route of `queen_broker::http::routes()`,
//! whoever adds it, against the four roles and every kind of bad token. The expected decisions
//! are §10.4 written out here, independently of `src/auth/roles.rs`.

use std::collections::HashSet;

use crate::support::auth::{call, claims, hs256, now, sign, unsigned, AUDIENCE, ISSUER, SECRET};
use crate::support::{fresh_db, spawn_app_with, test_settings, Reply, TestApp};
use jsonwebtoken::{Algorithm, EncodingKey};
use queen_broker::http::{routes, Capability, Route};
use serde_json::{json, Value};

const ROLES: [&str; 4] = ["admin", "read-write", "read-only", "write-only"];

/// §10.4, one arm per capability. A new `Capability` does not compile here until someone
/// decides which roles get it.
fn role_may(role: &str, capability: Capability) -> bool {
    match capability {
        Capability::Public => true,
        Capability::Produce => matches!(role, "admin" | "read-write" | "write-only"),
        Capability::Consume | Capability::ProduceAndConsume | Capability::Configure => {
            matches!(role, "admin" | "read-write")
        }
        Capability::Read => matches!(role, "admin" | "read-write" | "read-only"),
        Capability::Admin => role == "admin",
    }
}

/// A concrete path for a route pattern: `{name}` becomes `matrix-name`.
fn concrete(pattern: &str) -> String {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').expect("closed placeholder") + open;
        let name = rest[open + 1..close].split(':').next().unwrap_or("x");
        out.push_str(&format!("matrix-{name}"));
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

async fn request(app: &TestApp, route: &Route, token: Option<&str>) -> Reply {
    // Every POST gets a body; the answer may well be 400, which still means "let in".
    let body = (route.method.as_str() == "POST").then(|| json!({}));
    call(
        app,
        route.method.as_str(),
        &concrete(route.path),
        token,
        body.as_ref(),
    )
    .await
}

fn is_route_404(reply: &Reply) -> bool {
    reply.status == 404 && reply.body["code"] == "no_such_route"
}

fn describe(route: &Route) -> String {
    format!("{} {} ({:?})", route.method, route.path, route.capability)
}

async fn auth_app(db: &crate::support::TestDb) -> TestApp {
    spawn_app_with(test_settings(
        db,
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", SECRET),
            ("JWT_ISSUER", ISSUER),
            ("JWT_AUDIENCE", AUDIENCE),
        ],
    ))
    .await
}

#[actix_web::test]
async fn every_route_decides_every_caller_as_the_role_table_says() {
    let db = fresh_db().await;
    let app = auth_app(&db).await;
    let good = |role: &str| hs256(&claims(&format!("{role}-user"), role));
    let mut bad: Vec<(&str, Option<String>, &str)> = vec![
        ("no token", None, "Authentication required"),
        (
            "expired",
            Some(hs256(
                &json!({"sub": "x", "role": "admin", "iss": ISSUER, "aud": AUDIENCE,
                               "exp": now() - 3600}),
            )),
            "Token has expired",
        ),
        (
            "bad signature",
            Some(sign(
                Algorithm::HS256,
                None,
                &claims("x", "admin"),
                &EncodingKey::from_secret(b"not-the-secret").unwrap(),
            )),
            "Invalid token signature",
        ),
        (
            "wrong algorithm (HS512 with the right secret)",
            Some(sign(
                Algorithm::HS512,
                None,
                &claims("x", "admin"),
                &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
            )),
            "Token uses HS512, expected HS256",
        ),
        (
            "alg none",
            Some(unsigned("none", &claims("x", "admin"))),
            "Token uses none, expected HS256",
        ),
        (
            "wrong issuer",
            Some(hs256(
                &json!({"sub": "x", "role": "admin", "iss": "https://evil.test",
                               "aud": AUDIENCE, "exp": now() + 60}),
            )),
            "Invalid token issuer",
        ),
        (
            "wrong audience",
            Some(hs256(&json!({"sub": "x", "role": "admin", "iss": ISSUER,
                               "aud": "someone-else", "exp": now() + 60}))),
            "Invalid token audience",
        ),
    ];
    bad.push((
        "garbage",
        Some("not-a-jwt".into()),
        "Token decode error: expected three dot-separated parts",
    ));

    let table = routes();
    let mut checked = 0;
    for route in &table {
        for role in ROLES {
            let reply = request(&app, route, Some(&good(role))).await;
            let what = format!(
                "{} as {role}: {} {}",
                describe(route),
                reply.status,
                reply.body
            );
            if role_may(role, route.capability) {
                assert!(
                    ![401, 403].contains(&reply.status) && !is_route_404(&reply),
                    "should be let in: {what}"
                );
            } else {
                assert_eq!(reply.status, 403, "{what}");
                assert_eq!(
                    reply.body,
                    json!({"error": "Insufficient permissions"}),
                    "{what}"
                );
            }
            checked += 1;
        }
        for (case, token, text) in &bad {
            let reply = request(&app, route, token.as_deref()).await;
            let what = format!(
                "{} with {case}: {} {}",
                describe(route),
                reply.status,
                reply.body
            );
            if route.capability == Capability::Public {
                assert!(
                    ![401, 403].contains(&reply.status) && !is_route_404(&reply),
                    "public: {what}"
                );
            } else {
                assert_eq!(reply.status, 401, "{what}");
                assert_eq!(reply.body, json!({ "error": text }), "{what}");
                assert_eq!(reply.headers.get("www-authenticate").unwrap(), "Bearer");
                assert_eq!(
                    reply.headers.get("access-control-allow-origin").unwrap(),
                    "*",
                    "refusals carry CORS headers: {what}"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, table.len() * (ROLES.len() + bad.len()));
}

#[actix_web::test]
async fn a_write_only_token_can_push_and_nothing_else() {
    let db = fresh_db().await;
    let app = auth_app(&db).await;
    let token = hs256(&claims("ingest", "write-only"));
    let reply = call(
        &app,
        "POST",
        "/api/v1/push",
        Some(&token),
        Some(&json!({"items": [{"queue": "wo", "payload": {"n": 1}}]})),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_eq!(reply.body[0]["status"], "queued");
    for route in routes() {
        let produce = route.capability == Capability::Produce;
        let public = route.capability == Capability::Public;
        if produce || public {
            continue;
        }
        let reply = request(&app, &route, Some(&token)).await;
        assert_eq!(reply.status, 403, "{}: {}", describe(&route), reply.body);
    }
}

#[actix_web::test]
async fn roles_from_both_claims_add_up_and_unknown_roles_grant_nothing() {
    let db = fresh_db().await;
    let app = auth_app(&db).await;
    let body = json!({"items": [{"queue": "r", "payload": 1}]});
    let with = |extra: Value| {
        let mut c = json!({"sub": "s", "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 60});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        hs256(&c)
    };
    let cases = [
        (json!({"role": "read-only", "roles": ["write-only"]}), 201),
        (json!({"roles": ["nobody", "write-only"]}), 201),
        (json!({"role": "read-only"}), 403),
        (json!({"role": "superuser", "roles": ["root"]}), 403),
        (json!({"role": ["write-only"]}), 403), // `role` must be a string
        (json!({}), 403),
    ];
    for (extra, status) in cases {
        let token = with(extra.clone());
        let reply = call(&app, "POST", "/api/v1/push", Some(&token), Some(&body)).await;
        assert_eq!(reply.status, status, "{extra}: {}", reply.body);
    }
}

#[actix_web::test]
async fn role_values_and_claim_names_come_from_the_environment() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", SECRET),
            ("JWT_ROLES_CLAIM", "queen_role"),
            ("JWT_ROLES_ARRAY_CLAIM", "groups"),
            ("JWT_ROLE_WRITE_ONLY", "producers"),
        ],
    ))
    .await;
    let body = json!({"items": [{"queue": "r", "payload": 1}]});
    for (claims, status) in [
        (json!({"queen_role": "producers"}), 201),
        (json!({"groups": ["x", "producers"]}), 201),
        (json!({"role": "write-only", "roles": ["write-only"]}), 403),
    ] {
        let reply = call(
            &app,
            "POST",
            "/api/v1/push",
            Some(&hs256(&claims)),
            Some(&body),
        )
        .await;
        assert_eq!(reply.status, status, "{claims}: {}", reply.body);
    }
}

/// The table is the one source: each entry is served by a handler (none answers the
/// protocol's 404), no entry is listed twice, and nothing under `/api/` is public. That every
/// route *has* a capability is the type's doing (`Route::capability` is not optional), and a
/// handler registered outside the table is never reached with auth on (the gate's unit test).
#[actix_web::test]
async fn every_route_in_the_table_has_a_handler_and_a_deliberate_capability() {
    let table = routes();
    assert!(!table.is_empty());
    let mut seen = HashSet::new();
    for route in &table {
        assert!(
            seen.insert((route.method.clone(), route.path)),
            "listed twice: {}",
            describe(route)
        );
        assert!(
            route.capability != Capability::Public || !route.path.starts_with("/api/"),
            "an API route must not be public: {}",
            describe(route)
        );
    }
    let db = fresh_db().await;
    let off = spawn_app_with(test_settings(&db, &[])).await;
    let on = auth_app(&db).await;
    let admin = hs256(&claims("root", "admin"));
    for route in &table {
        let reply = request(&off, route, None).await;
        assert!(!is_route_404(&reply), "no handler: {}", describe(route));
        let reply = request(&on, route, Some(&admin)).await;
        assert!(
            !is_route_404(&reply),
            "no handler with auth on: {}",
            describe(route)
        );
    }
}

#[actix_web::test]
async fn unknown_routes_preflights_and_skip_paths_need_no_token() {
    let db = fresh_db().await;
    let app = auth_app(&db).await;
    for (method, path) in [
        ("GET", "/api/v1/no-such-thing"),
        ("POST", "/api/v1/no-such-thing"),
        ("GET", "/api/v1/push"), // the path exists, not with this method
        ("GET", "/dashboard/"),  // under the dashboard's files, but no file
    ] {
        let reply = call(&app, method, path, None, None).await;
        assert_eq!(reply.status, 404, "{method} {path}");
        assert_eq!(reply.body["code"], "no_such_route", "{method} {path}");
    }
    let reply = call(&app, "OPTIONS", "/api/v1/push", None, None).await;
    assert_eq!(reply.status, 204);
    assert_eq!(
        reply.headers.get("access-control-allow-headers").unwrap(),
        "Content-Type, Authorization"
    );
    let reply = call(&app, "GET", "/health", None, None).await;
    assert_eq!(reply.status, 200);
    // A default skip path; the dashboard's page (public in the table anyway).
    let reply = call(&app, "GET", "/", None, None).await;
    assert_eq!(reply.status, 200);
}

#[actix_web::test]
async fn with_auth_off_everything_is_allowed_without_a_token() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[])).await;
    for route in routes() {
        let reply = request(&app, &route, None).await;
        assert!(
            ![401, 403].contains(&reply.status) && !is_route_404(&reply),
            "{}: {} {}",
            describe(&route),
            reply.status,
            reply.body
        );
    }
    // A token that would be refused with auth on changes nothing.
    let reply = call(
        &app,
        "POST",
        "/api/v1/push",
        Some("garbage"),
        Some(&json!({"items": [{"queue": "q", "payload": 1}]})),
    )
    .await;
    assert_eq!(reply.status, 201);
}
