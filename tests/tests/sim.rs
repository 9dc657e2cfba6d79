//! The simulated cluster judged by the real `kubectl` (v1.32 on these machines): if kubectl
//! accepts it, the hub's proxy and the agents are tested against real Kubernetes behaviour.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, process::Stdio, time::Duration};

use sim::cluster::{ADMIN_TOKEN, Identity, SimCluster, SimConfig};
use tests::temp_dir;
use tokio_util::sync::CancellationToken;

struct Kubectl {
    kubeconfig: std::path::PathBuf,
}

impl Kubectl {
    fn new(dir: &Path, cluster: &SimCluster, token: &str) -> Self {
        let kubeconfig = dir.join(format!("kubeconfig-{token}"));
        std::fs::write(&kubeconfig, cluster.kubeconfig(token)).unwrap();
        Self { kubeconfig }
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .output()
            .await
            .expect("kubectl (v1.32) must be installed to judge the simulated cluster");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{stderr}");
        stdout
    }
}

const MANIFEST: &str = "\
apiVersion: v1
kind: Namespace
metadata:
  name: web
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: frontend
  namespace: web
spec:
  replicas: 2
  selector: {matchLabels: {app: frontend}}
  template:
    metadata: {labels: {app: frontend}}
    spec:
      containers:
        - name: nginx
          image: nginx:1.27
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: web}
data: {a: \"1\"}
";

#[tokio::test]
async fn kubectl_gets_applies_labels_scales_watches_reads_logs_and_deletes() {
    let dir = temp_dir("sim");
    let shutdown = CancellationToken::new();
    let cluster = SimCluster::start(
        SimConfig {
            nodes: 3,
            pods: 20,
            ..SimConfig::default()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    let kubectl = Kubectl::new(&dir, &cluster, ADMIN_TOKEN);

    let version = kubectl.ok(&["version", "-o", "json"]).await;
    assert!(version.contains(sim::cluster::GIT_VERSION), "{version}");
    let nodes = kubectl.ok(&["get", "nodes"]).await;
    assert!(
        nodes.lines().next().unwrap().starts_with("NAME")
            && nodes.contains("node-2")
            && nodes.contains("Ready"),
        "{nodes}"
    );
    let pods = kubectl.ok(&["get", "pods", "-A", "--no-headers"]).await;
    assert_eq!(pods.lines().count(), 20);

    let file = dir.join("web.yaml");
    std::fs::write(&file, MANIFEST).unwrap();
    let file = file.to_str().unwrap();
    let applied = kubectl.ok(&["apply", "-f", file]).await;
    assert!(
        applied.contains("deployment.apps/frontend created"),
        "{applied}"
    );
    let again = kubectl.ok(&["apply", "-f", file]).await;
    assert!(
        again.contains("deployment.apps/frontend unchanged"),
        "{again}"
    );
    std::fs::write(file, MANIFEST.replace("nginx:1.27", "nginx:1.28")).unwrap();
    let changed = kubectl.ok(&["apply", "-f", file]).await;
    assert!(
        changed.contains("deployment.apps/frontend configured"),
        "{changed}"
    );
    let image = kubectl
        .ok(&[
            "get",
            "deploy",
            "frontend",
            "-n",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
        .await;
    assert_eq!(image, "nginx:1.28");

    kubectl
        .ok(&["label", "cm", "settings", "-n", "web", "tier=cache"])
        .await;
    kubectl
        .ok(&["annotate", "cm", "settings", "-n", "web", "note=hello"])
        .await;
    let labelled = kubectl
        .ok(&["get", "cm", "-n", "web", "-l", "tier=cache", "-o", "name"])
        .await;
    assert_eq!(labelled.trim(), "configmap/settings");
    kubectl
        .ok(&["label", "cm", "settings", "-n", "web", "tier-"])
        .await;
    assert_eq!(
        kubectl
            .ok(&["get", "cm", "-n", "web", "-l", "tier=cache", "-o", "name"])
            .await
            .trim(),
        ""
    );
    kubectl
        .ok(&["scale", "deploy", "frontend", "-n", "web", "--replicas=5"])
        .await;
    let ready = kubectl
        .ok(&[
            "get",
            "deploy",
            "frontend",
            "-n",
            "web",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ])
        .await;
    assert_eq!(ready, "5");

    // A watch streams changes: whether the pod shows first in kubectl's list or in its watch,
    // its relabelling afterwards can only arrive through the watch.
    let watch = tokio::process::Command::new("kubectl")
        .args([
            "get",
            "pods",
            "-n",
            "web",
            "-w",
            "--show-labels",
            "--request-timeout=30s",
        ])
        .env("KUBECONFIG", &kubectl.kubeconfig)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.unwrap()));
    kubectl
        .ok(&["run", "probe", "-n", "web", "--image=busybox"])
        .await;
    let mut next_probe_row = async || {
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.starts_with("probe") {
                    return line;
                }
            }
            panic!("watch ended")
        })
        .await
        .unwrap()
    };
    let first = next_probe_row().await;
    assert!(first.contains("Running"), "{first}");
    kubectl
        .ok(&["label", "pod", "probe", "-n", "web", "watched=yes"])
        .await;
    let mut changed = next_probe_row().await;
    while !changed.contains("watched=yes") {
        changed = next_probe_row().await;
    }

    let logs = kubectl
        .ok(&["logs", "probe", "-n", "web", "--tail=2"])
        .await;
    assert_eq!(logs.lines().count(), 2, "{logs}");
    assert!(logs.contains("probe"), "{logs}");
    // The last lines, as a kubelet keeps them: consecutive, and the newest at the end (a
    // later read ends later).
    let numbers = |text: &str| -> Vec<u64> {
        text.lines()
            .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
            .collect()
    };
    let tail = numbers(&logs);
    assert_eq!(tail[1], tail[0] + 1, "{logs}");
    let all = kubectl.ok(&["logs", "probe", "-n", "web"]).await;
    let all = numbers(&all);
    assert_eq!(all[0], 0, "the whole log starts at its first line");
    assert!(*all.last().unwrap() >= tail[1], "{all:?} {tail:?}");
    // --timestamps, --since, -c and --previous are answered as the kubelet would.
    let stamped = kubectl
        .ok(&["logs", "probe", "-n", "web", "--tail=1", "--timestamps"])
        .await;
    let (stamp, rest) = stamped.trim_end().split_once(' ').unwrap();
    // RFC 3339 with nanoseconds, as the kubelet writes it: 2026-11-25T16:50:00.100000000Z.
    let b = stamp.as_bytes();
    assert!(
        b.len() == 30
            && b[4] == b'-'
            && b[10] == b'T'
            && b[19] == b'.'
            && b[29] == b'Z'
            && rest.starts_with("log line"),
        "{stamped}"
    );
    let recent = kubectl
        .ok(&["logs", "probe", "-n", "web", "--since=1s"])
        .await;
    assert!(
        (1..=11).contains(&recent.lines().count()),
        "a line every 100 ms: {recent}"
    );
    let (ok, _, stderr) = kubectl
        .run(&["logs", "probe", "-n", "web", "-c", "nope"])
        .await;
    assert!(
        !ok && stderr.contains("container nope is not valid for pod probe"),
        "{stderr}"
    );
    let (ok, _, stderr) = kubectl
        .run(&["logs", "probe", "-n", "web", "--previous"])
        .await;
    assert!(
        !ok && stderr.contains("previous terminated container"),
        "{stderr}"
    );

    assert!(
        kubectl
            .ok(&["delete", "pod", "probe", "-n", "web"])
            .await
            .contains("deleted")
    );
    let (found, _, stderr) = kubectl.run(&["get", "pod", "probe", "-n", "web"]).await;
    assert!(!found && stderr.contains("NotFound"), "{stderr}");
    kubectl.ok(&["delete", "ns", "web"]).await;
    let (_, _, stderr) = kubectl
        .run(&["get", "deploy", "frontend", "-n", "web"])
        .await;
    assert!(
        stderr.contains("NotFound"),
        "deleting the namespace deletes its objects: {stderr}"
    );

    shutdown.cancel();
    cluster.wait().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// kubectl's typed clients send built-in kinds as protobuf and ask for protobuf back
/// (`kubectl create`, `describe`); the simulator read none of them before.
#[tokio::test]
async fn kubectl_server_side_apply_owns_fields_conflicts_and_prunes_as_kube_apiserver_does() {
    let dir = temp_dir("sim-ssa");
    let shutdown = CancellationToken::new();
    let cluster = SimCluster::start(SimConfig::default(), shutdown.clone())
        .await
        .unwrap();
    let kubectl = Kubectl::new(&dir, &cluster, ADMIN_TOKEN);
    let file = dir.join("web.yaml");
    let write = |image: &str, sidecar: bool| {
        let extra = if sidecar {
            "\n        - name: proxy\n          image: envoy:1"
        } else {
            ""
        };
        std::fs::write(
            &file,
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: default}}\n\
                 spec:\n  replicas: 2\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    \
                 metadata: {{labels: {{app: web}}}}\n    spec:\n      containers:\n        \
                 - name: web\n          image: {image}{extra}\n"
            ),
        )
        .unwrap();
    };
    let apply = |force: bool| {
        let mut args = vec!["apply", "--server-side", "-f", file.to_str().unwrap()];
        if force {
            args.push("--force-conflicts");
        }
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = async |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl.run(&args).await
    };
    let images = async || {
        kubectl
            .ok(&[
                "get",
                "deployment",
                "web",
                "-o",
                "jsonpath={.spec.template.spec.containers[*].image}",
            ])
            .await
    };
    write("nginx:1.27", true);
    let (ok, out, err) = run(apply(false)).await;
    assert!(ok && out.contains("serverside-applied"), "{out}{err}");
    let managed = kubectl
        .ok(&[
            "get",
            "deployment",
            "web",
            "--show-managed-fields",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}/{.metadata.managedFields[*].operation}",
        ])
        .await;
    assert_eq!(managed, "kubectl/Apply");
    // Someone sets the image by hand: they own it now, and applying another is a conflict
    // that names them and the field.
    kubectl
        .ok(&["set", "image", "deployment/web", "web=nginx:hotfix"])
        .await;
    let (ok, _, err) = run(apply(false)).await;
    assert!(!ok, "an apply over another manager's field must fail");
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl-set\" using apps/v1: .spec.template.spec.containers[name=\"web\"].image"),
        "{err}"
    );
    assert_eq!(images().await, "nginx:hotfix envoy:1");
    // Forced, the applier takes it back.
    let (ok, _, err) = run(apply(true)).await;
    assert!(ok, "{err}");
    assert_eq!(images().await, "nginx:1.27 envoy:1");
    // A container the configuration drops is removed; a label someone else added stays.
    kubectl.ok(&["label", "deployment", "web", "team=a"]).await;
    write("nginx:1.28", false);
    let (ok, _, err) = run(apply(false)).await;
    assert!(ok, "{err}");
    assert_eq!(images().await, "nginx:1.28");
    let team = kubectl
        .ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.metadata.labels.team}",
        ])
        .await;
    assert_eq!(team, "a");
    shutdown.cancel();
}

