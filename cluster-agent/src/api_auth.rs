//! `drover-kube-api-auth`: the authorized cluster endpoint's token authenticator.
//!
//! It runs on every control-plane node (a DaemonSet the cluster-agent keeps while the hub says
//! the endpoint is on; host network) and answers the node's API server, whose token webhook
//! the planner points at `http://127.0.0.1:6440/v1/authenticate`, with `TokenReview`s for hub
//! tokens. It reads only the cluster: the token copies the cluster-agent keeps in its namespace
//! (a watch-driven cache, so a review costs no request), each with the token's sha256 (never
//! the token), who it acts as and when it expires. So it answers with the hub unreachable,
//! and a token the hub revokes stops working once the cluster-agent has removed its copy.
//! Tokens it does not know, expired ones and any of another cluster are refused.
//!
//! It listens on loopback only and speaks plain HTTP there, as Rancher's `kube-api-auth`
//! does: the API server and it share the node, nothing else reaches the port.

use std::{collections::HashMap, convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::{
    ConfigError, KubeTarget,
    access::{
        SYNC_LABEL,
        endpoint::{LISTEN, TOKEN_PREFIX, TOKEN_TYPE, TOKENS},
    },
};

/// `drover-kube-api-auth --help`.
pub const HELP: &str = "\
Drover's token authenticator for the authorized cluster endpoint: runs on the control-plane
nodes (a DaemonSet the cluster-agent creates when the endpoint is on) and answers the node's
API server's token webhook from the hashed token copies the cluster-agent keeps in the cluster.

Configured from the environment (the DaemonSet sets them):
  DROVER_NAMESPACE  where the token copies are (the cluster-agent's namespace)
  DROVER_LISTEN     the loopback address to answer on (default 127.0.0.1:6440)
  KUBECONFIG        outside a pod: a kubeconfig with a token for the cluster
";

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub namespace: String,
    pub kube: KubeTarget,
}

impl Config {
    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let listen = env.get("DROVER_LISTEN").map_or(LISTEN, String::as_str);
        let listen: SocketAddr = listen.parse().map_err(|_| {
            ConfigError(format!(
                "DROVER_LISTEN={listen:?}: give a loopback address and port, e.g. {LISTEN}"
            ))
        })?;
        // Anything else would offer the review of bearer tokens to the network.
        if !listen.ip().is_loopback() {
            return Err(ConfigError(format!(
                "DROVER_LISTEN={listen}: the authenticator answers on loopback only (the API server on the same node asks it)"
            )));
        }
        let (kube, _) = crate::kube_target(env)?;
        let namespace = env
            .get("DROVER_NAMESPACE")
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| {
                ConfigError(
                    "DROVER_NAMESPACE is required (the cluster-agent's namespace, where the token copies are)"
                        .into(),
                )
            })?;
        Ok(Config {
            listen,
            namespace,
            kube,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{0}")]
    Kube(String),
    #[error("listening on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

/// A token copy as the cluster-agent wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenCopy {
    pub hash: String,
    pub user: String,
    pub groups: Vec<String>,
    pub expires_at: Option<OffsetDateTime>,
}

impl TokenCopy {
    /// The copy in `secret`, if it is one (its type) and whole.
    pub fn of(secret: &Secret) -> Option<TokenCopy> {
        if secret.type_.as_deref() != Some(TOKEN_TYPE) {
            return None;
        }
        let data = secret.data.as_ref()?;
        let text = |key: &str| {
            data.get(key)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        let expires_at = match text("expiresAt").filter(|t| !t.is_empty()) {
            None => None,
            // An expiry that does not parse is no licence to last forever.
            Some(t) => Some(
                OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339).ok()?,
            ),
        };
        Some(TokenCopy {
            hash: text("hash").filter(|h| h.len() == 64)?,
            user: text("user").filter(|u| !u.is_empty())?,
            groups: serde_json::from_str(&text("groups")?).ok()?,
            expires_at,
        })
    }
}

/// Equal bytes, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Answers one `TokenReview` (the request's body): the status code and the review to send
/// back. `copy` finds a token copy by the hub Token's name.
pub fn review(
    body: &[u8],
    copy: impl Fn(&str) -> Option<TokenCopy>,
    now: OffsetDateTime,
) -> (StatusCode, Value) {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return (
            StatusCode::BAD_REQUEST,
            json!({"message": "the body is not JSON: send a TokenReview"}),
        );
    };
    let api_version = match request["apiVersion"].as_str() {
        Some(v @ ("authentication.k8s.io/v1" | "authentication.k8s.io/v1beta1")) => v,
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                json!({"message": "apiVersion: authentication.k8s.io/v1 or v1beta1 TokenReview expected"}),
            );
        }
    };
    let Some(token) = request
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .filter(|_| request["kind"] == "TokenReview")
    else {
        return (
            StatusCode::BAD_REQUEST,
            json!({"message": "a TokenReview with spec.token expected"}),
        );
    };
    let refused = |why: &str| {
        json!({"apiVersion": api_version, "kind": "TokenReview",
               "status": {"authenticated": false, "error": why}})
    };
    // `drt_<name>.<secret>`, as the hub issues them.
    let Some((name, secret)) = token
        .strip_prefix("drt_")
        .and_then(|rest| rest.split_once('.'))
        .filter(|(name, secret)| {
            !secret.is_empty()
                && !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
    else {
        return (StatusCode::OK, refused("not a Drover token"));
    };
    let Some(copy) = copy(name) else {
        return (
            StatusCode::OK,
            refused("unknown token: revoked, expired or not for this cluster"),
        );
    };
    if !same(proto::token_hash(secret).as_bytes(), copy.hash.as_bytes()) {
        return (
            StatusCode::OK,
            refused("unknown token: revoked, expired or not for this cluster"),
        );
    }
    if copy.expires_at.is_some_and(|at| at <= now) {
        return (StatusCode::OK, refused("the token has expired"));
    }
    (
        StatusCode::OK,
        json!({"apiVersion": api_version, "kind": "TokenReview",
               "status": {"authenticated": true,
                          "user": {"username": copy.user, "groups": copy.groups}}}),
    )
}

type Copies = reflector::Store<Secret>;

/// Serves reviews until `shutdown`; starts answering once the token copies are read.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), AuthError> {
    let client = crate::kube_client(&config.kube).map_err(AuthError::Kube)?;
    let api = kube::Api::<Secret>::namespaced(client, &config.namespace);
    let (copies, writer) = reflector::store();
    let selector = format!("{SYNC_LABEL}={TOKENS}");
    let mut watch = Box::pin(
        reflector(
            writer,
            watcher(api, watcher::Config::default().labels(&selector)),
        )
        .default_backoff(),
    );
    let watching = tokio::spawn(async move {
        while let Some(event) = watch.next().await {
            if let Err(e) = event {
                tracing::warn!(error = %e, "watching the token copies; retrying");
            }
        }
    });
    tokio::select! {
        () = shutdown.cancelled() => { watching.abort(); return Ok(()); }
        ready = copies.wait_until_ready() => {
            if let Err(e) = ready {
                watching.abort();
                return Err(AuthError::Kube(format!("reading the token copies: {e}")));
            }
        }
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| AuthError::Listen(config.listen, e))?;
    tracing::info!(listen = %config.listen, namespace = %config.namespace, tokens = copies.state().len(), "answering token reviews");
    let namespace: Arc<str> = config.namespace.into();
    loop {
        let (stream, _) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (copies, namespace) = (copies.clone(), namespace.clone());
        let service = hyper::service::service_fn(move |request| {
            answer(request, copies.clone(), namespace.clone())
        });
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = &mut connection => {}
                () = stop.cancelled() => connection.as_mut().graceful_shutdown(),
            }
        });
    }
    watching.abort();
    Ok(())
}

