//! The hub's own objects through the real kubectl, at `management.drover.io/v1`: the CRDs,
//! `explain`, Tables, `apply` (client- and server-side), a watch that sees an imported cluster
//! and a custom one (a `drover-sim host` installing the stand-in k3s) become active, `edit`, `patch`, `label`, `wait`, `delete --wait`, and the hub's
//! authorisation unchanged (a cluster-owner sees and changes only their cluster; `auth can-i`
//! answers per role).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde_json::{Value, json};
use sim::cluster::SimConfig;
use tests::{
    HubProcess, api, api_text, hub_cli,
    imported::{Imported, kubectl, kubectl_ok},
    local_host::{LocalHost, installs_the_standin},
    login, temp_dir,
};

/// The kubeconfig for the hub itself that the hub issues to the holder of `token`, aimed at
/// the address the test reaches the hub by.
async fn hub_kubeconfig(hub: &HubProcess, dir: &Path, name: &str, token: &str) -> PathBuf {
    let (status, kubeconfig) = api_text(hub.addr, "POST", "/v1/kubeconfig", Some(token)).await;
    assert_eq!(status, 201, "{kubeconfig}");
    aimed_at(hub, dir, name, &kubeconfig)
}

/// `kubeconfig` written to `dir/<name>-hub.kubeconfig`, its server the address the test
/// reaches the hub by.
fn aimed_at(hub: &HubProcess, dir: &Path, name: &str, kubeconfig: &str) -> PathBuf {
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned();
    assert!(
        kubeconfig.contains("certificate-authority-data: "),
        "{kubeconfig}"
    );
    let path = dir.join(format!("{name}-hub.kubeconfig"));
    std::fs::write(
        &path,
        kubeconfig.replace(&server, &format!("{:?}", hub.url())),
    )
    .unwrap();
    path
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn refused(kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, stdout, stderr) = kubectl(kubeconfig, args).await;
    assert!(!ok, "kubectl {args:?} should fail: {stdout}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_manages_the_hubs_own_objects_as_the_hubs_roles_allow() {
    let dir = temp_dir("kube-api");
    let hub = HubProcess::start_with(&dir.join("hub"), &["--listen", "127.0.0.1:0"]).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    // The admin's kubeconfig as the CLI prints it.
    let cli_config = dir.join("cli.json");
    let password = format!("{}\n", hub.admin_password.as_deref().unwrap());
    let url = hub.url();
    let r = hub_cli(
        &cli_config,
        &["login", "--server", &url, "--password-stdin"],
        &password,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = hub_cli(&cli_config, &["kubeconfig", "--hub"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("current-context: \"drover-hub\""),
        "{}",
        r.stdout
    );
    let kc = aimed_at(&hub, &dir, "admin", &r.stdout);
    let r = hub_cli(&cli_config, &["kubeconfig"], "");
    assert_ne!(r.code, 0, "a cluster or --hub");

    // Discovery and the kinds' definitions.
    let crds = kubectl_ok(&kc, &["get", "crd"]).await;
    assert!(
        crds.starts_with("NAME") && crds.contains("clusters.management.drover.io"),
        "{crds}"
    );
    let resources = kubectl_ok(
        &kc,
        &[
            "api-resources",
            "--api-group=management.drover.io",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(
        resources
            .lines()
            .any(|l| l == "clusters.management.drover.io"),
        "{resources}"
    );
    let explained = kubectl_ok(&kc, &["explain", "clusters.spec"]).await;
    assert!(
        explained.contains("KIND:       Cluster")
            && explained.contains("distribution")
            && explained.contains("version"),
        "{explained}"
    );

    // An imported cluster created by kubectl, its agent connected; a custom cluster applied
    // from YAML, a host registered with it. A watch sees both become active.
    let prod = write(
        &dir,
        "prod.yaml",
        "apiVersion: management.drover.io/v1\nkind: Cluster\nmetadata:\n  name: prod\nspec:\n  type: imported\n",
    );
    let created: Value =
        serde_json::from_str(&kubectl_ok(&kc, &["create", "-f", &prod, "-o", "json"]).await)
            .unwrap();
    let registration = created["registration"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let edge_yaml = "apiVersion: management.drover.io/v1\nkind: Cluster\nmetadata:\n  name: edge\n  labels: {env: test}\nspec:\n  type: custom\n  distribution: k3s\n  version: v1.33.4+k3s1\n";
    let edge = write(&dir, "edge.yaml", edge_yaml);
    // Applied, the new cluster as the hub answers it: its registration token, shown once.
    let applied: Value =
        serde_json::from_str(&kubectl_ok(&kc, &["apply", "-f", &edge, "-o", "json"]).await)
            .unwrap();
    assert_eq!(applied["metadata"]["name"], "edge");
    let edge_token = applied["registration"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let again = kubectl_ok(&kc, &["apply", "-f", &edge]).await;
    assert_eq!(again.trim(), "cluster.management.drover.io/edge unchanged");
    let mut watch = tokio::process::Command::new("kubectl")
        .args(["get", "clusters", "-w"])
        .env("KUBECONFIG", &kc)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    installs_the_standin(&hub, &admin, &dir).await;
    let _host = LocalHost::start(&hub, &edge_token, "node-k1", "127.0.0.35", &dir);
    let hub_admin = admin.clone();
    let imported = Imported::attach(
        dir.clone(),
        hub,
        hub_admin,
        registration,
        SimConfig::default(),
    )
    .await;
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let hub = &imported.hub;
    {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
        let mut seen = Vec::new();
        let mut active = BTreeSet::new();
        let both = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let columns: Vec<&str> = line.split_whitespace().collect();
                if let [name, "active", ..] = columns[..] {
                    active.insert(name.to_owned());
                }
                seen.push(line);
                if active.len() == 2 {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(both, Ok(true), "the watch showed: {seen:#?}");
        assert_eq!(Vec::from_iter(active), ["edge", "prod"]);
        assert!(
            seen[0].starts_with("NAME") && seen[0].contains("STATE"),
            "{seen:?}"
        );
        // What the custom cluster went through on its way, as the watch showed it.
        assert!(
            seen.iter()
                .any(|l| l.starts_with("edge ") && !l.contains(" active ")),
            "{seen:#?}"
        );
    }
    drop(watch);
    for cluster in ["cluster/prod", "cluster/edge"] {
        kubectl_ok(
            &kc,
            &["wait", "--for=condition=Ready", cluster, "--timeout=30s"],
        )
        .await;
    }
    let table = kubectl_ok(&kc, &["get", "clusters"]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "STATE", "TYPE", "VERSION", "NODES", "AGE"],
        "{table}"
    );
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows.iter().map(|r| &r[..3]).collect::<Vec<_>>(),
        [["edge", "active", "custom"], ["prod", "active", "imported"]],
        "{table}"
    );
    assert_eq!(rows[0][3..5], ["v1.33.4+k3s1", "1/1"], "{table}");

    // The custom cluster changed by kubectl. A field the kind does not know is refused
    // (kubectl validates strictly), or, asked to warn, dropped with a warning.
    let typo = write(
        &dir,
        "typo.yaml",
        &edge_yaml.replace("  version:", "  distro: k3s\n  version:"),
    );
    let said = refused(&kc, &["apply", "-f", &typo]).await;
    assert!(said.contains("unknown field \"spec.distro\""), "{said}");
    let invalid = write(
        &dir,
        "bad.yaml",
        &edge_yaml.replace("v1.33.4+k3s1", "latest"),
    );
    let said = refused(&kc, &["apply", "-f", &invalid]).await;
    assert!(
        said.contains("spec.version") && said.contains("not a k3s release"),
        "{said}"
    );
    let patched = kubectl_ok(
        &kc,
        &[
            "patch",
            "cluster",
            "edge",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ],
    )
    .await;
    assert!(patched.contains("patched"), "{patched}");
    kubectl_ok(&kc, &["label", "cluster", "edge", "tier=gold"]).await;
    kubectl_ok(&kc, &["annotate", "cluster", "edge", "owner=shop floor"]).await;
    let (ok, _, stderr) = tokio::process::Command::new("kubectl")
        .args(["edit", "cluster", "edge"])
        .env("KUBECONFIG", &kc)
        .env("EDITOR", "sed -i s/env:\\ test/env:\\ edited/")
        .output()
        .await
        .map(|o| {
            (
                o.status.success(),
                o.stdout,
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert!(ok, "{stderr}");
    let (_, stored) = api(hub.addr, "GET", "/v1/clusters/edge", Some(&admin), None).await;
    assert_eq!(stored["spec"]["paused"], true, "{stored}");
    assert_eq!(
        stored["metadata"]["labels"],
        json!({"env": "edited", "tier": "gold"})
    );
    assert_eq!(stored["metadata"]["annotations"]["owner"], "shop floor");
    let yaml = kubectl_ok(&kc, &["get", "cluster", "edge", "-o", "yaml"]).await;
    assert!(
        yaml.starts_with("apiVersion: management.drover.io/v1\n")
            && yaml.contains("\nkind: Cluster\n")
            && yaml.contains("    owner: shop floor\n"),
        "{yaml}"
    );
    assert_eq!(
        kubectl_ok(&kc, &["get", "clusters", "-l", "tier=gold", "-o", "name"])
            .await
            .trim(),
        "cluster.management.drover.io/edge"
    );

    // A server-side dry run checks as a write does and stores nothing; lists come in pages.
    let dry = write(
        &dir,
        "dry.yaml",
        &edge_yaml.replace("name: edge", "name: dry"),
    );
    let said = kubectl_ok(&kc, &["apply", "--dry-run=server", "-f", &dry]).await;
    assert_eq!(
        said.trim(),
        "cluster.management.drover.io/dry created (server dry run)"
    );
    assert!(
        refused(&kc, &["get", "cluster", "dry"])
            .await
            .contains("NotFound")
    );
    let said = refused(&kc, &["apply", "--dry-run=server", "-f", &invalid]).await;
    assert!(said.contains("spec.version"), "{said}");
    kubectl_ok(&kc, &["delete", "cluster", "edge", "--dry-run=server"]).await;
    let names = kubectl_ok(&kc, &["get", "clusters", "--chunk-size=1", "-o", "name"]).await;
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        [
            "cluster.management.drover.io/edge",
            "cluster.management.drover.io/prod"
        ]
    );

    // Server-side apply owns what it applied: a hand edit of it is a conflict until forced.
    let ssa = write(
        &dir,
        "ssa.yaml",
        "apiVersion: management.drover.io/v1\nkind: Cluster\nmetadata:\n  name: edge\nspec:\n  description: applied\n",
    );
    kubectl_ok(&kc, &["apply", "--server-side", "-f", &ssa]).await;
    kubectl_ok(
        &kc,
        &[
            "patch",
            "cluster",
            "edge",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"description":"by hand"}}"#,
        ],
    )
    .await;
    let conflict = refused(&kc, &["apply", "--server-side", "-f", &ssa]).await;
    assert!(
        conflict.contains("conflict") && conflict.contains(".spec.description"),
        "{conflict}"
    );
    kubectl_ok(
        &kc,
        &["apply", "--server-side", "--force-conflicts", "-f", &ssa],
    )
    .await;
    let description = kubectl_ok(
        &kc,
        &[
            "get",
            "cluster",
            "edge",
            "-o",
            "jsonpath={.spec.description}",
        ],
    )
    .await;
    assert_eq!(description, "applied");

    // A cluster-owner of prod sees and changes prod only; can-i answers per role.
    let password = "a long enough password";
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/users",
        Some(&admin),
        Some(json!({"metadata": {"name": "olive"}, "spec": {"password": password}})),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _) = api(hub.addr, "POST", "/v1/rolebindings", Some(&admin),
        Some(json!({"metadata": {"name": "olive-owner"}, "spec": {"user": "olive", "role": "cluster-owner", "cluster": "prod"}}))).await;
    assert_eq!(status, 201);
    let olive = login(hub.addr, "olive", password).await;
    let okc = hub_kubeconfig(hub, &dir, "olive", &olive).await;
    assert_eq!(
        kubectl_ok(&okc, &["get", "clusters", "-o", "name"])
            .await
            .trim(),
        "cluster.management.drover.io/prod"
    );
    let hidden = refused(&okc, &["get", "cluster", "edge"]).await;
    assert!(hidden.contains("NotFound"), "{hidden}");
    kubectl_ok(&okc, &["label", "cluster", "prod", "owner=olive"]).await;
    let not_hers = refused(&okc, &["label", "cluster", "edge", "owner=olive"]).await;
    assert!(not_hers.contains("NotFound"), "{not_hers}");
    for (kubeconfig, question, answer) in [
        (&kc, "create clusters", "yes"),
        (&okc, "create clusters", "no"),
        (&okc, "patch cluster/prod", "yes"),
        (&okc, "patch cluster/edge", "no"),
        (&okc, "list users", "no"),
    ] {
        let mut args = vec!["auth", "can-i"];
        args.extend(question.split(' '));
        let (_, stdout, _) = kubectl(kubeconfig, &args).await;
        assert_eq!(
            stdout.split_whitespace().next(),
            Some(answer),
            "{question}: {stdout}"
        );
    }

    // Deleted, waiting until the hub's clean-up is done and the object gone.
    let deleted = kubectl_ok(
        &kc,
        &["delete", "cluster", "edge", "--wait", "--timeout=60s"],
    )
    .await;
    assert!(deleted.contains("deleted"), "{deleted}");
    let gone = refused(&kc, &["get", "cluster", "edge"]).await;
    assert!(gone.contains("NotFound"), "{gone}");

    imported.shutdown.cancel();
    let _ = agent.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_manifests_apply_to_a_cluster_as_written() {
    let imported = Imported::start("hub-manifests", SimConfig::default()).await;
    let sim = imported.sim_admin.as_path();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/hub");
    let file = |name: &str| deploy.join(name).display().to_string();
    // One hub on its volume.
    let applied = kubectl_ok(sim, &["apply", "-f", &file("hub.yaml")]).await;
    for made in [
        "namespace/drover created",
        "service/drover-hub created",
        "statefulset.apps/drover-hub created",
    ] {
        assert!(applied.contains(made), "{applied}");
    }
    let spec: Value = serde_json::from_str(
        &kubectl_ok(
            sim,
            &[
                "-n",
                "drover",
                "get",
                "statefulset",
                "drover-hub",
                "-o",
                "json",
            ],
        )
        .await,
    )
    .unwrap();
    assert_eq!(spec["spec"]["replicas"], 1);
    let container = &spec["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        format!("drover/hub:{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        container["volumeMounts"][0]["mountPath"],
        "/var/lib/drover-hub"
    );
    assert_eq!(
        spec["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "data"
    );
    // Three on etcd, over the same objects.
    let applied = kubectl_ok(sim, &["apply", "-f", &file("hub-etcd.yaml")]).await;
    assert!(
        applied.contains("service/drover-hub-replicas created"),
        "{applied}"
    );
    assert!(
        applied.contains("statefulset.apps/drover-hub configured"),
        "{applied}"
    );
    let replicas = kubectl_ok(
        sim,
        &[
            "-n",
            "drover",
            "get",
            "statefulset",
            "drover-hub",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    )
    .await;
    assert_eq!(replicas, "3");
    imported.shutdown.cancel();
}
