//! The part of EKS that authenticates its API server's callers, for a simulated cluster that
//! plays an EKS cluster: aws-iam-authenticator as the API server's token webhook. It takes
//! `k8s-aws-v1.` tokens (base64url of an STS `GetCallerIdentity` URL presigned with the
//! cluster's name in its signed `x-k8s-aws-id` header) and, where EKS's authenticator would
//! make that call at STS, checks the URL's Signature Version 4 itself with the one access key
//! the test's cloud knows: a token signed with another secret, for another cluster, for
//! another call, or older than 15 minutes authenticates nobody. The key's holder is the
//! cluster's creator, as EKS maps it: `system:masters`.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::Engine;
use bytes::Bytes;
use drivers::aws::Credentials;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// The user name the key's holder gets.
pub const CREATOR: &str = "arn:aws:iam::123456789012:user/drover";

/// A running authenticator; it serves until dropped.
#[derive(Debug)]
pub struct EksAuthenticator {
    pub addr: SocketAddr,
    /// Tokens it was asked about, and whether each authenticated.
    pub reviews: Arc<Mutex<Vec<bool>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EksAuthenticator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EksAuthenticator {
    /// For cluster `cluster` in `region`, trusting `credentials`.
    pub async fn start(cluster: &str, region: &str, credentials: Credentials) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reviews = Arc::new(Mutex::new(Vec::new()));
        let (cluster, region, shared) = (cluster.to_owned(), region.to_owned(), reviews.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (cluster, region, credentials, reviews) = (
                    cluster.clone(),
                    region.clone(),
                    credentials.clone(),
                    shared.clone(),
                );
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let (cluster, region, credentials, reviews) = (
                            cluster.clone(),
                            region.clone(),
                            credentials.clone(),
                            reviews.clone(),
                        );
                        async move {
                            let body = request.into_body().collect().await.unwrap().to_bytes();
                            let review: Value = serde_json::from_slice(&body).unwrap_or_default();
                            let token = review["spec"]["token"].as_str().unwrap_or_default();
                            let verdict = verify(
                                token,
                                &cluster,
                                &region,
                                &credentials,
                                time::OffsetDateTime::now_utc(),
                            );
                            reviews.lock().unwrap().push(verdict.is_ok());
                            let status = match verdict {
                                Ok(()) => json!({"authenticated": true,
                                                 "user": {"username": CREATOR,
                                                          "groups": ["system:masters"]}}),
                                Err(why) => json!({"authenticated": false, "error": why}),
                            };
                            let answer = json!({"apiVersion": review["apiVersion"],
                                                "kind": "TokenReview", "status": status});
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                Bytes::from(answer.to_string()),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        EksAuthenticator {
            addr,
            reviews,
            task,
        }
    }

    /// The webhook's config file (kubeconfig format, as kube-apiserver's
    /// `--authentication-token-webhook-config-file`), written to `path`.
    pub fn config_file(&self, path: &Path) {
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: aws-iam-authenticator\n  cluster:\n    server: http://{}/authenticate\nusers:\n- name: apiserver\ncontexts:\n- name: webhook\n  context:\n    cluster: aws-iam-authenticator\n    user: apiserver\ncurrent-context: webhook\n",
            self.addr
        );
        std::fs::write(path, config).unwrap();
    }
}

/// Whether `token` is a `k8s-aws-v1.` token for `cluster`, signed with `credentials` within
/// the last 15 minutes; else why not.
pub fn verify(
    token: &str,
    cluster: &str,
    region: &str,
    credentials: &Credentials,
    now: time::OffsetDateTime,
) -> Result<(), String> {
    let encoded = token
        .strip_prefix("k8s-aws-v1.")
        .ok_or("not a k8s-aws-v1 token")?;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .map_err(|e| format!("not base64url: {e}"))?;
    let url = String::from_utf8(url).map_err(|_| "not text")?;
    let host = format!("sts.{region}.amazonaws.com");
    let query = url
        .strip_prefix(&format!("https://{host}/?"))
        .ok_or_else(|| format!("not a call at {host}"))?;
    let pairs: Vec<(String, String)> = query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| {
            let decoded = tunnel::percent_decode(v).unwrap_or_else(|| v.to_owned());
            (k.to_owned(), decoded)
        })
        .collect();
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    if get("Action") != "GetCallerIdentity" || get("Version") != "2011-06-15" {
        return Err("not a GetCallerIdentity call".into());
    }
    if !get("X-Amz-SignedHeaders")
        .split(';')
        .any(|h| h == "x-k8s-aws-id")
    {
        return Err("the cluster's name is not signed".into());
    }
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let signed_at = time::PrimitiveDateTime::parse(get("X-Amz-Date"), format)
        .map_err(|e| format!("X-Amz-Date: {e}"))?
        .assume_utc();
    if now - signed_at > Duration::from_secs(15 * 60) || signed_at - now > Duration::from_secs(60) {
        return Err("expired".into());
    }
    let expires: u32 = get("X-Amz-Expires").parse().map_err(|_| "X-Amz-Expires")?;
    // The same call presigned with the key the cloud knows, for this cluster: the same URL
    // only if the token was signed with that key's secret, for this cluster's name.
    let expected = drivers::aws::presigned_get(
        &host,
        "/",
        &[("Action", "GetCallerIdentity"), ("Version", "2011-06-15")],
        &[("x-k8s-aws-id", cluster)],
        region,
        "sts",
        credentials,
        signed_at,
        expires,
    );
    if expected != url {
        return Err("the signature does not match".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_token_for_this_cluster_signed_with_the_key_and_recent_is_taken() {
        let key = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        };
        let other = Credentials {
            secret_access_key: "another".into(),
            ..key.clone()
        };
        let now = time::OffsetDateTime::now_utc();
        let token =
            |c: &Credentials, cluster: &str, at| drivers::eks::token(c, "us-east-1", cluster, at);
        assert_eq!(
            verify(&token(&key, "shop", now), "shop", "us-east-1", &key, now),
            Ok(())
        );
        for (bad, says) in [
            (token(&other, "shop", now), "signature"),
            (token(&key, "other", now), "signature"),
            (
                token(&key, "shop", now - Duration::from_secs(16 * 60)),
                "expired",
            ),
            ("k8s-aws-v1.bm90LWEtdXJs".to_owned(), "not a call"),
            ("sim-admin-token".to_owned(), "not a k8s-aws-v1 token"),
        ] {
            let error = verify(&bad, "shop", "us-east-1", &key, now).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