/// The largest review taken: a token and its envelope are a few KiB.
const MAX_BODY: usize = 64 * 1024;

async fn answer(
    request: Request<Incoming>,
    copies: Copies,
    namespace: Arc<str>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let respond = |code: StatusCode, body: Value| {
        let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
        *response.status_mut() = code;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok(response)
    };
    if request.method() != http::Method::POST {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"message": "POST a TokenReview"}),
        );
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return respond(
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"message": "a TokenReview is at most 64 KiB"}),
            );
        }
    };
    let lookup = |name: &str| {
        let key = reflector::ObjectRef::new(&format!("{TOKEN_PREFIX}{name}")).within(&namespace);
        copies.get(&key).as_deref().and_then(TokenCopy::of)
    };
    let (code, review) = review(&body, lookup, OffsetDateTime::now_utc());
    respond(code, review)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(kind: &str, data: &[(&str, &str)]) -> Secret {
        Secret {
            type_: Some(kind.to_owned()),
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    fn request(token: &str) -> Vec<u8> {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
            .to_string()
            .into_bytes()
    }

    /// sha256("s3cret"), computed by `printf s3cret | sha256sum`.
    const HASH: &str = "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0";

    #[test]
    fn a_known_unexpired_token_is_its_user_with_its_groups_and_nothing_else_is() {
        let now = OffsetDateTime::now_utc();
        let later = (now + time::Duration::hours(1))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let earlier = (now - time::Duration::seconds(1))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let copies: HashMap<&str, Secret> = [
            (
                "tgood",
                secret(
                    TOKEN_TYPE,
                    &[
                        ("hash", HASH),
                        ("user", "ann"),
                        ("groups", r#"["drover:authenticated","ldap:ops"]"#),
                        ("expiresAt", &later),
                    ],
                ),
            ),
            (
                "told",
                secret(
                    TOKEN_TYPE,
                    &[
                        ("hash", HASH),
                        ("user", "ann"),
                        ("groups", "[]"),
                        ("expiresAt", &earlier),
                    ],
                ),
            ),
            (
                "tforever",
                secret(
                    TOKEN_TYPE,
                    &[
                        ("hash", HASH),
                        ("user", "bob"),
                        ("groups", "[]"),
                        ("expiresAt", ""),
                    ],
                ),
            ),
            // Someone else's Secret under the name: not a copy.
            (
                "tother",
                secret(
                    "Opaque",
                    &[("hash", HASH), ("user", "root"), ("groups", "[]")],
                ),
            ),
        ]
        .into();
        let lookup = |name: &str| copies.get(name).and_then(TokenCopy::of);
        let (code, ok) = review(&request("drt_tgood.s3cret"), lookup, now);
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            ok["status"],
            json!({"authenticated": true, "user": {"username": "ann", "groups": ["drover:authenticated", "ldap:ops"]}})
        );
        assert_eq!(ok["apiVersion"], "authentication.k8s.io/v1");
        let (_, forever) = review(&request("drt_tforever.s3cret"), lookup, now);
        assert_eq!(forever["status"]["user"]["username"], "bob");
        for token in [
            "drt_tgood.wrong",
            "drt_told.s3cret",
            "drt_tmissing.s3cret",
            "drt_tother.s3cret",
            "drr_tgood.s3cret",
            "drt_tgood",
            "drt_.s3cret",
            "drt_../x.s3cret",
            "sa.abc",
        ] {
            let (code, refused) = review(&request(token), lookup, now);
            assert_eq!(code, StatusCode::OK, "{token}");
            assert_eq!(refused["status"]["authenticated"], false, "{token}");
            assert!(refused["status"].get("user").is_none(), "{token}");
        }
        let (_, expired) = review(&request("drt_told.s3cret"), lookup, now);
        assert_eq!(expired["status"]["error"], "the token has expired");
        // Not a review at all.
        let (code, _) = review(b"{}", lookup, now);
        assert_eq!(code, StatusCode::BAD_REQUEST);
        let (code, _) = review(b"token", lookup, now);
        assert_eq!(code, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn the_hash_is_the_hubs_sha256_hex() {
        assert_eq!(proto::token_hash("s3cret"), HASH);
    }
}
