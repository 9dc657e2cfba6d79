//! What moto's EKS does not do, in front of it: a TLS stand-in at its own loopback port that
//! forwards every EKS call to moto untouched (moto checks each signature), and besides
//!
//! - names and counts the calls, as a provider's request log would;
//! - makes the cloud take its time as EKS does: a cluster or node group just made reports
//!   `CREATING` for the next `slow` descriptions of it (moto makes everything `ACTIVE` at
//!   once);
//! - answers the version upgrades moto lacks, itself: `UpdateClusterVersion` (one minor
//!   version up, not while another update runs, else refused as EKS refuses it) and
//!   `UpdateNodegroupVersion` (to the control plane's version only); the thing upgraded reports
//!   `UPDATING` for `slow` descriptions, then the new version. These two calls never reach
//!   moto, so their signatures are not checked;
//! - on request, forwards the next `CreateCluster` to moto and never answers it (a hub killed
//!   while it waits has made the cluster without hearing so);
//! - keeps the order in which upgrades started and ended, for the test to check;
//! - names, on request, a simulated cluster's API server as a cluster's endpoint and CA (moto
//!   gives every cluster the same made-up, unreachable endpoint).

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming};
use serde_json::{Value, json};

use crate::cloud::{Moto, Upstream};

/// Something the cloud is working on, reported for `left` more descriptions.
#[derive(Debug, Clone)]
struct Pending {
    status: &'static str,
    left: usize,
    /// The version it reports once done (an upgrade's).
    version: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    /// Every call by its EKS name, in order.
    calls: Vec<String>,
    /// By `cluster` or `cluster/group`.
    pending: HashMap<String, Pending>,
    /// Versions upgraded to (moto keeps the first).
    versions: HashMap<String, String>,
    /// The versions moto describes clusters at.
    made_at: HashMap<String, String>,
    /// Upgrades as they began and ended: `start cluster/1.32`, `end cluster/1.32`, …
    upgrades: Vec<String>,
    /// How many descriptions a slow step lasts.
    slow: usize,
    stall_next_create: bool,
    /// By cluster: the API server (URL, CA) its description names instead of moto's.
    served: HashMap<String, (String, String)>,
}

/// A handle on the front; it serves until dropped.
#[derive(Debug)]
pub struct EksFront {
    /// Where a hosted cluster's `endpoint` points; moto's CA serves for it too.
    pub endpoint: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EksFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EksFront {
    /// In front of `moto`, with the serving certificate moto's start left in `dir`; each slow
    /// step lasts `slow` descriptions.
    pub async fn start(moto: &Moto, dir: &Path, slow: usize) -> EksFront {
        let state = Arc::new(Mutex::new(State {
            slow,
            ..State::default()
        }));
        let (endpoint, task) = crate::cloud::front(
            moto,
            dir,
            state.clone(),
            |request, upstream, state| async move { answer(request, &upstream, &state).await },
        )
        .await;
        EksFront {
            endpoint,
            state,
            task,
        }
    }

    /// How many calls of `action` (EKS's name, e.g. `CreateCluster`) the front has seen.
    pub fn count(&self, action: &str) -> usize {
        let state = self.state.lock().unwrap();
        state.calls.iter().filter(|a| *a == action).count()
    }

    /// The next `CreateCluster` is made at moto and never answered.
    pub fn stall_next_create(&self) {
        self.state.lock().unwrap().stall_next_create = true;
    }

    /// Cluster `name`'s description names `endpoint` and `ca_pem` (a simulated cluster the
    /// test runs) instead of moto's fixed, unreachable ones.
    pub fn serve_cluster(&self, name: &str, endpoint: &str, ca_pem: &str) {
        self.state
            .lock()
            .unwrap()
            .served
            .insert(name.to_owned(), (endpoint.to_owned(), ca_pem.to_owned()));
    }

    /// Upgrades in the order they began and ended (`start shop/1.32`, `end shop/big/1.32`).
    pub fn upgrades(&self) -> Vec<String> {
        self.state.lock().unwrap().upgrades.clone()
    }
}

/// An EKS error answer, as EKS words them.
fn error(status: u16, code: &str, message: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("x-amzn-ErrorType", code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            json!({"message": message}).to_string(),
        )))
        .unwrap()
}

