//! Token verification (reference §10.2): the key material of `JWT_SECRET`, `JWT_PUBLIC_KEY` and
//! `JWT_JWKS_URL`, the algorithm rules of `JWT_ALGORITHM`, and the claim checks. Its answer is a
//! [`Caller`] (sub and roles) or an [`AuthError`] carrying the §10.3 text. Knows nothing about
//! routes or HTTP.
//!
//! The token header's `alg` is read before any key is chosen and must belong to the configured
//! mode, so an HS256 token is never checked against an RSA public key used as an HMAC secret,
//! and `none` is never accepted.

use std::str::FromStr;

use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::auth::jwks::{JwksCache, JwksError, KeyKind, UNKNOWN_KID_COOLDOWN};
use crate::auth::roles::Roles;
use crate::auth::{AuthError, Caller, ConfigError};
use crate::protocol::Name;
use crate::settings::{JwtAlgorithm, JwtSettings, RoleNames};

/// The key family a token's `alg` needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Hmac,
    Rsa,
    Ed,
}

/// Checks tokens against the configured keys and claims.
pub struct Verifier {
    mode: JwtAlgorithm,
    secret: Option<DecodingKey>,
    rsa_pem: Option<DecodingKey>,
    ed_pem: Option<DecodingKey>,
    jwks: Option<JwksCache>,
    issuer: Option<String>,
    audience: Option<String>,
    skew_secs: u64,
    roles_claim: String,
    roles_array_claim: String,
    role_names: RoleNames,
}

impl Verifier {
    /// Parses the key material of `settings`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable whose key cannot be used with `JWT_ALGORITHM`.
    pub fn new(settings: &JwtSettings) -> Result<Self, ConfigError> {
        let mode = settings.algorithm;
        let wants_secret = matches!(mode, JwtAlgorithm::Hs256 | JwtAlgorithm::Auto);
        let wants_public = !matches!(mode, JwtAlgorithm::Hs256);
        let secret = match settings.secret.as_deref().filter(|_| wants_secret) {
            Some(s) => Some(DecodingKey::from_secret(s.as_bytes()).map_err(|e| {
                ConfigError::new("JWT_SECRET", format!("is not a usable HMAC key: {e}"))
            })?),
            None => None,
        };
        let (mut rsa_pem, mut ed_pem) = (None, None);
        if let Some(text) = settings.public_key.as_deref().filter(|_| wants_public) {
            match parse_public_pem(text)? {
                (Family::Rsa, key) if mode != JwtAlgorithm::EdDsa => rsa_pem = Some(key),
                (Family::Ed, key) if mode != JwtAlgorithm::Rs256 => ed_pem = Some(key),
                (family, _) => {
                    return Err(ConfigError::new(
                        "JWT_PUBLIC_KEY",
                        format!(
                            "holds an {} key, which JWT_ALGORITHM={} cannot use",
                            if family == Family::Rsa {
                                "RSA"
                            } else {
                                "Ed25519"
                            },
                            mode.name()
                        ),
                    ))
                }
            }
        }
        let jwks = settings
            .jwks_url
            .clone()
            .filter(|_| wants_public)
            .map(|url| {
                JwksCache::new(
                    url,
                    settings.jwks_refresh,
                    settings.jwks_timeout,
                    UNKNOWN_KID_COOLDOWN,
                )
            });
        let usable = match mode {
            JwtAlgorithm::Hs256 => secret.is_some(),
            JwtAlgorithm::Rs256 => rsa_pem.is_some() || jwks.is_some(),
            JwtAlgorithm::EdDsa => ed_pem.is_some() || jwks.is_some(),
            JwtAlgorithm::Auto => {
                secret.is_some() || rsa_pem.is_some() || ed_pem.is_some() || jwks.is_some()
            }
        };
        if !usable {
            return Err(ConfigError::new(
                "JWT_ENABLED",
                format!(
                    "no key material for JWT_ALGORITHM={} (set {})",
                    mode.name(),
                    if mode == JwtAlgorithm::Hs256 {
                        "JWT_SECRET"
                    } else {
                        "JWT_PUBLIC_KEY or JWT_JWKS_URL"
                    }
                ),
            ));
        }
        Ok(Self {
            mode,
            secret,
            rsa_pem,
            ed_pem,
            jwks,
            issuer: settings.issuer.clone(),
            audience: settings.audience.clone(),
            skew_secs: settings.clock_skew_secs,
            roles_claim: settings.roles_claim.clone(),
            roles_array_claim: settings.roles_array_claim.clone(),
            role_names: settings.role_names.clone(),
        })
    }