#[tokio::test]
async fn kubectl_creates_and_describes_built_in_kinds_in_protobuf() {
    let dir = temp_dir("sim-pb");
    let shutdown = CancellationToken::new();
    let cluster = SimCluster::start(SimConfig::default(), shutdown.clone())
        .await
        .unwrap();
    let kubectl = Kubectl::new(&dir, &cluster, ADMIN_TOKEN);

    let (ok, created, trace) = kubectl.run(&["create", "namespace", "shop", "-v=8"]).await;
    assert!(ok && created.contains("namespace/shop created"), "{trace}");
    let protobuf = "Content-Type: application/vnd.kubernetes.protobuf";
    assert!(
        trace.matches(protobuf).count() >= 2,
        "sent and answered in protobuf: {trace}"
    );
    kubectl
        .ok(&[
            "create",
            "configmap",
            "cfg",
            "-n",
            "shop",
            "--from-literal=mode=fast",
        ])
        .await;
    kubectl
        .ok(&[
            "create",
            "secret",
            "generic",
            "db",
            "-n",
            "shop",
            "--from-literal=password=s3cret",
        ])
        .await;
    kubectl
        .ok(&[
            "create",
            "deployment",
            "web",
            "-n",
            "shop",
            "--image=nginx:1.27",
            "--replicas=3",
            "--port=80",
        ])
        .await;
    kubectl
        .ok(&["create", "serviceaccount", "robot", "-n", "shop"])
        .await;
    kubectl
        .ok(&[
            "create",
            "role",
            "reader",
            "-n",
            "shop",
            "--verb=get,list",
            "--resource=pods",
        ])
        .await;
    kubectl
        .ok(&[
            "create",
            "rolebinding",
            "reader",
            "-n",
            "shop",
            "--role=reader",
            "--serviceaccount=shop:robot",
        ])
        .await;

    let mode = kubectl
        .ok(&[
            "get",
            "configmap",
            "cfg",
            "-n",
            "shop",
            "-o",
            "jsonpath={.data.mode}",
        ])
        .await;
    assert_eq!(mode, "fast");
    let secret = kubectl
        .ok(&[
            "get",
            "secret",
            "db",
            "-n",
            "shop",
            "-o",
            "jsonpath={.type} {.data.password}",
        ])
        .await;
    assert_eq!(
        secret, "Opaque czNjcmV0",
        "bytes arrive as base64, type defaulted"
    );
    let port = kubectl
        .ok(&[
            "get",
            "deploy",
            "web",
            "-n",
            "shop",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].ports[0].containerPort}",
        ])
        .await;
    assert_eq!(port, "3 80");
    let described = kubectl
        .ok(&["describe", "deployment", "web", "-n", "shop"])
        .await;
    for line in [
        "Replicas:               3 desired",
        "StrategyType:           RollingUpdate",
        "RollingUpdateStrategy:  25% max unavailable, 25% max surge",
        "Image:         nginx:1.27",
        "Port:          80/TCP",
    ] {
        assert!(described.contains(line), "{line:?} in:\n{described}");
    }
    let namespace = kubectl.ok(&["describe", "namespace", "shop"]).await;
    assert!(
        namespace.contains("No resource quota.") && namespace.contains("Status:       Active"),
        "{namespace}"
    );
    let account = kubectl
        .ok(&[
            "get",
            "serviceaccount",
            "default",
            "-n",
            "shop",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(
        account, "serviceaccount/default\n",
        "every namespace has its default account"
    );
    let can = kubectl
        .ok(&[
            "auth",
            "can-i",
            "list",
            "pods",
            "-n",
            "shop",
            "--as=system:serviceaccount:shop:robot",
        ])
        .await;
    assert_eq!(can.trim(), "yes");
    // A service account's token (TokenRequest) acts as the account, while it exists.
    let token = kubectl
        .ok(&["create", "token", "robot", "-n", "shop"])
        .await;
    let robot = Kubectl::new(&dir, &cluster, token.trim());
    robot.ok(&["get", "pods", "-n", "shop"]).await;
    let (ok, _, stderr) = robot.run(&["get", "secrets", "-n", "shop"]).await;
    assert!(
        !ok && stderr.contains("User \"system:serviceaccount:shop:robot\" cannot list"),
        "{stderr}"
    );
    kubectl
        .ok(&["delete", "serviceaccount", "robot", "-n", "shop"])
        .await;
    let (ok, _, stderr) = robot.run(&["get", "pods", "-n", "shop"]).await;
    assert!(!ok && stderr.contains("Unauthorized"), "{stderr}");
    let (ok, _, stderr) = kubectl
        .run(&["create", "token", "ghost", "-n", "shop"])
        .await;
    assert!(!ok && stderr.contains("not found"), "{stderr}");
    let (ok, _, stderr) = kubectl.run(&["create", "namespace", "shop"]).await;
    assert!(
        !ok && stderr.contains("namespaces \"shop\" already exists"),
        "a protobuf Status reads as the error it is: {stderr}"
    );

    shutdown.cancel();
    cluster.wait().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// exec, cp and attach over kubectl 1.32's WebSocket protocol (and exec over SPDY, as older
/// kubectls speak), into the stand-in shell, and port-forward (SPDY over WebSocket) to the
/// stand-in echo server.
#[tokio::test]
async fn kubectl_execs_copies_attaches_and_forwards_ports() {
    let dir = temp_dir("sim-exec");
    let shutdown = CancellationToken::new();
    let cluster = SimCluster::start(
        SimConfig {
            pods: 2,
            ..SimConfig::default()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    let kubectl = Kubectl::new(&dir, &cluster, ADMIN_TOKEN);

    let hello = kubectl
        .ok(&[
            "exec", "pod-0", "-n", "load-0", "--", "echo", "hello", "there",
        ])
        .await;
    assert_eq!(hello, "hello there\n");
    let (ok, out, stderr) = kubectl
        .run(&[
            "exec",
            "pod-0",
            "-n",
            "load-0",
            "--",
            "sh",
            "-c",
            "hostname; exit 4",
        ])
        .await;
    assert!(!ok && out == "pod-0\n", "{out} {stderr}");
    assert!(
        stderr.contains("command terminated with exit code 4"),
        "{stderr}"
    );
    let (ok, _, stderr) = kubectl
        .run(&[
            "exec", "pod-0", "-n", "load-0", "-c", "sidecar", "--", "true",
        ])
        .await;
    assert!(
        !ok && stderr.contains("container sidecar is not valid for pod pod-0"),
        "{stderr}"
    );

    // Commands on stdin, one a line, as to a shell.
    let mut shell = tokio::process::Command::new("kubectl")
        .args(["exec", "-i", "pod-0", "-n", "load-0", "--", "sh"])
        .env("KUBECONFIG", &kubectl.kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = shell.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"echo one\nprintenv HOSTNAME\n")
        .await
        .unwrap();
    drop(stdin);
    let out = shell.wait_with_output().await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\npod-0\n");

    // The same over SPDY/3.1, as kubectl before 1.31 speaks it (and 1.32 when told to).
    let spdy = |args: &[&str], stdin: &[u8]| {
        let mut command = tokio::process::Command::new("kubectl");
        command
            .args(args)
            .env("KUBECONFIG", &kubectl.kubeconfig)
            .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let stdin = stdin.to_vec();
        async move {
            let mut child = command.spawn().unwrap();
            let mut pipe = child.stdin.take().unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut pipe, &stdin)
                .await
                .unwrap();
            drop(pipe);
            let out = child.wait_with_output().await.unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let before = cluster.audit().len();
    let (code, out, err) = spdy(
        &[
            "exec", "pod-0", "-n", "load-0", "--", "echo", "over", "spdy",
        ],
        b"",
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(0), "over spdy\n"), "{err}");
    let (code, out, err) = spdy(
        &[
            "exec",
            "pod-0",
            "-n",
            "load-0",
            "--",
            "sh",
            "-c",
            "hostname; exit 3",
        ],
        b"",
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(3), "pod-0\n"), "{err}");
    assert!(err.contains("command terminated with exit code 3"), "{err}");
    let (code, out, err) = spdy(
        &["exec", "-i", "pod-0", "-n", "load-0", "--", "sh"],
        b"echo two\nprintenv HOSTNAME\n",
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(0), "two\npod-0\n"), "{err}");
    let methods: Vec<String> = cluster.audit()[before..]
        .iter()
        .filter(|e| e.path.ends_with("/exec"))
        .map(|e| e.method.clone())
        .collect();
    assert_eq!(
        methods, ["POST"; 3],
        "SPDY's exec is a POST, WebSocket's a GET"
    );

    // cp in and out: tar through exec, both ways.
    let local = dir.join("notes.txt");
    std::fs::write(&local, "written here\n").unwrap();
    kubectl
        .ok(&["cp", local.to_str().unwrap(), "load-0/pod-0:/tmp/notes.txt"])
        .await;
    let read = kubectl
        .ok(&[
            "exec",
            "pod-0",
            "-n",
            "load-0",
            "--",
            "cat",
            "/tmp/notes.txt",
        ])
        .await;
    assert_eq!(read, "written here\n");
    let back = dir.join("back.txt");
    kubectl
        .ok(&["cp", "load-0/pod-0:/tmp/notes.txt", back.to_str().unwrap()])
        .await;
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "written here\n");
    let other = kubectl
        .ok(&["exec", "pod-1", "-n", "load-1", "--", "ls", "/tmp"])
        .await;
    assert_eq!(other, "", "each pod has its own files");
    // A pod made again after its namespace was deleted starts with none of the old files.
    kubectl.ok(&["delete", "namespace", "load-0"]).await;
    kubectl.ok(&["create", "namespace", "load-0"]).await;
    kubectl
        .ok(&[
            "run",
            "pod-0",
            "-n",
            "load-0",
            "--image=nginx",
            "--overrides={\"spec\":{\"containers\":[{\"name\":\"main\",\"image\":\"nginx\"}]}}",
        ])
        .await;
    let fresh = kubectl
        .ok(&["exec", "pod-0", "-n", "load-0", "--", "ls", "/tmp"])
        .await;
    assert_eq!(fresh, "", "the old pod's files went with its namespace");

    // port-forward reaches the pod's stand-in echo server, a connection at a time.
    let echoed = tests::imported::port_forward(
        &kubectl.kubeconfig,
        "load-0",
        "pod-0",
        8080,
        &["ping\n", "pong\n"],
    )
    .await;
    assert_eq!(echoed, ["ping\n", "pong\n"]);

    // attach shows the container's output as it is written.
    let first = tests::imported::attach_first_line(&kubectl.kubeconfig, "load-0", "pod-0").await;
    assert!(
        first.starts_with("log line ") && first.ends_with(" from pod-0/main"),
        "{first}"
    );

    shutdown.cancel();
    cluster.wait().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kubectl drain` evicts through `pods/eviction`, and a PodDisruptionBudget holds it back
/// until it allows the disruption.
#[tokio::test]
async fn kubectl_drain_evicts_as_disruption_budgets_allow() {
    let dir = temp_dir("sim-drain");
    let shutdown = CancellationToken::new();
    let cluster = SimCluster::start(
        SimConfig {
            nodes: 2,
            pods: 0,
            ..SimConfig::default()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    let kubectl = Kubectl::new(&dir, &cluster, ADMIN_TOKEN);
    let objects = dir.join("web.yaml");
    std::fs::write(
        &objects,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web-a, namespace: default, labels: {app: web}}\n\
         spec: {nodeName: node-0, containers: [{name: web, image: nginx}]}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: web-b, namespace: default, labels: {app: web}}\n\
         spec: {nodeName: node-1, containers: [{name: web, image: nginx}]}\n---\n\
         apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: default}\n\
         spec: {minAvailable: 2, selector: {matchLabels: {app: web}}}\n",
    )
    .unwrap();
    kubectl
        .ok(&["apply", "-f", objects.to_str().unwrap()])
        .await;
    let budget = kubectl.ok(&["get", "pdb", "web", "--no-headers"]).await;
    assert!(
        budget.split_whitespace().collect::<Vec<_>>()[..4] == ["web", "2", "N/A", "0"],
        "{budget}"
    );

    let drain = [
        "drain",
        "node-0",
        "--ignore-daemonsets",
        "--force",
        "--timeout=3s",
    ];
    let (ok, _, stderr) = kubectl.run(&drain).await;
    assert!(
        !ok && stderr.contains("error when evicting pods/\"web-a\""),
        "{stderr}"
    );
    let pods = kubectl.ok(&["get", "pods", "-o", "name"]).await;
    assert_eq!(pods, "pod/web-a\npod/web-b\n", "the budget kept web-a");
    let cordoned = kubectl
        .ok(&[
            "get",
            "node",
            "node-0",
            "-o",
            "jsonpath={.spec.unschedulable}",
        ])
        .await;
    assert_eq!(cordoned, "true");

    kubectl
        .ok(&[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            "{\"spec\":{\"minAvailable\":1}}",
        ])
        .await;
    let (ok, out, stderr) = kubectl.run(&drain).await;
    assert!(ok && out.contains("pod/web-a evicted"), "{out} {stderr}");
    let pods = kubectl.ok(&["get", "pods", "-o", "name"]).await;
    assert_eq!(pods, "pod/web-b\n");
    let allowed = kubectl
        .ok(&[
            "get",
            "pdb",
            "web",
            "-o",
            "jsonpath={.status.currentHealthy} {.status.disruptionsAllowed}",
        ])
        .await;
    assert_eq!(allowed, "1 0", "one left, and it must stay");
    let audit = cluster.audit();
    assert!(
        audit.iter().any(|e| e.method == "POST"
            && e.path.ends_with("/pods/web-a/eviction")
            && e.code == 429),
        "refused by the budget first"
    );
    assert!(
        !audit
            .iter()
            .any(|e| e.method == "DELETE" && e.path.ends_with("/pods/web-a")),
        "evicted, never deleted"
    );

    shutdown.cancel();
    cluster.wait().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn impersonation_is_honoured_only_from_those_allowed_and_recorded() {
    let dir = temp_dir("sim-imp");
    let shutdown = CancellationToken::new();
    let cluster = SimCluster::start(SimConfig::default(), shutdown.clone())
        .await
        .unwrap();
    cluster.add_token(
        "alice-token",
        Identity {
            user: "alice".into(),
            groups: vec!["system:authenticated".into()],
        },
    );
    let admin = Kubectl::new(&dir, &cluster, ADMIN_TOKEN);
    let alice = Kubectl::new(&dir, &cluster, "alice-token");
    // RBAC decides what the impersonated identity may do: the group devs, and alice, may view.
    cluster
        .apply_manifest(&format!(
            "{}---\n{}",
            binding(
                "ClusterRoleBinding",
                "devs-view",
                None,
                "view",
                "Group",
                "devs"
            ),
            binding(
                "ClusterRoleBinding",
                "alice-view",
                None,
                "view",
                "User",
                "alice"
            ),
        ))
        .unwrap();

    admin
        .ok(&["get", "ns", "default", "--as", "bob", "--as-group", "devs"])
        .await;
    let (ok, _, stderr) = admin.run(&["get", "ns", "default", "--as", "bob"]).await;
    assert!(
        !ok && stderr.contains("forbidden"),
        "bob alone has no role: {stderr}"
    );
    let (ok, _, stderr) = alice.run(&["get", "ns", "default", "--as", "bob"]).await;
    assert!(!ok && stderr.contains("cannot impersonate"), "{stderr}");
    alice.ok(&["get", "ns", "default"]).await;

    // Impersonation is RBAC's `impersonate` verb, per user, group and service account named.
    let role = dir.join("impersonator.yaml");
    std::fs::write(
        &role,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: impersonate-bob}\n\
         rules:\n- {apiGroups: [\"\"], resources: [users], verbs: [impersonate], resourceNames: [bob]}\n",
    )
    .unwrap();
    admin.ok(&["apply", "-f", role.to_str().unwrap()]).await;
    admin
        .ok(&[
            "create",
            "clusterrolebinding",
            "alice-impersonates",
            "--clusterrole=impersonate-bob",
            "--user=alice",
        ])
        .await;
    let (ok, _, stderr) = alice.run(&["get", "ns", "default", "--as", "bob"]).await;
    assert!(
        !ok && stderr.contains("User \"bob\" cannot get resource \"namespaces\""),
        "alice may be bob now, and bob may not read: {stderr}"
    );
    let (ok, _, stderr) = alice.run(&["get", "ns", "--as", "carol"]).await;
    assert!(
        !ok && stderr.contains("cannot impersonate resource \"users\""),
        "{stderr}"
    );
    let (ok, _, stderr) = alice
        .run(&["get", "ns", "default", "--as", "bob", "--as-group", "devs"])
        .await;
    assert!(
        !ok && stderr.contains("cannot impersonate resource \"groups\""),
        "{stderr}"
    );
    std::fs::write(
        &role,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: impersonate-bob}\n\
         rules:\n- {apiGroups: [\"\"], resources: [users], verbs: [impersonate], resourceNames: [bob]}\n\
         - {apiGroups: [\"\"], resources: [groups], verbs: [impersonate], resourceNames: [devs]}\n",
    )
    .unwrap();
    admin.ok(&["apply", "-f", role.to_str().unwrap()]).await;
    alice
        .ok(&["get", "ns", "default", "--as", "bob", "--as-group", "devs"])
        .await;
    let (ok, _, stderr) = alice
        .run(&["get", "ns", "--as", "system:serviceaccount:default:robot"])
        .await;
    assert!(
        !ok && stderr.contains("cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"default\""),
        "{stderr}"
    );

    let audit = cluster.audit();
    let bob = audit
        .iter()
        .find(|e| e.user == "bob" && e.path == "/api/v1/namespaces/default")
        .unwrap();
    assert_eq!(bob.impersonated_by.as_deref(), Some("kubernetes-admin"));
    assert!(bob.groups.contains(&"devs".to_owned()));
    assert!(audit.iter().any(|e| e.user == "alice" && e.code == 403));
    shutdown.cancel();
    cluster.wait().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A RoleBinding (in `namespace`) or ClusterRoleBinding of `role` (a ClusterRole) to one
/// subject, as YAML.
fn binding(
    kind: &str,
    name: &str,
    namespace: Option<&str>,
    role: &str,
    subject_kind: &str,
    subject: &str,
) -> String {
    let namespace = namespace.map_or(String::new(), |ns| format!("\n  namespace: {ns}"));
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: {name}{namespace}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: {subject_kind}, name: {subject}}}]\n"
    )
}

#[tokio::test]
async fn rbac_is_enforced_per_verb_namespace_and_resource_and_can_i_answers() {
    let dir = temp_dir("sim-rbac");
    let shutdown = CancellationToken::new();
    let cluster = SimCluster::start(SimConfig::default(), shutdown.clone())
        .await
        .unwrap();
    cluster.add_token(
        "carol-token",
        Identity {
            user: "carol".into(),
            groups: vec!["system:authenticated".into(), "testers".into()],
        },
    );
    let admin = Kubectl::new(&dir, &cluster, ADMIN_TOKEN);
    let carol = Kubectl::new(&dir, &cluster, "carol-token");
    let manifest = dir.join("setup.yaml");
    std::fs::write(
        &manifest,
        format!(
            "{MANIFEST}---\n{}---\n{}---\n{}",
            binding("RoleBinding", "carol-edit", Some("web"), "edit", "User", "carol"),
            binding("RoleBinding", "testers-view", Some("default"), "view", "Group", "testers"),
            // A role of one's own, aggregated into view as Kubernetes does it.
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: leases-viewer\n  \
             labels: {rbac.authorization.k8s.io/aggregate-to-view: \"true\"}\n\
             rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch]}]\n",
        ),
    )
    .unwrap();
    admin.ok(&["apply", "-f", manifest.to_str().unwrap()]).await;

    // edit in web: deployments and pods, scale; not RBAC objects.
    carol.ok(&["get", "deploy", "-n", "web"]).await;
    carol
        .ok(&[
            "scale",
            "deployment",
            "frontend",
            "-n",
            "web",
            "--replicas",
            "3",
        ])
        .await;
    carol
        .ok(&["delete", "deployment", "frontend", "-n", "web"])
        .await;
    // view (through the group) in default, and what view aggregates.
    carol.ok(&["get", "pods", "-n", "default"]).await;
    carol.ok(&["get", "leases", "-n", "default"]).await;
    for (args, what) in [
        (
            &["delete", "configmap", "x", "-n", "default"][..],
            "configmaps \"x\" is forbidden: User \"carol\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"default\"",
        ),
        (
            &["get", "pods", "-n", "kube-system"][..],
            "cannot list resource \"pods\" in API group \"\" in the namespace \"kube-system\"",
        ),
        (
            &["get", "nodes"][..],
            "cannot list resource \"nodes\" in API group \"\" at the cluster scope",
        ),
        (
            &["get", "secrets", "-n", "default"][..],
            "cannot list resource \"secrets\"",
        ),
        (
            &["get", "rolebindings", "-n", "web"][..],
            "cannot list resource \"rolebindings\" in API group \"rbac.authorization.k8s.io\"",
        ),
    ] {
        let (ok, _, stderr) = carol.run(args).await;
        assert!(!ok && stderr.contains(what), "{args:?}: {stderr}");
    }
    // kubectl auth can-i (a SelfSubjectAccessReview, sent as protobuf) says the same.
    for (args, answer) in [
        (
            &["auth", "can-i", "create", "deployments", "-n", "web"][..],
            "yes",
        ),
        (
            &["auth", "can-i", "delete", "pods", "-n", "default"][..],
            "no",
        ),
        (
            &["auth", "can-i", "list", "pods", "-n", "default"][..],
            "yes",
        ),
        (&["auth", "can-i", "list", "nodes"][..], "no"),
    ] {
        let (_, stdout, stderr) = carol.run(args).await;
        assert_eq!(stdout.trim(), answer, "{args:?}: {stderr}");
    }
    // The cluster's admin may do anything, and a 403 reached the audit log.
    admin.ok(&["delete", "ns", "web"]).await;
    assert!(
        cluster
            .audit()
            .iter()
            .any(|e| e.user == "carol" && e.code == 403)
    );
    shutdown.cancel();
    cluster.wait().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_thousand_nodes_and_thirty_thousand_pods_list_in_full() {
    let dir = temp_dir("sim-scale");
    let shutdown = CancellationToken::new();
    let cluster = SimCluster::start(
        SimConfig {
            nodes: 1000,
            pods: 30_000,
            ..SimConfig::default()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    let kubectl = Kubectl::new(&dir, &cluster, ADMIN_TOKEN);
    let nodes = kubectl.ok(&["get", "nodes", "--no-headers"]).await;
    assert_eq!(nodes.lines().count(), 1000);
    let pods = kubectl.ok(&["get", "pods", "-A", "-o", "name"]).await;
    assert_eq!(pods.lines().count(), 30_000);
    shutdown.cancel();
    cluster.wait().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