fn ok(body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// EKS's name for a call, and the cluster / node group it is about.
fn route(method: &str, path: &str) -> (&'static str, String, String) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let s = |i: usize| parts.get(i).copied().unwrap_or_default().to_owned();
    let action = match (method, parts.as_slice()) {
        ("POST", ["clusters"]) => "CreateCluster",
        ("GET", ["clusters"]) => "ListClusters",
        ("GET", ["clusters", _]) => "DescribeCluster",
        ("DELETE", ["clusters", _]) => "DeleteCluster",
        ("POST", ["clusters", _, "updates"]) => "UpdateClusterVersion",
        ("GET", ["clusters", _, "node-groups"]) => "ListNodegroups",
        ("POST", ["clusters", _, "node-groups"]) => "CreateNodegroup",
        ("GET", ["clusters", _, "node-groups", _]) => "DescribeNodegroup",
        ("DELETE", ["clusters", _, "node-groups", _]) => "DeleteNodegroup",
        ("POST", ["clusters", _, "node-groups", _, "update-config"]) => "UpdateNodegroupConfig",
        ("POST", ["clusters", _, "node-groups", _, "update-version"]) => "UpdateNodegroupVersion",
        _ => "Other",
    };
    (action, s(1), s(3))
}

fn minor(version: &str) -> Option<(u32, u32)> {
    let (a, b) = version.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

async fn answer(
    request: Request<Incoming>,
    upstream: &Upstream,
    state: &Mutex<State>,
) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let (action, cluster, group) = route(parts.method.as_str(), parts.uri.path());
    let asked: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let key = if group.is_empty() {
        cluster.clone()
    } else {
        format!("{cluster}/{group}")
    };
    let stall = {
        let mut state = state.lock().unwrap();
        state.calls.push(action.to_owned());
        match action {
            "UpdateClusterVersion" | "UpdateNodegroupVersion" => {
                return upgrade(&mut state, action, &cluster, &key, &asked);
            }
            "CreateCluster" => std::mem::take(&mut state.stall_next_create),
            _ => false,
        }
    };
    let (status, headers, answer) = upstream.send(parts, body).await;
    if stall {
        // Made at moto; the caller never hears so.
        std::future::pending::<()>().await;
    }
    let mut state = state.lock().unwrap();
    let slow = state.slow;
    if status.is_success() {
        match action {
            "CreateCluster" => {
                let name = asked["name"].as_str().unwrap_or_default().to_owned();
                state.pending.insert(
                    name,
                    Pending {
                        status: "CREATING",
                        left: slow,
                        version: None,
                    },
                );
            }
            "CreateNodegroup" => {
                let name = asked["nodegroupName"].as_str().unwrap_or_default();
                state.pending.insert(
                    format!("{cluster}/{name}"),
                    Pending {
                        status: "CREATING",
                        left: slow,
                        version: None,
                    },
                );
            }
            _ => {}
        }
    }
    let mut response = Response::builder().status(status);
    for (name, value) in &headers {
        if name != "content-length" {
            response = response.header(name, value);
        }
    }
    let answer = match (action, status.is_success()) {
        ("DescribeCluster", true) => describe(&mut state, &key, "cluster", answer),
        ("DescribeNodegroup", true) => describe(&mut state, &key, "nodegroup", answer),
        _ => answer,
    };
    response.body(Full::new(answer)).unwrap()
}

/// Moto's description of `key` as the cloud would give it now: still working on it, or at the
/// version it was upgraded to.
fn describe(state: &mut State, key: &str, field: &str, answer: Bytes) -> Bytes {
    let Ok(mut described) = serde_json::from_slice::<Value>(&answer) else {
        return answer;
    };
    if let Some(pending) = state.pending.get_mut(key) {
        described[field]["status"] = json!(pending.status);
        if pending.left > 0 {
            pending.left -= 1;
        } else {
            let done = state.pending.remove(key).unwrap();
            if let Some(version) = done.version {
                state.upgrades.push(format!("end {key}/{version}"));
                state.versions.insert(key.to_owned(), version);
            }
            described[field]["status"] = json!("ACTIVE");
        }
    }
    if field == "cluster"
        && let Some(made_at) = described[field]["version"].as_str()
    {
        state.made_at.insert(key.to_owned(), made_at.to_owned());
    }
    if let Some(version) = state.versions.get(key) {
        described[field]["version"] = json!(version);
    }
    if field == "cluster"
        && let Some((endpoint, ca_pem)) = state.served.get(key)
    {
        use base64::Engine;
        described[field]["endpoint"] = json!(endpoint);
        described[field]["certificateAuthority"]["data"] =
            json!(base64::engine::general_purpose::STANDARD.encode(ca_pem));
    }
    Bytes::from(described.to_string())
}

/// The upgrades moto does not answer.
fn upgrade(
    state: &mut State,
    action: &str,
    cluster: &str,
    key: &str,
    asked: &Value,
) -> Response<Full<Bytes>> {
    let version = asked["version"].as_str().unwrap_or_default().to_owned();
    if state.pending.contains_key(key) {
        return error(
            409,
            "ResourceInUseException",
            &format!("An update is already in progress for {key}"),
        );
    }
    // The control plane's version: upgraded to, else as moto describes it.
    let current = state
        .versions
        .get(cluster)
        .or_else(|| state.made_at.get(cluster))
        .cloned()
        .unwrap_or_default();
    if action == "UpdateClusterVersion" {
        let from = current;
        let one_up = match (minor(&from), minor(&version)) {
            (Some(a), Some(b)) => a.0 == b.0 && b.1 == a.1 + 1,
            _ => false,
        };
        if !one_up {
            return error(
                400,
                "InvalidParameterException",
                &format!("Unsupported Kubernetes minor version update from {from} to {version}"),
            );
        }
    } else {
        let control_plane = current;
        if version != control_plane {
            return error(
                400,
                "InvalidParameterException",
                &format!(
                    "Requested Nodegroup version {version} must match the cluster's {control_plane}"
                ),
            );
        }
    }
    let slow = state.slow;
    state.upgrades.push(format!("start {key}/{version}"));
    state.pending.insert(
        key.to_owned(),
        Pending {
            status: "UPDATING",
            left: slow,
            version: Some(version.clone()),
        },
    );
    ok(
        &json!({"update": {"id": format!("front-{}", state.upgrades.len()), "status": "InProgress",
               "type": "VersionUpdate", "params": [{"type": "Version", "value": version}]}}),
    )
}
