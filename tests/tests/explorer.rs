//! The cluster explorer in a real headless Chromium, against a hub with an imported cluster
//! of 30,000 pods: the kinds the cluster serves (its CRDs too), lists a page at a time with
//! filters and live updates, one object's YAML edited (and a conflicting edit refused), a
//! delete, a pod's logs followed, a shell, cordon and drain; a read-only user sees no write
//! control and a hand-made write from their session is refused; a project member sees their
//! project's namespaces. Every page is checked for accessibility and saved as a screenshot.
//!
//! The downstream cluster is `sim`'s simulated API server (a stand-in: no real kube-apiserver
//! can be had here); the hub, the cluster-agent, kubectl and the browser are the real ones.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use sim::cluster::SimConfig;
use tests::{
    api,
    browser::{Browser, Driver, check_and_save_as},
    imported::{Imported, issued_kubeconfig, kubectl, kubectl_ok, until_allowed, user_kubeconfig},
    login,
};

const PODS: usize = 30_000;
const WAIT: Duration = Duration::from_secs(30);

/// What the test adds to the simulated cluster: a project's namespace with a deployment, its
/// pod, a configmap and an event about the pod, and the project's second namespace with a
/// configmap; a spare node with two pods to drain.
const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shop
  labels:
    drover.io/project: shop
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  replicas: 1
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: registry.example/web:1
---
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: shop
  labels:
    app: web
spec:
  containers:
  - name: web
    image: registry.example/web:1
  - name: sidecar
    image: registry.example/proxy:1
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: shop
data:
  mode: fast
---
apiVersion: v1
kind: Namespace
metadata:
  name: shop-jobs
  labels:
    drover.io/project: shop
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: orders
  namespace: shop-jobs
data:
  batch: nightly
---
apiVersion: v1
kind: Node
metadata:
  name: spare
  labels:
    kubernetes.io/hostname: spare
spec:
  taints:
  - key: dedicated
    value: batch
    effect: NoSchedule
---
apiVersion: v1
kind: Pod
metadata:
  name: spare-a
  namespace: shop
spec:
  nodeName: spare
  containers:
  - name: main
    image: registry.example/app:1
    resources:
      requests:
        cpu: 250m
        memory: 256Mi
---
apiVersion: v1
kind: Pod
metadata:
  name: spare-b
  namespace: shop
spec:
  nodeName: spare
  containers:
  - name: main
    image: registry.example/app:1
"#;

fn event(name: &str, reason: &str, message: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Event
metadata:
  name: {name}
  namespace: shop
involvedObject:
  kind: Pod
  name: web-0
  namespace: shop
reason: {reason}
message: {message}
type: Normal
"#
    )
}

/// A warning about `shop/spare-b`, as the kubelet would write one.
const WARNING: &str = r#"apiVersion: v1
kind: Event
metadata:
  name: spare-b.backoff
  namespace: shop
involvedObject:
  kind: Pod
  name: spare-b
  namespace: shop
reason: BackOff
message: Back-off restarting failed container main
type: Warning
count: 3
lastTimestamp: "2026-12-01T10:00:00Z"
"#;

/// The sum of `quantities` (kubectl's jsonpath output, space-separated), each a plain number
/// or one with `suffix`, scaled by `scale`.
fn sum_of(quantities: &str, suffix: &str, scale: f64) -> f64 {
    quantities
        .split_whitespace()
        .map(|q| match q.strip_suffix(suffix) {
            Some(n) => n.parse::<f64>().unwrap() * scale,
            None => q.parse::<f64>().unwrap(),
        })
        .sum()
}

/// The cluster's dashboard: what the nodes offer (as kubectl reads them) beside what the pods
/// on them ask for (only `spare-a` asks: 250m and 256Mi), node and deployment health as
/// kubectl counts it, the warning, and the cluster-agent connected at its version. A project
/// member, who may not list the whole cluster, is told so.
async fn cluster_dashboard(
    browser: &Browser<'_>,
    hub: &tests::HubProcess,
    kube: &Path,
    pat_token: &str,
) {
    until(
        browser,
        "the overview",
        "return document.getElementById('overview').dataset.loaded === 'true';",
    )
    .await;
    let jsonpath = |field: &str| format!("jsonpath={{.items[*].{field}}}");
    let cpu = kubectl_ok(
        kube,
        &["get", "nodes", "-o", &jsonpath("status.allocatable.cpu")],
    )
    .await;
    let memory = kubectl_ok(
        kube,
        &["get", "nodes", "-o", &jsonpath("status.allocatable.memory")],
    )
    .await;
    let (cpu, memory) = (sum_of(&cpu, "m", 0.001), sum_of(&memory, "Gi", 1.0));
    let gauges = browser.text("#gauges").await;
    for line in [
        format!("Requested: 0.25 cores of {cpu:.2} cores"),
        format!("Requested: 0.25 GiB of {memory:.2} GiB"),
        format!("Limits: 0.00 cores of {cpu:.2} cores"),
    ] {
        assert!(gauges.contains(&line), "{line:?} in {gauges}");
    }
    let ready = kubectl_ok(
        kube,
        &["get", "nodes", "-o", r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#],
    )
    .await;
    let nodes = ready.lines().count();
    let ready = ready.lines().filter(|l| *l == "True").count();
    let replicas = kubectl_ok(
        kube,
        &[
            "get",
            "deployments",
            "-A",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.replicas} {.status.availableReplicas}{"\n"}{end}"#,
        ],
    )
    .await;
    let deployments = replicas.lines().count();
    let available = replicas
        .lines()
        .filter(|l| {
            let mut parts = l.split(' ');
            let (want, have) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            have.parse::<u64>().unwrap_or(0) >= want.parse::<u64>().unwrap_or(1)
        })
        .count();
    let health = browser.text("#health").await;
    for fact in [
        format!("{ready} of {nodes} ready"),
        format!("{available} of {deployments} available"),
    ] {
        assert!(health.contains(&fact), "{fact:?} in {health}");
    }
    let warnings = browser.text("#warnings tbody").await;
    assert!(
        warnings.contains("Pod spare-b")
            && warnings.contains("BackOff")
            && warnings.contains("Back-off restarting failed container main"),
        "{warnings}"
    );
    let agent = browser.text("#agents tr[data-agent='cluster-agent']").await;
    assert!(
        agent.contains("connected") && agent.contains(env!("CARGO_PKG_VERSION")),
        "{agent}"
    );
    check_and_save_as(browser, "explorer-dashboard").await;
    let (status, body) = api(
        hub.addr,
        "GET",
        "/v1/clusters/prod/overview",
        Some(pat_token),
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("may not list nodes"),
        "{body}"
    );
}

