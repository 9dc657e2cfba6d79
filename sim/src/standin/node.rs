//! The installed node's service (`drover-sim serve-node`), as the installer's systemd unit
//! would run it: the health endpoints, the node's Node object, and on the first server the
//! simulated API server, the admin kubeconfig, the node token and the auto-deploy manifests.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{
    Distribution, Installed, NodeConfig, day2, read_installed, save, stop_pid_file,
    write_client_cert, write_private,
};
use crate::cluster::{Identity, Serving, SimCluster, SimConfig, resources::by_kind};

/// `drover-sim serve-node <dist>`: the installed node's service, until `shutdown`.
pub async fn serve_node(dist: Distribution, shutdown: CancellationToken) -> Result<(), String> {
    let installed = read_installed(dist)?;
    let config = NodeConfig::read(dist)?;
    let node = config.node_name();
    let mut tasks = tokio::task::JoinSet::new();
    let loopback = super::loopback();
    tasks.spawn(serve_health(
        (loopback, 10248).into(),
        "/healthz",
        "ok",
        shutdown.clone(),
    ));
    let etcd = installed.server && !config.disable_etcd;
    let mut cluster = None;
    if installed.server {
        // As K3s: the CA is made once and kept; the serving certificate names the node's
        // addresses and `tls-san`, so clients that reach the node directly can verify it.
        let tls = dist.data_dir().join("server/tls");
        let ca = kept_ca(&tls)?;
        let mut names: Vec<String> = [&config.node_ip, &config.node_external_ip]
            .into_iter()
            .flatten()
            .cloned()
            .chain(config.tls_san.iter().cloned())
            .collect();
        names.push(node.clone());
        let webhook = if config.disable_apiserver {
            None
        } else {
            config.token_webhook()?
        };
        let sim = SimCluster::start_with(
            SimConfig {
                // Every address, as K3s; a host sharing its machine only its own.
                listen: if loopback == std::net::Ipv4Addr::LOCALHOST {
                    ([0, 0, 0, 0], 6443).into()
                } else {
                    (loopback, 6443).into()
                },
                nodes: 0,
                pods: 0,
                version: Some(installed.version.clone()),
            },
            Serving {
                ca: Some(ca),
                names,
                webhook,
            },
            shutdown.clone(),
        )
        .await
        .map_err(|e| format!("serving the API on :6443: {e}"))?;
        // The cluster's objects survive a restart (an upgrade), as in K3s's datastore.
        let db = dist.data_dir().join("server/db.json");
        if let Ok(bytes) = std::fs::read(&db)
            && let Ok(state) = serde_json::from_slice::<Value>(&bytes)
        {
            sim.import_state(&state);
        }
        let token = server_token(dist, &config)?;
        sim.add_token(
            &token,
            Identity {
                user: "system:node".into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
            },
        );
        write_private(
            &dist.kubeconfig_path(),
            &sim.kubeconfig(crate::cluster::ADMIN_TOKEN),
        )?;
        write_private(
            &dist.node_token_path(),
            &format!("K10{}::server:{token}\n", short_hash(sim.ca_pem())),
        )?;
        // What the probes of the real thing name: the server CA and a client certificate.
        write_private(&tls.join("server-ca.crt"), sim.ca_pem())?;
        write_client_cert(dist, false)?;
        cluster = Some(sim);
    }
    if etcd {
        // etcd's health, and (the stand-in's etcd being the API server's store) its data for
        // `etcd-snapshot save`; both on loopback only.
        let state = cluster.as_ref().map(SimCluster::state_reader);
        tasks.spawn(serve_etcd(state, shutdown.clone()));
    }
    // Where this node's Node object lives: the first server's API.
    let (api, token) = match (&config.server, &cluster) {
        (Some(server), _) => {
            let token = config.token.clone().unwrap_or_default();
            let token = token
                .rsplit("::server:")
                .next()
                .unwrap_or_default()
                .to_owned();
            (api_url(server), token)
        }
        (None, Some(sim)) => (sim.url(), crate::cluster::ADMIN_TOKEN.to_owned()),
        (None, None) => return Err("an agent needs `server` in its config.yaml".into()),
    };
    let object = node_object(&node, &config, &installed, dist);
    if cluster.is_some() && config.server.is_none() {
        tasks.spawn(run_daemon_pods(
            dist,
            (api.clone(), token.clone()),
            node.clone(),
            object["metadata"]["labels"].clone(),
            shutdown.clone(),
        ));
    }
    tasks.spawn(keep_node(
        api.clone(),
        token.clone(),
        object,
        shutdown.clone(),
    ));
    if cluster.is_some() && config.server.is_none() {
        tasks.spawn(auto_deploy(
            dist,
            api,
            token,
            node.clone(),
            shutdown.clone(),
        ));
    }
    tracing::info!(dist = dist.name(), version = %installed.version, %node, server = installed.server, "stand-in node service up");
    // Saved every few seconds and at the end.
    let db = dist.data_dir().join("server/db.json");
    loop {
        if let Some(sim) = &cluster {
            save(&db, &sim.export_state());
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
    tasks.shutdown().await;
    if let Some(sim) = cluster {
        save(&db, &sim.export_state());
        sim.wait().await;
    }
    Ok(())
}

/// The first server's join token: from the config, else made once and kept (a restarted server
/// must keep the token its joiners hold).
fn server_token(dist: Distribution, config: &NodeConfig) -> Result<String, String> {
    if let Some(token) = &config.token {
        return Ok(token.rsplit("::server:").next().unwrap_or(token).to_owned());
    }
    let kept = dist.data_dir().join("server/token");
    if let Ok(token) = std::fs::read_to_string(&kept)
        && !token.trim().is_empty()
    {
        return Ok(token.trim().to_owned());
    }
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no randomness for the token".to_owned())?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&kept, &token)?;
    Ok(token)
}

/// The server's CA, made at its first start and kept in `tls` (`server-ca.crt`, `.key`).
fn kept_ca(tls: &std::path::Path) -> Result<tunnel::tls::CertificateAuthority, String> {
    let (cert, key) = (tls.join("server-ca.crt"), tls.join("server-ca.key"));
    if let (Ok(cert_pem), Ok(key_pem)) = (
        std::fs::read_to_string(&cert),
        std::fs::read_to_string(&key),
    ) {
        return tunnel::tls::CertificateAuthority::from_pem(&cert_pem, &key_pem)
            .map_err(|e| format!("{}: {e}", cert.display()));
    }
    let ca = tunnel::tls::CertificateAuthority::generate("drover-sim cluster CA")
        .map_err(|e| e.to_string())?;
    write_private(&key, &ca.pem().key_pem)?;
    write_private(&cert, &ca.pem().cert_pem)?;
    Ok(ca)
}

fn short_hash(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// K3s joins at `https://SERVER:6443`, RKE2 at its supervisor port `:9345`; the stand-in keeps
/// everything on the API server's port.
fn api_url(server: &str) -> String {
    let rest = server.trim_end_matches('/');
    match rest.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) && host.contains("//") => {
            format!("{host}:6443")
        }
        _ => format!("{rest}:6443"),
    }
}

/// A plain-HTTP health endpoint, as the kubelet and etcd serve on loopback.
async fn serve_health(
    addr: SocketAddr,
    path: &'static str,
    body: &'static str,
    shutdown: CancellationToken,
) {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot serve health");
            return;
        }
    };
    let app = axum::Router::new().route(path, axum::routing::get(move || async move { body }));
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
}

