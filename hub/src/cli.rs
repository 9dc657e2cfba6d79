//! `drover-hub login|cluster|kubeconfig|token`: the REST API for people and scripts. Tables for
//! people, `-o json|yaml` for scripts. Exit codes: 0 done; 1 the hub refused (the message says
//! why); 2 bad command line; 3 the hub cannot be reached or its certificate is not the one
//! trusted; 4 not logged in.

use std::{path::PathBuf, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::fsutil::write_atomic;

/// What the CLI keeps between runs (mode 0600: it holds a token).
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Saved {
    pub server: String,
    pub token: String,
    /// The hub's CA, as fetched and checked at login.
    pub ca_pem: String,
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saved")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// A CLI failure, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Unreachable(String),
    #[error("not logged in: run `drover-hub login --server https://HUB:8443` first ({0})")]
    NotLoggedIn(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Refused(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Unreachable(_) => 3,
            CliError::NotLoggedIn(_) => 4,
        }
    }
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

/// A client command, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Login {
        server: String,
        username: String,
        /// Redacted in `Debug`, like every credential.
        password: tunnel::Secret,
        ca_checksum: Option<String>,
    },
    ClusterCreate {
        name: String,
        spec: Value,
    },
    ClusterList,
    ClusterGet {
        name: String,
    },
    ClusterDelete {
        name: String,
    },
    SnapshotCreate {
        cluster: String,
        name: String,
        copy_to_hub: bool,
    },
    SnapshotList {
        cluster: String,
    },
    SnapshotDelete {
        name: String,
    },
    /// Raises the cluster's `spec.restore.generation`, naming the snapshot.
    ClusterRestore {
        cluster: String,
        snapshot: String,
    },
    /// Raises the cluster's `spec.rotateCertificates.generation`.
    ClusterRotateCertificates {
        cluster: String,
    },
    Kubeconfig {
        cluster: String,
    },
    TokenCreate {
        description: String,
        expires_at: Option<String>,
    },
    TokenList,
    TokenRevoke {
        name: String,
    },
    ProjectCreate {
        name: String,
        cluster: String,
        display_name: String,
    },
    ProjectList,
    ProjectDelete {
        name: String,
    },
    /// A role on a project for a user or a group: a RoleBinding named `<project>-<subject>`.
    ProjectAddMember {
        project: String,
        cluster: String,
        user: Option<String>,
        group: Option<String>,
        role: String,
    },
    ProjectRemoveMember {
        binding: String,
    },
}

/// The name of the RoleBinding `project add-member` makes, so `remove-member` can find it.
pub fn member_binding(project: &str, user: Option<&str>, group: Option<&str>) -> String {
    match (user, group) {
        (Some(user), _) => format!("{project}-{user}"),
        (None, Some(group)) => format!("{project}-group-{group}"),
        (None, None) => project.to_owned(),
    }
}

/// Where the CLI keeps its login: `--config`, else `$DROVER_CONFIG`, else
/// `$HOME/.config/drover/cli.json`.
pub fn config_path(
    flag: Option<PathBuf>,
    env: &std::collections::HashMap<String, String>,
) -> PathBuf {
    flag.or_else(|| env.get("DROVER_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| {
            let home = env.get("HOME").cloned().unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".config/drover/cli.json")
        })
}

fn load(path: &std::path::Path) -> Result<Saved, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::NotLoggedIn(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| CliError::NotLoggedIn(format!("{} is damaged: {e}", path.display())))
}

