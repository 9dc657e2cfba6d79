//! The rollout's decisions as tables: hosts and what their agents reported in, the writes,
//! drains and status out. No store, no cluster.

#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;
use crate::{
    model::Distribution,
    planner::{NODE_TOKEN, host_plan::Installer},
};

const V1: &str = "v1.33.4+k3s1";
const V2: &str = "v1.34.1+k3s1";

fn ctx(version: &'static str) -> Ctx<'static> {
    Ctx {
        dist: Distribution::K3s,
        version,
        installer: Installer::Script("https://get.k3s.io".into()),
        ca_pem: "",
        endpoint: false,
        config: std::collections::BTreeMap::new(),
        host_config: Vec::new(),
        registries: Vec::new(),
        env: Vec::new(),
    }
}

/// A host of cluster `edge`: roles `all`, `etcd`, `controlplane` or `worker`.
fn host(name: &str, roles: &str, address: &str) -> Object {
    let (etcd, control_plane, worker) = match roles {
        "all" => (true, true, true),
        "etcd" => (true, false, false),
        "controlplane" => (false, true, false),
        _ => (false, false, true),
    };
    let mut object = Object::new(
        "Host",
        name,
        json!({"cluster": "edge", "nodeName": format!("node-{name}"), "address": address,
               "roles": {"etcd": etcd, "controlPlane": control_plane, "worker": worker}}),
    );
    object.metadata.creation_timestamp = format!("2026-11-25T00:00:0{}Z", name.len());
    object
}

fn specs(hosts: &[Object]) -> Vec<(&Object, HostSpec)> {
    hosts
        .iter()
        .map(|h| (h, serde_json::from_value(h.spec.clone()).unwrap()))
        .collect()
}

fn strategy(value: Value) -> UpgradeStrategy {
    serde_json::from_value(value).unwrap()
}

/// One pass over `hosts` with `plans` stored, at `ctx`'s version.
fn decide(
    hosts: &[Object],
    plans: &HashMap<String, Object>,
    ctx: &Ctx<'_>,
    strategy: &UpgradeStrategy,
) -> Rollout {
    let specs = specs(hosts);
    let init = init_host(&specs, None).unwrap().0.metadata.name.clone();
    rollout(&View {
        hosts: &specs,
        plans,
        ctx,
        strategy,
        init: &init,
        manifest: "kind: Deployment\n",
    })
}

/// A stored plan for `host` with the status its agent reported: `state` "" for none yet.
fn stored(host: &str, plan: &Plan, state: &str, token: Option<&str>) -> Object {
    let mut object = Object::new(
        "Plan",
        host,
        json!({"host": host, "cluster": "edge", "plan": serde_json::to_value(plan).unwrap()}),
    );
    let sum = checksum(plan);
    object.status = match state {
        "" => json!({}),
        "applied" => json!({
            "checksum": sum, "appliedChecksum": sum, "state": "applied",
            "probes": plan.probes.iter().map(|p| json!({"name": p.name, "healthy": true})).collect::<Vec<_>>(),
            "results": [{"name": NODE_TOKEN, "exitCode": 0, "stdout": token.unwrap_or("")}],
        }),
        "failed" => json!({
            "checksum": sum, "state": "failed", "message": "install: exit code 1",
            "failureCount": 3, "maxFailures": 3,
        }),
        other => json!({"checksum": sum, "state": other}),
    };
    object
}

/// The hosts the rollout writes plans for, in order.
fn written(rollout: &Rollout) -> Vec<&str> {
    rollout
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Write { host, .. } => Some(host.as_str()),
            _ => None,
        })
        .collect()
}

fn plan_for<'a>(rollout: &'a Rollout, name: &str) -> &'a Plan {
    rollout
        .actions
        .iter()
        .find_map(|a| match a {
            Action::Write { host, plan, .. } if host == name => Some(plan),
            _ => None,
        })
        .unwrap()
}

/// What the planner and the agents do with a pass: the join token recorded, and every plan
/// written and applied as its agent would report it (the init host printing `token`).
fn apply(plans: &mut HashMap<String, Object>, rollout: &Rollout, token: &str) {
    for action in &rollout.actions {
        match action {
            Action::Write { host, plan, .. } => {
                plans.insert(host.clone(), stored(host, plan, "applied", Some(token)));
            }
            Action::RecordJoinToken { host, token } => {
                plans.get_mut(host).unwrap().status["joinToken"] = json!(token);
            }
            Action::Uncordon { .. } => {}
        }
    }
}

