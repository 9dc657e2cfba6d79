//! Custom roles made real, judged by the real kubectl through the hub against the simulated
//! cluster, which enforces RBAC as kube-apiserver does: a role template made with the CLI and
//! granted to a group, its inheritance followed as it changes, and a global role's cluster
//! templates on every cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde_json::json;
use sim::cluster::SimConfig;
use tests::{
    api,
    browser::{Driver, check_and_save_as},
    create, hub_cli,
    imported::{Imported, issued_kubeconfig, kubectl, kubectl_ok, until_allowed},
    login,
};

/// Asks `kubectl auth can-i` until it answers `want`; how long that took.
async fn until_can(kubeconfig: &Path, can: &[&str], want: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let mut args = vec!["auth", "can-i"];
        args.extend_from_slice(can);
        let (_, stdout, stderr) = kubectl(kubeconfig, &args).await;
        if stdout.trim() == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "kubectl auth can-i {can:?} still says {stdout:?} after {within:?}: {stderr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A user in `groups`, with a kubeconfig for cluster prod once the hub issues one.
async fn user(imported: &Imported, name: &str, groups: &[&str]) -> String {
    let password = "a long enough password";
    create(
        &imported.hub,
        &imported.admin,
        "users",
        json!({"metadata": {"name": name}, "spec": {"password": password, "groups": groups}}),
    )
    .await;
    login(imported.hub.addr, name, password).await
}

/// Projects shop and lab of cluster prod, with a namespace each (shop-a, lab-a) holding a
/// Deployment `web`; shop-a also a Secret `db`.
async fn shop_and_lab(imported: &Imported) {
    let (hub, admin, sim_admin) = (
        &imported.hub,
        imported.admin.as_str(),
        imported.sim_admin.as_path(),
    );
    for project in ["shop", "lab"] {
        create(
            hub,
            admin,
            "projects",
            json!({"metadata": {"name": project}, "spec": {"cluster": "prod"}}),
        )
        .await;
    }
    let setup = imported.dir.join("setup.yaml");
    let mut documents = Vec::new();
    for (ns, project) in [("shop-a", "shop"), ("lab-a", "lab")] {
        documents.push(format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}, labels: {{drover.io/project: {project}}}}}\n"
        ));
        documents.push(format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: {ns}}}\n\
             spec:\n  replicas: 1\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    \
             metadata: {{labels: {{app: web}}}}\n    spec: {{containers: [{{name: web, image: nginx}}]}}\n"
        ));
    }
    documents.push("apiVersion: v1\nkind: Secret\nmetadata: {name: db, namespace: shop-a}\ndata: {password: czNjcmV0}\n".into());
    std::fs::write(&setup, documents.join("---\n")).unwrap();
    kubectl_ok(sim_admin, &["apply", "-f", setup.to_str().unwrap()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployer_template_gives_a_group_exactly_its_rules_in_its_project() {
    let imported = Imported::start("roles-deployer", SimConfig::default()).await;
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let (hub, sim_admin) = (&imported.hub, imported.sim_admin.as_path());
    shop_and_lab(&imported).await;

    // The template and the grant, as an operator types them.
    let cli = imported.cli_login();
    let r = hub_cli(
        &cli,
        &[
            "role",
            "template",
            "create",
            "deployer",
            "--context",
            "project",
            "--display-name",
            "Deployer",
            "--rule",
            "get,list,watch,patch:deployments.apps,deployments.apps/scale",
            "--rule",
            "get,list:pods,pods/log",
        ],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let dan = user(&imported, "dan", &["ci"]).await;
    let r = hub_cli(
        &cli,
        &[
            "role",
            "grant",
            "--group",
            "ci",
            "--template",
            "deployer",
            "--cluster",
            "prod",
            "--project",
            "shop",
        ],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = hub_cli(&cli, &["role", "template", "list"], "");
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("deployer ") && l.contains("project") && l.contains("Deployer")),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("cluster-owner ") && l.contains("yes")),
        "{}",
        r.stdout
    );

    let dan = issued_kubeconfig(hub, &dan, &imported.dir, "dan", None).await;
    until_allowed(&dan, &["patch", "deployments", "-n", "shop-a"]).await;
    kubectl_ok(
        &dan,
        &["scale", "deployment", "web", "--replicas=3", "-n", "shop-a"],
    )
    .await;
    let (_, replicas, _) = kubectl(
        sim_admin,
        &[
            "get",
            "deployment",
            "web",
            "-n",
            "shop-a",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    )
    .await;
    assert_eq!(replicas, "3");
    kubectl_ok(&dan, &["get", "pods", "-n", "shop-a"]).await;
    for (refused, what) in [
        (&["get", "secret", "db", "-n", "shop-a"][..], "secrets"),
        (&["get", "secrets", "-n", "shop-a"], "secrets"),
        (
            &["delete", "deployment", "web", "-n", "shop-a"],
            "deployments",
        ),
        (&["get", "deployments", "-n", "lab-a"], "deployments"),
        (
            &["scale", "deployment", "web", "--replicas=3", "-n", "lab-a"],
            "deployments",
        ),
        (&["get", "deployments", "-A"], "deployments"),
    ] {
        let (ok, _, stderr) = kubectl(&dan, refused).await;
        assert!(
            !ok && stderr.contains("forbidden") && stderr.contains(what),
            "{refused:?}: {stderr}"
        );
    }
    let (_, answer, _) = kubectl(
        &dan,
        &[
            "auth",
            "can-i",
            "get",
            "pods",
            "--subresource=log",
            "-n",
            "shop-a",
        ],
    )
    .await;
    assert_eq!(answer.trim(), "yes");

    // In the cluster: one ClusterRole, and one RoleBinding in the project's namespace naming
    // the group; no ClusterRoleBinding grants it.
    let (_, verbs, _) = kubectl(
        sim_admin,
        &[
            "get",
            "clusterrole",
            "drover-role-deployer",
            "-o",
            "jsonpath={.rules[0].verbs}",
        ],
    )
    .await;
    assert!(verbs.contains("patch"), "{verbs}");
    let (_, subjects, _) = kubectl(
        sim_admin,
        &[
            "get",
            "rolebinding",
            "drover-role-deployer",
            "-n",
            "shop-a",
            "-o",
            "jsonpath={.subjects[*].name}",
        ],
    )
    .await;
    assert_eq!(subjects, "ci");
    let (ok, _, _) = kubectl(
        sim_admin,
        &["get", "rolebinding", "drover-role-deployer", "-n", "lab-a"],
    )
    .await;
    assert!(!ok, "the template reached another project's namespace");
    let (_, cluster_wide, _) = kubectl(
        sim_admin,
        &[
            "get",
            "clusterrolebindings",
            "-l",
            "drover.io/sync",
            "-o",
            "jsonpath={.items[*].roleRef.name}",
        ],
    )
    .await;
    assert!(
        !cluster_wide.contains("drover-role-deployer"),
        "{cluster_wide}"
    );

    imported.shutdown.cancel();
    agent.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_to_an_inherited_template_reaches_its_holders_and_a_global_role_reaches_every_cluster()
 {
    let imported = Imported::start("roles-inherit", SimConfig::default()).await;
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let (hub, admin) = (&imported.hub, imported.admin.as_str());
    create(
        hub,
        admin,
        "roletemplates",
        json!({"metadata": {"name": "base"}, "spec": {"context": "cluster",
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}}),
    )
    .await;
    create(hub, admin, "roletemplates", json!({"metadata": {"name": "support"}, "spec": {"context": "cluster",
        "inherits": ["base"], "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list"]}]}})).await;
    let ann = user(&imported, "ann", &[]).await;
    create(
        hub,
        admin,
        "rolebindings",
        json!({"metadata": {"name": "ann-support"},
        "spec": {"user": "ann", "roleTemplate": "support", "cluster": "prod"}}),
    )
    .await;
    let ann = issued_kubeconfig(hub, &ann, &imported.dir, "ann", None).await;
    until_allowed(&ann, &["list", "configmaps", "-A"]).await;
    until_allowed(&ann, &["list", "services", "-A"]).await;
    let (_, events, _) = kubectl(&ann, &["auth", "can-i", "list", "events", "-A"]).await;
    assert_eq!(events.trim(), "no");

    // A rule added to base reaches support's holders; taken out, it goes.
    let rules = |extra: bool| {
        let mut rules =
            vec![json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]})];
        if extra {
            rules.push(json!({"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}));
        }
        json!({"spec": {"rules": rules}})
    };
    let (addr, admin_token) = (hub.addr, imported.admin.clone());
    let patch = |extra: bool| {
        let (body, admin_token) = (rules(extra), admin_token.clone());
        async move {
            let (status, answer) = api(
                addr,
                "PATCH",
                "/v1/roletemplates/base",
                Some(&admin_token),
                Some(body),
            )
            .await;
            assert_eq!(status, 200, "{answer}");
        }
    };
    patch(true).await;
    let granted = until_can(
        &ann,
        &["list", "events", "-A"],
        "yes",
        Duration::from_secs(30),
    )
    .await;
    patch(false).await;
    let revoked = until_can(
        &ann,
        &["list", "events", "-A"],
        "no",
        Duration::from_secs(30),
    )
    .await;
    println!(
        "{}",
        json!({"measure": "template edit to cluster", "granted_ms": granted.as_millis(), "revoked_ms": revoked.as_millis()})
    );

    // A global role with inheritedClusterRoles [read-only] reads every cluster.
    let vic = user(&imported, "vic", &[]).await;
    create(
        hub,
        admin,
        "rolebindings",
        json!({"metadata": {"name": "vic-views"},
        "spec": {"user": "vic", "globalRole": "clusters-view"}}),
    )
    .await;
    let vic = issued_kubeconfig(hub, &vic, &imported.dir, "vic", None).await;
    until_allowed(&vic, &["list", "deployments", "-A"]).await;
    let (_, write, _) = kubectl(
        &vic,
        &["auth", "can-i", "create", "deployments", "-n", "default"],
    )
    .await;
    assert_eq!(write.trim(), "no");
    imported.shutdown.cancel();
    agent.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_are_made_on_the_roles_page_and_a_deployer_sees_its_controls_in_the_explorer() {
    let imported = Imported::start("roles-page", SimConfig::default()).await;
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    shop_and_lab(&imported).await;
    user(&imported, "dan", &[]).await;
    let (hub, admin) = (&imported.hub, imported.admin.as_str());
    let base = hub.url();
    let password = hub.admin_password.clone().unwrap();

    let driver = Driver::start(&imported.dir).await;
    let browser = driver.browser("roles-admin", 1280, 900).await;
    browser.goto(&format!("{base}/login?next=/roles")).await;
    browser.type_into("#username", "admin").await;
    browser.type_into("#password", &password).await;
    browser.click("form#login button[type=submit]").await;
    browser
        .find("table#templates tr[data-name='cluster-owner']")
        .await;
    let listed = browser.text("table#templates").await;
    for builtin in [
        "cluster-member",
        "read-only",
        "project-owner",
        "project-member",
        "project-read-only",
    ] {
        assert!(listed.contains(builtin), "{builtin}: {listed}");
    }
    assert!(
        browser
            .text("table#globalroles")
            .await
            .contains("clusters-view")
    );
    check_and_save_as(&browser, "roles").await;

    // A template from the table: what is ticked becomes its rules.
    browser.type_into("#template-name", "deployer").await;
    browser.type_into("#template-display", "Deployer").await;
    for (resource, verbs) in [
        ("deployments.apps", &["get", "list", "watch", "patch"][..]),
        ("deployments.apps/scale", &["get", "patch"]),
        ("pods", &["get", "list"]),
        ("pods/log", &["get"]),
    ] {
        for verb in verbs {
            browser
                .click(&format!(
                    "#template-rules input[data-resource='{resource}'][value='{verb}']"
                ))
                .await;
        }
    }
    browser
        .click("form#create-template button[type=submit]")
        .await;
    browser
        .find("table#templates tr[data-name='deployer']")
        .await;
    let (_, made) = api(
        hub.addr,
        "GET",
        "/v1/roletemplates/deployer",
        Some(admin),
        None,
    )
    .await;
    assert_eq!(made["spec"]["context"], "project", "{made}");
    assert_eq!(
        made["spec"]["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
        ]),
        "{made}"
    );
    // And one from YAML.
    browser
        .run(
            "const a = document.getElementById('template-yaml'); a.value = a.value.replace('name: deployer', 'name: lister'); return true;",
            json!([]),
        )
        .await;
    browser
        .click("form#create-template-yaml button[type=submit]")
        .await;
    browser.find("table#templates tr[data-name='lister']").await;

    // The cluster page offers it to the project's members.
    browser.goto(&format!("{base}/clusters/prod")).await;
    browser.type_into("#member-project", "shop").await;
    browser.type_into("#member-user", "dan").await;
    browser
        .run(
            "document.getElementById('member-role').value = 'deployer'; return true;",
            json!([]),
        )
        .await;
    browser
        .click("#create-project-member button[type='submit']")
        .await;
    browser
        .until(
            "dan listed as a deployer",
            Duration::from_secs(10),
            "const t = document.querySelector('table#projects'); return t !== null && t.textContent.includes('dan (deployer)');",
        )
        .await;
    let (_, binding) = api(
        hub.addr,
        "GET",
        "/v1/rolebindings/shop-dan",
        Some(admin),
        None,
    )
    .await;
    assert_eq!(binding["spec"]["roleTemplate"], "deployer", "{binding}");
    browser.close().await;

    // dan, in the explorer: Scale on shop-a's web, no Delete; no Secrets.
    let dan_kube = issued_kubeconfig(
        hub,
        &login(hub.addr, "dan", "a long enough password").await,
        &imported.dir,
        "dan",
        None,
    )
    .await;
    until_allowed(&dan_kube, &["patch", "deployments", "-n", "shop-a"]).await;
    let dan = driver.browser("roles-dan", 1280, 900).await;
    dan.goto(&format!(
        "{base}/login?next=/clusters/prod/explorer/deployments.apps/shop-a/web"
    ))
    .await;
    dan.type_into("#username", "dan").await;
    dan.type_into("#password", "a long enough password").await;
    dan.click("form#login button[type=submit]").await;
    dan.until(
        "the object page",
        Duration::from_secs(30),
        "const a = document.getElementById('actions'); return a !== null && a.dataset.ready === 'true';",
    )
    .await;
    assert!(dan.exists("#scale").await, "a deployer may scale");
    assert!(!dan.exists("#delete").await, "a deployer may not delete");
    dan.goto(&format!(
        "{base}/clusters/prod/explorer/secrets?namespace=shop-a"
    ))
    .await;
    dan.until(
        "the secrets list refused",
        Duration::from_secs(30),
        "const e = document.getElementById('list-error'); return e !== null && e.textContent !== '';",
    )
    .await;
    let refused = dan.text("#list-error").await;
    assert!(
        refused.contains("forbidden") || refused.contains("not allowed"),
        "{refused}"
    );
    assert!(
        !dan.exists("#objects tbody tr").await,
        "a deployer sees no secret"
    );
    // The Roles page shows dan the templates, not who holds them, and no way to make one.
    dan.goto(&format!("{base}/roles")).await;
    dan.find("table#templates tr[data-name='deployer']").await;
    assert!(!dan.exists("#create-template").await);
    dan.close().await;
    imported.shutdown.cancel();
    agent.await.unwrap().unwrap();
}
