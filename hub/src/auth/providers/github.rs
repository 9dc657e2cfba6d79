//! Signing in with GitHub or GitHub Enterprise Server: an OAuth app's web flow (`state`, and
//! PKCE where the server takes it), then the user, their organisations and their teams from
//! the REST API: `acme` and `acme/ops` become the groups `<provider>:acme` and
//! `<provider>:acme/ops`. The access token (an OAuth app's does not expire) is what the
//! scheduled refresh reads the organisations and teams with again.

use std::time::Duration;

use serde_json::Value;

use super::{DirectoryError, Finished, Identity, Started, http};
use crate::{auth::secret::random_text, model::GithubSpec};

/// Items per page of the REST API's lists (its largest).
const PER_PAGE: usize = 100;
/// Pages read of one list at most: 10,000 organisations or teams.
const MAX_PAGES: usize = 100;

#[derive(Debug, Clone)]
pub struct Github {
    spec: GithubSpec,
    tls: std::sync::Arc<rustls::ClientConfig>,
}

impl Github {
    pub fn new(spec: &GithubSpec) -> Result<Self, DirectoryError> {
        let tls = http::tls(&spec.ca_certs).map_err(DirectoryError::Connect)?;
        Ok(Github {
            spec: spec.clone(),
            tls,
        })
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.spec.timeout_seconds.clamp(1, 300))
    }

    /// Where users sign in: github.com or the Enterprise server.
    fn web(&self) -> String {
        if self.spec.base_url.is_empty() {
            "https://github.com".to_owned()
        } else {
            self.spec.base_url.trim_end_matches('/').to_owned()
        }
    }

    /// The REST API: api.github.com, or `/api/v3` of the Enterprise server.
    fn api(&self) -> String {
        if self.spec.base_url.is_empty() {
            "https://api.github.com".to_owned()
        } else {
            format!("{}/api/v3", self.web())
        }
    }

    pub async fn start(&self, redirect_uri: &str) -> Result<Started, DirectoryError> {
        let (state, verifier) = (random_text::<24>(), random_text::<48>());
        let challenge = super::oidc::challenge(&verifier);
        let query = http::form(&[
            ("client_id", &self.spec.client_id),
            ("redirect_uri", redirect_uri),
            ("scope", "read:user read:org"),
            ("state", &state),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("allow_signup", "false"),
        ]);
        Ok(Started {
            url: format!("{}/login/oauth/authorize?{query}", self.web()),
            state,
            nonce: String::new(),
            verifier,
        })
    }

    pub async fn finish(
        &self,
        redirect_uri: &str,
        code: &str,
        verifier: &str,
    ) -> Result<Finished, DirectoryError> {
        let secret = self.spec.client_secret.clone().unwrap_or_default();
        let (status, body) = http::send(
            &self.tls,
            "POST",
            &format!("{}/login/oauth/access_token", self.web()),
            &[("user-agent", "drover-hub")],
            Some((
                "application/x-www-form-urlencoded",
                http::form(&[
                    ("client_id", &self.spec.client_id),
                    ("client_secret", &secret),
                    ("code", code),
                    ("redirect_uri", redirect_uri),
                    ("code_verifier", verifier),
                ]),
            )),
            self.timeout(),
        )
        .await
        .map_err(DirectoryError::Connect)?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        // GitHub answers a refused code with 200 and an `error`.
        let Some(token) = answer["access_token"].as_str().filter(|_| status == 200) else {
            let error = answer["error"].as_str().unwrap_or("no access token");
            let why = answer["error_description"].as_str().unwrap_or_default();
            return Err(
                if error == "bad_verification_code" || error == "incorrect_client_credentials" {
                    DirectoryError::Refused(format!("GitHub refused the code: {error} {why}"))
                } else {
                    DirectoryError::Search(format!(
                        "GitHub's token endpoint answered {status}: {error} {why}"
                    ))
                },
            );
        };
        let identity = self
            .identity(token)
            .await?
            .ok_or_else(|| DirectoryError::Refused("GitHub refused its own token".into()))?;
        Ok(Finished {
            identity,
            refresh_token: Some(token.to_owned()),
        })
    }

    pub async fn refresh(&self, token: &str) -> Result<Option<Finished>, DirectoryError> {
        Ok(self.identity(token).await?.map(|identity| Finished {
            identity,
            refresh_token: Some(token.to_owned()),
        }))
    }

    /// GETs `path` of the API with `token`; `Ok(None)` if the token is refused (401).
    async fn get(&self, token: &str, path: &str) -> Result<Option<Value>, DirectoryError> {
        let auth = format!("Bearer {token}");
        let url = format!("{}{path}", self.api());
        let (status, body) = http::send(
            &self.tls,
            "GET",
            &url,
            &[
                ("authorization", &auth),
                ("user-agent", "drover-hub"),
                ("x-github-api-version", "2022-11-28"),
            ],
            None,
            self.timeout(),
        )
        .await
        .map_err(DirectoryError::Connect)?;
        match status {
            200 => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| DirectoryError::Search(format!("{url}: {e}"))),
            401 => Ok(None),
            other => Err(DirectoryError::Search(format!("{url} answered {other}"))),
        }
    }

    /// Every item of a paged list, or `None` if the token is refused.
    async fn all(&self, token: &str, path: &str) -> Result<Option<Vec<Value>>, DirectoryError> {
        let mut items = Vec::new();
        for page in 1..=MAX_PAGES {
            let Some(Value::Array(batch)) = self
                .get(token, &format!("{path}?per_page={PER_PAGE}&page={page}"))
                .await?
            else {
                return Ok(None);
            };
            let last = batch.len() < PER_PAGE;
            items.extend(batch);
            if last {
                break;
            }
        }
        Ok(Some(items))
    }

    /// The user the token is for, with their organisations and teams as groups; `None` if
    /// GitHub no longer accepts the token (the user revoked the app, or is gone).
    async fn identity(&self, token: &str) -> Result<Option<Identity>, DirectoryError> {
        let Some(user) = self.get(token, "/user").await? else {
            return Ok(None);
        };
        let (Some(id), Some(login)) = (user["id"].as_u64(), user["login"].as_str()) else {
            return Err(DirectoryError::Search(
                "GitHub's /user has no id and login".into(),
            ));
        };
        let (Some(orgs), Some(teams)) = (
            self.all(token, "/user/orgs").await?,
            self.all(token, "/user/teams").await?,
        ) else {
            return Ok(None);
        };
        let mut groups: Vec<String> = orgs
            .iter()
            .filter_map(|o| o["login"].as_str().map(str::to_owned))
            .collect();
        groups.extend(teams.iter().filter_map(|t| {
            Some(format!(
                "{}/{}",
                t["organization"]["login"].as_str()?,
                t["slug"].as_str()?
            ))
        }));
        Ok(Some(Identity {
            // The numeric id: a login can be renamed (and taken by someone else).
            id: id.to_string(),
            login: login.to_owned(),
            display_name: user["name"].as_str().unwrap_or(login).to_owned(),
            groups,
            // GitHub's /user email is whatever the user typed: never trusted to name them.
            verified_email: None,
        }))
    }
}
