//! `drover-hub login|cluster|kubeconfig|token|get|apply|…`: the REST API for people and scripts. Tables for
//! people, `-o json|yaml` for scripts. Exit codes: 0 done; 1 the hub refused (the message says
//! why); 2 bad command line; 3 the hub cannot be reached or its certificate is not the one
//! trusted; 4 not logged in.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use self::{
    connection::{Client, login},
    render::{render, text},
};

/// What the CLI keeps between runs (mode 0600: it holds a token).
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Saved {
    pub server: String,
    pub token: String,
    /// The hub's CA, as fetched and checked at login.
    pub ca_pem: String,
    /// This CLI's own id, sent at login: logging in again revokes the token it replaces.
    #[serde(default)]
    pub client: String,
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
        /// The auth provider; the hub's own users if `None`.
        provider: Option<String>,
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
    ClusterWatch {
        name: String,
    },
    ClusterDelete {
        name: String,
        /// Without waiting for its hosts.
        force: bool,
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
    /// Sets one machine pool's quantity.
    /// A hosted cluster's node group resized (read, changed, written back at that version).
    NodeGroupScale {
        cluster: String,
        group: String,
        desired: u32,
        min: Option<u32>,
        max: Option<u32>,
    },
    PoolScale {
        cluster: String,
        pool: String,
        quantity: u32,
    },
    MachineList {
        cluster: String,
    },
    /// Sets the cluster's `spec.authorizedEndpoint` (`ca_certs`: a PEM file to read).
    ClusterEndpoint {
        cluster: String,
        enabled: bool,
        fqdn: String,
        ca_certs: Option<PathBuf>,
    },
    /// `None`: the hub's own.
    Kubeconfig {
        cluster: Option<String>,
    },
    TokenCreate {
        description: String,
        expires_at: Option<String>,
    },
    TokenList {
        /// Only this user's (admins).
        user: Option<String>,
    },
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
    UserCreate {
        name: String,
        display_name: String,
        groups: Vec<String>,
        password: tunnel::Secret,
    },
    UserList,
    UserDelete {
        name: String,
    },
    UserSetPassword {
        name: String,
        password: tunnel::Secret,
    },
    /// A role for a user or a group: a RoleBinding named `name`.
    RoleGrant {
        name: String,
        user: Option<String>,
        group: Option<String>,
        /// The binding's field that names the role: `role` (a builtin by name),
        /// `roleTemplate` or `globalRole`.
        field: &'static str,
        role: String,
        cluster: Option<String>,
        project: Option<String>,
    },
    RoleRevoke {
        name: String,
    },
    RoleList,
    TemplateCreate {
        name: String,
        spec: Value,
    },
    TemplateList,
    TemplateDelete {
        name: String,
    },
    /// Objects of any kind (`kind` as the user wrote it: plural, singular, any case).
    Get {
        kind: String,
        name: Option<String>,
        selector: Option<String>,
    },
    /// Creates or merges every object in the file (`-`: stdin).
    Apply {
        file: PathBuf,
    },
    HostList {
        cluster: Option<String>,
    },
    HostGet {
        name: String,
    },
    GitrepoCreate {
        name: String,
        spec: Value,
    },
    GitrepoList,
    GitrepoGet {
        name: String,
    },
    BundleList {
        cluster: Option<String>,
    },
    BundleGet {
        name: String,
    },
    SettingList,
    SettingGet {
        name: String,
    },
    SettingSet {
        name: String,
        value: String,
    },
}

impl Request {
    /// The password this request carries, and whose it is (to ask for it by name).
    pub fn password_mut(&mut self) -> Option<(&mut tunnel::Secret, &str)> {
        match self {
            Request::Login {
                password, username, ..
            } => Some((password, username)),
            Request::UserCreate { password, name, .. }
            | Request::UserSetPassword { password, name } => Some((password, name)),
            _ => None,
        }
    }
}

/// The name of the RoleBinding `project add-member` makes, so `remove-member` can find it.
pub fn member_binding(project: &str, user: Option<&str>, group: Option<&str>) -> String {
    object_name(&match (user, group) {
        (Some(user), _) => format!("{project}-{user}"),
        (None, Some(group)) => format!("{project}-group-{group}"),
        (None, None) => project.to_owned(),
    })
}

/// `raw` as an object name (1-63 lowercase letters, digits and '-', starting with a letter):
/// what a name may not hold (`@`, `.`, capitals…) becomes `-`, so a user called
/// `bob@example.com` can still be named in a binding.
pub fn object_name(raw: &str) -> String {
    let mut name: String = raw
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    while name.contains("--") {
        name = name.replace("--", "-");
    }
    let name = name.trim_matches('-');
    let name = if name.starts_with(|c: char| c.is_ascii_lowercase()) {
        name.to_owned()
    } else {
        format!("u-{name}")
    };
    name.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches('-')
        .to_owned()
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
        provider,
        password,
        ca_checksum,
    } = request
    {
        return login(
            config,
            &server,
            (&username, provider.as_deref()),
            password.expose(),
            ca_checksum.as_deref(),
        )
        .await;
    }
    let saved = load(config)?;
    let client = Client::new(&saved)?;
    match &request {
        Request::Apply { file } => return objects::apply(&client, &saved, file).await,
        Request::ClusterWatch { name } => return watch::run(&client, &saved, name).await,
        Request::SettingSet { name, value } => {
            return objects::set_setting(&client, &saved, name, value).await;
        }
        _ => {}
    }
    let (method, path, body) = match &request {
        Request::ClusterCreate { name, spec } => (
            "POST",
            "/v1/clusters".to_owned(),
            Some(json!({"metadata": {"name": name}, "spec": spec})),
        ),
        Request::ClusterList => ("GET", "/v1/clusters".to_owned(), None),
        Request::ClusterGet { name } => ("GET", format!("/v1/clusters/{name}"), None),
        Request::ClusterDelete { name, force } => (
            "DELETE",
            match force {
                true => format!("/v1/clusters/{name}?force=true"),
                false => format!("/v1/clusters/{name}"),
            },
            None,
        ),
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
        Request::PoolScale {
            cluster,
            pool,
            quantity,
        } => {
            let (version, pools) = scaled_pools(&client, &saved, cluster, pool, *quantity).await?;
            (
                "PATCH",
                format!("/v1/clusters/{cluster}"),
                Some(json!({"metadata": {"resourceVersion": version},
                            "spec": {"machinePools": pools}})),
            )
        }
        Request::NodeGroupScale {
            cluster,
            group,
            desired,
            min,
            max,
        } => {
            let mut value = get_cluster(&client, &saved, cluster).await?;
            let mut hosted = value["spec"]["hosted"].take();
            let size = (*desired, *min, *max);
            resize_group(&mut hosted, cluster, group, size)?;
            (
                "PATCH",
                format!("/v1/clusters/{cluster}"),
                Some(
                    json!({"metadata": {"resourceVersion": value["metadata"]["resourceVersion"].take()},
                            "spec": {"hosted": hosted}}),
                ),
            )
        }
        Request::MachineList { .. } => ("GET", "/v1/machines".to_owned(), None),
        Request::ClusterRotateCertificates { cluster } => {
            let generation =
                next_generation(&client, &saved, cluster, "rotateCertificates").await?;
            (
                "PATCH",
                format!("/v1/clusters/{cluster}"),
                Some(json!({"spec": {"rotateCertificates": {"generation": generation}}})),
            )
        }
        Request::ClusterEndpoint {
            cluster,
            enabled,
            fqdn,
            ca_certs,
        } => {
            let ca_certs = match ca_certs {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| CliError::Usage(format!("--ca-certs {}: {e}", path.display())))?,
                None => String::new(),
            };
            let endpoint = json!({"enabled": enabled, "fqdn": fqdn, "caCerts": ca_certs});
            (
                "PATCH",
                format!("/v1/clusters/{cluster}"),
                Some(json!({"spec": {"authorizedEndpoint": endpoint}})),
            )
        }
        Request::Kubeconfig {
            cluster: Some(cluster),
        } => ("POST", format!("/v1/clusters/{cluster}/kubeconfig"), None),
        Request::Kubeconfig { cluster: None } => ("POST", "/v1/kubeconfig".to_owned(), None),
        Request::TokenCreate {
            description,
            expires_at,
        } => (
            "POST",
            "/v1/tokens".to_owned(),
            Some(json!({"spec": {"description": description, "expiresAt": expires_at}})),
        ),
        Request::TokenList { user: None } => ("GET", "/v1/tokens".to_owned(), None),
        Request::TokenList { user: Some(user) } => (
            "GET",
            format!(
                "/v1/tokens?labelSelector={}%3D{}",
                crate::auth::lifetimes::USER_LABEL,
                form_urlencoded::byte_serialize(user.as_bytes()).collect::<String>()
            ),
            None,
        ),
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
        Request::UserCreate {
            name,
            display_name,
            groups,
            password,
        } => (
            "POST",
            "/v1/users".to_owned(),
            Some(json!({"metadata": {"name": name},
                "spec": {"displayName": display_name, "groups": groups, "password": password.expose()}})),
        ),
        Request::UserList => ("GET", "/v1/users".to_owned(), None),
        Request::UserDelete { name } => ("DELETE", format!("/v1/users/{name}"), None),
        Request::UserSetPassword { name, password } => (
            "PATCH",
            format!("/v1/users/{name}"),
            Some(json!({"spec": {"password": password.expose()}})),
        ),
        Request::RoleGrant {
            name,
            user,
            group,
            field,
            role,
            cluster,
            project,
        } => {
            let mut spec = json!({ *field: role });
            for (field, value) in [
                ("user", user),
                ("group", group),
                ("cluster", cluster),
                ("project", project),
            ] {
                if let Some(value) = value {
                    spec[field] = json!(value);
                }
            }
            (
                "POST",
                "/v1/rolebindings".to_owned(),
                Some(json!({"metadata": {"name": name}, "spec": spec})),
            )
        }
        Request::RoleRevoke { name } => ("DELETE", format!("/v1/rolebindings/{name}"), None),
        Request::RoleList => ("GET", "/v1/rolebindings".to_owned(), None),
        Request::TemplateCreate { name, spec } => (
            "POST",
            "/v1/roletemplates".to_owned(),
            Some(json!({"metadata": {"name": name}, "spec": spec})),
        ),
        Request::TemplateList => ("GET", "/v1/roletemplates".to_owned(), None),
        Request::GitrepoCreate { name, spec } => (
            "POST",
            "/v1/gitrepos".to_owned(),
            Some(json!({"metadata": {"name": name}, "spec": spec})),
        ),
        Request::TemplateDelete { name } => ("DELETE", format!("/v1/roletemplates/{name}"), None),
        Request::Get { .. }
        | Request::HostList { .. }
        | Request::HostGet { .. }
        | Request::BundleList { .. }
        | Request::BundleGet { .. }
        | Request::GitrepoList
        | Request::GitrepoGet { .. }
        | Request::SettingList
        | Request::SettingGet { .. } => ("GET", objects::read_path(&request)?, None),
        Request::Login { .. }
        | Request::Apply { .. }
        | Request::SettingSet { .. }
        | Request::ClusterWatch { .. } => {
            unreachable!("handled above")
        }
    };
    let (status, bytes) = client
        .send(method, &path, Some(&saved.token), body.as_ref())
        .await?;
    if !(200..300).contains(&status) {
        return Err(refused(status, &bytes));
    }
    if let Request::Kubeconfig { .. } = request {
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    let mut value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| CliError::Refused(format!("unreadable answer: {e}")))?;
    // As kubectl waits for finalizers: a cluster is deleted once its cleanup is done, a
    // snapshot taken once it is saved.
    match &request {
        Request::ClusterDelete { name, .. } => {
            // What the removal waits on changes as hosts uninstall: said as it changes.
            let said = std::sync::Mutex::new(String::new());
            until(&client, &saved, &format!("/v1/clusters/{name}"), |v| {
                let Some(v) = v else { return Some(Ok(())) };
                let now = text(&v["state"]["message"]);
                let mut said = said.lock().unwrap_or_else(|e| e.into_inner());
                if !now.is_empty() && *said != now {
                    #[allow(clippy::print_stderr)]
                    {
                        eprintln!("{now}");
                    }
                    *said = now;
                }
                None
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
        Request::SnapshotList { cluster }
        | Request::MachineList { cluster }
        | Request::HostList {
            cluster: Some(cluster),
        } => {
            if let Some(items) = value["items"].as_array_mut() {
                items.retain(|s| s["spec"]["cluster"] == cluster.as_str());
            }
        }
        _ => {}
    }
    Ok(render(&request, &value, output))
}

/// What the hub's non-2xx answer means for the CLI: its message, as "not logged in" for 401.
fn refused(status: u16, bytes: &[u8]) -> CliError {
    let message = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(bytes).into_owned());
    match status {
        401 => CliError::NotLoggedIn(message),
        _ => CliError::Refused(format!("the hub answered {status}: {message}")),
    }
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
/// The cluster's pools with `pool` at `quantity`, and the resourceVersion they were read at
/// (so a concurrent change is refused, not overwritten).
async fn scaled_pools(
    client: &Client,
    saved: &Saved,
    cluster: &str,
    pool: &str,
    quantity: u32,
) -> Result<(Value, Value), CliError> {
    let mut value = get_cluster(client, saved, cluster).await?;
    let mut pools = value["spec"]["machinePools"].take();
    let names: Vec<String> = pools
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let Some(entry) = pools
        .as_array_mut()
        .and_then(|all| all.iter_mut().find(|p| p["name"] == pool))
    else {
        return Err(CliError::Refused(format!(
            "cluster {cluster} has no pool {pool:?} (its pools: {})",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )));
    };
    entry["quantity"] = json!(quantity);
    Ok((value["metadata"]["resourceVersion"].take(), pools))
}

/// Sets node group `group`'s size in `spec.hosted` (desired, and min and max if given).
fn resize_group(
    hosted: &mut Value,
    cluster: &str,
    group: &str,
    (desired, min, max): (u32, Option<u32>, Option<u32>),
) -> Result<(), CliError> {
    let names: Vec<String> = hosted["nodeGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["name"].as_str().map(str::to_owned))
        .collect();
    let Some(entry) = hosted["nodeGroups"]
        .as_array_mut()
        .and_then(|all| all.iter_mut().find(|g| g["name"] == group))
    else {
        return Err(CliError::Refused(format!(
            "cluster {cluster} has no node group {group:?} (its node groups: {})",
            if names.is_empty() {
                "none; is it a hosted cluster?".to_owned()
            } else {
                names.join(", ")
            }
        )));
    };
    entry["desiredSize"] = json!(desired);
    if let Some(min) = min {
        entry["minSize"] = json!(min);
    }
    if let Some(max) = max {
        entry["maxSize"] = json!(max);
    }
    Ok(())
}

async fn next_generation(
    client: &Client,
    saved: &Saved,
    cluster: &str,
    field: &str,
) -> Result<u64, CliError> {
    let value = get_cluster(client, saved, cluster).await?;
    Ok(value["spec"][field]["generation"].as_u64().unwrap_or(0) + 1)
}

/// The cluster as the hub has it now.
async fn get_cluster(client: &Client, saved: &Saved, cluster: &str) -> Result<Value, CliError> {
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
    Ok(value)
}

mod connection;
pub use connection::provider_redirects;
mod objects;
mod render;
mod watch;
