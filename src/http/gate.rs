//! The gate: one middleware around the whole App that decides every request before routing,
//! from the same table that registers the routes ([`crate::http::routes`]).
//!
//! With auth on, in order: `OPTIONS` (CORS preflight) and `JWT_SKIP_PATHS` pass; a method and
//! path that match no table entry get the protocol's 404 here (so a handler registered outside
//! the table is never reachable without a check); a `Public` route passes; otherwise the bearer
//! token must verify (401) and its roles must grant the route's capability (403). The verified
//! [`Caller`] rides in the request's extensions for the handler. With auth off everything
//! passes untouched.

use std::future::{ready, Ready};
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::EitherBody;
use actix_web::dev::{
    forward_ready, ResourceDef, Service, ServiceRequest, ServiceResponse, Transform,
};
use actix_web::http::{header, Method};
use actix_web::{Error, HttpMessage};
use futures_util::future::LocalBoxFuture;

use crate::auth::jwt::Verifier;
use crate::auth::roles::Capability;
use crate::auth::{AuthError, Caller, ConfigError};
use crate::http::error::ApiError;
use crate::http::Route;
use crate::settings::JwtSettings;

/// The table of routes as the gate matches them, in registration order (first match wins, as
/// in actix's router).
struct RouteTable(Vec<(Method, ResourceDef, Capability)>);

impl RouteTable {
    fn new(routes: Vec<Route>) -> Self {
        Self(
            routes
                .into_iter()
                .map(|r| (r.method, ResourceDef::new(r.path), r.capability))
                .collect(),
        )
    }

    fn capability(&self, method: &Method, path: &str) -> Option<Capability> {
        self.0
            .iter()
            .find(|(m, def, _)| {
                m == method && path.starts_with(Route::literal_head(def)) && def.is_match(path)
            })
            .map(|(_, _, capability)| *capability)
    }
}

/// `JWT_SKIP_PATHS`: exact entries, and prefixes for entries longer than `/` ending in `/`.
struct SkipPaths(Vec<String>);

impl SkipPaths {
    fn skips(&self, path: &str) -> bool {
        self.0.iter().any(|entry| {
            entry == path || (entry.len() > 1 && entry.ends_with('/') && path.starts_with(entry))
        })
    }
}

/// What the gate decided for one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Serve it; with the verified caller when a token was checked.
    Pass(Option<Caller>),
    /// No route has this method and path: 404.
    NoSuchRoute,
    /// Refuse it.
    Refuse(AuthError),
}

/// The decision maker: settings, route table and verifier. One per broker, shared by workers.
pub struct Gatekeeper {
    verifier: Option<Arc<Verifier>>,
    skip: SkipPaths,
    routes: RouteTable,
}

impl Gatekeeper {
    /// A gatekeeper for `routes`; parses the key material when auth is on.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the `JWT_*` variable whose key material cannot be used.
    pub fn new(settings: &JwtSettings, routes: Vec<Route>) -> Result<Self, ConfigError> {
        let verifier = if settings.enabled {
            Some(Arc::new(Verifier::new(settings)?))
        } else {
            None
        };
        Ok(Self {
            verifier,
            skip: SkipPaths(settings.skip_paths.clone()),
            routes: RouteTable::new(routes),
        })
    }

    /// Whether tokens are checked at all.
    pub fn enabled(&self) -> bool {
        self.verifier.is_some()
    }

    /// The verifier, when auth is on: the Kafka listener checks SASL tokens with the same one
    /// (same keys, same JWKS cache).
    pub fn verifier(&self) -> Option<Arc<Verifier>> {
        self.verifier.clone()
    }

    /// Decides one request from its method, routed path and `Authorization` header.
    pub async fn admit(
        &self,
        method: &Method,
        path: &str,
        authorization: Option<&header::HeaderValue>,
    ) -> Admission {
        let Some(verifier) = &self.verifier else {
            return Admission::Pass(None);
        };
        if method == Method::OPTIONS || self.skip.skips(path) {
            return Admission::Pass(None);
        }
        let capability = match self.routes.capability(method, path) {
            None => return Admission::NoSuchRoute,
            Some(Capability::Public) => return Admission::Pass(None),
            Some(capability) => capability,
        };
        let token = match bearer_token(authorization) {
            Ok(Some(token)) => token,
            Ok(None) => return Admission::Refuse(AuthError::invalid("Authentication required")),
            Err(e) => return Admission::Refuse(e),
        };
        match verifier.verify(token).await {
            Ok(caller) if caller.roles.allow(capability) => Admission::Pass(Some(caller)),
            Ok(_) => Admission::Refuse(AuthError::Forbidden),
            Err(e) => Admission::Refuse(e),
        }
    }
}

/// The token of an `Authorization` header: after `Bearer ` (any case), or the whole value.
fn bearer_token(value: Option<&header::HeaderValue>) -> Result<Option<&str>, AuthError> {
    let Some(value) = value else { return Ok(None) };
    let text = value
        .to_str()
        .map_err(|_| AuthError::invalid("Token decode error: Authorization header is not text"))?
        .trim();
    let token = match text.get(..7) {
        Some(prefix) if prefix.eq_ignore_ascii_case("bearer ") => text[7..].trim_start(),
        _ if text.eq_ignore_ascii_case("bearer") => "",
        _ => text,
    };
    Ok(Some(token).filter(|t| !t.is_empty()))
}

