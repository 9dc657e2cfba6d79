//! The connection to a hub: logging in (and deciding whether to trust the hub's CA), and an
//! HTTPS client that pins it.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::{CliError, Saved, render::text};
use crate::fsutil::write_atomic;

pub(super) async fn login(
    config: &std::path::Path,
    server: &str,
    (username, provider): (&str, Option<&str>),
    password: &str,
    ca_checksum: Option<&str>,
) -> Result<String, CliError> {
    let server = server.trim_end_matches('/').to_owned();
    let authority = authority(&server)?;
    // Fetch the CA without trusting anything yet, then decide whether to trust it.
    let insecure = Client::with_config(&server, tunnel::tls::unverified_client_config())?;
    let (status, ca_pem) = insecure.send("GET", "/cacerts", None, None).await?;
    if status != 200 {
        return Err(CliError::Unreachable(format!(
            "{server}/cacerts answered {status}; is this a Drover hub?"
        )));
    }
    let actual = tunnel::tls::ca_checksum(&ca_pem);
    let mut notice = String::new();
    match ca_checksum {
        Some(expected) if !expected.eq_ignore_ascii_case(&actual) => {
            return Err(CliError::Unreachable(format!(
                "the hub at {authority} serves a CA with checksum {actual}, not {expected}; do not log in there"
            )));
        }
        Some(_) => {}
        None => {
            notice = format!(
                "Trusting the hub's CA, checksum {actual} (pass --ca-checksum to check it instead).\n"
            )
        }
    }
    let ca_pem = String::from_utf8_lossy(&ca_pem).into_owned();
    let client = Client::new(&Saved {
        server: server.clone(),
        token: String::new(),
        ca_pem: ca_pem.clone(),
        client: String::new(),
    })?;
    // The id of this CLI (its saved configuration): kept across logins, so the hub revokes the
    // token a new login replaces.
    let client_id = super::load(config)
        .ok()
        .map(|s| s.client)
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| format!("cli-{}", crate::auth::secret::random_password()));
    if let Some(provider) = provider
        && redirects(&client, provider).await
    {
        return browser_login(
            config,
            &client,
            (provider, &client_id),
            (server, ca_pem, notice),
        )
        .await;
    }
    let mut body = json!({"username": username, "password": password, "session": false, "description": "drover-hub CLI", "client": client_id});
    if let Some(provider) = provider {
        body["provider"] = provider.into();
    }
    let (status, bytes) = client.send("POST", "/v1/login", None, Some(&body)).await?;
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status == 401 {
        return Err(CliError::Refused(format!(
            "login refused: {} (as user {username:?}; give another with --username)",
            text(&value["message"])
        )));
    }
    if status != 200 {
        return Err(CliError::Refused(format!(
            "login refused: {}",
            text(&value["message"])
        )));
    }
    let saved = Saved {
        server,
        token: text(&value["token"]),
        ca_pem,
        client: client_id,
    };
    save(config, &saved)?;
    let who = match provider {
        Some(provider) => format!("{} ({username} of {provider})", text(&value["user"])),
        None => username.to_owned(),
    };
    Ok(format!(
        "{notice}Logged in to {} as {who}; the token (valid until {}) is saved in {}.\n",
        saved.server,
        text(&value["expiresAt"]),
        config.display()
    ))
}

/// Whether `provider` on the hub behind `client` signs users in at its own page.
async fn redirects(client: &Client, provider: &str) -> bool {
    let Ok((200, bytes)) = client.send("GET", "/v1/login/providers", None, None).await else {
        return false;
    };
    let offered: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    offered["items"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["name"] == provider && p["redirects"] == true)
}

/// As [`redirects`], asked before the hub's CA is trusted (nothing secret is sent): whether
/// to ask for a password at all.
pub async fn provider_redirects(server: &str, provider: &str) -> bool {
    match Client::with_config(server, tunnel::tls::unverified_client_config()) {
        Ok(client) => redirects(&client, provider).await,
        Err(_) => false,
    }
}