/// etcd's loopback health endpoint and the datastore `etcd-snapshot save` reads.
async fn serve_etcd(
    state: Option<std::sync::Arc<dyn Fn() -> Value + Send + Sync>>,
    shutdown: CancellationToken,
) {
    let addr: SocketAddr = (super::loopback(), 2381).into();
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot serve etcd's health");
            return;
        }
    };
    let mut app = axum::Router::new().route(
        "/health",
        axum::routing::get(|| async { r#"{"health":"true","reason":""}"# }),
    );
    if let Some(state) = state {
        app = app.route(
            day2::STATE_PATH,
            axum::routing::get(move || {
                let state = state.clone();
                async move { state().to_string() }
            }),
        );
    }
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
}

/// The Node this node keeps in the cluster, as a kubelet registers it.
fn node_object(
    name: &str,
    config: &NodeConfig,
    installed: &Installed,
    dist: Distribution,
) -> Value {
    let mut labels = json!({
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": dist.name(),
    });
    if installed.server && !config.disable_apiserver {
        labels["node-role.kubernetes.io/control-plane"] = json!("true");
    }
    if installed.server && !config.disable_etcd {
        labels["node-role.kubernetes.io/etcd"] = json!("true");
    }
    for label in &config.node_label {
        if let Some((k, v)) = label.split_once('=') {
            labels[k] = json!(v);
        }
    }
    let taints: Vec<Value> = config
        .node_taint
        .iter()
        .filter_map(|t| {
            let (kv, effect) = t.split_once(':')?;
            let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
            Some(json!({"key": key, "value": value, "effect": effect}))
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": config.node_ip.clone().unwrap_or_default()}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": installed.version, "osImage": format!("drover-sim stand-in {}", dist.name()), "architecture": "amd64", "operatingSystem": "linux"},
        },
    })
}