/// The plans of a cluster of `hosts` fully provisioned at `ctx`'s version.
fn provisioned(hosts: &[Object], ctx: &Ctx<'_>) -> HashMap<String, Object> {
    let mut plans = HashMap::new();
    for _ in 0..hosts.len() + 1 {
        let pass = decide(hosts, &plans, ctx, &UpgradeStrategy::default());
        apply(&mut plans, &pass, "K10::server:secret");
    }
    plans
}

fn join_url(plan: &Plan) -> String {
    let config = &plan
        .files
        .iter()
        .find(|f| f.path.ends_with("config.yaml"))
        .unwrap()
        .content;
    let text = String::from_utf8_lossy(config).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("server: "))
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned()
}

#[test]
fn a_new_cluster_plans_its_init_host_first_and_the_others_wait_for_its_token() {
    let hosts = [
        host("a", "all", "10.0.0.1"),
        host("bb", "worker", "10.0.0.2"),
        host("ccc", "worker", "10.0.0.3"),
    ];
    let pass = decide(
        &hosts,
        &HashMap::new(),
        &ctx(V1),
        &UpgradeStrategy::default(),
    );
    assert_eq!(written(&pass), ["a"]);
    assert_eq!(pass.never_provisioned, 3);
    assert_eq!(
        pass.waiting,
        [
            "bb (node-bb): waiting for the init host a to report its join token",
            "ccc (node-ccc): waiting for the init host a to report its join token",
        ]
    );
    // An init host without an address cannot be joined, and the others say why.
    let hosts = [host("a", "all", ""), host("bb", "worker", "10.0.0.2")];
    let pass = decide(
        &hosts,
        &HashMap::new(),
        &ctx(V1),
        &UpgradeStrategy::default(),
    );
    assert_eq!(written(&pass), ["a"]);
    assert!(
        pass.waiting[0].contains("has no address to join"),
        "{:?}",
        pass.waiting
    );
}

#[test]
fn once_the_init_host_reports_its_token_the_others_join_it_in_order() {
    let hosts = [
        host("a", "all", "10.0.0.1"),
        host("bb", "etcd", "10.0.0.2"),
        host("ccc", "controlplane", "10.0.0.3"),
        host("dddd", "worker", "10.0.0.4"),
    ];
    let mut plans = HashMap::new();
    let first = decide(&hosts, &plans, &ctx(V1), &UpgradeStrategy::default());
    apply(&mut plans, &first, "K10::server:secret");
    // Step by step: etcd, then the control plane, then the worker, each once the step before
    // it is ready.
    let mut order = Vec::new();
    for _ in 0..3 {
        let pass = decide(&hosts, &plans, &ctx(V1), &UpgradeStrategy::default());
        let hosts_written = written(&pass);
        assert_eq!(hosts_written.len(), 1, "one step at a time: {pass:?}");
        let plan = plan_for(&pass, hosts_written[0]);
        assert_eq!(join_url(plan), "https://10.0.0.1:6443");
        order.push(hosts_written[0].to_owned());
        if hosts_written[0] == "bb" {
            // The init host's token is kept on its plan, once.
            assert!(pass.actions.contains(&Action::RecordJoinToken {
                host: "a".into(),
                token: "K10::server:secret".into(),
            }));
            assert!(
                pass.waiting
                    .contains(&"ccc (node-ccc): waiting for the hosts before it".to_owned()),
                "{:?}",
                pass.waiting
            );
        }
        apply(&mut plans, &pass, "");
    }
    assert_eq!(order, ["bb", "ccc", "dddd"]);
    let done = decide(&hosts, &plans, &ctx(V1), &UpgradeStrategy::default());
    assert_eq!((done.ready, done.total), (4, 4));
    assert!(written(&done).is_empty());
}

