//! The hub's roles and projects made real in the cluster's RBAC, judged by the real kubectl
//! through the hub: the cluster-agent keeps the (simulated) cluster's RoleBindings,
//! ClusterRoleBindings and project secrets in step with the hub's role bindings, projects and
//! project secrets; the cluster enforces them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::json;
use sim::cluster::SimConfig;
use tests::{
    api, create,
    imported::{
        IMPORT_OBJECTS, Imported, issued_kubeconfig, kubectl, kubectl_ok, remove_cluster,
        until_allowed, user_kubeconfig,
    },
};

/// Runs kubectl until `done` accepts (success, stdout); how long that took.
async fn until(
    kubeconfig: &Path,
    args: &[&str],
    within: Duration,
    done: impl Fn(bool, &str) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let (ok, stdout, stderr) = kubectl(kubeconfig, args).await;
        if done(ok, &stdout) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "kubectl {args:?} not as wanted within {within:?}: {stdout}{stderr}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn write(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, yaml).unwrap();
    path
}

fn namespace(name: &str, project: Option<&str>) -> String {
    let labels = project.map_or(String::new(), |p| {
        format!("\n  labels: {{drover.io/project: {p}}}")
    });
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}{labels}\n")
}

fn deployment(namespace: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: {namespace}}}\n\
         spec:\n  replicas: 1\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    \
         metadata: {{labels: {{app: web}}}}\n    spec: {{containers: [{{name: web, image: nginx}}]}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_roles_and_projects_become_the_clusters_rbac_and_stay_so() {
    let imported = Imported::start("rbac", SimConfig::default()).await;
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let (hub, admin, dir, sim_admin) = (
        &imported.hub,
        imported.admin.as_str(),
        imported.dir.as_path(),
        imported.sim_admin.as_path(),
    );

    // Project "shop" with namespaces shop-a (now) and shop-b (later); "other" is outside it.
    create(
        hub,
        admin,
        "projects",
        json!({"metadata": {"name": "shop"}, "spec": {"cluster": "prod", "displayName": "Shop"}}),
    )
    .await;
    let setup = write(
        dir,
        "namespaces.yaml",
        &[namespace("shop-a", Some("shop")), namespace("other", None)].join("---\n"),
    );
    kubectl_ok(sim_admin, &["apply", "-f", setup.to_str().unwrap()]).await;

    // pat is a project-member of shop: deployments in shop's namespaces, nowhere else.
    let pat = user_kubeconfig(hub, admin, dir, "pat", None).await;
    create(
        hub,
        admin,
        "rolebindings",
        json!({"metadata": {"name": "pat-shop"},
        "spec": {"user": "pat", "role": "project-member", "cluster": "prod", "project": "shop"}}),
    )
    .await;
    until_allowed(&pat, &["create", "deployments", "-n", "shop-a"]).await;
    let web_a = write(dir, "web-a.yaml", &deployment("shop-a"));
    kubectl_ok(&pat, &["apply", "-f", web_a.to_str().unwrap()]).await;
    let web_other = write(dir, "web-other.yaml", &deployment("other"));
    let (ok, _, stderr) = kubectl(&pat, &["apply", "-f", web_other.to_str().unwrap()]).await;
    assert!(
        !ok && stderr.contains("forbidden") && stderr.contains("\"other\""),
        "{stderr}"
    );
    let (_, answer, _) = kubectl(
        &pat,
        &["auth", "can-i", "create", "deployments", "-n", "other"],
    )
    .await;
    assert_eq!(answer.trim(), "no");

    // The hub's cache answers pat what the cluster's RBAC lets pat list, as the proxy does:
    // shop's namespaces, not the others, not every namespace, not the nodes.
    let pat_token = tests::imported::kubeconfig_token(&pat);
    let cache = |query: &str| {
        let path = format!("/v1/clusters/prod/cache/{query}");
        let (addr, token) = (hub.addr, pat_token.clone());
        async move { tests::api(addr, "GET", &path, Some(&token), None).await }
    };
    let (status, list) = cache("deployments?namespace=shop-a").await;
    assert_eq!(status, 200, "{list}");
    let items = list["items"].as_array().unwrap();
    assert!(
        items.iter().all(|d| d["metadata"]["namespace"] == "shop-a"),
        "{list}"
    );
    for refused in [
        "deployments?namespace=other",
        "deployments",
        "pods",
        "nodes",
        "namespaces",
    ] {
        let (status, answer) = cache(refused).await;
        assert_eq!(status, 403, "{refused}: {answer}");
    }
    // What pat sees through the cache is what kubectl shows pat through the proxy.
    let (ok, _, stderr) = kubectl(&pat, &["get", "deployments", "-n", "other"]).await;
    assert!(!ok && stderr.contains("forbidden"), "{stderr}");

    // A second project, lab, where pat may only read, with a secret of its own.
    create(
        hub,
        admin,
        "projects",
        json!({"metadata": {"name": "lab"}, "spec": {"cluster": "prod"}}),
    )
    .await;
    create(
        hub,
        admin,
        "rolebindings",
        json!({"metadata": {"name": "pat-lab"},
            "spec": {"user": "pat", "role": "read-only", "cluster": "prod", "project": "lab"}}),
    )
    .await;
    create(
        hub,
        admin,
        "projectsecrets",
        json!({"metadata": {"name": "lab-key"},
            "spec": {"cluster": "prod", "project": "lab", "type": "kubernetes.io/ssh-auth",
                "data": {"ssh-privatekey": "a2V5"}}}),
    )
    .await;

    // A project secret is in every namespace of the project, including one added later, and
    // leaves a namespace moved out of it (to another project).
    create(
        hub,
        admin,
        "projectsecrets",
        json!({"metadata": {"name": "db-password"},
        "spec": {"cluster": "prod", "project": "shop", "data": {"password": "czNjcmV0"}}}),
    )
    .await;
    let has_secret = |ok: bool, out: &str| ok && out == "czNjcmV0";
    until(
        sim_admin,
        &[
            "get",
            "secret",
            "db-password",
            "-n",
            "shop-a",
            "-o",
            "jsonpath={.data.password}",
        ],
        Duration::from_secs(10),
        has_secret,
    )
    .await;
    let later = write(dir, "shop-b.yaml", &namespace("shop-b", Some("shop")));
    kubectl_ok(sim_admin, &["apply", "-f", later.to_str().unwrap()]).await;
    let appeared = until(
        sim_admin,
        &[
            "get",
            "secret",
            "db-password",
            "-n",
            "shop-b",
            "-o",
            "jsonpath={.data.password}",
        ],
        Duration::from_secs(10),
        has_secret,
    )
    .await;
    until_allowed(&pat, &["create", "deployments", "-n", "shop-b"]).await;
    kubectl_ok(
        sim_admin,
        &[
            "label",
            "namespace",
            "shop-b",
            "drover.io/project=lab",
            "--overwrite",
        ],
    )
    .await;
    until(
        sim_admin,
        &["get", "secret", "db-password", "-n", "shop-b"],
        Duration::from_secs(10),
        |ok, _| !ok,
    )
    .await;
    // ... into project lab, whose members and secret it now has.
    until(
        sim_admin,
        &[
            "get",
            "secret",
            "lab-key",
            "-n",
            "shop-b",
            "-o",
            "jsonpath={.type}",
        ],
        Duration::from_secs(10),
        |ok, out| ok && out == "kubernetes.io/ssh-auth",
    )
    .await;
    let lab_reader = [
        "get",
        "rolebinding",
        "drover-project-read-only",
        "-n",
        "shop-b",
        "-o",
        "jsonpath={.roleRef.name} {.subjects[*].name}",
    ];
    until(
        sim_admin,
        &lab_reader,
        Duration::from_secs(10),
        |ok, out| ok && out == "view pat",
    )
    .await;
    let (_, answer, _) = kubectl(
        &pat,
        &["auth", "can-i", "create", "deployments", "-n", "shop-b"],
    )
    .await;
    assert_eq!(
        answer.trim(),
        "no",
        "moved out: the project's bindings went with it"
    );
    // Changed on the hub, changed in the cluster; deleted, deleted.
    let (status, _) = api(
        hub.addr,
        "PATCH",
        "/v1/projectsecrets/db-password",
        Some(admin),
        Some(json!({"spec": {"data": {"password": "bmV3"}}})),
    )
    .await;
    assert_eq!(status, 200);
    until(
        sim_admin,
        &[
            "get",
            "secret",
            "db-password",
            "-n",
            "shop-a",
            "-o",
            "jsonpath={.data.password}",
        ],
        Duration::from_secs(10),
        |ok, out| ok && out == "bmV3",
    )
    .await;
    let (status, _) = api(
        hub.addr,
        "DELETE",
        "/v1/projectsecrets/db-password",
        Some(admin),
        None,
    )
    .await;
    assert_eq!(status, 200);
    until(
        sim_admin,
        &["get", "secret", "db-password", "-n", "shop-a"],
        Duration::from_secs(10),
        |ok, _| !ok,
    )
    .await;

    // A group's role reaches its members: gina is in group "ops", ops are cluster-members.
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/users",
        Some(admin),
        Some(json!({"metadata": {"name": "gina"},
        "spec": {"password": "a long enough password", "groups": ["ops"]}})),
    )
    .await;
    assert_eq!(status, 201);
    create(
        hub,
        admin,
        "rolebindings",
        json!({"metadata": {"name": "ops-members"},
        "spec": {"group": "ops", "role": "cluster-member", "cluster": "prod"}}),
    )
    .await;
    let gina_token = tests::login(hub.addr, "gina", "a long enough password").await;
    let gina = issued_kubeconfig(hub, &gina_token, dir, "gina", None).await;
    until_allowed(&gina, &["create", "configmaps", "-n", "other"]).await;
    let (_, answer, _) = kubectl(
        &gina,
        &[
            "auth",
            "can-i",
            "create",
            "configmaps",
            "-n",
            "drover-system",
        ],
    )
    .await;
    assert_eq!(
        answer.trim(),
        "no",
        "cluster-members do not write in the agent's namespace"
    );

    // Drift: a synced binding deleted by hand comes back.
    let binding = [
        "get",
        "rolebinding",
        "drover-cluster-member",
        "-n",
        "other",
        "-o",
        "jsonpath={.subjects[*].name}",
    ];
    until(sim_admin, &binding, Duration::from_secs(10), |ok, out| {
        ok && out.contains("ops")
    })
    .await;
    kubectl_ok(
        sim_admin,
        &[
            "delete",
            "rolebinding",
            "drover-cluster-member",
            "-n",
            "other",
        ],
    )
    .await;
    let repaired = until(sim_admin, &binding, Duration::from_secs(10), |ok, out| {
        ok && out.contains("ops")
    })
    .await;

    // Someone else's object under a name the sync uses is left alone.
    let foreign = write(
        dir,
        "foreign.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
        metadata: {name: drover-project-member, namespace: shop-a}\n\
        roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\n\
        subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: someone-else}]\n",
    );
    let (status, _) = api(
        hub.addr,
        "DELETE",
        "/v1/rolebindings/pat-shop",
        Some(admin),
        None,
    )
    .await;
    assert_eq!(status, 200);
    // Removed on the hub: the downstream binding goes, and pat is denied.
    let removed = until(
        sim_admin,
        &[
            "get",
            "rolebinding",
            "drover-project-member",
            "-n",
            "shop-a",
        ],
        Duration::from_secs(10),
        |ok, _| !ok,
    )
    .await;
    // (Refused by the hub first: pat holds no role in the cluster any more.)
    let (ok, _, stderr) = kubectl(&pat, &["get", "deployments", "-n", "shop-a"]).await;
    assert!(!ok && stderr.contains("Forbidden"), "{stderr}");
    // And by the cluster, should the request come some other way.
    let (ok, _, stderr) = kubectl(
        sim_admin,
        &["get", "deployments", "-n", "shop-a", "--as", "pat"],
    )
    .await;
    assert!(!ok && stderr.contains("forbidden"), "{stderr}");
    kubectl_ok(sim_admin, &["apply", "-f", foreign.to_str().unwrap()]).await;
    create(
        hub,
        admin,
        "rolebindings",
        json!({"metadata": {"name": "pat-shop-again"},
        "spec": {"user": "pat", "role": "project-member", "cluster": "prod", "project": "shop"}}),
    )
    .await;
    // The sync runs: a new namespace of the project gets pat's binding (pat may write there
    // only through the binding just made again, in the pass that also meets shop-a's)...
    let shop_c = write(dir, "shop-c.yaml", &namespace("shop-c", Some("shop")));
    kubectl_ok(sim_admin, &["apply", "-f", shop_c.to_str().unwrap()]).await;
    until_allowed(&pat, &["create", "deployments", "-n", "shop-c"]).await;
    // ... and the foreign one in shop-a stays as it was.
    let subjects = kubectl_ok(
        sim_admin,
        &[
            "get",
            "rolebinding",
            "drover-project-member",
            "-n",
            "shop-a",
            "-o",
            "jsonpath={.subjects[*].name}",
        ],
    )
    .await;
    assert_eq!(
        subjects, "someone-else",
        "an object not labelled drover.io/sync is never changed"
    );

    eprintln!(
        "rbac: project secret in a new namespace after {:.2} s; a deleted binding back after {:.2} s; a hub binding's removal downstream after {:.2} s",
        appeared.as_secs_f64(),
        repaired.as_secs_f64(),
        removed.as_secs_f64()
    );

    // Removing the cluster removes what Drover created in it (through its agent) and nothing
    // else; its agents' credentials are revoked.
    let started = std::time::Instant::now();
    remove_cluster(hub, admin, "prod").await;
    let synced = kubectl_ok(
        sim_admin,
        &[
            "get",
            "clusterrolebindings,clusterroles,rolebindings,secrets",
            "-A",
            "-l",
            "drover.io/sync",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(synced.trim(), "", "the objects the agent kept are gone");
    for object in IMPORT_OBJECTS {
        let (ok, _, _) = kubectl(sim_admin, &["get", object]).await;
        assert!(!ok, "{object} is gone");
    }
    let (ok, _, _) = kubectl(
        sim_admin,
        &[
            "get",
            "rolebinding",
            "drover-project-member",
            "-n",
            "shop-a",
        ],
    )
    .await;
    assert!(ok, "an object Drover did not create stays");
    let (_, tokens) = api(hub.addr, "GET", "/v1/tokens", Some(admin), None).await;
    assert!(
        !tokens.to_string().contains("\"cluster\":\"prod\""),
        "agent credentials revoked: {tokens:#}"
    );
    eprintln!(
        "rbac: the imported cluster removed, and cleaned, in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    imported.shutdown.cancel();
    let _ = agent.await;
}
