//! Signing in with an OpenID Connect provider: discovery, the authorization code flow with
//! PKCE (S256), `state` and `nonce`, the ID token's signature and claims checked here (see
//! [`super::jwt`]), groups from a claim of the ID token or else of the userinfo endpoint, and
//! the refresh grant to read a user's groups again later.

use std::time::Duration;

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD as B64};
use serde::Deserialize;
use serde_json::Value;

use super::{
    DirectoryError, Finished, Identity, Started, http,
    jwt::{self, JwkSet},
};
use crate::{auth::secret::random_text, model::OidcSpec};

/// What discovery says (OpenID Connect Discovery 1.0), the fields used here.
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    #[serde(default)]
    pub userinfo_endpoint: Option<String>,
    pub jwks_uri: String,
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
}

/// One OIDC provider's client.
#[derive(Debug, Clone)]
pub struct Oidc {
    spec: OidcSpec,
    tls: std::sync::Arc<rustls::ClientConfig>,
}

/// The PKCE challenge of `verifier` (RFC 7636, S256).
pub fn challenge(verifier: &str) -> String {
    B64.encode(ring::digest::digest(
        &ring::digest::SHA256,
        verifier.as_bytes(),
    ))
}

impl Oidc {
    pub fn new(spec: &OidcSpec) -> Result<Self, DirectoryError> {
        let tls = http::tls(&spec.ca_certs).map_err(DirectoryError::Connect)?;
        Ok(Oidc {
            spec: spec.clone(),
            tls,
        })
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.spec.timeout_seconds.clamp(1, 300))
    }

    async fn get_json(&self, url: &str, bearer: Option<&str>) -> Result<Value, DirectoryError> {
        let auth = bearer.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("authorization", a)])
            .unwrap_or_default();
        let (status, body) = http::send(&self.tls, "GET", url, &headers, None, self.timeout())
            .await
            .map_err(DirectoryError::Connect)?;
        if status != 200 {
            return Err(DirectoryError::Search(format!(
                "{url} answered {status}: {}",
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| DirectoryError::Search(format!("{url} answered no JSON: {e}")))
    }

    /// The provider's configuration; its issuer must be exactly the one configured. Kept for
    /// [`FRESH`]: every login needs it, and providers change it rarely.
    pub async fn discover(&self) -> Result<Discovery, DirectoryError> {
        if let Some(known) = cached(&self.spec.issuer, |c| Some(c.discovery.clone())) {
            return Ok(known);
        }
        let discovery = self.fetch_discovery().await?;
        remember(
            &self.spec.issuer,
            |kept| kept.discovery = discovery.clone(),
            || Cached {
                at: std::time::Instant::now(),
                discovery: discovery.clone(),
                keys: None,
            },
        );
        Ok(discovery)
    }

    async fn fetch_discovery(&self) -> Result<Discovery, DirectoryError> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.spec.issuer.trim_end_matches('/')
        );
        let document = self.get_json(&url, None).await?;
        let discovery: Discovery = serde_json::from_value(document)
            .map_err(|e| DirectoryError::Search(format!("{url}: {e}")))?;
        if discovery.issuer != self.spec.issuer {
            return Err(DirectoryError::Search(format!(
                "{url} names issuer {:?}, not {:?} as configured (spec.oidc.issuer must match exactly)",
                discovery.issuer, self.spec.issuer
            )));
        }
        Ok(discovery)
    }

    /// Where to send the user's browser, with a fresh `state`, `nonce` and PKCE verifier.
    pub async fn start(&self, redirect_uri: &str) -> Result<Started, DirectoryError> {
        let discovery = self.discover().await?;
        let (state, nonce, verifier) = (
            random_text::<24>(),
            random_text::<24>(),
            random_text::<48>(),
        );
        let scope = self.spec.scopes.join(" ");
        let challenge = challenge(&verifier);
        let mut params = vec![
            ("response_type", "code"),
            ("client_id", self.spec.client_id.as_str()),
            ("redirect_uri", redirect_uri),
            ("scope", scope.as_str()),
            ("state", state.as_str()),
            ("nonce", nonce.as_str()),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
        ];
        // OIDC Core 11: a refresh token for offline use is granted on consent asked for.
        if self.spec.scopes.iter().any(|s| s == "offline_access") {
            params.push(("prompt", "consent"));
        }
        let query = http::form(&params);
        let separator = if discovery.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        Ok(Started {
            url: format!("{}{separator}{query}", discovery.authorization_endpoint),
            state,
            nonce,
            verifier,
        })
    }

    /// Calls the token endpoint with `grant` (client_secret_basic), returning its answer.
    async fn token(
        &self,
        discovery: &Discovery,
        grant: &[(&str, &str)],
    ) -> Result<Value, DirectoryError> {
        let mut form: Vec<(&str, &str)> = grant.to_vec();
        let basic;
        let mut headers = Vec::new();
        match self.spec.client_secret.as_deref().filter(|s| !s.is_empty()) {
            Some(secret) => {
                // RFC 6749 2.3.1: both parts form-urlencoded before the base64.
                let encode = |s: &str| http::form(&[("", s)]).trim_start_matches('=').to_owned();
                basic = format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!(
                        "{}:{}",
                        encode(&self.spec.client_id),
                        encode(secret)
                    ))
                );
                headers.push(("authorization", basic.as_str()));
            }
            None => form.push(("client_id", &self.spec.client_id)),
        }
        let (status, body) = http::send(
            &self.tls,
            "POST",
            &discovery.token_endpoint,
            &headers,
            Some(("application/x-www-form-urlencoded", http::form(&form))),
            self.timeout(),
        )
        .await
        .map_err(DirectoryError::Connect)?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status != 200 {
            let error = answer["error"].as_str().unwrap_or("no error code");
            let why = answer["error_description"].as_str().unwrap_or_default();
            // A refused grant is the user's (or their session's) refusal, not the provider's
            // trouble.
            return Err(if status == 400 && error == "invalid_grant" {
                DirectoryError::Refused(format!("the provider refused the grant: {why}"))
            } else {
                DirectoryError::Search(format!(
                    "the token endpoint answered {status} ({error}) {why}"
                ))
            });
        }
        Ok(answer)
    }

    /// Checks an ID token with the provider's keys (fetched again once if none matches: keys
    /// rotate).
    async fn id_claims(
        &self,
        discovery: &Discovery,
        id_token: &str,
        nonce: Option<&str>,
    ) -> Result<Value, DirectoryError> {
        let expected = jwt::Expected {
            issuer: &self.spec.issuer,
            audience: &self.spec.client_id,
            nonce,
            skew_seconds: i64::try_from(self.spec.clock_skew_seconds.min(600)).unwrap_or(60),
            now: time::OffsetDateTime::now_utc().unix_timestamp(),
        };
        // The kept key set, unless it lacks the token's key (the provider rotated its keys).
        let kid = jwt::key_id(id_token);
        let kept = cached(&self.spec.issuer, |c| {
            c.keys
                .clone()
                .filter(|k| k.keys.iter().any(|key| key.kid == kid))
        });
        let keys = match kept {
            Some(keys) => keys,
            None => {
                let keys: JwkSet =
                    serde_json::from_value(self.get_json(&discovery.jwks_uri, None).await?)
                        .map_err(|e| {
                            DirectoryError::Search(format!("{}: {e}", discovery.jwks_uri))
                        })?;
                let fresh = keys.clone();
                remember(
                    &self.spec.issuer,
                    |kept| kept.keys = Some(fresh.clone()),
                    || Cached {
                        at: std::time::Instant::now(),
                        discovery: discovery.clone(),
                        keys: Some(fresh.clone()),
                    },
                );
                keys
            }
        };
        // Refused tokens are the login's failure (a forged or misdirected token), not the
        // provider's trouble.
        jwt::verify(id_token, &keys, &expected).map_err(DirectoryError::Refused)
    }

    /// The identity in `claims`, with groups from them or else from the userinfo endpoint.
    async fn identity(
        &self,
        discovery: &Discovery,
        claims: &Value,
        access_token: Option<&str>,
    ) -> Result<Identity, DirectoryError> {
        let text = |v: &Value, name: &str| v.get(name).and_then(Value::as_str).map(str::to_owned);
        let sub = text(claims, "sub").unwrap_or_default();
        let mut groups = groups_in(claims, &self.spec.groups_claim);
        let mut profile = claims.clone();
        if (groups.is_none() || text(claims, &self.spec.username_claim).is_none())
            && let (Some(endpoint), Some(token)) = (&discovery.userinfo_endpoint, access_token)
        {
            let info = self.get_json(endpoint, Some(token)).await?;
            // OIDC Core 5.3.2: userinfo about another subject must not be used.
            if text(&info, "sub").as_deref() != Some(sub.as_str()) {
                return Err(DirectoryError::Search(
                    "the userinfo endpoint answered for another subject".into(),
                ));
            }
            if groups.is_none() {
                groups = groups_in(&info, &self.spec.groups_claim);
            }
            if let (Value::Object(profile), Value::Object(info)) = (&mut profile, info) {
                for (k, v) in info {
                    profile.entry(k).or_insert(v);
                }
            }
        }
        // OIDC Core 5.1: `email_verified` is a boolean; anything else is not a verification.
        let verified_email = text(&profile, "email")
            .filter(|_| profile.get("email_verified").and_then(Value::as_bool) == Some(true));
        let login = text(&profile, &self.spec.username_claim)
            .or_else(|| verified_email.clone())
            .unwrap_or_else(|| sub.clone());
        Ok(Identity {
            display_name: text(&profile, "name").unwrap_or_else(|| login.clone()),
            // OIDC Core 5.7: only the issuer and subject together identify a user, exactly
            // as sent (a subject is case-sensitive).
            id: format!("{}#{sub}", self.spec.issuer),
            login,
            groups: groups.unwrap_or_default(),
            verified_email,
        })
    }

    /// Exchanges the callback's `code` (with the login's PKCE verifier) and checks what comes
    /// back.
    pub async fn finish(
        &self,
        redirect_uri: &str,
        code: &str,
        verifier: &str,
        nonce: &str,
    ) -> Result<Finished, DirectoryError> {
        let discovery = self.discover().await?;
        let answer = self
            .token(
                &discovery,
                &[
                    ("grant_type", "authorization_code"),
                    ("code", code),
                    ("redirect_uri", redirect_uri),
                    ("code_verifier", verifier),
                ],
            )
            .await?;
        let id_token = answer["id_token"]
            .as_str()
            .ok_or_else(|| DirectoryError::Search("the token endpoint sent no ID token".into()))?;
        let claims = self.id_claims(&discovery, id_token, Some(nonce)).await?;
        let identity = self
            .identity(&discovery, &claims, answer["access_token"].as_str())
            .await?;
        Ok(Finished {
            identity,
            refresh_token: answer["refresh_token"].as_str().map(str::to_owned),
        })
    }

    /// The user as the provider has them now, by the refresh grant; `Ok(None)` if the
    /// provider refuses it (the user or their grant is gone).
    pub async fn refresh(&self, refresh_token: &str) -> Result<Option<Finished>, DirectoryError> {
        let discovery = self.discover().await?;
        let answer = match self
            .token(
                &discovery,
                &[
                    ("grant_type", "refresh_token"),
                    ("refresh_token", refresh_token),
                ],
            )
            .await
        {
            Ok(answer) => answer,
            Err(DirectoryError::Refused(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let access = answer["access_token"].as_str();
        let claims = match answer["id_token"].as_str() {
            Some(id_token) => self.id_claims(&discovery, id_token, None).await?,
            None => {
                let endpoint = discovery.userinfo_endpoint.as_deref().ok_or_else(|| {
                    DirectoryError::Search(
                        "a refresh gave no ID token and there is no userinfo endpoint".into(),
                    )
                })?;
                self.get_json(endpoint, access).await?
            }
        };
        let identity = self.identity(&discovery, &claims, access).await?;
        Ok(Some(Finished {
            identity,
            refresh_token: answer["refresh_token"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| Some(refresh_token.to_owned())),
        }))
    }

    /// Where the browser ends the provider's session too (RP-initiated logout), if it says.
    pub async fn end_session(&self, after: &str) -> Option<String> {
        let endpoint = self.discover().await.ok()?.end_session_endpoint?;
        let query = http::form(&[
            ("client_id", &self.spec.client_id),
            ("post_logout_redirect_uri", after),
        ]);
        Some(format!("{endpoint}?{query}"))
    }
}

/// How long a provider's discovery document and key set are kept.
const FRESH: Duration = Duration::from_secs(300);

/// What is kept of a provider, by issuer.
#[derive(Debug, Clone)]
struct Cached {
    at: std::time::Instant,
    discovery: Discovery,
    keys: Option<JwkSet>,
}

static CACHE: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, Cached>>> =
    std::sync::LazyLock::new(Default::default);

/// `read` of what is kept of `issuer`, if it is fresh.
fn cached<T>(issuer: &str, read: impl FnOnce(&Cached) -> Option<T>) -> Option<T> {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .get(issuer)
        .filter(|c| c.at.elapsed() < FRESH)
        .and_then(read)
}

/// Changes what is kept of `issuer` with `change` if it is fresh, else keeps `fresh()`.
fn remember(issuer: &str, change: impl FnOnce(&mut Cached), fresh: impl FnOnce() -> Cached) {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    match cache.get_mut(issuer).filter(|c| c.at.elapsed() < FRESH) {
        Some(kept) => change(kept),
        None => {
            cache.insert(issuer.to_owned(), fresh());
        }
    }
}

/// The groups a claim holds: an array of strings, or one string.
fn groups_in(claims: &Value, claim: &str) -> Option<Vec<String>> {
    match claims.get(claim)? {
        Value::Array(items) => Some(
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        ),
        Value::String(one) => Some(vec![one.clone()]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pkce_challenge_is_rfc_7636s() {
        // RFC 7636 appendix B.
        assert_eq!(
            challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn groups_come_from_an_array_or_a_string() {
        let claims = serde_json::json!({"groups": ["a", "b", 3], "role": "ops"});
        assert_eq!(
            groups_in(&claims, "groups"),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(groups_in(&claims, "role"), Some(vec!["ops".into()]));
        assert_eq!(groups_in(&claims, "none"), None);
    }
}