    /// Verifies `token` and reads its caller.
    ///
    /// # Errors
    ///
    /// [`AuthError::Unauthenticated`] for a token that fails any check (401);
    /// [`AuthError::Unavailable`] when the key it needs cannot be had (500).
    pub async fn verify(&self, token: &str) -> Result<Caller, AuthError> {
        let header = Header::read(token)?;
        let family = self.family(&header.alg)?;
        let algorithm = Algorithm::from_str(&header.alg)
            .map_err(|_| AuthError::invalid(format!("Unsupported algorithm: {}", header.alg)))?;
        let key = self.key(family, header.kid.as_deref()).await?;

        let mut validation = Validation::new(algorithm);
        validation.leeway = self.skew_secs;
        validation.validate_nbf = true;
        validation.required_spec_claims.clear();
        validation.validate_aud = false;
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            validation.required_spec_claims.insert("iss".into());
        }
        if let Some(audience) = &self.audience {
            validation.set_audience(&[audience]);
            validation.validate_aud = true;
            validation.required_spec_claims.insert("aud".into());
        }
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(|e| AuthError::invalid(describe(e.kind(), &header.alg, self.mode)))?;
        let claims = data.claims;
        // jsonwebtoken skips a time claim it cannot read; a token must not outlive its `exp`
        // by writing it as a string.
        for name in ["exp", "nbf", "iat"] {
            if claims.get(name).is_some_and(|v| !v.is_number()) {
                return Err(AuthError::invalid(format!(
                    "Token decode error: {name} is not a number"
                )));
            }
        }
        // Nor by making it negative, which jsonwebtoken cannot read either.
        if claims
            .get("exp")
            .and_then(Value::as_f64)
            .is_some_and(|exp| exp < 0.0)
        {
            return Err(AuthError::invalid("Token has expired"));
        }
        if let Some(iat) = claims.get("iat").and_then(Value::as_f64) {
            let now = jsonwebtoken::get_current_timestamp() as f64;
            if iat > now + self.skew_secs as f64 {
                return Err(AuthError::invalid("Token issued in the future"));
            }
        }
        self.caller(&claims)
    }

    /// The key family the header's `alg` needs in this mode; anything else is refused here.
    fn family(&self, alg: &str) -> Result<Family, AuthError> {
        let family = match alg {
            "HS256" => Some(Family::Hmac),
            // 0.15 accepts these three under RS256; each is verified with its own hash.
            "RS256" | "RS384" | "RS512" => Some(Family::Rsa),
            "EdDSA" => Some(Family::Ed),
            _ => None,
        };
        match (self.mode, family) {
            (JwtAlgorithm::Hs256, Some(Family::Hmac))
            | (JwtAlgorithm::Rs256, Some(Family::Rsa))
            | (JwtAlgorithm::EdDsa, Some(Family::Ed)) => Ok(family.expect("matched Some")),
            (JwtAlgorithm::Auto, Some(family)) => Ok(family),
            (JwtAlgorithm::Auto, None) => {
                Err(AuthError::invalid(format!("Unsupported algorithm: {alg}")))
            }
            (mode, _) => Err(AuthError::invalid(format!(
                "Token uses {alg}, expected {}",
                mode.name()
            ))),
        }
    }

    async fn key(&self, family: Family, kid: Option<&str>) -> Result<DecodingKey, AuthError> {
        let (pem, kind, missing) = match family {
            Family::Hmac => {
                return self
                    .secret
                    .clone()
                    .ok_or_else(|| AuthError::Unavailable("HS256 secret not configured".into()))
            }
            Family::Rsa => (
                &self.rsa_pem,
                KeyKind::Rsa,
                "RS256 public key not configured",
            ),
            Family::Ed => (
                &self.ed_pem,
                KeyKind::Ed25519,
                "EdDSA public key not configured",
            ),
        };
        // A configured PEM wins over the JWKS, whatever kid the token names.
        if let Some(key) = pem {
            return Ok(key.clone());
        }
        let Some(jwks) = &self.jwks else {
            return Err(AuthError::Unavailable(missing.into()));
        };
        jwks.key(kid, kind).await.map_err(|e| match e {
            JwksError::Unavailable => AuthError::Unavailable(e.to_string()),
            JwksError::UnknownKid(_) | JwksError::WrongKind { .. } | JwksError::NoKeyOfKind(_) => {
                AuthError::invalid(e.to_string())
            }
        })
    }

    /// The caller of verified claims: `sub` (a string of at most 255 characters, or none) and
    /// the union of the role claims.
    fn caller(&self, claims: &Map<String, Value>) -> Result<Caller, AuthError> {
        let sub = match claims.get("sub") {
            Some(Value::String(sub)) if !Name::fits(sub) => {
                let why = Name::check(sub)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                return Err(AuthError::invalid(format!("Token sub {why}")));
            }
            Some(Value::String(sub)) => Some(sub.clone()),
            _ => None,
        };
        let mut roles = Roles::default();
        if let Some(Value::String(role)) = claims.get(&self.roles_claim) {
            roles.add_claim(role, &self.role_names);
        }
        if let Some(Value::Array(values)) = claims.get(&self.roles_array_claim) {
            for role in values.iter().filter_map(Value::as_str) {
                roles.add_claim(role, &self.role_names);
            }
        }
        // `verify` refused a negative or non-numeric `exp` already.
        let expires_at = claims
            .get("exp")
            .and_then(Value::as_f64)
            .map(|exp| exp as u64);
        Ok(Caller {
            sub,
            roles,
            expires_at,
        })
    }
}

