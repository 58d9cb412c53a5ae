//! The dashboard's files (`GET /`, `GET /dashboard/{file}`: built in, public, locked down by a
//! content security policy) and `GET /api/v1/access` (what the caller's token may do), with auth
//! off and on. The page itself is tested in a browser: tests/browser.

use serde_json::json;

use crate::support::auth::{call, claims, hs256, AUDIENCE, ISSUER, SECRET};
use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings};

#[actix_web::test]
async fn the_page_and_its_files_are_served_from_the_binary() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let (status, html) = app.get_text("/").await;
    assert_eq!(status, 200);
    assert!(html.contains(r#"<script src="/dashboard/app.js" defer></script>"#));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external resource"
    );
    let page = app.get("/").await;
    assert_eq!(
        page.headers.get("content-type").unwrap(),
        "text/html; charset=utf-8"
    );
    let csp = page
        .headers
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    for (file, kind, needle) in [
        ("app.js", "text/javascript; charset=utf-8", "sessionStorage"),
        ("app.css", "text/css; charset=utf-8", "--focus"),
    ] {
        let path = format!("/dashboard/{file}");
        let (status, text) = app.get_text(&path).await;
        assert_eq!(status, 200, "{file}");
        assert!(text.contains(needle), "{file}");
        assert_eq!(
            app.get(&path).await.headers.get("content-type").unwrap(),
            kind
        );
    }
    let missing = app.get("/dashboard/secrets.txt").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body["error"], r#"no dashboard file "secrets.txt""#);
    let access = app.get("/api/v1/access").await;
    assert_eq!(access.status, 200);
    assert_eq!(
        access.body,
        json!({
            "authEnabled": false,
            "sub": null,
            "capabilities": ["produce", "consume", "configure", "read", "admin"],
        })
    );
}

#[actix_web::test]
async fn with_auth_on_the_files_are_public_and_access_names_the_tokens_rights() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", SECRET),
            ("JWT_ISSUER", ISSUER),
            ("JWT_AUDIENCE", AUDIENCE),
            // Even when "/" is not a skip path, the page's files need no token.
            ("JWT_SKIP_PATHS", "/health"),
        ],
    ))
    .await;
    for path in ["/", "/dashboard/app.js", "/dashboard/app.css"] {
        assert_eq!(
            call(&app, "GET", path, None, None).await.status,
            200,
            "{path}"
        );
    }
    assert_eq!(
        call(&app, "GET", "/api/v1/access", None, None).await.status,
        401
    );
    let rights = |role: &'static str| {
        let token = hs256(&claims("u-1", role));
        let app = &app;
        async move { call(app, "GET", "/api/v1/access", Some(&token), None).await }
    };
    let reader = rights("read-only").await;
    assert_eq!(reader.status, 200);
    assert_eq!(
        reader.body,
        json!({"authEnabled": true, "sub": "u-1", "capabilities": ["read"]})
    );
    assert_eq!(
        rights("read-write").await.body["capabilities"],
        json!(["produce", "consume", "configure", "read"])
    );
    assert_eq!(
        rights("admin").await.body["capabilities"],
        json!(["produce", "consume", "configure", "read", "admin"])
    );
    // A token that may not read may not ask either (the dashboard says so and asks again).
    assert_eq!(rights("write-only").await.status, 403);
}
