//! Scenario `rbac`: RBAC sync at scale. A hub with U users bound to one cluster (cluster
//! roles, and project roles over P projects) and a cluster of N namespaces spread over those
//! projects, each project with a secret; the real cluster-agent writes it all into the
//! (simulated) cluster's RBAC. Reports the objects written downstream against what the mapping
//! calls for, the time from the first hub write until the cluster matches, and the writes the
//! agent makes afterwards while nothing changes (a window longer than its periodic resync),
//! which should be none.
//!
//! Then the templates' turn: T role templates (half cluster, half project; chains of
//! inheritance) bound to G groups the users are spread over, with what that writes in the
//! cluster, and the time from an edit of the template the chains start from until every
//! ClusterRole that inherits it holds the new rule, with the CPU this process (hub, agent and
//! simulated API server together) spent for it. The RoleBindings in the cluster are reported
//! beside Rancher's formula for the same clusters, users, projects and assignments.
//!
//! Hub, cluster-agent and simulated cluster run in this process. Users and bindings are written
//! straight to the hub's store (as the API would store them, without hashing 500 passwords).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use hub::store::Object;
use serde_json::{Value, json};
use sim::cluster::{Identity, SimCluster, SimConfig};
use tokio_util::sync::CancellationToken;

use crate::{
    health_scenario::round,
    proxy_scenario::{admin_with_cluster, hub_config, import_into},
};

const AGENT_TOKEN: &str = "bench-agent-token";
const AGENT_USER: &str = "system:serviceaccount:drover-system:drover-agent";
const AGENT_NAMESPACE: &str = "drover-system";

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Users with a role on the cluster or one of its projects.
    #[arg(long, default_value_t = 500)]
    users: usize,
    /// Namespaces in the cluster, spread over the projects.
    #[arg(long, default_value_t = 200)]
    namespaces: usize,
    /// Projects.
    #[arg(long, default_value_t = 20)]
    projects: usize,
    /// Seconds watched after convergence for writes that should not happen (the agent
    /// resyncs every 60 s, so the default window holds one resync).
    #[arg(long, default_value_t = 65)]
    quiet_seconds: u64,
    /// Role templates of the second phase (none: skip it).
    #[arg(long, default_value_t = 20)]
    templates: usize,
    /// Groups the users are spread over, each bound to one template.
    #[arg(long, default_value_t = 50)]
    groups: usize,
}

/// The role user `i` gets: a tenth each cluster-owner and read-only, a fifth cluster-member,
/// the rest project roles, ten users at a time to one project, so each project has an owner,
/// members and readers.
fn role_of(i: usize, projects: usize) -> (&'static str, Option<String>) {
    let project = || Some(format!("p-{}", (i / 10) % projects));
    match i % 10 {
        0 => ("cluster-owner", None),
        1 | 2 => ("cluster-member", None),
        3 => ("read-only", None),
        4 => ("project-owner", project()),
        9 => ("read-only", project()),
        _ => ("project-member", project()),
    }
}

/// Successful writes the agent has made so far to RBAC objects and secrets: creates, updates,
/// deletes (from the cluster's audit log: what the agent did, not what is there).
fn agent_writes(sim: &SimCluster) -> [usize; 3] {
    let mut counts = [0; 3];
    for e in sim.audit() {
        let ours = e.user == AGENT_USER
            && e.impersonated_by.is_none()
            && (200..300).contains(&e.code)
            && (e.path.contains("/rbac.authorization.k8s.io/") || e.path.contains("/secrets"));
        let slot = match e.method.as_str() {
            "POST" => 0,
            "PUT" | "PATCH" => 1,
            "DELETE" => 2,
            _ => continue,
        };
        if ours {
            counts[slot] += 1;
        }
    }
    counts
}

/// The objects the agent keeps in the cluster (labelled `drover.io/sync`), listed from the
/// cluster itself: what is there.
fn synced_objects(sim: &SimCluster) -> anyhow::Result<usize> {
    let mut count = 0;
    for (api_version, kind) in [
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("v1", "Secret"),
    ] {
        count += sim
            .list(api_version, kind, "drover.io/sync")
            .map_err(anyhow::Error::msg)?
            .len();
    }
    Ok(count)
}