/// Runs one request; returns what to print.
pub async fn run(
    request: Request,
    config: &std::path::Path,
    output: Output,
) -> Result<String, CliError> {
    if let Request::Login {
        server,
        username,
        password,
        ca_checksum,
    } = request
    {
        return login(
            config,
            &server,
            &username,
            password.expose(),
            ca_checksum.as_deref(),
        )
        .await;
    }
    let saved = load(config)?;
    let client = Client::new(&saved)?;
    let (method, path, body) = match &request {
        Request::ClusterCreate { name, spec } => (
            "POST",
            "/v1/clusters".to_owned(),
            Some(json!({"metadata": {"name": name}, "spec": spec})),
        ),
        Request::ClusterList => ("GET", "/v1/clusters".to_owned(), None),
        Request::ClusterGet { name } => ("GET", format!("/v1/clusters/{name}"), None),
        Request::ClusterDelete { name } => ("DELETE", format!("/v1/clusters/{name}"), None),
        Request::SnapshotCreate {
            cluster,
            name,
            copy_to_hub,
        } => (
            "POST",
            "/v1/etcdsnapshots".to_owned(),
            Some(json!({"metadata": {"name": name},
                "spec": {"cluster": cluster, "copyToHub": copy_to_hub}})),
        ),
        Request::SnapshotList { .. } => ("GET", "/v1/etcdsnapshots".to_owned(), None),
        Request::SnapshotDelete { name } => ("DELETE", format!("/v1/etcdsnapshots/{name}"), None),
        Request::ClusterRestore { cluster, snapshot } => {
            let generation = next_generation(&client, &saved, cluster, "restore").await?;
            (
                "PATCH",
                format!("/v1/clusters/{cluster}"),
                Some(
                    json!({"spec": {"restore": {"snapshot": snapshot, "generation": generation}}}),
                ),
            )
        }
        Request::ClusterRotateCertificates { cluster } => {
            let generation =
                next_generation(&client, &saved, cluster, "rotateCertificates").await?;
            (
                "PATCH",
                format!("/v1/clusters/{cluster}"),
                Some(json!({"spec": {"rotateCertificates": {"generation": generation}}})),
            )
        }
        Request::Kubeconfig { cluster } => {
            ("POST", format!("/v1/clusters/{cluster}/kubeconfig"), None)
        }
        Request::TokenCreate {
            description,
            expires_at,
        } => (
            "POST",
            "/v1/tokens".to_owned(),
            Some(json!({"spec": {"description": description, "expiresAt": expires_at}})),
        ),
        Request::TokenList => ("GET", "/v1/tokens".to_owned(), None),
        Request::TokenRevoke { name } => ("DELETE", format!("/v1/tokens/{name}"), None),
        Request::ProjectCreate {
            name,
            cluster,
            display_name,
        } => (
            "POST",
            "/v1/projects".to_owned(),
            Some(json!({"metadata": {"name": name},
                "spec": {"cluster": cluster, "displayName": display_name}})),
        ),
        Request::ProjectList => ("GET", "/v1/projects".to_owned(), None),
        Request::ProjectDelete { name } => ("DELETE", format!("/v1/projects/{name}"), None),
        Request::ProjectAddMember {
            project,
            cluster,
            user,
            group,
            role,
        } => {
            let mut spec = json!({"role": role, "cluster": cluster, "project": project});
            if let Some(user) = user {
                spec["user"] = json!(user);
            }
            if let Some(group) = group {
                spec["group"] = json!(group);
            }
            let name = member_binding(project, user.as_deref(), group.as_deref());
            (
                "POST",
                "/v1/rolebindings".to_owned(),
                Some(json!({"metadata": {"name": name}, "spec": spec})),
            )
        }
        Request::ProjectRemoveMember { binding } => {
            ("DELETE", format!("/v1/rolebindings/{binding}"), None)
        }
        Request::Login { .. } => unreachable!("handled above"),
    };
    let (status, bytes) = client
        .send(method, &path, Some(&saved.token), body.as_ref())
        .await?;
    if !(200..300).contains(&status) {
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        return Err(match status {
            401 => CliError::NotLoggedIn(message),
            _ => CliError::Refused(format!("the hub answered {status}: {message}")),
        });
    }
    if let Request::Kubeconfig { .. } = request {
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    let mut value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| CliError::Refused(format!("unreadable answer: {e}")))?;
    // As kubectl waits for finalizers: a cluster is deleted once its cleanup is done, a
    // snapshot taken once it is saved.
    match &request {
        Request::ClusterDelete { name } => {
            until(&client, &saved, &format!("/v1/clusters/{name}"), |v| {
                v.is_none().then_some(Ok(()))
            })
            .await?;
        }
        Request::SnapshotDelete { name } => {
            until(&client, &saved, &format!("/v1/etcdsnapshots/{name}"), |v| {
                v.is_none().then_some(Ok(()))
            })
            .await?;
        }
        Request::SnapshotCreate { name, .. } => {
            value = until(&client, &saved, &format!("/v1/etcdsnapshots/{name}"), |v| {
                let v = v?;
                match v["state"]["state"].as_str() {
                    Some("active") => Some(Ok(v.clone())),
                    Some("error") => Some(Err(CliError::Refused(format!(
                        "snapshot {name} failed: {}",
                        text(&v["state"]["message"])
                    )))),
                    _ => None,
                }
            })
            .await?;
        }
        Request::SnapshotList { cluster } => {
            if let Some(items) = value["items"].as_array_mut() {
                items.retain(|s| s["spec"]["cluster"] == cluster.as_str());
            }
        }
        _ => {}
    }
    Ok(render(&request, &value, output))
}