#[test]
fn a_version_change_rolls_servers_then_workers_within_the_concurrency() {
    let hosts = [
        host("a", "all", "10.0.0.1"),
        host("bb", "worker", "10.0.0.2"),
        host("ccc", "worker", "10.0.0.3"),
        host("dddd", "worker", "10.0.0.4"),
    ];
    let one_at_a_time = UpgradeStrategy::default();
    let mut plans = provisioned(&hosts, &ctx(V1));
    let v2 = ctx(V2);
    // Servers first: the workers wait for them.
    let pass = decide(&hosts, &plans, &v2, &one_at_a_time);
    assert_eq!(written(&pass), ["a"]);
    apply(&mut plans, &pass, "K10::server:secret");
    // Then the workers, one at a time.
    let pass = decide(&hosts, &plans, &v2, &one_at_a_time);
    assert_eq!(written(&pass), ["bb"]);
    assert!(
        pass.waiting
            .contains(&"ccc (node-ccc): waiting for its turn to upgrade".to_owned()),
        "{:?}",
        pass.waiting
    );
    // The next waits while the one upgrading has not reported.
    let before = plans["bb"].status["appliedChecksum"].clone();
    let mut upgrading = stored("bb", plan_for(&pass, "bb"), "in-progress", None);
    upgrading.status["appliedChecksum"] = before;
    plans.insert("bb".into(), upgrading);
    let pass = decide(&hosts, &plans, &v2, &one_at_a_time);
    assert!(written(&pass).is_empty(), "{pass:?}");
    // With every worker at once, all of them go together.
    let all = strategy(json!({"workerConcurrency": "100%"}));
    let pass = decide(&hosts, &plans, &v2, &all);
    assert_eq!(written(&pass), ["ccc", "dddd"]);
    let mut status = Status::default();
    pass.status(&mut status, "a", V2, &[]);
    let updated = status.condition("Updated").unwrap();
    assert_eq!(updated.reason, "Updating");
    assert!(
        updated
            .message
            .starts_with(&format!("rolling to {V2}: 1 of 4 hosts done"))
    );
}

fn file(plan: &Plan, suffix: &str) -> Option<String> {
    plan.files
        .iter()
        .find(|f| f.path.ends_with(suffix))
        .map(|f| String::from_utf8_lossy(&f.content).into_owned())
}

/// The hosts written in `passes` passes of `ctx` one host at a time, in order (each applied).
fn rolled_one_at_a_time(
    hosts: &[Object],
    plans: &mut HashMap<String, Object>,
    ctx: &Ctx<'_>,
    passes: usize,
) -> Vec<String> {
    let mut order = Vec::new();
    for _ in 0..passes {
        let pass = decide(hosts, plans, ctx, &UpgradeStrategy::default());
        assert!(written(&pass).len() <= 1, "{:?}", written(&pass));
        order.extend(written(&pass).into_iter().map(str::to_owned));
        apply(plans, &pass, "K10::server:secret");
    }
    order
}

#[test]
fn the_authorized_endpoint_rolls_the_control_plane_one_host_at_a_time_and_back() {
    let hosts = [
        host("a", "all", "10.0.0.1"),
        host("bb", "etcd", "10.0.0.2"),
        host("ccc", "controlplane", "10.0.0.3"),
        host("dddd", "controlplane", "10.0.0.4"),
        host("eeeee", "worker", "10.0.0.5"),
    ];
    let one_at_a_time = UpgradeStrategy::default();
    let mut plans = provisioned(&hosts, &ctx(V1));
    let on = Ctx {
        endpoint: true,
        ..ctx(V1)
    };
    // Only hosts with an API server change, one at a time, in order; etcd-only hosts and
    // workers keep their plans.
    let order = rolled_one_at_a_time(&hosts, &mut plans, &on, 6);
    assert_eq!(order, ["a", "ccc", "dddd"]);
    for name in ["a", "ccc", "dddd"] {
        let plan: Plan = serde_json::from_value(plans[name].spec["plan"].clone()).unwrap();
        let config = file(&plan, "config.yaml").unwrap();
        assert!(
            config.contains(
                "kube-apiserver-arg:\n  - \"authentication-token-webhook-config-file=/etc/rancher/k3s/kube-api-authn-webhook.yaml\"\n  - \"authentication-token-webhook-version=v1\"\n  - \"authentication-token-webhook-cache-ttl=10s\"\n"
            ),
            "{name}: {config}"
        );
        let webhook = file(&plan, "kube-api-authn-webhook.yaml").unwrap();
        assert!(
            webhook.contains("server: http://127.0.0.1:6440/v1/authenticate"),
            "{webhook}"
        );
    }
    for name in ["bb", "eeeee"] {
        let plan: Plan = serde_json::from_value(plans[name].spec["plan"].clone()).unwrap();
        assert!(
            file(&plan, "kube-api-authn-webhook.yaml").is_none(),
            "{name}"
        );
        assert!(
            !file(&plan, "config.yaml")
                .unwrap()
                .contains("kube-apiserver-arg")
        );
    }
    // Off again: the same hosts roll back to exactly the plans they had before.
    let before = provisioned(&hosts, &ctx(V1));
    let mut order = Vec::new();
    for _ in 0..6 {
        let pass = decide(&hosts, &plans, &ctx(V1), &one_at_a_time);
        order.extend(written(&pass).into_iter().map(str::to_owned));
        apply(&mut plans, &pass, "K10::server:secret");
    }
    assert_eq!(order, ["a", "ccc", "dddd"]);
    for (name, plan) in &before {
        assert_eq!(plans[name].spec["plan"], plan.spec["plan"], "{name}");
    }
}