/// The header fields we decide on, read before anything is verified.
struct Header {
    alg: String,
    kid: Option<String>,
}

impl Header {
    fn read(token: &str) -> Result<Header, AuthError> {
        let decode_error = |why: &str| AuthError::invalid(format!("Token decode error: {why}"));
        let mut parts = token.split('.');
        let (Some(first), Some(_), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(decode_error("expected three dot-separated parts"));
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(first.trim_end_matches('='))
            .map_err(|e| decode_error(&format!("header is not base64url: {e}")))?;
        let header: Map<String, Value> = serde_json::from_slice(&bytes)
            .map_err(|e| decode_error(&format!("header is not a JSON object: {e}")))?;
        let alg = match header.get("alg") {
            Some(Value::String(alg)) => alg.clone(),
            _ => return Err(decode_error("header has no alg")),
        };
        // RFC 7515 §4.1.11: a recipient that does not understand every extension `crit` lists
        // must reject the token. This verifier understands none.
        if let Some(crit) = header.get("crit") {
            return Err(decode_error(&format!(
                "header lists critical extensions this broker does not understand: {crit}"
            )));
        }
        let kid = header
            .get("kid")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Header { alg, kid })
    }
}

/// The §10.3 text of a jsonwebtoken failure.
fn describe(kind: &ErrorKind, alg: &str, mode: JwtAlgorithm) -> String {
    match kind {
        ErrorKind::InvalidSignature => "Invalid token signature".into(),
        ErrorKind::ExpiredSignature => "Token has expired".into(),
        ErrorKind::ImmatureSignature => "Token is not yet valid".into(),
        ErrorKind::InvalidIssuer => "Invalid token issuer".into(),
        ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => "Invalid token issuer".into(),
        ErrorKind::InvalidAudience => "Invalid token audience".into(),
        ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => "Invalid token audience".into(),
        ErrorKind::InvalidAlgorithm => format!("Token uses {alg}, expected {}", mode.name()),
        // An `exp`/`nbf` written as a string or as a negative number (CVE-2026-25537 was the
        // library skipping such claims; since 10.3 it refuses them, and so does `verify`).
        ErrorKind::InvalidClaimFormat(claim) if claim == "exp" || claim == "nbf" => {
            format!("Token decode error: {claim} is not a valid time (seconds since 1970)")
        }
        // A key that does not fit (e.g. a short RSA key) fails the signature check.
        ErrorKind::InvalidRsaKey(_) | ErrorKind::InvalidKeyFormat | ErrorKind::Provider(_) => {
            "Invalid token signature".into()
        }
        other => format!(
            "Token decode error: {}",
            jsonwebtoken::errors::Error::from(other.clone())
        ),
    }
}