/// Keeps the Node registered and reporting its version, as a kubelet does.
async fn keep_node(api: String, token: String, node: Value, shutdown: CancellationToken) {
    let name = node["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let path = format!("/api/v1/nodes/{name}");
    loop {
        match call(&api, &token, "GET", &path, None).await {
            Ok((404, _)) => {
                if let Err(e) = call(&api, &token, "POST", "/api/v1/nodes", Some(&node)).await {
                    tracing::warn!(error = %e, "cannot register the node");
                }
            }
            Ok((200, current))
                if current.pointer("/status/nodeInfo/kubeletVersion")
                    != node.pointer("/status/nodeInfo/kubeletVersion") =>
            {
                // Upgraded: the kubelet reports its new version; the rest (a cordon) stays.
                let mut updated = current.clone();
                updated["status"]["nodeInfo"]["kubeletVersion"] =
                    node["status"]["nodeInfo"]["kubeletVersion"].clone();
                if let Err(e) = call(&api, &token, "PUT", &path, Some(&updated)).await {
                    tracing::warn!(error = %e, "cannot update the node");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "the API server is not reachable yet"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// One request to a (simulated) API server, trusting any certificate (as a joining node trusts
/// the server named by its token).
async fn call(
    base: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let authority = base
        .strip_prefix("https://")
        .ok_or_else(|| format!("{base}: not https"))?
        .trim_end_matches('/')
        .to_owned();
    let host = authority
        .rsplit_once(':')
        .map_or(authority.as_str(), |(h, _)| h)
        .trim_matches(['[', ']'])
        .to_owned();
    let tcp = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(&authority),
    )
    .await
    .map_err(|_| format!("{authority}: timed out"))?
    .map_err(|e| format!("{authority}: {e}"))?;
    let name = server_name(&host)?;
    let tls = tokio_rustls::TlsConnector::from(tunnel::tls::unverified_client_config())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("{authority}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, authority.as_str())
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    let bytes = match body {
        Some(v) => {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    let response = sender
        .send_request(request.body(Full::new(bytes)).map_err(|e| e.to_string())?)
        .await
        .map_err(|e| e.to_string())?;
    let code = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((code, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

fn server_name(host: &str) -> Result<tokio_rustls::rustls::pki_types::ServerName<'static>, String> {
    tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host}: {e}"))
}

/// The auto-deploy manifests directory: every `*.yaml` in it is applied when it appears or
/// changes; the `drover-cluster-agent` Deployment is also run, as a process.
async fn auto_deploy(
    dist: Distribution,
    api: String,
    token: String,
    node: String,
    shutdown: CancellationToken,
) {
    let dir = dist.manifests_dir();
    let mut seen = std::collections::HashMap::<PathBuf, String>::new();
    let mut agent: Option<tokio::process::Child> = None;
    loop {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        for file in files {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            let sum = short_hash(&text);
            if seen.get(&file) == Some(&sum) {
                continue;
            }
            match apply_manifest(&api, &token, &text).await {
                Ok(objects) => {
                    tracing::info!(file = %file.display(), objects = objects.len(), "applied a manifest");
                    seen.insert(file.clone(), sum);
                    if let Some(deployment) = objects.iter().find(|o| {
                        o["kind"] == "Deployment" && o["metadata"]["name"] == "drover-cluster-agent"
                    }) {
                        if let Some(mut old) = agent.take() {
                            let _ = old.kill().await;
                        }
                        agent =
                            run_cluster_agent(dist, deployment, &objects, &node, (&api, &token))
                                .await;
                    }
                }
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "cannot apply a manifest yet")
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
    if let Some(mut agent) = agent {
        let _ = agent.kill().await;
    }
}

/// Creates (or replaces) every object of a multi-document manifest; returns them.
async fn apply_manifest(api: &str, token: &str, text: &str) -> Result<Vec<Value>, String> {
    let objects: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    let objects: Vec<Value> = objects.into_iter().filter(|o| o.is_object()).collect();
    for object in &objects {
        let (api_version, kind) = (
            object["apiVersion"].as_str().unwrap_or_default(),
            object["kind"].as_str().unwrap_or_default(),
        );
        let resource = by_kind(api_version, kind)
            .ok_or_else(|| format!("{api_version} {kind} is not served"))?;
        let prefix = if resource.group.is_empty() {
            "/api/v1".to_owned()
        } else {
            format!("/apis/{}", resource.api_version())
        };
        let collection = match object["metadata"]["namespace"].as_str() {
            Some(ns) if resource.namespaced => {
                format!("{prefix}/namespaces/{ns}/{}", resource.plural)
            }
            _ => format!("{prefix}/{}", resource.plural),
        };
        let (code, answer) = call(api, token, "POST", &collection, Some(object)).await?;
        match code {
            200..=299 => {}
            409 => {
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                let item = format!("{collection}/{name}");
                let (_, current) = call(api, token, "GET", &item, None).await?;
                let mut replacement = object.clone();
                replacement["metadata"]["resourceVersion"] =
                    current["metadata"]["resourceVersion"].clone();
                call(api, token, "PUT", &item, Some(&replacement)).await?;
            }
            _ => {
                return Err(format!(
                    "{kind} {}: HTTP {code}: {}",
                    object["metadata"]["name"], answer["message"]
                ));
            }
        }
    }
    Ok(objects)
}

/// Runs a Deployment's first container as a process, with its environment resolved as the
/// kubelet would (values, Secret keys from the same manifest, the pod's own fields).
async fn run_cluster_agent(
    dist: Distribution,
    deployment: &Value,
    objects: &[Value],
    node: &str,
    api: (&str, &str),
) -> Option<tokio::process::Child> {
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let secret_value = |secret: &str, key: &str| -> Option<String> {
        let s = objects.iter().find(|o| {
            o["kind"] == "Secret"
                && o["metadata"]["name"] == secret
                && o["metadata"]["namespace"].as_str().unwrap_or("default") == namespace
        })?;
        if let Some(v) = s["stringData"][key].as_str() {
            return Some(v.to_owned());
        }
        use base64::Engine as _;
        let data = s["data"][key].as_str()?;
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .ok()?,
        )
        .ok()
    };
    run_pod(dist, deployment, &secret_value, node, api).await
}

/// The pod of a workload (`owner`: a Deployment or DaemonSet) as a process: its first
/// container's binary (the command, else `drover-<image name>`) from beside this one, with
/// its environment resolved as the kubelet would (values, `secret(name, key)`, the pod's own
/// fields) and its service account's token (TokenRequest), so what it may do in the cluster
/// is what the cluster's RBAC grants that account.
async fn run_pod(
    dist: Distribution,
    owner: &Value,
    secret: &(dyn Fn(&str, &str) -> Option<String> + Sync),
    node: &str,
    (api, node_token): (&str, &str),
) -> Option<tokio::process::Child> {
    let namespace = owner["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = owner["metadata"]["name"].as_str().unwrap_or_default();
    let pod = format!("{name}-standin");
    let container = owner.pointer("/spec/template/spec/containers/0")?;
    let state = dist.data_dir().join("pods").join(name);
    let _ = std::fs::create_dir_all(&state);
    let account = owner
        .pointer("/spec/template/spec/serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let request = serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}});
    let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token");
    let issued = match call(api, node_token, "POST", &path, Some(&request)).await {
        Ok((201, answer)) => answer
            .pointer("/status/token")
            .and_then(Value::as_str)
            .map(str::to_owned),
        Ok((code, answer)) => {
            tracing::warn!(code, pod, message = %answer["message"], "no token for the pod's service account");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, pod, "no token for the pod's service account");
            None
        }
    }?;
    let mut kubeconfig: Value = std::fs::read_to_string(dist.kubeconfig_path())
        .ok()
        .and_then(|text| serde_saphyr::from_str(&text).ok())?;
    kubeconfig["users"][0]["user"] = serde_json::json!({"token": issued});
    let pod_kubeconfig = state.join("kubeconfig");
    write_private(&pod_kubeconfig, &kubeconfig.to_string()).ok()?;
    let binary = container
        .pointer("/command/0")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| {
            // `registry/drover/cluster-agent:1.2` → `drover-cluster-agent`.
            let image = container["image"].as_str()?;
            let repository = image.rsplit('/').next()?.split([':', '@']).next()?;
            Some(format!("drover-{repository}"))
        })?;
    let exe = std::env::current_exe().ok()?.parent()?.join(binary);
    let mut command = tokio::process::Command::new(&exe);
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", &pod_kubeconfig)
        .env("DROVER_STATE_DIR", &state)
        .env("DROVER_NAMESPACE", namespace)
        .env("DROVER_LOG", "info");
    for entry in container["env"].as_array().into_iter().flatten() {
        let key = entry["name"].as_str().unwrap_or_default();
        let value = if let Some(v) = entry["value"].as_str() {
            Some(v.to_owned())
        } else if let Some(r) = entry.pointer("/valueFrom/secretKeyRef") {
            secret(
                r["name"].as_str().unwrap_or_default(),
                r["key"].as_str().unwrap_or_default(),
            )
        } else {
            match entry
                .pointer("/valueFrom/fieldRef/fieldPath")
                .and_then(Value::as_str)
            {
                Some("metadata.name") => Some(pod.clone()),
                Some("metadata.namespace") => Some(namespace.to_owned()),
                Some("spec.nodeName") => Some(node.to_owned()),
                _ => None,
            }
        };
        if let Some(value) = value {
            command.env(key, value);
        }
    }
    let log = std::fs::File::create(state.join("container.log")).ok()?;
    command
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().ok()?)
        .stderr(log)
        .kill_on_drop(true);
    let pid_file = dist.data_dir().join("pods").join(format!("{name}.pid"));
    stop_pid_file(&pid_file);
    match command.spawn() {
        Ok(child) => {
            if let Some(pid) = child.id() {
                let _ = std::fs::write(&pid_file, pid.to_string());
            }
            tracing::info!(pod = %pod, exe = %exe.display(), "running a pod");
            Some(child)
        }
        Err(e) => {
            tracing::error!(exe = %exe.display(), error = %e, "cannot run a pod");
            None
        }
    }
}

/// The DaemonSets the stand-in runs as processes on its first server, when their node
/// selector picks this node: the authorized endpoint's authenticator (the agents' other
/// DaemonSet, the node-agent, is not run by the stand-in). Started when the DaemonSet appears
/// or its pod template changes, stopped when it goes.
const DAEMON_PODS: [&str; 1] = ["drover-kube-api-auth"];

async fn run_daemon_pods(
    dist: Distribution,
    (api, token): (String, String),
    node: String,
    labels: Value,
    shutdown: CancellationToken,
) {
    let mut running: std::collections::HashMap<String, (String, tokio::process::Child)> =
        std::collections::HashMap::new();
    let no_secrets = |_: &str, _: &str| None;
    loop {
        match call(&api, &token, "GET", "/apis/apps/v1/daemonsets", None).await {
            Ok((200, list)) => {
                let wanted: Vec<&Value> = list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|d| {
                        DAEMON_PODS.contains(&d["metadata"]["name"].as_str().unwrap_or_default())
                    })
                    .filter(|d| {
                        d.pointer("/spec/template/spec/nodeSelector")
                            .and_then(Value::as_object)
                            .is_none_or(|s| s.iter().all(|(k, v)| &labels[k] == v))
                    })
                    .collect();
                running.retain(|name, _| {
                    wanted
                        .iter()
                        .any(|d| d["metadata"]["name"] == name.as_str())
                });
                for daemon_set in wanted {
                    let name = daemon_set["metadata"]["name"].as_str().unwrap_or_default();
                    let template = daemon_set["spec"]["template"].to_string();
                    if running.get(name).is_some_and(|(t, _)| *t == template) {
                        continue;
                    }
                    running.remove(name);
                    if let Some(child) =
                        run_pod(dist, daemon_set, &no_secrets, &node, (&api, &token)).await
                    {
                        running.insert(name.to_owned(), (template, child));
                    }
                }
            }
            Ok((code, answer)) => {
                tracing::warn!(code, message = %answer["message"], "cannot list DaemonSets")
            }
            Err(e) => tracing::debug!(error = %e, "the API server is not reachable yet"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_go_to_the_api_port() {
        assert_eq!(api_url("https://10.0.0.1:9345"), "https://10.0.0.1:6443");
        assert_eq!(api_url("https://10.0.0.1:6443/"), "https://10.0.0.1:6443");
        assert_eq!(
            api_url("https://server.example"),
            "https://server.example:6443"
        );
    }

    #[test]
    fn config_yaml_reads_as_the_distribution_writes_it() {
        let c: NodeConfig = serde_saphyr::from_str(
            "cluster-init: true\nnode-name: n1\nnode-label:\n  - rack=r1\nnode-taint:\n  - a=b:NoSchedule\nwrite-kubeconfig-mode: \"0644\"\n",
        )
        .unwrap_or_default();
        assert!(c.cluster_init);
        assert_eq!(c.node_name.as_deref(), Some("n1"));
        assert_eq!(c.node_label, ["rack=r1"]);
        let installed = Installed {
            version: "v1.33.4+k3s1".into(),
            server: true,
        };
        let node = node_object("n1", &c, &installed, Distribution::K3s);
        assert_eq!(node["metadata"]["labels"]["rack"], "r1");
        assert_eq!(node["spec"]["taints"][0]["effect"], "NoSchedule");
        assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.33.4+k3s1");
    }
}
