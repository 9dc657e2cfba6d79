//! kube-apiserver's webhook token authenticator (`--authentication-token-webhook-config-file`,
//! `--authentication-token-webhook-cache-ttl`), as far as the authorized endpoint uses it: a
//! bearer token no other authenticator knows is sent, as a `TokenReview`, to the server the
//! config file's current cluster names; the answer (authenticated or not) is kept for the TTL;
//! a webhook that cannot be reached authenticates nobody and is not cached, so the request falls
//! through to the other authenticators (and is refused if none knows the token). As in
//! kube-apiserver, an authenticated user also gets `system:authenticated`.
//!
//! The stand-in speaks plain HTTP to the webhook, which is all the authorized endpoint needs (its
//! authenticator listens on the node's loopback).

use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::Identity;

/// kube-apiserver's default `--authentication-token-webhook-cache-ttl`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(120);

/// A duration as Go's flags take it (`10s`, `2m`, `1h30m`, `500ms`).
pub fn go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (e.g. 10s, 2m, 1h30m)");
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * scale;
        rest = &rest[unit..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// A cached answer: who the token is (`None`: not authenticated), and until when it holds.
type Answer = (Option<Identity>, Instant);

/// The webhook as configured.
#[derive(Debug)]
pub struct TokenWebhook {
    /// `http://HOST:PORT/PATH`.
    url: http::Uri,
    api_version: String,
    ttl: Duration,
    /// Answers by sha256 of the token: who it is (`None`: not authenticated), and until when.
    cache: Mutex<HashMap<[u8; 32], Answer>>,
    /// Reviews sent (cache misses), for tests and benchmarks.
    calls: AtomicU64,
}

impl TokenWebhook {
    /// From the flags' values: the kubeconfig-format file, the version (`v1` or `v1beta1`) and
    /// the TTL.
    pub fn from_config_file(path: &Path, version: &str, ttl: Duration) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: Value =
            serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let current = config["current-context"].as_str().unwrap_or_default();
        let contexts = config["contexts"].as_array().cloned().unwrap_or_default();
        let context = contexts
            .iter()
            .find(|c| c["name"] == current)
            .or(contexts.first())
            .ok_or_else(|| format!("{}: no context", path.display()))?;
        let cluster = config["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == context["context"]["cluster"])
            .ok_or_else(|| format!("{}: the context's cluster is missing", path.display()))?;
        let server = cluster["cluster"]["server"].as_str().unwrap_or_default();
        let url: http::Uri = server
            .parse()
            .map_err(|_| format!("{}: server {server:?} is not a URL", path.display()))?;
        if url.scheme_str() != Some("http") || url.host().is_none() {
            return Err(format!(
                "{}: server {server:?}: the stand-in's webhook client speaks plain HTTP (http://HOST:PORT/PATH)",
                path.display()
            ));
        }
        let api_version = match version {
            "v1" | "" => "authentication.k8s.io/v1",
            "v1beta1" => "authentication.k8s.io/v1beta1",
            other => {
                return Err(format!(
                    "authentication-token-webhook-version={other:?}: v1 or v1beta1"
                ));
            }
        };
        Ok(TokenWebhook {
            url,
            api_version: api_version.to_owned(),
            ttl,
            cache: Mutex::default(),
            calls: AtomicU64::new(0),
        })
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Who `token` is, by the webhook (or its cached answer).
    pub async fn authenticate(&self, token: &str) -> Option<Identity> {
        let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .ok()?;
        let now = Instant::now();
        {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((answer, until)) = cache.get(&key) {
                if *until > now {
                    return answer.clone();
                }
                cache.remove(&key);
            }
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        match self.review(token).await {
            Ok(answer) => {
                let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                // Expired entries go as new ones come, so the cache stays as large as the
                // tokens seen within one TTL.
                if cache.len() > 10_000 {
                    cache.retain(|_, (_, until)| *until > now);
                }
                cache.insert(key, (answer.clone(), now + self.ttl));
                answer
            }
            Err(e) => {
                tracing::warn!(webhook = %self.url, error = %e, "the token webhook did not answer");
                None
            }
        }
    }

    async fn review(&self, token: &str) -> Result<Option<Identity>, String> {
        let host = self.url.host().unwrap_or_default().trim_matches(['[', ']']);
        let port = self.url.port_u16().unwrap_or(80);
        let body = json!({
            "apiVersion": self.api_version, "kind": "TokenReview",
            "metadata": {"creationTimestamp": null},
            "spec": {"token": token}, "status": {"user": {}},
        });
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect((host, port))
                .await
                .map_err(|e| format!("{host}:{port}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            let request = http::Request::post(self.url.path())
                .header(http::header::HOST, format!("{host}:{port}"))
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json")
                .body(Full::new(Bytes::from(body.to_string())))
                .map_err(|e| e.to_string())?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            let code = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if !code.is_success() {
                return Err(format!("HTTP {code}"));
            }
            serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string())
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .map_err(|_| "timed out".to_owned())??;
        let status = &answer["status"];
        if status["authenticated"] != true {
            return Ok(None);
        }
        let Some(user) = status
            .pointer("/user/username")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
        else {
            return Ok(None);
        };
        let mut groups: Vec<String> = status
            .pointer("/user/groups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_owned))
            .collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        Ok(Some(Identity {
            user: user.to_owned(),
            groups,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_writes_them() {
        assert_eq!(go_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(go_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(go_duration("0"), Ok(Duration::ZERO));
        assert!(go_duration("10").is_err());
        assert!(go_duration("ten seconds").is_err());
    }
}