/// How long the CLI waits for a deletion or a snapshot.
const WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Reads `path` every second until `done` says (given the object, `None` once it is gone).
async fn until<T>(
    client: &Client,
    saved: &Saved,
    path: &str,
    done: impl Fn(Option<&Value>) -> Option<Result<T, CliError>>,
) -> Result<T, CliError> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (status, bytes) = client.send("GET", path, Some(&saved.token), None).await?;
        let value = serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null);
        let current = (status != 404).then_some(&value);
        if let Some(result) = done(current) {
            return result;
        }
        if std::time::Instant::now() > deadline {
            return Err(CliError::Refused(format!(
                "still not done after {} s: {}",
                WAIT.as_secs(),
                text(&value["state"]["message"])
            )));
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The cluster's `spec.<field>.generation` plus one.
async fn next_generation(
    client: &Client,
    saved: &Saved,
    cluster: &str,
    field: &str,
) -> Result<u64, CliError> {
    let (status, bytes) = client
        .send(
            "GET",
            &format!("/v1/clusters/{cluster}"),
            Some(&saved.token),
            None,
        )
        .await?;
    let value = serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null);
    if status != 200 {
        return Err(CliError::Refused(format!(
            "the hub answered {status}: {}",
            text(&value["message"])
        )));
    }
    Ok(value["spec"][field]["generation"].as_u64().unwrap_or(0) + 1)
}

