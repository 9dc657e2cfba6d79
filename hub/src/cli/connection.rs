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

/// Signs in with a provider whose users sign in at its own page, as a device authorisation:
/// this CLI makes its token (the secret stays here) and asks the hub for a code; a person
/// opens the page the hub names, signs in there, types the code and confirms; meanwhile the
/// CLI asks the hub every few seconds whether that happened. Until it does, the token does
/// not exist.
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
            &format!("/v1/login/{provider}/device"),
            None,
            Some(&body),
        )
        .await?;
    let started: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status != 200 {
        return Err(CliError::Refused(format!(
            "login refused: {}",
            text(&started["message"])
        )));
    }
    let minutes = started["expiresIn"].as_u64().unwrap_or(600) / 60;
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "{notice}To sign in with {provider}, open this page in a browser:\n\n  {}\n\nsign in there and enter this code (waiting up to {minutes} minutes):\n\n  Code: {}\n\nThe page shows this command line as {client_id:?}; confirm only there.\n",
        text(&started["verificationUri"]),
        text(&started["userCode"]),
    );
    let poll = json!({"deviceCode": started["deviceCode"]});
    let every =
        std::time::Duration::from_secs(started["interval"].as_u64().unwrap_or(5).clamp(1, 60));
    let user = loop {
        tokio::time::sleep(every).await;
        let (status, bytes) = client
            .send("POST", "/v1/login/device/token", None, Some(&poll))
            .await?;
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        match (status, answer["error"].as_str()) {
            (200, _) => break text(&answer["user"]),
            (400, Some("authorization_pending" | "slow_down")) => continue,
            (_, Some("access_denied")) => {
                return Err(CliError::Refused(
                    "the sign-in was denied in the browser".into(),
                ));
            }
            (_, Some("expired_token")) => {
                return Err(CliError::Refused(format!(
                    "no confirmation within {minutes} minutes (or the code was used); run the login again"
                )));
            }
            _ => {
                return Err(CliError::Refused(format!(
                    "the hub answered {status}: {}",
                    text(&answer["message"])
                )));
            }
        }
    };
    let saved = Saved {
        server,
        token: token.value,
        ca_pem,
        client: client_id.to_owned(),
    };
    save(config, &saved)?;
    Ok(format!(
        "Logged in to {} as {user} (with {provider}); the token is saved in {}.\n",
        saved.server,
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