fn total(counts: [usize; 3]) -> usize {
    counts.iter().sum()
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let (users, namespaces, projects) = (args.users, args.namespaces, args.projects.max(1));
    let shutdown = CancellationToken::new();
    let sim = SimCluster::start(SimConfig::default(), shutdown.clone()).await?;
    sim.add_token(
        AGENT_TOKEN,
        Identity {
            user: AGENT_USER.into(),
            // The bench measures the proxy, not the import manifest's RBAC: cluster-admin.
            groups: vec!["system:serviceaccounts".into(), "system:masters".into()],
        },
    );
    let manifest: Vec<String> = (0..namespaces)
        .map(|n| {
            format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns-{n}\n  labels: {{drover.io/project: p-{}}}\n",
                n % projects
            )
        })
        .collect();
    sim.apply_manifest(&manifest.join("---\n"))
        .map_err(anyhow::Error::msg)?;

    let data_dir = std::env::temp_dir().join(format!("drover-bench-rbac-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let hub = hub::Hub::start(hub_config(&data_dir.join("hub")), shutdown.clone()).await?;
    let (api, registration) = admin_with_cluster(
        &hub,
        json!({"metadata": {"name": "prod"}, "spec": {"type": "imported"}}),
    )
    .await?;
    let agent = import_into(
        &hub,
        &sim,
        AGENT_TOKEN,
        registration,
        &data_dir,
        AGENT_NAMESPACE,
    )
    .await?;
    tokio::spawn(cluster_agent::run(agent, shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let cluster = api.call("GET", "/v1/clusters/prod", None, 200).await?;
        let connected = cluster["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Connected" && c["status"] == "True")
            });
        if connected {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the cluster-agent did not connect"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = agent_writes(&sim);
    // The audit log keeps the last 10,000 requests: enough for the default sizes.

    // The burst: projects, users, their bindings, a secret per project.
    let store = hub.store().clone();
    let started = Instant::now();
    let mut hub_objects = 0;
    for p in 0..projects {
        hub::refs::create(
            store.as_ref(),
            Object::new("Project", &format!("p-{p}"), json!({"cluster": "prod"})),
        )
        .await?;
        hub_objects += 1;
    }
    let mut project_roles: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut cluster_roles = BTreeSet::new();
    for i in 0..users {
        let user = format!("u-{i}");
        hub::refs::create(
            store.as_ref(),
            Object::new("User", &user, json!({"displayName": user})),
        )
        .await?;
        let (role, project) = role_of(i, projects);
        let mut spec = json!({"user": user, "role": role, "cluster": "prod"});
        match &project {
            Some(p) => {
                spec["project"] = json!(p);
                project_roles.entry(p.clone()).or_default().insert(role);
            }
            None => {
                cluster_roles.insert(role);
            }
        }
        hub::refs::create(
            store.as_ref(),
            Object::new("RoleBinding", &format!("b-{i}"), spec),
        )
        .await?;
        hub_objects += 2;
    }
    for p in 0..projects {
        hub::refs::create(
            store.as_ref(),
            Object::new(
                "ProjectSecret",
                &format!("p-{p}-registry"),
                json!({"cluster": "prod", "project": format!("p-{p}"), "data": {"token": "czNjcmV0"}}),
            ))
            .await?;
        hub_objects += 1;
    }
    let hub_write_s = started.elapsed().as_secs_f64();

    // What the mapping calls for: cluster bindings (owner; read-only and cluster-view for
    // members and readers, with the cluster-view role), a member binding in every namespace
    // but the agent's, and per project namespace a binding per project role held and the secret.
    let all_namespaces = namespaces + 4; // default, kube-system, kube-public, kube-node-lease
    let viewers = cluster_roles.contains("read-only") || cluster_roles.contains("cluster-member");
    let mut expected =
        usize::from(cluster_roles.contains("cluster-owner")) + 3 * usize::from(viewers);
    if cluster_roles.contains("cluster-member") {
        expected += all_namespaces;
    }
    for n in 0..namespaces {
        let roles = project_roles
            .get(&format!("p-{}", n % projects))
            .map_or(0, BTreeSet::len);
        expected += roles + 1;
    }

    // Converged: the cluster holds the expected objects, and no write for 3 s.
    let mut last = agent_writes(&sim);
    let mut last_change = Instant::now();
    let mut present = synced_objects(&sim)?;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = agent_writes(&sim);
        if now != last {
            last = now;
            last_change = Instant::now();
            present = synced_objects(&sim)?;
        }
        if present >= expected && last_change.elapsed() > Duration::from_secs(3) {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "not converged after 10 minutes: {present} of {expected} objects"
        );
    }
    let converge_s = last_change.duration_since(started).as_secs_f64();

    let quiet = Duration::from_secs(args.quiet_seconds);
    tokio::time::sleep(quiet).await;
    let writes_when_quiet = total(agent_writes(&sim)) - total(last);
    let user_rolebindings = count(&sim, "RoleBinding")?;
    // Rancher's minimum for the same: 1 cluster, U users, U_aC of them bound on the cluster,
    // P projects, P_a bound on a project.
    let on_cluster = (0..users)
        .filter(|i| role_of(*i, projects).1.is_none())
        .count();
    let rancher = 32 + users + 2 * on_cluster + 8 * projects + 5 * (users - on_cluster);
    let templates = if args.templates > 0 {
        templates_phase(&sim, &store, &args, projects).await?
    } else {
        Value::Null
    };
    shutdown.cancel();
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(json!({
        "scenario": "rbac",
        "users": users,
        "namespaces": namespaces,
        "projects": projects,
        "hub_objects_written": hub_objects,
        "hub_write_s": round(hub_write_s, 2),
        "downstream_objects_expected": expected,
        // Listed from the cluster once converged.
        "downstream_objects": present,
        // Writes while converging: creates, and updates as bindings gained subjects.
        "downstream_writes": total(last) - total(before),
        "converge_s": round(converge_s, 2),
        "quiet_seconds": quiet.as_secs(),
        "writes_when_quiet": writes_when_quiet,
        "rolebindings": user_rolebindings,
        "rancher_formula_rolebindings": rancher,
        "templates_phase": templates,
    }))
}

/// The cluster's objects of `kind` the agent keeps.
fn count(sim: &SimCluster, kind: &str) -> anyhow::Result<usize> {
    Ok(sim
        .list("rbac.authorization.k8s.io/v1", kind, "drover.io/sync")
        .map_err(anyhow::Error::msg)?
        .len())
}

/// Template `t`'s context and what it inherits: even ones are cluster templates, odd ones
/// project templates; each inherits the one two before it, in chains of five, so an edit of
/// `t-0` reaches `t-2`, `t-4`, `t-6` and `t-8`.
fn template_of(t: usize) -> (&'static str, Option<String>) {
    let context = if t.is_multiple_of(2) {
        "cluster"
    } else {
        "project"
    };
    let parent = (t % 10 >= 2).then(|| format!("t-{}", t - 2));
    (context, parent)
}

/// The ClusterRoles that inherit `t-0` (itself included).
fn heirs_of_first(templates: usize) -> Vec<String> {
    (0..templates.min(10))
        .step_by(2)
        .map(|t| format!("drover-role-t-{t}"))
        .collect()
}

async fn templates_phase(
    sim: &SimCluster,
    store: &std::sync::Arc<dyn hub::store::Store>,
    args: &Args,
    projects: usize,
) -> anyhow::Result<Value> {
    let (templates, groups) = (args.templates, args.groups.max(1));
    let before = agent_writes(sim);
    let started = Instant::now();
    let resources = ["configmaps", "services", "pods", "events", "endpoints"];
    for t in 0..templates {
        let (context, parent) = template_of(t);
        let mut spec = json!({"context": context, "rules": [
            {"apiGroups": [""], "resources": [resources[t % resources.len()]], "verbs": ["get", "list"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": [format!("app-{t}")], "verbs": ["patch"]}]});
        if let Some(parent) = parent {
            spec["inherits"] = json!([parent]);
        }
        hub::refs::create(
            store.as_ref(),
            Object::new("RoleTemplate", &format!("t-{t}"), spec),
        )
        .await?;
    }
    // Each user in one group; each group bound to one template, a project template on one
    // project.
    for i in 0..args.users {
        let mut user = store.get("User", &format!("u-{i}")).await?;
        user.spec["groups"] = json!([format!("g-{}", i % groups)]);
        store.update(user).await?;
    }
    let mut held: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    let mut cluster_templates = BTreeSet::new();
    let (mut group_on_cluster, mut group_on_project) = (0, 0);
    for g in 0..groups {
        let t = g % templates;
        let (context, _) = template_of(t);
        let mut spec =
            json!({"group": format!("g-{g}"), "roleTemplate": format!("t-{t}"), "cluster": "prod"});
        if context == "project" {
            let project = format!("p-{}", g % projects);
            spec["project"] = json!(project);
            held.entry(project).or_default().insert(t);
            group_on_project += 1;
        } else {
            cluster_templates.insert(t);
            group_on_cluster += 1;
        }
        hub::refs::create(
            store.as_ref(),
            Object::new("RoleBinding", &format!("g-{g}-t-{t}"), spec),
        )
        .await?;
    }
    let hub_write_s = started.elapsed().as_secs_f64();
    let roles_expected = templates.min(groups);
    let namespaces_of = |p: usize| (0..args.namespaces).filter(|n| n % projects == p).count();
    let rolebindings_expected: usize = held
        .iter()
        .map(|(p, ts)| {
            let p: usize = p.trim_start_matches("p-").parse().unwrap_or_default();
            ts.len() * namespaces_of(p)
        })
        .sum();
    let template_objects = |sim: &SimCluster| -> anyhow::Result<[usize; 3]> {
        let of = |kind: &str| -> anyhow::Result<usize> {
            Ok(sim
                .list("rbac.authorization.k8s.io/v1", kind, "drover.io/sync")
                .map_err(anyhow::Error::msg)?
                .iter()
                .filter(|o| {
                    o["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("drover-role-t-"))
                })
                .count())
        };
        Ok([
            of("ClusterRole")?,
            of("ClusterRoleBinding")?,
            of("RoleBinding")?,
        ])
    };
    let expected = [
        roles_expected,
        cluster_templates.len(),
        rolebindings_expected,
    ];
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut present = template_objects(sim)?;
    while present != expected {
        anyhow::ensure!(
            Instant::now() < deadline,
            "templates not in the cluster after 10 minutes: {present:?} of {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        present = template_objects(sim)?;
    }
    let converge_s = started.elapsed().as_secs_f64();
    // Settled: no agent write for 3 s.
    let mut last = agent_writes(sim);
    let mut last_change = Instant::now();
    while last_change.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = agent_writes(sim);
        if now != last {
            last = now;
            last_change = Instant::now();
        }
    }
    let downstream_writes = total(last) - total(before);

    // The edit: t-0 gains a rule; every ClusterRole that inherits it must hold it.
    let heirs = heirs_of_first(templates);
    let cpu_before = crate::load::cpu_time();
    let edited = Instant::now();
    let mut first = store.get("RoleTemplate", "t-0").await?;
    first.spec["rules"]
        .as_array_mut()
        .ok_or_else(|| anyhow::anyhow!("t-0 has no rules"))?
        .push(json!({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}));
    store.update(first).await?;
    loop {
        let roles = sim
            .list(
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                "drover.io/sync",
            )
            .map_err(anyhow::Error::msg)?;
        let updated = heirs.iter().all(|name| {
            roles.iter().any(|r| {
                r["metadata"]["name"] == name.as_str()
                    && r["rules"].to_string().contains("\"jobs\"")
            })
        });
        if updated {
            break;
        }
        anyhow::ensure!(
            edited.elapsed() < Duration::from_secs(120),
            "the edit of t-0 did not reach {heirs:?} within 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let edit_s = edited.elapsed().as_secs_f64();
    let cpu_s = cpu_before
        .zip(crate::load::cpu_time())
        .map(|(b, a)| round((a - b).as_secs_f64(), 3));
    let rolebindings = count(sim, "RoleBinding")?;
    Ok(json!({
        "templates": templates,
        "groups": groups,
        "group_bindings_on_cluster": group_on_cluster,
        "group_bindings_on_projects": group_on_project,
        "hub_write_s": round(hub_write_s, 2),
        "clusterroles": present[0],
        "clusterrolebindings": present[1],
        "rolebindings_for_templates": present[2],
        "downstream_writes": downstream_writes,
        "converge_s": round(converge_s, 2),
        "edit_reached": heirs.len(),
        "edit_to_cluster_s": round(edit_s, 3),
        // Hub, cluster-agent and simulated API server: one process.
        "edit_cpu_s": cpu_s,
        "rolebindings_total": rolebindings,
    }))
}