#[test]
fn the_distributions_config_rolls_the_hosts_it_touches_servers_one_at_a_time() {
    let hosts = [
        host("a", "all", "10.0.0.1"),
        host("bb", "controlplane", "10.0.0.2"),
        host("ccc", "worker", "10.0.0.3"),
        host("dddd", "worker", "10.0.0.4"),
    ];
    let mut plans = provisioned(&hosts, &ctx(V1));
    let config: std::collections::BTreeMap<String, serde_json::Value> = serde_json::from_value(
        json!({"tls-san": ["api.example.com"], "cluster-cidr": "10.100.0.0/16",
               "kube-apiserver-arg": ["audit-log-maxage=30"]}),
    )
    .unwrap();
    let configured = Ctx {
        config,
        endpoint: true,
        ..ctx(V1)
    };
    // Server options only: the workers' plans stay, the servers roll one at a time.
    let order = rolled_one_at_a_time(&hosts, &mut plans, &configured, 5);
    assert_eq!(order, ["a", "bb"]);
    let plan: Plan = serde_json::from_value(plans["bb"].spec["plan"].clone()).unwrap();
    let config = file(&plan, "config.yaml").unwrap();
    // K3s's documented config.yaml: a flag's name without "--", lists for repeatable flags;
    // the cluster's API server arguments after the endpoint's.
    assert!(
        config.ends_with(
            "kube-apiserver-arg:\n  - \"authentication-token-webhook-config-file=/etc/rancher/k3s/kube-api-authn-webhook.yaml\"\n  \
             - \"authentication-token-webhook-version=v1\"\n  - \"authentication-token-webhook-cache-ttl=10s\"\n  \
             - \"audit-log-maxage=30\"\ncluster-cidr: \"10.100.0.0/16\"\ntls-san:\n  - \"api.example.com\"\n"
        ),
        "{config}"
    );
    let worker: Plan = serde_json::from_value(plans["ccc"].spec["plan"].clone()).unwrap();
    let worker_config = file(&worker, "config.yaml").unwrap();
    assert!(!worker_config.contains("tls-san"), "{worker_config}");
}

#[test]
fn with_drain_a_node_is_drained_before_its_upgrade_and_uncordoned_after() {
    let hosts = [
        host("a", "all", "10.0.0.1"),
        host("bb", "worker", "10.0.0.2"),
    ];
    let drain = strategy(json!({"drain": true}));
    let mut plans = provisioned(&hosts, &ctx(V1));
    let v2 = ctx(V2);
    let pass = decide(&hosts, &plans, &v2, &drain);
    let Action::Write {
        drain: node, plan, ..
    } = &pass.actions[0]
    else {
        panic!("{pass:?}");
    };
    assert_eq!(node.as_deref(), Some("node-a"));
    // Drained for this plan already (an earlier pass): no second drain.
    plans.get_mut("a").unwrap().status["drainedFor"] = json!(checksum(plan));
    let again = decide(&hosts, &plans, &v2, &drain);
    assert!(
        matches!(&again.actions[0], Action::Write { drain: None, .. }),
        "{again:?}"
    );
    // Applied: the node is made schedulable again.
    let mut applied = stored("a", plan, "applied", Some("K10::server:secret"));
    applied.status["drainedFor"] = json!(checksum(plan));
    plans.insert("a".into(), applied);
    let after = decide(&hosts, &plans, &v2, &drain);
    assert!(after.actions.contains(&Action::Uncordon {
        host: "a".into(),
        node: "node-a".into()
    }));
    // A first install never drains.
    let fresh = decide(&hosts, &HashMap::new(), &v2, &drain);
    assert!(matches!(
        &fresh.actions[0],
        Action::Write { drain: None, .. }
    ));
}

#[test]
fn a_failing_host_fails_the_cluster_with_its_reason() {
    let hosts = [host("a", "all", "10.0.0.1")];
    let first = decide(
        &hosts,
        &HashMap::new(),
        &ctx(V1),
        &UpgradeStrategy::default(),
    );
    let plans = HashMap::from([(
        "a".to_owned(),
        stored("a", plan_for(&first, "a"), "failed", None),
    )]);
    let pass = decide(&hosts, &plans, &ctx(V1), &UpgradeStrategy::default());
    assert!(written(&pass).is_empty());
    let failed = pass.failed.as_deref().unwrap();
    assert!(
        failed.starts_with("host a (node-a): install: exit code 1 (gave up after 3 attempts)"),
        "{failed}"
    );
    let mut status = Status::default();
    pass.status(&mut status, "a", V1, &[]);
    let provisioned = status.condition("Provisioned").unwrap();
    assert_eq!(
        (provisioned.status.as_str(), provisioned.reason.as_str()),
        ("False", "ProvisioningFailed")
    );
}