async fn apply(kubeconfig: &Path, dir: &Path, name: &str, yaml: &str) {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    kubectl_ok(kubeconfig, &["apply", "-f", file.to_str().unwrap()]).await;
}

async fn log_in(browser: &Browser<'_>, base: &str, user: &str, password: &str, next: &str) {
    browser.goto(&format!("{base}/login?next={next}")).await;
    browser.type_into("#username", user).await;
    browser.type_into("#password", password).await;
    browser.click("form#login button[type=submit]").await;
}

/// The text of every row's first cell (the object's name) on the list page.
async fn names(browser: &Browser<'_>) -> Vec<String> {
    let names = browser
        .run(
            "return Array.from(document.querySelectorAll('#objects tbody tr')).map((r) => r.dataset.name);",
            json!([]),
        )
        .await;
    serde_json::from_value(names).unwrap()
}

/// Waits up to [`WAIT`] for `script` (a function body) to return true on the page.
async fn until(browser: &Browser<'_>, what: &str, script: &str) {
    browser.until(what, WAIT, script).await;
}

/// Waits until the list page has drawn a page (or said why not); `data-shown` on the list is
/// the query whose page is drawn.
async fn listed(browser: &Browser<'_>) {
    until(browser, "the list", "const l = document.getElementById('list'), e = document.getElementById('list-error'); return (l !== null && l.dataset.shown !== undefined) || (e !== null && e.textContent !== '');").await;
}

/// Waits until the list page has decided which controls to show.
async fn controls_decided(browser: &Browser<'_>) {
    until(browser, "the list's controls", "const l = document.getElementById('list'); return l !== null && l.dataset.ready === 'true';").await;
}

/// Waits until the object page has read the object and decided which controls to show.
async fn settled(browser: &Browser<'_>) {
    until(browser, "the object page", "const a = document.getElementById('actions'), e = document.getElementById('object-error'); return (a !== null && a.dataset.ready === 'true') || (e !== null && e.textContent !== '');").await;
    assert_eq!(browser.text("#object-error").await, "");
}

/// The replicas deployment `shop/web` asks for, as kubectl reads them.
async fn web_replicas(kube: &Path) -> String {
    web_field(kube, ".spec.replicas").await
}

/// A field of deployment `shop/web` (a kubectl JSONPath), as kubectl reads it.
async fn web_field(kube: &Path, path: &str) -> String {
    let jsonpath = format!("jsonpath={{{path}}}");
    kubectl_ok(
        kube,
        &["get", "deployment", "web", "-n", "shop", "-o", &jsonpath],
    )
    .await
}

/// Says yes to the page's next confirms, keeping each question in `sessionStorage` (it
/// outlives the navigation a confirmed delete makes).
async fn accept_confirms(browser: &Browser<'_>) {
    browser
        .run(
            "window.confirm = (m) => { sessionStorage.setItem('confirmed', m); return true; }; return true;",
            json!([]),
        )
        .await;
}

/// What a `fetch` from the page (the user's session, the hub's own origin) answers.
async fn fetch_from_page(browser: &Browser<'_>, method: &str, path: &str, body: &str) -> Value {
    browser
        .run(
            "window.fetched = null; fetch(arguments[1], {method: arguments[0], headers: {'Content-Type': 'application/json'}, body: arguments[2] || undefined}).then(async (r) => { window.fetched = {status: r.status, body: await r.text()}; }); return true;",
            json!([method, path, body]),
        )
        .await;
    browser
        .until("the page's fetch", WAIT, "return window.fetched !== null;")
        .await;
    browser.run("return window.fetched;", json!([])).await
}

/// What the terminal on the shell page shows, line by line.
async fn terminal_lines(browser: &Browser<'_>) -> Vec<String> {
    let lines = browser
        .run(
            "return Array.from(document.querySelectorAll('#terminal .xterm-rows > div')).map((d) => d.textContent.replace(/\\u00a0/g, ' ').trimEnd());",
            json!([]),
        )
        .await;
    serde_json::from_value(lines).unwrap()
}

/// Types `text` into the terminal (xterm reads keys from its helper textarea).
async fn type_in_terminal(browser: &Browser<'_>, text: &str) {
    browser.type_into("#terminal textarea", text).await;
}