fn render(request: &Request, value: &Value, output: Output) -> String {
    match output {
        Output::Json => serde_json::to_string_pretty(value).unwrap_or_default() + "\n",
        Output::Yaml => serde_saphyr::to_string(value).unwrap_or_default(),
        Output::Table => match request {
            Request::ClusterList => table(
                &["NAME", "TYPE", "STATE", "MESSAGE"],
                value["items"].as_array().into_iter().flatten().map(|c| {
                    vec![
                        text(&c["metadata"]["name"]),
                        text(&c["spec"]["type"]),
                        text(&c["state"]["state"]),
                        text(&c["state"]["message"]),
                    ]
                }),
            ),
            Request::TokenList => table(
                &["NAME", "DESCRIPTION", "EXPIRES", "KIND"],
                value["items"].as_array().into_iter().flatten().map(|t| {
                    let kind = if t["spec"]["agent"].is_object() {
                        "agent"
                    } else if t["spec"]["session"] == true {
                        "session"
                    } else {
                        "api"
                    };
                    vec![
                        text(&t["metadata"]["name"]),
                        text(&t["spec"]["description"]),
                        text(&t["spec"]["expiresAt"]),
                        kind.into(),
                    ]
                }),
            ),
            Request::ClusterCreate { name, .. } => {
                let r = &value["registration"];
                let command = r["importCommand"]
                    .as_str()
                    .or(r["hostCommand"].as_str())
                    .unwrap_or("");
                let mut out =
                    format!("Cluster {name} created.\n\nRegister it with:\n\n    {command}\n");
                if let Some(insecure) = r["importCommandInsecure"].as_str() {
                    out.push_str(&format!(
                        "\nIf kubectl does not trust the hub's certificate:\n\n    {insecure}\n"
                    ));
                }
                if r["roleFlags"].is_array() {
                    out.push_str("\nAdd --etcd, --controlplane, --worker or --all-roles for each host's roles.\n");
                }
                out.push_str("\nThe token in this command is not shown again.\n");
                out
            }
            Request::TokenCreate { .. } => format!(
                "Token {} created:\n\n    {}\n\nIt is not shown again.\n",
                text(&value["metadata"]["name"]),
                text(&value["token"])
            ),
            Request::ProjectList => table(
                &["NAME", "CLUSTER", "DISPLAY NAME"],
                value["items"].as_array().into_iter().flatten().map(|p| {
                    vec![
                        text(&p["metadata"]["name"]),
                        text(&p["spec"]["cluster"]),
                        text(&p["spec"]["displayName"]),
                    ]
                }),
            ),
            Request::ProjectCreate { name, cluster, .. } => format!(
                "Project {name} created in cluster {cluster}.\nLabel its namespaces drover.io/project={name}.\n"
            ),
            Request::ProjectDelete { name } => format!("Project {name} deleted.\n"),
            Request::ProjectAddMember { project, role, .. } => format!(
                "{} is {role} of project {project} (binding {}).\n",
                text(&value["spec"]["user"]).max(text(&value["spec"]["group"])),
                text(&value["metadata"]["name"])
            ),
            Request::ProjectRemoveMember { binding } => format!("Binding {binding} removed.\n"),
            Request::ClusterDelete { name } => format!("Cluster {name} deleted.\n"),
            Request::SnapshotCreate { name, .. } => format!(
                "Snapshot {name} saved on {}: {} ({} bytes, sha256 {}).\n",
                text(&value["status"]["host"]),
                text(&value["status"]["file"]),
                text(&value["status"]["size"]),
                text(&value["status"]["sha256"])
            ),
            Request::SnapshotList { .. } => table(
                &[
                    "NAME",
                    "STATE",
                    "HOST",
                    "SIZE",
                    "CREATED",
                    "VERSION",
                    "SCHEDULED",
                ],
                value["items"].as_array().into_iter().flatten().map(|s| {
                    vec![
                        text(&s["metadata"]["name"]),
                        text(&s["state"]["state"]),
                        text(&s["status"]["host"]),
                        text(&s["status"]["size"]),
                        text(&s["status"]["createdAt"]),
                        text(&s["status"]["version"]),
                        text(&s["spec"]["scheduled"]),
                    ]
                }),
            ),
            Request::SnapshotDelete { name } => format!("Snapshot {name} deleted.\n"),
            Request::ClusterRestore { cluster, snapshot } => format!(
                "Restoring cluster {cluster} from {snapshot}; `drover-hub cluster get {cluster}` shows each phase.\n"
            ),
            Request::ClusterRotateCertificates { cluster } => format!(
                "Rotating the certificates of cluster {cluster}, host by host; `drover-hub cluster get {cluster}` shows progress.\n"
            ),
            Request::TokenRevoke { name } => format!("Token {name} revoked.\n"),
            _ => serde_saphyr::to_string(value).unwrap_or_default(),
        },
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows.collect();
    let widths: Vec<usize> = (0..headers.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([headers[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("   ").trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

async fn login(
    config: &std::path::Path,
    server: &str,
    username: &str,
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
    })?;
    let body = json!({"username": username, "password": password, "session": false, "description": "drover-hub CLI"});
    let (status, bytes) = client.send("POST", "/v1/login", None, Some(&body)).await?;
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
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
    };
    if let Some(dir) = config.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Usage(format!("cannot create {}: {e}", dir.display())))?;
    }
    let json = serde_json::to_vec_pretty(&saved).unwrap_or_default();
    write_atomic(config, &json, 0o600)
        .map_err(|e| CliError::Usage(format!("cannot write {}: {e}", config.display())))?;
    Ok(format!(
        "{notice}Logged in to {} as {username}; the token (valid until {}) is saved in {}.\n",
        saved.server,
        text(&value["expiresAt"]),
        config.display()
    ))
}

fn authority(server: &str) -> Result<String, CliError> {
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

struct Client {
    authority: String,
    host: String,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    fn new(saved: &Saved) -> Result<Self, CliError> {
        let roots = tunnel::tls::roots_from_pem(saved.ca_pem.as_bytes())
            .map_err(|e| CliError::NotLoggedIn(format!("the saved CA is unusable: {e}")))?;
        Self::with_config(&saved.server, tunnel::tls::client_config(roots))
    }

    fn with_config(server: &str, tls: Arc<rustls::ClientConfig>) -> Result<Self, CliError> {
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

    async fn send(
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
