//! How answers print: tables for people, JSON or YAML for scripts.

use serde_json::Value;

use super::{Output, Request};

pub(super) fn render(request: &Request, value: &Value, output: Output) -> String {
    match output {
        Output::Json => serde_json::to_string_pretty(value).unwrap_or_default() + "\n",
        Output::Yaml => serde_saphyr::to_string(value).unwrap_or_default(),
        Output::Table => match request {
            Request::Get { .. }
            | Request::HostList { .. }
            | Request::HostGet { .. }
            | Request::BundleList { .. }
            | Request::BundleGet { .. }
            | Request::GitrepoList
            | Request::GitrepoGet { .. }
            | Request::SettingList
            | Request::SettingGet { .. } => objects_table(request, value),
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
            Request::TokenList { .. } => table(
                &["NAME", "USER", "DESCRIPTION", "EXPIRES", "KIND"],
                value["items"].as_array().into_iter().flatten().map(|t| {
                    let kind = if t["spec"]["agent"].is_object() {
                        "agent"
                    } else if t["spec"]["session"] == true {
                        "session"
                    } else {
                        "api"
                    };
                    // Whom it acts as: a user, or an agent's identity.
                    let user = match &t["spec"]["user"] {
                        Value::Null => text(&t["spec"]["agent"]["id"]),
                        user => text(user),
                    };
                    vec![
                        text(&t["metadata"]["name"]),
                        user,
                        text(&t["spec"]["description"]),
                        text(&t["spec"]["expiresAt"]),
                        kind.into(),
                    ]
                }),
            ),
            Request::ClusterCreate { name, .. } if value["spec"]["type"] == "hosted" => format!(
                "Cluster {name} created. The hub makes it in the cloud; `drover-hub cluster get {name}` shows its progress.\n"
            ),
            Request::ClusterCreate { name, .. } => {
                let r = &value["registration"];
                let command = r["importCommand"]
                    .as_str()
                    .or(r["hostCommand"].as_str())
                    .unwrap_or("");
                let mut out =
                    format!("Cluster {name} created.\n\nRegister it with:\n\n    {command}\n");
                if let Some(trusted) = r["importCommandTrusted"].as_str() {
                    out.push_str(&format!(
                        "\nIf the cluster trusts the hub's certificate (a --tls-cert from a public CA):\n\n    {trusted}\n"
                    ));
                }
                if let Some(insecure) = r["importCommandInsecure"].as_str() {
                    out.push_str(&format!(
                        "\nWithout sha256sum, skipping the certificate check (agents still pin the CA):\n\n    {insecure}\n"
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
            Request::ClusterDelete { name, .. } => format!("Cluster {name} deleted.\n"),
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
            Request::NodeGroupScale {
                cluster,
                group,
                desired,
                ..
            } => format!(
                "Node group {group} of cluster {cluster} now asks for {desired} machines; `drover-hub cluster get {cluster}` shows its size in the cloud.\n"
            ),
            Request::PoolScale {
                cluster,
                pool,
                quantity,
            } => format!(
                "Pool {pool} of cluster {cluster} now asks for {quantity} machines; `drover-hub machine list {cluster}` shows them.\n"
            ),
            Request::MachineList { .. } => table(
                &["NAME", "POOL", "PHASE", "ADDRESS", "HOST", "MESSAGE"],
                value["items"].as_array().into_iter().flatten().map(|m| {
                    vec![
                        text(&m["metadata"]["name"]),
                        text(&m["spec"]["pool"]),
                        text(&m["status"]["phase"]),
                        text(&m["status"]["addresses"][0]),
                        text(&m["status"]["host"]),
                        text(&m["status"]["message"]),
                    ]
                }),
            ),
            Request::ClusterEndpoint {
                cluster, enabled, ..
            } => {
                if *enabled {
                    format!(
                        "The authorized endpoint of cluster {cluster} is on; its control plane rolls, one host at a time. A new `drover-hub kubeconfig {cluster}` has a context per control-plane host.\n"
                    )
                } else {
                    format!(
                        "The authorized endpoint of cluster {cluster} is off; its control plane rolls back, one host at a time.\n"
                    )
                }
            }
            Request::TokenRevoke { name } => format!("Token {name} revoked.\n"),
            Request::UserList => table(
                &["NAME", "DISPLAY NAME", "GROUPS", "DISABLED"],
                value["items"].as_array().into_iter().flatten().map(|u| {
                    let groups: Vec<String> = u["spec"]["groups"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(text)
                        .collect();
                    vec![
                        text(&u["metadata"]["name"]),
                        text(&u["spec"]["displayName"]),
                        groups.join(","),
                        if u["spec"]["disabled"] == true {
                            "yes"
                        } else {
                            "no"
                        }
                        .into(),
                    ]
                }),
            ),
            Request::UserCreate { name, .. } => format!("User {name} created.\n"),
            Request::UserDelete { name } => format!("User {name} deleted.\n"),
            Request::UserSetPassword { name, .. } => format!("The password of {name} is set.\n"),
            Request::RoleList => table(
                &["NAME", "SUBJECT", "ROLE", "CLUSTER", "PROJECT"],
                value["items"].as_array().into_iter().flatten().map(|b| {
                    let spec = &b["spec"];
                    let subject = match (&spec["user"], &spec["group"]) {
                        (Value::String(user), _) => format!("user {user}"),
                        (_, Value::String(group)) => format!("group {group}"),
                        _ => String::new(),
                    };
                    let role = [&spec["role"], &spec["roleTemplate"]]
                        .into_iter()
                        .find(|r| r.is_string())
                        .map(text)
                        .or_else(|| spec["globalRole"].as_str().map(|g| format!("global {g}")))
                        .unwrap_or_default();
                    vec![
                        text(&b["metadata"]["name"]),
                        subject,
                        role,
                        text(&spec["cluster"]),
                        text(&spec["project"]),
                    ]
                }),
            ),
            Request::RoleGrant { name, role, .. } => {
                format!("Granted {role} (binding {name}).\n")
            }
            Request::RoleRevoke { name } => format!("Role binding {name} revoked.\n"),
            Request::TemplateList => table(
                &[
                    "NAME",
                    "CONTEXT",
                    "BUILTIN",
                    "INHERITS",
                    "RULES",
                    "DISPLAY NAME",
                ],
                value["items"].as_array().into_iter().flatten().map(|t| {
                    let spec = &t["spec"];
                    let inherits: Vec<String> = spec["inherits"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(text)
                        .collect();
                    vec![
                        text(&t["metadata"]["name"]),
                        text(&spec["context"]),
                        if spec["builtin"] == true { "yes" } else { "no" }.into(),
                        inherits.join(","),
                        spec["rules"].as_array().map_or(0, Vec::len).to_string(),
                        text(&spec["displayName"]),
                    ]
                }),
            ),
            Request::TemplateCreate { name, .. } => format!("Role template {name} created.\n"),
            Request::GitrepoCreate { name, .. } => format!("GitRepo {name} created.\n"),
            Request::TemplateDelete { name } => format!("Role template {name} deleted.\n"),
            _ => serde_saphyr::to_string(value).unwrap_or_default(),
        },
    }
}

pub(super) fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub(super) fn table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
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

/// One object, or a list's items.
fn items(value: &Value) -> Vec<&Value> {
    match value["items"].as_array() {
        Some(items) => items.iter().collect(),
        None => vec![value],
    }
}

/// The table a reading request prints.
fn objects_table(request: &Request, value: &Value) -> String {
    let rows = items(value);
    match request {
        Request::HostList { .. } | Request::HostGet { .. } => table(
            &["NAME", "CLUSTER", "ROLES", "ADDRESS", "STATE", "MESSAGE"],
            rows.into_iter().map(|h| {
                let roles = &h["spec"]["roles"];
                let named: Vec<&str> = [
                    ("etcd", "etcd"),
                    ("controlPlane", "controlplane"),
                    ("worker", "worker"),
                ]
                .into_iter()
                .filter(|(field, _)| roles[*field] == true)
                .map(|(_, name)| name)
                .collect();
                vec![
                    text(&h["metadata"]["name"]),
                    text(&h["spec"]["cluster"]),
                    named.join(","),
                    text(&h["spec"]["address"]),
                    text(&h["state"]["state"]),
                    text(&h["state"]["message"]),
                ]
            }),
        ),
        Request::GitrepoList | Request::GitrepoGet { .. } => table(
            &["NAME", "REPO", "COMMIT", "READY", "ERROR"],
            rows.into_iter().map(|r| {
                vec![
                    text(&r["metadata"]["name"]),
                    text(&r["spec"]["repo"]),
                    text(&r["status"]["commit"]).chars().take(12).collect(),
                    text(&r["status"]["summary"]),
                    text(&r["status"]["error"]),
                ]
            }),
        ),
        Request::BundleList { cluster: Some(_) } => table(
            &["BUNDLE", "CLUSTER", "TARGET", "STATE", "MESSAGE"],
            rows.into_iter().map(|d| {
                let applied = d["status"]["revision"] == d["spec"]["revision"];
                let state = match d["status"]["state"].as_str() {
                    Some(s) if applied => s,
                    _ => "Pending",
                };
                vec![
                    text(&d["spec"]["bundle"]),
                    text(&d["spec"]["cluster"]),
                    text(&d["spec"]["target"]),
                    state.to_owned(),
                    text(&d["status"]["message"]),
                ]
            }),
        ),
        Request::BundleList { cluster: None } | Request::BundleGet { .. } => table(
            &["NAME", "OBJECTS", "READY", "CONTENT", "PROBLEMS"],
            rows.into_iter().map(|b| {
                let problems: Vec<String> = b["status"]["problems"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| format!("{}: {}", text(&p["cluster"]), text(&p["message"])))
                    .collect();
                vec![
                    text(&b["metadata"]["name"]),
                    text(&b["spec"]["content"]["objects"]),
                    text(&b["status"]["summary"]),
                    // Enough of the digest to tell revisions apart.
                    text(&b["spec"]["content"]["digest"])
                        .chars()
                        .take(19)
                        .collect(),
                    problems.join("; "),
                ]
            }),
        ),
        Request::SettingList | Request::SettingGet { .. } => table(
            &["NAME", "VALUE"],
            rows.into_iter()
                .map(|s| vec![text(&s["metadata"]["name"]), text(&s["spec"]["value"])]),
        ),
        _ => table(
            &["NAME", "STATE", "CREATED"],
            rows.into_iter().map(|o| {
                vec![
                    text(&o["metadata"]["name"]),
                    text(&o["state"]["state"]),
                    text(&o["metadata"]["creationTimestamp"]),
                ]
            }),
        ),
    }
}