/// The middleware; wrap the whole `App` in it (inside the CORS headers, so refusals carry them).
#[derive(Clone)]
pub struct Gate {
    keeper: Arc<Gatekeeper>,
}

impl Gate {
    /// A gate deciding with `keeper`.
    pub fn new(keeper: Arc<Gatekeeper>) -> Self {
        Self { keeper }
    }
}

impl<S, B> Transform<S, ServiceRequest> for Gate
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Transform = GateService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(GateService {
            service: Rc::new(service),
            keeper: self.keeper.clone(),
        }))
    }
}

/// The gate around one worker's App.
pub struct GateService<S> {
    service: Rc<S>,
    keeper: Arc<Gatekeeper>,
}

impl<S, B> Service<ServiceRequest> for GateService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = self.service.clone();
        let keeper = self.keeper.clone();
        Box::pin(async move {
            if !keeper.enabled() {
                return service
                    .call(req)
                    .await
                    .map(ServiceResponse::map_into_left_body);
            }
            // The path as the router will match it (percent-decoded where actix decodes), so
            // the gate and the router can never disagree about which route this is.
            let path = req.match_info().as_str().to_string();
            let decision = keeper
                .admit(
                    req.method(),
                    &path,
                    req.headers().get(header::AUTHORIZATION),
                )
                .await;
            let refusal = match decision {
                Admission::Pass(caller) => {
                    if let Some(caller) = caller {
                        req.extensions_mut().insert(caller);
                    }
                    return service
                        .call(req)
                        .await
                        .map(ServiceResponse::map_into_left_body);
                }
                Admission::NoSuchRoute => ApiError::NoSuchRoute {
                    method: req.method().to_string(),
                    path: req.path().to_string(),
                },
                Admission::Refuse(e) => ApiError::from(e),
            };
            Ok(req.error_response(refusal).map_into_right_body())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use actix_web::http::header::HeaderValue;
    use actix_web::{test, web, App, HttpResponse};
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    use serde_json::json;

    use super::*;
    use crate::settings::Settings;

    fn jwt(pairs: &[(&str, &str)]) -> JwtSettings {
        let mut env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.insert("QUEEN_CONFIG".into(), String::new());
        Settings::from_map(env).expect("valid settings").jwt
    }

    fn token(claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(b"k").unwrap(),
        )
        .unwrap()
    }

    fn table() -> Vec<Route> {
        vec![
            Route::new(Method::POST, "/api/v1/push", Capability::Produce, |r| r),
            Route::new(
                Method::GET,
                "/api/v1/resources/queues/{queue}",
                Capability::Read,
                |r| r,
            ),
            Route::new(
                Method::DELETE,
                "/api/v1/resources/queues/{queue}",
                Capability::Admin,
                |r| r,
            ),
            Route::new(Method::GET, "/health", Capability::Public, |r| r),
            Route::new(Method::GET, "/status", Capability::Public, |r| r),
        ]
    }

    fn keeper(extra: &[(&str, &str)]) -> Gatekeeper {
        let mut pairs = vec![("JWT_ENABLED", "true"), ("JWT_SECRET", "k")];
        pairs.extend_from_slice(extra);
        Gatekeeper::new(&jwt(&pairs), table()).unwrap()
    }

    async fn admit(k: &Gatekeeper, method: Method, path: &str, auth: Option<&str>) -> Admission {
        let value = auth.map(|a| HeaderValue::from_str(a).unwrap());
        k.admit(&method, path, value.as_ref()).await
    }

    fn refused(text: &str) -> Admission {
        Admission::Refuse(AuthError::invalid(text))
    }

    #[actix_web::test]
    async fn off_lets_everything_through() {
        let k = Gatekeeper::new(&jwt(&[]), table()).unwrap();
        assert_eq!(
            admit(&k, Method::DELETE, "/nowhere", None).await,
            Admission::Pass(None)
        );
    }

    #[actix_web::test]
    async fn routes_are_decided_by_the_table() {
        let k = keeper(&[]);
        let writer = token(json!({"sub": "w", "role": "write-only"}));
        let bearer = format!("Bearer {writer}");
        match admit(&k, Method::POST, "/api/v1/push", Some(&bearer)).await {
            Admission::Pass(Some(caller)) => assert_eq!(caller.sub.as_deref(), Some("w")),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            admit(&k, Method::GET, "/api/v1/resources/queues/q", Some(&bearer)).await,
            Admission::Refuse(AuthError::Forbidden)
        );
        let reader = format!("Bearer {}", token(json!({"roles": ["read-only"]})));
        assert!(matches!(
            admit(&k, Method::GET, "/api/v1/resources/queues/q", Some(&reader)).await,
            Admission::Pass(Some(_))
        ));
        assert_eq!(
            admit(
                &k,
                Method::DELETE,
                "/api/v1/resources/queues/q",
                Some(&reader)
            )
            .await,
            Admission::Refuse(AuthError::Forbidden)
        );
        assert_eq!(
            admit(&k, Method::POST, "/api/v1/push", None).await,
            refused("Authentication required")
        );
        // Method and path must both match; anything else is the protocol's 404, token or not.
        assert_eq!(
            admit(&k, Method::GET, "/api/v1/push", None).await,
            Admission::NoSuchRoute
        );
        assert_eq!(
            admit(&k, Method::POST, "/api/v1/pushx", None).await,
            Admission::NoSuchRoute
        );
        assert_eq!(
            admit(&k, Method::GET, "/status", None).await,
            Admission::Pass(None)
        );
        assert_eq!(
            admit(&k, Method::OPTIONS, "/api/v1/push", None).await,
            Admission::Pass(None)
        );
    }

    #[actix_web::test]
    async fn the_token_may_come_with_or_without_the_bearer_prefix() {
        let k = keeper(&[]);
        let t = token(json!({"role": "admin"}));
        for header in [
            format!("Bearer {t}"),
            format!("bearer  {t}"),
            format!("BEARER {t}"),
            t.clone(),
        ] {
            assert!(
                matches!(
                    admit(&k, Method::POST, "/api/v1/push", Some(&header)).await,
                    Admission::Pass(Some(_))
                ),
                "{header}"
            );
        }
        for header in ["Bearer", "Bearer   ", ""] {
            assert_eq!(
                admit(&k, Method::POST, "/api/v1/push", Some(header)).await,
                refused("Authentication required"),
                "{header:?}"
            );
        }
    }

    #[actix_web::test]
    async fn skip_paths_are_exact_or_slash_ended_prefixes() {
        let k = keeper(&[("JWT_SKIP_PATHS", "/api/v1/resources/, /api/v1/push/,/x")]);
        let open = [
            (Method::GET, "/api/v1/resources/queues/q"),
            (Method::DELETE, "/api/v1/resources/queues/q"),
            (Method::GET, "/x"),
        ];
        for (method, path) in open {
            assert_eq!(
                admit(&k, method, path, None).await,
                Admission::Pass(None),
                "{path}"
            );
        }
        // "/api/v1/push/" skips what is under it, not "/api/v1/push" itself.
        assert_eq!(
            admit(&k, Method::POST, "/api/v1/push", None).await,
            refused("Authentication required")
        );
        // The default list skips "/" exactly, not everything below it.
        let k = keeper(&[]);
        assert_eq!(
            admit(&k, Method::GET, "/", None).await,
            Admission::Pass(None)
        );
        assert_eq!(
            admit(&k, Method::GET, "/health", None).await,
            Admission::Pass(None)
        );
        assert_eq!(
            admit(&k, Method::POST, "/api/v1/push", None).await,
            refused("Authentication required")
        );
    }

    /// A handler registered outside the table is unreachable with auth on: the gate answers 404.
    #[actix_web::test]
    async fn a_route_missing_from_the_table_is_never_served_with_auth_on() {
        let gate = Gate::new(Arc::new(keeper(&[])));
        let app = test::init_service(
            App::new()
                .wrap(gate)
                .route("/api/v1/push", web::post().to(HttpResponse::Created))
                .route("/api/v1/secret", web::get().to(HttpResponse::Ok)),
        )
        .await;
        let admin = format!("Bearer {}", token(json!({"role": "admin"})));
        let req = test::TestRequest::get()
            .uri("/api/v1/secret")
            .insert_header((header::AUTHORIZATION, admin.clone()))
            .to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(res.status(), 404);
        let body: serde_json::Value = test::read_body_json(res).await;
        assert_eq!(body["code"], "no_such_route");
        let req = test::TestRequest::post()
            .uri("/api/v1/push")
            .insert_header((header::AUTHORIZATION, admin))
            .to_request();
        assert_eq!(test::call_service(&app, req).await.status(), 201);
        let req = test::TestRequest::post().uri("/api/v1/push").to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(res.status(), 401);
        assert_eq!(
            res.headers().get(header::WWW_AUTHENTICATE).unwrap(),
            "Bearer"
        );
        let body: serde_json::Value = test::read_body_json(res).await;
        assert_eq!(body, json!({"error": "Authentication required"}));
    }

    /// The gate matches the path the router matches: percent-encoding cannot steer a request
    /// to one route while the gate checks another.
    #[actix_web::test]
    async fn the_gate_sees_the_path_the_router_sees() {
        let gate = Gate::new(Arc::new(keeper(&[])));
        let app = test::init_service(
            App::new()
                .wrap(gate)
                .route("/api/v1/push", web::post().to(HttpResponse::Created)),
        )
        .await;
        let reader = format!("Bearer {}", token(json!({"role": "read-only"})));
        let req = test::TestRequest::post()
            .uri("/api/v1/p%75sh")
            .insert_header((header::AUTHORIZATION, reader))
            .to_request();
        assert_eq!(test::call_service(&app, req).await.status(), 403);
    }
}