/// Signs in at a provider's page: this CLI makes its token (the secret stays here), the hub
/// gives the URL to open, and once the user has signed in there the token works.
async fn browser_login(
    config: &std::path::Path,
    client: &Client,
    (provider, client_id): (&str, &str),
    (server, ca_pem, notice): (String, String, String),
) -> Result<String, CliError> {
    use std::io::Write as _;
    let token = crate::auth::secret::new_token(crate::auth::secret::TokenKind::Token);
    let body = json!({"tokenName": token.name, "tokenHash": token.hash, "client": client_id});
    let (status, bytes) = client
        .send(
            "POST",
            &format!("/v1/login/{provider}/cli"),
            None,
            Some(&body),
        )
        .await?;
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status != 200 {
        return Err(CliError::Refused(format!(
            "login refused: {}",
            text(&value["message"])
        )));
    }
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "{notice}Open this URL in a browser and sign in with {provider} (waiting up to 5 minutes):\n\n  {}\n",
        text(&value["url"])
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let me = loop {
        let (status, bytes) = client
            .send("GET", "/v1/me", Some(&token.value), None)
            .await?;
        if status == 200 {
            break serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null);
        }
        if std::time::Instant::now() > deadline {
            return Err(CliError::Refused(
                "no sign-in within 5 minutes; run the login again".into(),
            ));
        }
        // The hub has no way to call back: ask again shortly.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    let saved = Saved {
        server,
        token: token.value,
        ca_pem,
        client: client_id.to_owned(),
    };
    save(config, &saved)?;
    Ok(format!(
        "Logged in to {} as {} (with {provider}); the token is saved in {}.\n",
        saved.server,
        text(&me["user"]),
        config.display()
    ))
}

fn save(config: &std::path::Path, saved: &Saved) -> Result<(), CliError> {
    if let Some(dir) = config.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Usage(format!("cannot create {}: {e}", dir.display())))?;
    }
    let json = serde_json::to_vec_pretty(saved).unwrap_or_default();
    write_atomic(config, &json, 0o600)
        .map_err(|e| CliError::Usage(format!("cannot write {}: {e}", config.display())))
}

pub(super) fn authority(server: &str) -> Result<String, CliError> {
    let uri: http::Uri = server.parse().map_err(|_| {
        CliError::Usage(format!(
            "--server {server:?} is not a URL; use https://HOST[:PORT]"
        ))
    })?;
    if uri.scheme_str() != Some("https") {
        return Err(CliError::Usage(format!(
            "--server {server:?} must start with https://"
        )));
    }
    uri.authority()
        .map(|a| a.to_string())
        .ok_or_else(|| CliError::Usage(format!("--server {server:?} has no host")))
}

pub(super) struct Client {
    authority: String,
    host: String,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    pub(super) fn new(saved: &Saved) -> Result<Self, CliError> {
        let roots = tunnel::tls::roots_from_pem(saved.ca_pem.as_bytes())
            .map_err(|e| CliError::NotLoggedIn(format!("the saved CA is unusable: {e}")))?;
        Self::with_config(&saved.server, tunnel::tls::client_config(roots))
    }

    pub(super) fn with_config(
        server: &str,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<Self, CliError> {
        let authority = authority(server)?;
        let uri: http::Uri = server
            .parse()
            .map_err(|_| CliError::Usage(format!("bad server URL {server:?}")))?;
        Ok(Self {
            host: uri
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_owned(),
            port: uri.port_u16().unwrap_or(443),
            authority,
            tls,
        })
    }

    pub(super) async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, Bytes), CliError> {
        let unreachable = |e: String| {
            CliError::Unreachable(format!("cannot reach the hub at {}: {e}", self.authority))
        };
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let name = rustls_pki_types::ServerName::try_from(self.host.clone())
            .map_err(|e| unreachable(e.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| unreachable(format!("TLS: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(conn);
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &self.authority);
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let payload = match body {
            Some(v) => {
                request = request.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(v.to_string())
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(payload))
            .map_err(|e| CliError::Usage(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        Ok((status, bytes))
    }
}