async fn until_terminal_shows(browser: &Browser<'_>, what: &str, line: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let lines = terminal_lines(browser).await;
        if lines.iter().any(|l| l == line) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: no line {line:?} in {lines:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every shell session through the hub is recorded: the dashboard's (the admin's, above) and a
/// project member's `kubectl exec`, over WebSocket and over SPDY. An admin lists them and replays one in the dashboard; the
/// member may not list them.
async fn recorded_sessions(
    hub: &tests::HubProcess,
    admin: &str,
    pat: &Path,
    pat_token: &str,
    browser: &Browser<'_>,
    base: &str,
) {
    let said = kubectl_ok(
        pat,
        &[
            "exec",
            "web-0",
            "-n",
            "shop",
            "--",
            "echo",
            "recorded-by-kubectl",
        ],
    )
    .await;
    assert_eq!(said.trim(), "recorded-by-kubectl");
    // kubectl before 1.31 speaks SPDY/3.1 (1.32 when told to): recorded as well.
    let out = tokio::process::Command::new("kubectl")
        .args([
            "exec",
            "web-0",
            "-n",
            "shop",
            "--",
            "echo",
            "recorded-over-spdy",
        ])
        .env("KUBECONFIG", pat)
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "recorded-over-spdy\n");
    // The three sessions have ended; their recordings are written as they end.
    let deadline = tokio::time::Instant::now() + WAIT;
    let sessions = loop {
        let (status, list) = api(hub.addr, "GET", "/v1/recordings", Some(admin), None).await;
        assert_eq!(status, 200, "{list}");
        let items = list["items"].as_array().unwrap().clone();
        if items.len() == 3 && items.iter().all(|s| s["endedAt"].is_string()) {
            break items;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "three ended sessions: {list:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by = |user: &str, protocol: &str| {
        sessions
            .iter()
            .find(|s| s["user"] == user && s["protocol"].as_str().unwrap().starts_with(protocol))
            .unwrap_or_else(|| panic!("{user}'s {protocol} session in {sessions:#?}"))
            .clone()
    };
    let (mine, theirs, spdy) = (by("admin", ""), by("pat", "v5."), by("pat", "SPDY"));
    assert_eq!(
        (
            &mine["cluster"],
            &mine["namespace"],
            &mine["pod"],
            &mine["container"]
        ),
        (
            &json!("prod"),
            &json!("shop"),
            &json!("web-0"),
            &json!("web")
        )
    );
    assert_eq!(mine["command"], json!(["sh"]));
    assert_eq!(theirs["command"], json!(["echo", "recorded-by-kubectl"]));
    assert_eq!(theirs["protocol"], "v5.channel.k8s.io", "{theirs}");
    assert!(theirs["groups"].as_array().is_some());
    assert_eq!(spdy["command"], json!(["echo", "recorded-over-spdy"]));
    assert_eq!(spdy["protocol"], "SPDY/3.1 v4.channel.k8s.io", "{spdy}");
    assert!(spdy.get("notRecorded").is_none(), "{spdy}");
    for session in [&mine, &theirs, &spdy] {
        assert_eq!(session["inputRecorded"], false);
        // Tied to the audit record of the request that opened it.
        let user = session["user"].as_str().unwrap();
        let (status, audit) = api(
            hub.addr,
            "GET",
            &format!("/v1/audit?user={user}"),
            Some(admin),
            None,
        )
        .await;
        assert_eq!(status, 200, "{audit}");
        let opened = audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["requestId"] == session["auditId"])
            .unwrap_or_else(|| panic!("no audit record {} in {audit:#}", session["auditId"]));
        assert_eq!(
            opened["path"],
            "/k8s/clusters/prod/api/v1/namespaces/shop/pods/web-0/exec"
        );
        assert_eq!(opened["code"], 101);
    }
    // The recordings: asciicast v2, what the container wrote, nothing typed (input is off).
    let cast = |id: &str| {
        let id = id.to_owned();
        async move {
            let (status, bytes) =
                tests::https_get_as(hub.addr, &format!("/v1/recordings/{id}/cast"), Some(admin))
                    .await;
            assert_eq!(status, 200);
            let text = String::from_utf8(bytes.to_vec()).unwrap();
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        }
    };
    let lines = cast(mine["id"].as_str().unwrap()).await;
    assert_eq!(lines[0]["version"], 2);
    let output: String = lines[1..]
        .iter()
        .filter(|e| e[1] == "o")
        .map(|e| e[2].as_str().unwrap())
        .collect();
    assert!(output.contains("hello-from-the-explorer"), "{output}");
    assert!(lines[1..].iter().all(|e| e[1] != "i"), "input was recorded");
    assert!(
        lines[1..].iter().any(|e| e[1] == "r"),
        "no resize in {lines:?}"
    );
    for (session, said) in [
        (&theirs, "recorded-by-kubectl"),
        (&spdy, "recorded-over-spdy"),
    ] {
        let lines = cast(session["id"].as_str().unwrap()).await;
        assert!(
            lines[1..]
                .iter()
                .any(|e| e[1] == "o" && e[2].as_str().unwrap().contains(said)),
            "{lines:?}"
        );
    }
    // A member may neither list nor read them.
    for path in [
        "/v1/recordings".to_owned(),
        format!("/v1/recordings/{}", theirs["id"].as_str().unwrap()),
    ] {
        let (status, body) = api(hub.addr, "GET", &path, Some(pat_token), None).await;
        assert_eq!(status, 403, "{path}: {body}");
    }

    // The admin replays their session in the dashboard.
    browser.goto(&format!("{base}/recordings")).await;
    browser.find("#recordings tbody tr").await;
    check_and_save_as(browser, "recordings").await;
    browser
        .click(&format!(
            "#recordings a[href='/recordings/{}']",
            mine["id"].as_str().unwrap()
        ))
        .await;
    until(
        browser,
        "the recording loaded",
        "return document.getElementById('replay').dataset.loaded === 'true';",
    )
    .await;
    browser
        .run(
            "document.getElementById('speed').value = '0'; return true;",
            json!([]),
        )
        .await;
    browser.click("#play").await;
    until_terminal_shows(browser, "the replayed output", "hello-from-the-explorer").await;
    check_and_save_as(browser, "recording-replay").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_explore_and_act_on_a_cluster_in_a_browser() {
    let imported = Imported::start(
        "explorer",
        SimConfig {
            nodes: 3,
            pods: PODS,
            ..SimConfig::default()
        },
    )
    .await;
    let (hub, admin, dir) = (&imported.hub, imported.admin.clone(), imported.dir.clone());
    let base = hub.url();
    let config =
        cluster_agent::Config::from_env(&imported.agent_env("drover-cluster-agent-0").await)
            .unwrap();
    tokio::spawn(cluster_agent::run(config, imported.shutdown.child_token()));
    let kube = imported.sim_admin.clone();
    apply(&kube, &dir, "objects", OBJECTS).await;
    apply(
        &kube,
        &dir,
        "event-1",
        &event("web-0.1", "Pulled", "pulled the image"),
    )
    .await;

    // People: an admin (the bootstrap one), a read-only user of the cluster, and a member of
    // the project `shop`.
    let viewer = user_kubeconfig(hub, &admin, &dir, "viewer", Some("read-only")).await;
    for (path, object) in [
        (
            "/v1/projects",
            json!({"metadata": {"name": "shop"}, "spec": {"cluster": "prod"}}),
        ),
        (
            "/v1/users",
            json!({"metadata": {"name": "pat"}, "spec": {"password": "a long enough password"}}),
        ),
        (
            "/v1/rolebindings",
            json!({"metadata": {"name": "shop-pat"}, "spec": {"user": "pat", "role": "project-member", "cluster": "prod", "project": "shop"}}),
        ),
    ] {
        let (status, body) = api(hub.addr, "POST", path, Some(&admin), Some(object)).await;
        assert_eq!(status, 201, "{path}: {body}");
    }
    let pat_token = login(hub.addr, "pat", "a long enough password").await;
    let pat = issued_kubeconfig(hub, &pat_token, &dir, "pat", None).await;
    // The cluster-agent has written the hub's roles into the cluster's RBAC.
    until_allowed(&viewer, &["list", "pods", "--all-namespaces"]).await;
    until_allowed(&pat, &["create", "configmaps", "-n", "shop"]).await;
    until_allowed(&pat, &["delete", "configmaps", "-n", "shop-jobs"]).await;

    let driver = Driver::start(&dir).await;
    let browser = driver.browser("explorer-admin", 1280, 900).await;
    let password = hub.admin_password.clone().unwrap();
    apply(&kube, &dir, "warning", WARNING).await;
    // The cluster-agent's version comes with its first facts, a moment after it connects.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, cluster) = api(hub.addr, "GET", "/v1/clusters/prod", Some(&admin), None).await;
        if cluster["status"]["agentVersion"] == env!("CARGO_PKG_VERSION") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no agent version in {cluster:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    log_in(&browser, &base, "admin", &password, "/clusters/prod").await;
    browser.click("#explore").await;
    cluster_dashboard(&browser, hub, &kube, &pat_token).await;

    // Beside the dashboard, the kinds the cluster serves, grouped, with counts; K3s's CRDs among
    // the custom kinds.
    until(&browser, "the pods' count", "const c = document.querySelector('span.count[data-resource=\"pods\"]'); return c !== null && /^\\d+$/.test(c.textContent);").await;
    let section = |name: &str| {
        format!(
            "return Array.from(document.querySelectorAll('section[aria-label=\"{name}\"] li')).map((li) => li.dataset.resource);"
        )
    };
    let workloads = browser.run(&section("Workloads"), json!([])).await;
    assert!(
        workloads.as_array().unwrap().contains(&json!("pods"))
            && workloads
                .as_array()
                .unwrap()
                .contains(&json!("deployments.apps")),
        "{workloads}"
    );
    let custom = browser.run(&section("Custom"), json!([])).await;
    assert!(
        custom
            .as_array()
            .unwrap()
            .contains(&json!("helmcharts.helm.cattle.io")),
        "{custom}"
    );
    // 30,000 load pods, web-0, spare-a and spare-b.
    let pod_count = browser.text("span.count[data-resource='pods']").await;
    assert_eq!(pod_count, (PODS + 3).to_string());
    check_and_save_as(&browser, "explorer-kinds").await;

    // Pods across namespaces, a page at a time: the first page, then the next.
    let opened = std::time::Instant::now();
    browser
        .goto(&format!("{base}/clusters/prod/explorer/pods"))
        .await;
    listed(&browser).await;
    eprintln!(
        "the pods list (first page of {} pods) drawn {:?} after navigating to it",
        PODS + 3,
        opened.elapsed()
    );
    let first = names(&browser).await;
    assert_eq!(first.len(), 100);
    assert_eq!(
        browser.text("#page-info").await,
        format!("1–100 of {}", PODS + 3)
    );
    let headings = browser.text("#objects thead").await;
    for column in ["Namespace", "Name", "Ready", "Status", "Restarts", "Age"] {
        assert!(headings.contains(column), "{headings}");
    }
    check_and_save_as(&browser, "explorer-pods").await;
    browser.click("#next").await;
    until(
        &browser,
        "the second page",
        "return document.getElementById('page-info').textContent.startsWith('101–200');",
    )
    .await;
    let second = names(&browser).await;
    assert_eq!(second.len(), 100);
    assert!(second.iter().all(|n| !first.contains(n)), "{second:?}");
    browser.click("#prev").await;
    until(
        &browser,
        "back to the first page",
        "return document.getElementById('page-info').textContent.startsWith('1–100');",
    )
    .await;
    assert_eq!(names(&browser).await, first);

    // Filtered by label (server-side) and by name.
    browser.type_into("#selector", "app=app-7").await;
    browser.click("#list-filters button[type=submit]").await;
    until(&browser, "the label filter", "return new URLSearchParams(document.getElementById('list').dataset.shown).get('labelSelector') === 'app=app-7';").await;
    let labelled = names(&browser).await;
    // The load pods' label is app-(i % 100): pod-7, pod-107, …
    assert!(
        labelled
            .iter()
            .all(|n| n.strip_prefix("pod-").unwrap().parse::<usize>().unwrap() % 100 == 7),
        "{labelled:?}"
    );
    browser
        .goto(&format!("{base}/clusters/prod/explorer/pods?name=pod-2999"))
        .await;
    until(
        &browser,
        "the name filter",
        "return document.querySelectorAll('#objects tbody tr').length === 11;",
    )
    .await;
    let mut matching = names(&browser).await;
    matching.sort();
    let mut expected: Vec<String> = std::iter::once("pod-2999".to_owned())
        .chain((29_990..30_000).map(|i| format!("pod-{i}")))
        .collect();
    expected.sort();
    assert_eq!(matching, expected);

    // Sorting orders the whole list, across namespaces and pages: by name with numbers in
    // order (pod-1 lives in load-1, pod-0 in load-0), then the other way (web-0 is in `shop`,
    // the last namespace the API server lists).
    browser
        .goto(&format!("{base}/clusters/prod/explorer/pods"))
        .await;
    listed(&browser).await;
    browser.click("button.sort[data-sort='0']").await;
    until(
        &browser,
        "sorted by name",
        "return document.getElementById('list-status').textContent.includes('sorted by Name (ascending)');",
    )
    .await;
    assert_eq!(names(&browser).await[..3], ["pod-0", "pod-1", "pod-2"]);
    assert_eq!(
        browser.text("#page-info").await,
        format!("1–100 of {}", PODS + 3)
    );
    browser.click("button.sort[data-sort='0']").await;
    until(
        &browser,
        "sorted by name, descending",
        "return document.getElementById('list-status').textContent.includes('sorted by Name (descending)');",
    )
    .await;
    assert_eq!(names(&browser).await[..3], ["web-0", "spare-b", "spare-a"]);
    browser.click("#next").await;
    until(
        &browser,
        "the sorted list's second page",
        "return document.getElementById('page-info').textContent.startsWith('101–200');",
    )
    .await;
    // The first page held web-0, spare-b, spare-a and pod-29999 down to pod-29903.
    assert_eq!(names(&browser).await[0], "pod-29902");

    // Pods are a kind the cluster-agent caches: the count, the pages, the filters and the
    // sorts above were answered from its cache. The cluster's API server was asked to watch
    // pods for the user (live rows) but never to list them.
    let source = browser
        .run(
            "return document.getElementById('list').dataset.source;",
            json!([]),
        )
        .await;
    assert_eq!(source, "cache");
    let pod_lists: Vec<String> = imported
        .sim
        .audit()
        .into_iter()
        .filter(|e| {
            e.impersonated_by.is_some()
                && e.method == "GET"
                && (e.path == "/api/v1/pods"
                    || (e.path.starts_with("/api/v1/namespaces/") && e.path.ends_with("/pods")))
                && !e
                    .query
                    .split('&')
                    .any(|p| p == "watch=1" || p == "watch=true")
        })
        .map(|e| format!("{} {}?{} as {}", e.method, e.path, e.query, e.user))
        .collect();
    assert!(pod_lists.is_empty(), "{pod_lists:?}");

    // The deployments of `shop`: a change made elsewhere shows in the list without a reload.
    browser
        .goto(&format!(
            "{base}/clusters/prod/explorer/deployments.apps?namespace=shop"
        ))
        .await;
    listed(&browser).await;
    assert_eq!(names(&browser).await, ["web"]);
    browser.run("window.notReloaded = true;", json!([])).await;
    kubectl_ok(
        &kube,
        &["scale", "deployment", "web", "-n", "shop", "--replicas=3"],
    )
    .await;
    until(&browser, "the scaled deployment, live", "const row = document.querySelector('#objects tr[data-name=\"web\"]'); return window.notReloaded === true && row !== null && row.textContent.includes('/3');").await;
    check_and_save_as(&browser, "explorer-deployments").await;
    // The row's own Scale and Restart, as kubectl sees them.
    controls_decided(&browser).await;
    browser
        .run("window.prompt = () => '4'; return true;", json!([]))
        .await;
    let open_menu = "#objects summary[aria-label='Actions for Deployment shop/web']";
    browser.click(open_menu).await;
    check_and_save_as(&browser, "explorer-row-menu").await;
    browser
        .click("#objects button[aria-label='Scale Deployment shop/web']")
        .await;
    until(&browser, "scaled from its row", "const row = document.querySelector('#objects tr[data-name=\"web\"]'); return row !== null && row.textContent.includes('/4');").await;
    assert_eq!(web_replicas(&kube).await, "4");
    accept_confirms(&browser).await;
    browser.click(open_menu).await;
    browser
        .click("#objects button[aria-label='Restart Deployment shop/web']")
        .await;
    until(
        &browser,
        "restarted from its row",
        "return document.getElementById('list-status').textContent.startsWith('Restart of Deployment shop/web requested');",
    )
    .await;
    let restarted = web_field(
        &kube,
        ".spec.template.metadata.annotations.kubectl\\.kubernetes\\.io/restartedAt",
    )
    .await;
    assert!(restarted.ends_with('Z'), "{restarted:?}");

    // The kinds are beside the list, this one marked, with counts; the namespace chosen stays
    // for the next list opened.
    until(&browser, "the kinds beside the list", "const a = document.querySelector('#kinds-nav a[aria-current=\"page\"]'); const c = document.querySelector('#kinds-nav span.count[data-resource=\"deployments.apps\"]'); return a !== null && a.textContent === 'Deployment' && c !== null && /^\\d+$/.test(c.textContent);").await;
    browser
        .click("#kinds-nav a[href='/clusters/prod/explorer/pods']")
        .await;
    listed(&browser).await;
    assert_eq!(
        browser
            .run(
                "return document.getElementById('namespace').value;",
                json!([])
            )
            .await,
        "shop"
    );
    let mut shown = names(&browser).await;
    shown.sort();
    assert_eq!(shown, ["spare-a", "spare-b", "web-0"]);
    // kubectl's wide columns: a pod's node and IP.
    let seen = browser
        .run(
            "const heads = Array.from(document.querySelectorAll('#objects thead th')).map((th) => th.textContent); const row = document.querySelector('#objects tr[data-name=\"spare-a\"]'); return [heads, Array.from(row.cells).map((c) => c.textContent)];",
            json!([]),
        )
        .await;
    let heads: Vec<String> = serde_json::from_value(seen[0].clone()).unwrap();
    for wide in ["IP", "Node", "Nominated Node"] {
        assert!(heads.iter().any(|h| h == wide), "{heads:?}");
    }
    let node = heads.iter().position(|h| h == "Node").unwrap();
    assert_eq!(seen[1][node], "spare", "{seen}");
    check_and_save_as(&browser, "explorer-pods-wide").await;

    // Several objects deleted at once, after one confirmation naming them all.
    for doomed in ["doomed-1", "doomed-2"] {
        kubectl_ok(&kube, &["create", "configmap", doomed, "-n", "shop"]).await;
    }
    browser
        .goto(&format!(
            "{base}/clusters/prod/explorer/configmaps?namespace=shop"
        ))
        .await;
    listed(&browser).await;
    browser.find("#objects td.row-actions").await;
    for doomed in ["doomed-1", "doomed-2"] {
        browser
            .click(&format!("#objects tr[data-name='{doomed}'] input.select"))
            .await;
    }
    assert_eq!(browser.text("#delete-selected").await, "Delete 2 selected");
    accept_confirms(&browser).await;
    browser.click("#delete-selected").await;
    until(
        &browser,
        "two deleted",
        "return document.getElementById('list-status').textContent.startsWith('Deleted 2 of 2');",
    )
    .await;
    let asked = browser
        .run("return sessionStorage.getItem('confirmed');", json!([]))
        .await;
    let asked = asked.as_str().unwrap();
    assert!(
        asked.contains("shop/doomed-1") && asked.contains("shop/doomed-2"),
        "{asked}"
    );
    let left = kubectl_ok(&kube, &["get", "configmaps", "-n", "shop", "-o", "name"]).await;
    assert!(!left.contains("doomed"), "{left}");
    until(
        &browser,
        "the rows gone, live",
        "return document.querySelector('#objects tr[data-name=\"doomed-1\"]') === null;",
    )
    .await;
    check_and_save_as(&browser, "explorer-deleted-several").await;
    browser
        .goto(&format!(
            "{base}/clusters/prod/explorer/deployments.apps?namespace=shop"
        ))
        .await;
    listed(&browser).await;

    // The deployment's page: its summary and YAML; edit the YAML (replicas) and save.
    browser.click("#objects a[href$='/shop/web']").await;
    settled(&browser).await;
    let facts = browser.text("#facts").await;
    assert!(
        facts.contains("Deployment (apps/v1)") && facts.contains("of 4 wanted"),
        "{facts}"
    );
    assert!(browser.text("#owned").await.contains("Pod web-0"));
    // The YAML is coloured: keys, and values by what they are.
    let coloured = |class: &str| {
        format!(
            "return Array.from(document.querySelectorAll('#yaml-highlight .{class}')).map((s) => s.textContent);"
        )
    };
    let keys = browser.run(&coloured("yaml-key"), json!([])).await;
    assert!(
        keys.as_array().unwrap().contains(&json!("apiVersion")),
        "{keys}"
    );
    let numbers = browser.run(&coloured("yaml-number"), json!([])).await;
    assert!(
        numbers.as_array().unwrap().contains(&json!("4")),
        "{numbers}"
    );
    browser.click("#edit").await;
    browser
        .run(
            "const a = document.getElementById('yaml'); a.value = a.value.replace(/replicas: 4/, 'replicas: 2'); a.dispatchEvent(new Event('input')); return true;",
            json!([]),
        )
        .await;
    // What is typed is coloured too.
    until(
        &browser,
        "the edit coloured",
        "const h = document.getElementById('yaml-highlight'); return h.textContent === document.getElementById('yaml').value + '\\n' && Array.from(h.querySelectorAll('.yaml-number')).some((s) => s.textContent === '2');",
    )
    .await;
    // Save first shows what changes, and saves only when confirmed.
    browser.click("#save").await;
    browser.find("#yaml-confirm:not([hidden])").await;
    let removed = browser.text("#yaml-diff .removed").await;
    let added = browser.text("#yaml-diff .added").await;
    assert!(
        removed.starts_with('-') && removed.contains("replicas: 4"),
        "{removed}"
    );
    assert!(
        added.starts_with('+') && added.contains("replicas: 2"),
        "{added}"
    );
    check_and_save_as(&browser, "explorer-deployment-diff").await;
    assert_eq!(
        web_replicas(&kube).await,
        "4",
        "nothing saved before confirming"
    );
    browser.click("#save-confirm").await;
    until(
        &browser,
        "the saved YAML",
        "return document.getElementById('yaml-status').textContent.startsWith('Saved');",
    )
    .await;
    let replicas = web_replicas(&kube).await;
    assert_eq!(replicas, "2");
    // The summary and the scale box follow the object, without a reload.
    let agree = |wanted: &str| {
        format!(
            "return document.getElementById('facts').textContent.includes('of {wanted} wanted') && document.getElementById('replicas').value === '{wanted}';"
        )
    };
    until(&browser, "the summary after saving", &agree("2")).await;
    check_and_save_as(&browser, "explorer-deployment").await;

    // A conflicting edit: someone changes the object after the page read it; saving is
    // refused with a clear message, and their change stands.
    browser.click("#edit").await;
    kubectl_ok(
        &kube,
        &["scale", "deployment", "web", "-n", "shop", "--replicas=5"],
    )
    .await;
    browser
        .run(
            "const a = document.getElementById('yaml'); a.value = a.value.replace(/replicas: 2/, 'replicas: 9'); return true;",
            json!([]),
        )
        .await;
    // Their change shows in the summary at once, and the editor is told.
    until(&browser, "someone else's change, live", &agree("5")).await;
    assert!(
        browser
            .text("#yaml-status")
            .await
            .contains("changed since you began editing")
    );
    browser.click("#save").await;
    browser.click("#save-confirm").await;
    until(&browser, "the conflict", "return document.getElementById('yaml-error').textContent.includes('changed by someone else');").await;
    let error = browser.text("#yaml-error").await;
    assert!(error.contains("Conflict"), "{error}");
    let replicas = web_replicas(&kube).await;
    assert_eq!(replicas, "5", "the conflicting edit overwrote nothing");
    check_and_save_as(&browser, "explorer-conflict").await;

    // Scale and restart from the page.
    browser
        .goto(&format!(
            "{base}/clusters/prod/explorer/deployments.apps/shop/web"
        ))
        .await;
    settled(&browser).await;
    browser
        .run(
            "document.getElementById('replicas').value = '3'; return true;",
            json!([]),
        )
        .await;
    browser.click("#scale").await;
    until(
        &browser,
        "scaled",
        "return document.getElementById('action-status').textContent.includes('Scaled to 3');",
    )
    .await;
    until(&browser, "the summary after scaling", &agree("3")).await;
    browser.click("#restart").await;
    until(&browser, "restarted", "return document.getElementById('action-status').textContent.includes('Restart requested');").await;
    let deployment: Value = serde_json::from_str(
        &kubectl_ok(
            &kube,
            &["get", "deployment", "web", "-n", "shop", "-o", "json"],
        )
        .await,
    )
    .unwrap();
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert!(
        deployment["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
            .is_string(),
        "{deployment}"
    );

    // Delete a configmap: the confirm names it; kubectl no longer finds it.
    browser
        .goto(&format!(
            "{base}/clusters/prod/explorer/configmaps/shop/settings"
        ))
        .await;
    settled(&browser).await;
    accept_confirms(&browser).await;
    browser.click("#delete").await;
    until(
        &browser,
        "back on the configmaps list",
        "return location.pathname.endsWith('/explorer/configmaps');",
    )
    .await;
    let (found, _, stderr) = kubectl(&kube, &["get", "configmap", "settings", "-n", "shop"]).await;
    assert!(!found && stderr.contains("NotFound"), "{stderr}");
    assert_eq!(
        browser
            .run("return sessionStorage.getItem('confirmed');", json!([]))
            .await,
        "Delete ConfigMap shop/settings? This cannot be undone."
    );
    // Whoever may create configmaps is offered to (a reader, below, is not).
    controls_decided(&browser).await;
    // Create from YAML: a body that is not an object is refused with the cluster's reason;
    // a good one is created where its YAML says, and its page opens.
    browser.click("#create-open").await;
    let set_yaml = "document.getElementById('create-yaml').value = arguments[0]; return true;";
    browser.run(set_yaml, json!(["just: [a broken"])).await;
    browser.click("#create-submit").await;
    until(
        &browser,
        "the refused create",
        "return document.getElementById('create-error').textContent !== '';",
    )
    .await;
    browser
        .run(
            set_yaml,
            json!(["apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: created\n  namespace: shop\ndata:\n  made: here\n"]),
        )
        .await;
    browser.click("#create-submit").await;
    until(
        &browser,
        "the new object's page",
        "return location.pathname.endsWith('/explorer/configmaps/shop/created');",
    )
    .await;
    let made = kubectl_ok(
        &kube,
        &[
            "get",
            "configmap",
            "created",
            "-n",
            "shop",
            "-o",
            "jsonpath={.data.made}",
        ],
    )
    .await;
    assert_eq!(made, "here");

    // A pod's logs, followed: new lines arrive.
    browser
        .goto(&format!("{base}/clusters/prod/explorer/pods/shop/web-0"))
        .await;
    settled(&browser).await;
    browser.click("#logs-link").await;
    until(
        &browser,
        "log lines",
        "return document.getElementById('log').textContent.includes('from web-0/web');",
    )
    .await;
    let lines = |text: &Value| text.as_str().unwrap().lines().count();
    let before = lines(
        &browser
            .run(
                "return document.getElementById('log').textContent;",
                json!([]),
            )
            .await,
    );
    until(
        &browser,
        "more log lines, live",
        &format!(
            "return document.getElementById('log').textContent.split('\\n').length > {} + 3;",
            before + 1
        ),
    )
    .await;
    check_and_save_as(&browser, "explorer-logs").await;
    browser.click("#download").await;
    until(
        &browser,
        "the log's download",
        "const a = document.getElementById('log-download'); return a !== null && a.href.startsWith('blob:') && a.download === 'web-0-web.log';",
    )
    .await;
    // Another container, the last lines only, with timestamps, not followed: it ends, and
    // says so.
    browser
        .run(
            "document.getElementById('container').value = 'sidecar'; document.getElementById('follow').checked = false; document.getElementById('timestamps').checked = true; document.getElementById('tail').value = '5'; return true;",
            json!([]),
        )
        .await;
    browser.click("#log-options button[type=submit]").await;
    until(
        &browser,
        "the end of the log",
        "return document.getElementById('log-status').textContent === 'End of the log.';",
    )
    .await;
    let log = browser
        .run(
            "return document.getElementById('log').textContent;",
            json!([]),
        )
        .await;
    let log = log.as_str().unwrap();
    assert_eq!(log.lines().count(), 5, "{log}");
    assert!(
        log.lines()
            .all(|l| l.contains("Z log line") && l.ends_with("from web-0/sidecar")),
        "{log}"
    );
    // `previous` of a container that never restarted: the cluster's own answer.
    browser
        .run(
            "document.getElementById('previous').checked = true; return true;",
            json!([]),
        )
        .await;
    browser.click("#log-options button[type=submit]").await;
    until(&browser, "the previous container's answer", "return document.getElementById('log-error').textContent.includes('previous terminated container');").await;

    // A shell in the pod: a real terminal over a WebSocket through the hub.
    browser
        .goto(&format!(
            "{base}/clusters/prod/explorer/pods/shop/web-0/shell"
        ))
        .await;
    until(
        &browser,
        "the shell",
        "return document.getElementById('shell').dataset.connected === 'true';",
    )
    .await;
    until_terminal_shows(&browser, "the prompt", "/ #").await;
    type_in_terminal(&browser, "echo hello-from-the-explorer\n").await;
    until_terminal_shows(&browser, "echo's output", "hello-from-the-explorer").await;
    type_in_terminal(&browser, "stty size\n").await;
    let before_resize = {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let lines = terminal_lines(&browser).await;
            if let Some(answer) = lines.iter().find(|l| {
                l.split(' ').count() == 2 && l.split(' ').all(|w| w.parse::<u16>().is_ok())
            }) {
                break answer.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no stty size answer in {lines:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    check_and_save_as(&browser, "explorer-shell").await;
    // A narrower window: the terminal fits itself and tells the container its new size.
    browser.resize(900, 900).await;
    type_in_terminal(&browser, "clear\nstty size\n").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let lines = terminal_lines(&browser).await;
        let answers: Vec<&String> = lines
            .iter()
            .filter(|l| l.split(' ').count() == 2 && l.split(' ').all(|w| w.parse::<u16>().is_ok()))
            .collect();
        if answers.iter().any(|a| **a != before_resize) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the terminal's size did not change from {before_resize}: {lines:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    browser.resize(1280, 900).await;
    // Leaving the page ends the stream.
    assert_eq!(imported.sim.open_exec_sessions(), 1);
    browser
        .goto(&format!("{base}/clusters/prod/explorer"))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while imported.sim.open_exec_sessions() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the shell outlived its page"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    recorded_sessions(hub, &admin, &pat, &pat_token, &browser, &base).await;

    // Cordon a node: kubectl sees it unschedulable. Drain the spare node: its pods go.
    browser
        .goto(&format!("{base}/clusters/prod/explorer/nodes/node-1"))
        .await;
    settled(&browser).await;
    browser.click("#cordon").await;
    until(
        &browser,
        "cordoned",
        "return document.getElementById('action-status').textContent.includes('is cordoned');",
    )
    .await;
    let nodes = kubectl_ok(&kube, &["get", "node", "node-1"]).await;
    assert!(nodes.contains("SchedulingDisabled"), "{nodes}");
    check_and_save_as(&browser, "explorer-node").await;
    browser
        .goto(&format!("{base}/clusters/prod/explorer/nodes/spare"))
        .await;
    settled(&browser).await;
    // A node's page: its taints, the pods on it and what they ask of it.
    until(&browser, "what the pods on spare ask for", "const r = document.getElementById('node-requested'); return r !== null && r.textContent.startsWith('CPU 0.25');").await;
    let facts = browser.text("#facts").await;
    assert!(facts.contains("dedicated=batch:NoSchedule"), "{facts}");
    assert!(facts.contains("memory 0.25 GiB"), "{facts}");
    assert_eq!(browser.text("#owned-title").await, "Pods on it");
    let on_it = browser.text("#owned").await;
    assert!(
        on_it.contains("Pod shop/spare-a") && on_it.contains("Pod shop/spare-b"),
        "{on_it}"
    );
    check_and_save_as(&browser, "explorer-node-spare").await;
    accept_confirms(&browser).await;
    browser.click("#drain").await;
    until(
        &browser,
        "drained",
        "return document.getElementById('action-status').textContent.includes('drained');",
    )
    .await;
    assert_eq!(
        browser
            .run("return sessionStorage.getItem('confirmed');", json!([]))
            .await,
        "Drain node spare? It is cordoned and its pods (but DaemonSet and mirror pods) are evicted."
    );
    let left = kubectl_ok(
        &kube,
        &[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=spare",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(left.trim(), "", "pods left on the drained node");

    // The cluster's events, filtered by namespace and object, live.
    browser
        .goto(&format!(
            "{base}/clusters/prod/explorer/events?namespace=shop&object=web-0"
        ))
        .await;
    listed(&browser).await;
    assert_eq!(names(&browser).await, ["web-0.1"]);
    browser.run("window.notReloaded = true;", json!([])).await;
    apply(
        &kube,
        &dir,
        "event-2",
        &event("web-0.2", "Started", "started the container"),
    )
    .await;
    until(&browser, "the new event, live", "return window.notReloaded === true && document.querySelector('#objects tr[data-name=\"web-0.2\"]') !== null;").await;
    check_and_save_as(&browser, "explorer-events").await;
    // The session ends (logged out elsewhere): the next request sends the page to log in,
    // to come back to this list with its filters.
    let logout = fetch_from_page(&browser, "POST", "/v1/logout", "").await;
    assert!(logout["status"].as_u64().unwrap() < 300, "{logout}");
    browser.click("#list-filters button[type=submit]").await;
    until(
        &browser,
        "the login page",
        "return location.pathname === '/login' && new URLSearchParams(location.search).get('next') === '/clusters/prod/explorer/events?namespace=shop&object=web-0';",
    )
    .await;

    // A read-only user: no write control anywhere, and writes from their session refused.
    let reader = driver.browser("explorer-viewer", 1280, 900).await;
    log_in(
        &reader,
        &base,
        "viewer",
        "a long enough password",
        "/clusters/prod/explorer/deployments.apps/shop/web",
    )
    .await;
    settled(&reader).await;
    assert!(
        reader
            .run(
                "return document.getElementById('yaml').value.includes('name: web');",
                json!([])
            )
            .await
            == true,
        "a reader sees the YAML"
    );
    for control in [
        "#edit:not([hidden])",
        "#save:not([hidden])",
        "#delete",
        "#scale",
        "#restart",
    ] {
        assert!(
            !reader.exists(control).await,
            "{control} shown to a read-only user"
        );
    }
    check_and_save_as(&reader, "explorer-read-only").await;
    // A list offers a reader no row actions and nothing to select.
    reader
        .goto(&format!(
            "{base}/clusters/prod/explorer/configmaps?namespace=shop"
        ))
        .await;
    listed(&reader).await;
    for control in [
        "#objects input.select",
        "#objects td.row-actions button",
        "#delete-selected:not([hidden])",
    ] {
        assert!(
            !reader.exists(control).await,
            "{control} shown to a read-only user"
        );
    }
    reader
        .goto(&format!("{base}/clusters/prod/explorer/pods/shop/web-0"))
        .await;
    settled(&reader).await;
    assert!(reader.exists("#logs-link").await);
    assert!(
        !reader.exists("#shell-link").await,
        "exec offered to a read-only user"
    );
    assert!(!reader.exists("#delete").await);
    reader
        .goto(&format!("{base}/clusters/prod/explorer/nodes/node-2"))
        .await;
    settled(&reader).await;
    assert!(!reader.exists("#cordon").await && !reader.exists("#drain").await);
    reader
        .goto(&format!("{base}/clusters/prod/explorer/configmaps"))
        .await;
    controls_decided(&reader).await;
    assert!(reader.exists("#create-open[hidden]").await);
    // Hand-made writes with the reader's session: the hub refuses them.
    let delete = fetch_from_page(
        &reader,
        "DELETE",
        "/k8s/clusters/prod/api/v1/namespaces/shop/pods/web-0",
        "",
    )
    .await;
    assert_eq!(delete["status"], 403, "{delete}");
    assert!(
        delete["body"].as_str().unwrap().contains("read-only"),
        "{delete}"
    );
    let drain = fetch_from_page(&reader, "POST", "/v1/clusters/prod/nodes/node-2/drain", "").await;
    assert_eq!(drain["status"], 403, "{drain}");
    let (exists, _, _) = kubectl(&kube, &["get", "pod", "web-0", "-n", "shop"]).await;
    assert!(exists, "the reader's delete removed the pod");
    reader.close().await;

    // A project member: the namespace filter offers their project; its list shows its
    // namespace's objects. A write outside the project reaches the cluster, whose RBAC refuses.
    let member = driver.browser("explorer-member", 1280, 900).await;
    log_in(
        &member,
        &base,
        "pat",
        "a long enough password",
        "/clusters/prod/explorer/pods?namespace=project%3Ashop",
    )
    .await;
    listed(&member).await;
    let options = member
        .run(
            "return Array.from(document.querySelectorAll('#namespace option')).map((o) => o.value);",
            json!([]),
        )
        .await;
    assert!(
        options.as_array().unwrap().contains(&json!("project:shop"))
            && options.as_array().unwrap().contains(&json!("shop")),
        "{options}"
    );
    let mut shown = names(&member).await;
    shown.sort();
    assert_eq!(shown, ["web-0"], "spare-a and spare-b were drained");
    // From the cache, which answers each namespace asked for only if the cluster lets the
    // member list pods there.
    let source = member
        .run(
            "return document.getElementById('list').dataset.source;",
            json!([]),
        )
        .await;
    assert_eq!(source, "cache");
    let beyond = fetch_from_page(
        &member,
        "GET",
        "/v1/clusters/prod/cache/pods?namespace=shop,load-1",
        "",
    )
    .await;
    assert_eq!(beyond["status"], 403, "{beyond}");
    check_and_save_as(&member, "explorer-project-member").await;
    // The project's two namespaces in one list: the member may not delete configmaps
    // cluster-wide but may in each of them, and every row offers it (asked per namespace).
    member
        .goto(&format!(
            "{base}/clusters/prod/explorer/configmaps?namespace=project%3Ashop"
        ))
        .await;
    listed(&member).await;
    let rows = member
        .run(
            "return Array.from(document.querySelectorAll('#objects tbody tr')).map((r) => [`${r.dataset.namespace}/${r.dataset.name}`, r.querySelector('input.select') !== null, r.querySelector(\"button[aria-label^='Delete ']\") !== null]);",
            json!([]),
        )
        .await;
    let rows: Vec<(String, bool, bool)> = serde_json::from_value(rows).unwrap();
    assert!(
        rows.iter().any(|(name, _, _)| name == "shop-jobs/orders")
            && rows.iter().any(|(name, _, _)| name.starts_with("shop/")),
        "{rows:?}"
    );
    assert!(
        rows.iter().all(|(_, select, delete)| *select && *delete),
        "a row without its delete: {rows:?}"
    );
    // An empty list says so in the table.
    member
        .goto(&format!(
            "{base}/clusters/prod/explorer/pods?namespace=shop-jobs"
        ))
        .await;
    listed(&member).await;
    assert_eq!(
        member.text("#objects td.empty").await,
        "No pods in namespace shop-jobs."
    );
    let outside = fetch_from_page(
        &member,
        "POST",
        "/k8s/clusters/prod/api/v1/namespaces/load-1/configmaps",
        r#"{"metadata": {"name": "not-mine"}}"#,
    )
    .await;
    assert_eq!(outside["status"], 403, "{outside}");
    let inside = fetch_from_page(
        &member,
        "POST",
        "/k8s/clusters/prod/api/v1/namespaces/shop/configmaps",
        r#"{"metadata": {"name": "mine"}}"#,
    )
    .await;
    assert_eq!(inside["status"], 201, "{inside}");
    member.close().await;
    browser.close().await;
    imported.shutdown.cancel();
}