/// Reads `JWT_PUBLIC_KEY`: an RSA (`PUBLIC KEY` or `RSA PUBLIC KEY`) or Ed25519 (`PUBLIC KEY`)
/// public key in PEM. Literal `\n` sequences (a PEM squeezed into one env line) are newlines.
fn parse_public_pem(text: &str) -> Result<(Family, DecodingKey), ConfigError> {
    let text = text.replace("\\n", "\n");
    let fail = |why: &str| ConfigError::new("JWT_PUBLIC_KEY", why.to_string());
    if text.contains("PRIVATE KEY") {
        return Err(fail(
            "holds a private key; give the public key (never the private one)",
        ));
    }
    if !text.contains("-----BEGIN") {
        return Err(fail("is not PEM text (-----BEGIN PUBLIC KEY----- ...)"));
    }
    if let Ok(key) = DecodingKey::from_rsa_pem(text.as_bytes()) {
        return Ok((Family::Rsa, key));
    }
    if let Ok(key) = DecodingKey::from_ed_pem(text.as_bytes()) {
        return Ok((Family::Ed, key));
    }
    Err(fail("is neither an RSA nor an Ed25519 public key in PEM"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use jsonwebtoken::{encode, EncodingKey};
    use serde_json::json;

    use super::*;
    use crate::auth::roles::Role;
    use crate::settings::Settings;

    fn settings(pairs: &[(&str, &str)]) -> JwtSettings {
        let mut env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.insert("QUEEN_CONFIG".into(), String::new());
        env.insert("JWT_ENABLED".into(), "true".into());
        Settings::from_map(env).expect("valid settings").jwt
    }

    fn hs(claims: Value, secret: &str) -> String {
        encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
        )
        .unwrap()
    }

    /// An HS256 token with a header written by hand.
    fn hs_with_header(header: Value, claims: Value, secret: &str) -> String {
        let b64 = |v: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
        };
        let message = format!("{}.{}", b64(&header), b64(&claims));
        let signature = jsonwebtoken::crypto::sign(
            message.as_bytes(),
            &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
            Algorithm::HS256,
        )
        .unwrap();
        format!("{message}.{signature}")
    }

    /// CVE-2026-25537: jsonwebtoken before 10.3 skipped an `exp`/`nbf` written as a string.
    /// The verifier checks the claim types itself (above); this pins that the library, on its
    /// own, refuses them too, so neither layer alone lets such a token outlive its `exp`.
    #[test]
    fn the_library_alone_refuses_time_claims_written_as_strings() {
        let key = DecodingKey::from_secret(b"k").unwrap();
        let mut validation = Validation::new(Algorithm::HS256);
        validation.required_spec_claims.clear();
        validation.validate_nbf = true;
        for name in ["exp", "nbf"] {
            let token = hs(json!({ name: (now() - 100_000).to_string() }), "k");
            let decoded = jsonwebtoken::decode::<Map<String, Value>>(&token, &key, &validation);
            assert!(
                decoded.is_err(),
                "{name} as a string must not pass: {decoded:?}"
            );
        }
    }

    #[actix_web::test]
    async fn a_token_with_a_critical_extension_is_refused() {
        let v = Verifier::new(&settings(&[("JWT_SECRET", "k")])).unwrap();
        let plain = hs_with_header(json!({"alg": "HS256", "typ": "JWT"}), json!({}), "k");
        assert!(v.verify(&plain).await.is_ok());
        for crit in [json!(["exp-ext"]), json!(["b64"]), json!([]), json!("x")] {
            let token = hs_with_header(
                json!({"alg": "HS256", "crit": crit, "exp-ext": 1, "b64": false}),
                json!({}),
                "k",
            );
            let text = error(&v, &token).await;
            assert!(text.contains("critical extensions"), "{crit}: {text}");
        }
    }

    fn now() -> i64 {
        jsonwebtoken::get_current_timestamp() as i64
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    async fn error(v: &Verifier, token: &str) -> String {
        match v.verify(token).await {
            Err(AuthError::Unauthenticated(text) | AuthError::Unavailable(text)) => text,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[actix_web::test]
    async fn a_good_hs256_token_gives_sub_and_roles() {
        let v = Verifier::new(&settings(&[("JWT_SECRET", "s3")])).unwrap();
        let caller = v
            .verify(&hs(
                json!({"sub": "alice", "role": "read-only", "roles": ["write-only", 7, "x"],
                       "exp": now() + 60, "iat": now()}),
                "s3",
            ))
            .await
            .unwrap();
        assert_eq!(caller.sub.as_deref(), Some("alice"));
        assert_eq!(caller.roles.as_slice(), [Role::ReadOnly, Role::WriteOnly]);
        // No exp, no sub, no roles: valid, anonymous, allowed nothing.
        let caller = v.verify(&hs(json!({}), "s3")).await.unwrap();
        assert_eq!(caller.sub, None);
        assert!(caller.roles.as_slice().is_empty());
    }

    #[actix_web::test]
    async fn claims_are_checked_with_the_clock_skew() {
        let v = Verifier::new(&settings(&[("JWT_SECRET", "k"), ("JWT_CLOCK_SKEW", "30")])).unwrap();
        assert_eq!(
            error(&v, &hs(json!({"exp": now() - 31}), "k")).await,
            "Token has expired"
        );
        assert!(v.verify(&hs(json!({"exp": now() - 25}), "k")).await.is_ok());
        assert_eq!(
            error(&v, &hs(json!({"nbf": now() + 31}), "k")).await,
            "Token is not yet valid"
        );
        assert!(v.verify(&hs(json!({"nbf": now() + 25}), "k")).await.is_ok());
        assert_eq!(
            error(&v, &hs(json!({"iat": now() + 31}), "k")).await,
            "Token issued in the future"
        );
        assert!(v.verify(&hs(json!({"iat": now() + 25}), "k")).await.is_ok());
        assert_eq!(
            error(&v, &hs(json!({"exp": -1}), "k")).await,
            "Token decode error: exp is not a valid time (seconds since 1970)"
        );
        // A time claim written as a string never lets a token outlive its `exp`: the library
        // refuses `exp`/`nbf`, the verifier's own check refuses `iat` (and would refuse the
        // others, were the library to let them through again).
        for (name, text) in [
            ("exp", "exp is not a valid time (seconds since 1970)"),
            ("nbf", "nbf is not a valid time (seconds since 1970)"),
            ("iat", "iat is not a number"),
        ] {
            assert_eq!(
                error(&v, &hs(json!({ name: (now() - 100_000).to_string() }), "k")).await,
                format!("Token decode error: {text}")
            );
        }
        assert_eq!(
            error(&v, &hs(json!({}), "other")).await,
            "Invalid token signature"
        );
    }

    #[actix_web::test]
    async fn issuer_and_audience_are_required_when_configured() {
        let v = Verifier::new(&settings(&[
            ("JWT_SECRET", "k"),
            ("JWT_ISSUER", "https://idp"),
            ("JWT_AUDIENCE", "queen"),
        ]))
        .unwrap();
        let ok = json!({"iss": "https://idp", "aud": ["other", "queen"]});
        assert!(v.verify(&hs(ok, "k")).await.is_ok());
        for (claims, text) in [
            (
                json!({"iss": "https://evil", "aud": "queen"}),
                "Invalid token issuer",
            ),
            (json!({"aud": "queen"}), "Invalid token issuer"),
            (
                json!({"iss": "https://idp", "aud": "other"}),
                "Invalid token audience",
            ),
            (json!({"iss": "https://idp"}), "Invalid token audience"),
        ] {
            assert_eq!(error(&v, &hs(claims.clone(), "k")).await, text, "{claims}");
        }
        // Without JWT_AUDIENCE a token's aud is not a reason to refuse it.
        let open = Verifier::new(&settings(&[("JWT_SECRET", "k")])).unwrap();
        assert!(open
            .verify(&hs(json!({"aud": "anyone"}), "k"))
            .await
            .is_ok());
    }

    #[actix_web::test]
    async fn the_header_alg_must_fit_the_mode() {
        let v = Verifier::new(&settings(&[("JWT_SECRET", "k")])).unwrap();
        let claims = b64(br#"{"sub":"mallory"}"#);
        let none = format!("{}.{claims}.", b64(br#"{"alg":"none","typ":"JWT"}"#));
        assert_eq!(error(&v, &none).await, "Token uses none, expected HS256");
        let hs512 = format!("{}.{claims}.c2ln", b64(br#"{"alg":"HS512"}"#));
        assert_eq!(error(&v, &hs512).await, "Token uses HS512, expected HS256");
        assert!(error(&v, "abc").await.starts_with("Token decode error: "));
        assert!(error(&v, "!!.x.y")
            .await
            .starts_with("Token decode error: "));
        let no_alg = format!("{}.{claims}.c2ln", b64(br#"{"typ":"JWT"}"#));
        assert!(error(&v, &no_alg).await.starts_with("Token decode error: "));
        let bad_claims = format!("{}.bm90IGpzb24.c2ln", b64(br#"{"alg":"HS256"}"#));
        assert!(error(&v, &bad_claims)
            .await
            .starts_with("Invalid token signature"));
    }

    #[actix_web::test]
    async fn auto_mode_picks_by_alg_and_reports_missing_keys() {
        let v = Verifier::new(&settings(&[
            ("JWT_ALGORITHM", "auto"),
            ("JWT_JWKS_URL", "http://127.0.0.1:9/jwks"),
        ]))
        .unwrap();
        assert_eq!(
            error(&v, &hs(json!({}), "k")).await,
            "HS256 secret not configured"
        );
        let claims = b64(b"{}");
        let es = format!("{}.{claims}.c2ln", b64(br#"{"alg":"ES256"}"#));
        assert_eq!(error(&v, &es).await, "Unsupported algorithm: ES256");
        let none = format!("{}.{claims}.", b64(br#"{"alg":"none"}"#));
        assert_eq!(error(&v, &none).await, "Unsupported algorithm: none");
    }

    #[actix_web::test]
    async fn a_long_sub_is_refused_because_it_could_not_be_stored() {
        let v = Verifier::new(&settings(&[("JWT_SECRET", "k")])).unwrap();
        let sub = "é".repeat(256);
        assert!(error(&v, &hs(json!({ "sub": sub }), "k"))
            .await
            .contains("longer than 255"));
        let sub = "é".repeat(255);
        let caller = v.verify(&hs(json!({ "sub": sub }), "k")).await.unwrap();
        assert_eq!(caller.sub.as_deref(), Some(sub.as_str()));
        // A sub that is not a string is no sub.
        let caller = v.verify(&hs(json!({ "sub": 42 }), "k")).await.unwrap();
        assert_eq!(caller.sub, None);
    }

    #[actix_web::test]
    async fn claim_names_and_role_values_come_from_settings() {
        let v = Verifier::new(&settings(&[
            ("JWT_SECRET", "k"),
            ("JWT_ROLES_CLAIM", "queue_role"),
            ("JWT_ROLE_WRITE_ONLY", "producers"),
        ]))
        .unwrap();
        let c = v
            .verify(&hs(json!({"queue_role": "producers"}), "k"))
            .await
            .unwrap();
        assert_eq!(c.roles.as_slice(), [Role::WriteOnly]);
    }

    #[test]
    fn unusable_public_keys_stop_the_start_naming_the_variable() {
        for pem in [
            "garbage",
            "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
        ] {
            let err = Verifier::new(&settings(&[
                ("JWT_ALGORITHM", "RS256"),
                ("JWT_PUBLIC_KEY", pem),
            ]))
            .err()
            .expect("refused")
            .to_string();
            assert!(err.contains("JWT_PUBLIC_KEY"), "{err}");
        }
    }
}