#[test]
fn a_cluster_whose_hosts_are_all_ready_is_provisioned_and_updated_at_its_version() {
    let hosts = [
        host("a", "all", "10.0.0.1"),
        host("bb", "worker", "10.0.0.2"),
    ];
    let plans = provisioned(&hosts, &ctx(V1));
    let pass = decide(&hosts, &plans, &ctx(V1), &UpgradeStrategy::default());
    let mut status = Status::default();
    // What carrying out the actions found not done yet keeps it from being updated.
    pass.status(
        &mut status,
        "a",
        V1,
        &["bb: draining node node-bb: evicting 2 pods".into()],
    );
    assert_eq!(status.condition("Updated").unwrap().reason, "Updating");
    pass.status(&mut status, "a", V1, &[]);
    assert_eq!(status.condition("Provisioned").unwrap().status, "True");
    assert_eq!(status.condition("Updated").unwrap().status, "True");
    assert_eq!(status.extra["version"], V1);
    assert_eq!(status.extra["hosts"], json!({"ready": 2, "total": 2}));
    assert_eq!(status.extra["initHost"], "a");
}

#[test]
fn the_init_host_stays_the_one_chosen_while_it_is_an_etcd_host() {
    let hosts = [
        host("a", "worker", "10.0.0.1"),
        host("bb", "etcd", "10.0.0.2"),
        host("ccc", "all", "10.0.0.3"),
    ];
    let all = specs(&hosts);
    let name = |previous| init_host(&all, previous).map(|(h, _)| h.metadata.name.as_str());
    assert_eq!(name(None), Some("bb"), "the oldest etcd host");
    assert_eq!(name(Some("ccc")), Some("ccc"), "the one chosen before");
    assert_eq!(
        name(Some("a")),
        Some("bb"),
        "not a worker, even if named before"
    );
    let workers = [host("a", "worker", "10.0.0.1")];
    assert!(init_host(&specs(&workers), None).is_none());
}

#[test]
fn a_removed_host_is_uninstalled_then_released() {
    let ctx = ctx(V1);
    let mut leaving = host("bb", "worker", "10.0.0.2");
    // Never planned: nothing to undo.
    assert_eq!(removal(&ctx, &leaving, None, false), Removal::Nothing);
    leaving.metadata.finalizers.push(FINALIZER.into());
    let Removal::Uninstall { plan, drain } = removal(&ctx, &leaving, None, true) else {
        panic!("the uninstall plan comes first");
    };
    assert_eq!(drain.as_deref(), Some("node-bb"));
    assert_eq!(
        plan.instructions[0].script,
        "\"$DROVER_ROOT/usr/local/bin/k3s-agent-uninstall.sh\""
    );
    // A server runs the server's uninstall script.
    let mut server = host("a", "all", "10.0.0.1");
    server.metadata.finalizers.push(FINALIZER.into());
    let Removal::Uninstall {
        plan: server_plan,
        drain: None,
    } = removal(&ctx, &server, None, false)
    else {
        panic!("no drain without upgradeStrategy.drain");
    };
    assert_eq!(
        server_plan.instructions[0].script,
        "\"$DROVER_ROOT/usr/local/bin/k3s-uninstall.sh\""
    );
    // A machine of a pool with drainBeforeDelete is drained all the same.
    server
        .metadata
        .annotations
        .insert(crate::model::DRAIN_BEFORE_DELETE.into(), "true".into());
    let Removal::Uninstall { drain, .. } = removal(&ctx, &server, None, false) else {
        panic!("the uninstall plan comes first");
    };
    assert_eq!(drain.as_deref(), Some("node-a"));
    // A machine destroyed (replaced as unhealthy) has nothing to uninstall.
    server
        .metadata
        .annotations
        .insert(crate::model::MACHINE_DESTROYED.into(), "true".into());
    assert_eq!(
        removal(&ctx, &server, None, false),
        Removal::Release {
            node: "node-a".into()
        }
    );
    let pending = stored("bb", &plan, "", None);
    assert_eq!(removal(&ctx, &leaving, Some(&pending), true), Removal::Wait);
    let done = stored("bb", &plan, "applied", None);
    assert_eq!(
        removal(&ctx, &leaving, Some(&done), true),
        Removal::Release {
            node: "node-bb".into()
        }
    );
}
