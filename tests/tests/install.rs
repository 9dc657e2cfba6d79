//! The host install script as an operator runs it: `curl … | sh -s - FLAGS` against the real
//! hub, which serves the script and the agent binary. `--root` installs under a directory, so
//! the test leaves the machine as it was (and so several hosts can share one machine).

#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, SystemTime},
};

use serde_json::{Value, json};
use tests::{HubProcess, api, create_custom_cluster, login, temp_dir};

/// Runs the hub's host command the way an operator pastes it, plus `extra` flags; returns the
/// running shell (the agent runs in the foreground with `--no-systemd`).
fn install(hub: &HubProcess, flags: &str) -> tokio::process::Child {
    let command = format!(
        "curl --insecure -fsSL {url}/system-agent-install.sh | sh -s - --server {url} {flags}",
        url = hub.url()
    );
    tokio::process::Command::new("sh")
        .args(["-c", &command])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Every file under `root` with its content and modification time.
fn files(root: &Path) -> BTreeMap<PathBuf, (Vec<u8>, SystemTime)> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let meta = std::fs::metadata(&path).unwrap();
                found.insert(
                    path.strip_prefix(root).unwrap().to_owned(),
                    (std::fs::read(&path).unwrap(), meta.modified().unwrap()),
                );
            }
        }
    }
    found
}

async fn hosts(hub: &HubProcess, admin: &str) -> Vec<Value> {
    let (_, list) = api(hub.addr, "GET", "/v1/hosts", Some(admin), None).await;
    list["items"].as_array().cloned().unwrap_or_default()
}

fn connected(host: &Value) -> Option<bool> {
    host["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Connected")
        .map(|c| c["status"] == "True")
}

/// Waits until the single host shows `Connected` = `want`; returns it.
async fn host_connected(hub: &HubProcess, admin: &str, want: bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let hosts = hosts(hub, admin).await;
        if let [host] = hosts.as_slice()
            && connected(host) == Some(want)
        {
            return host.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no host with Connected={want}: {hosts:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops the foreground agent the way the uninstall script does: by its pid file.
fn stop_agent(root: &Path) {
    let pid = std::fs::read_to_string(root.join("var/lib/drover/system-agent/agent.pid")).unwrap();
    let ok = std::process::Command::new("kill")
        .arg(pid.trim())
        .status()
        .unwrap();
    assert!(ok.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_script_verifies_installs_is_idempotent_and_uninstalls() {
    let dir = temp_dir("install");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    // Paused: the planner must not install a distribution on the machine running the tests.
    let registration = create_custom_cluster(
        hub.addr,
        &admin,
        "edge",
        json!({"distribution": "rke2", "version": "v1.33.4+rke2r1", "paused": true}),
    )
    .await;
    let command = registration["hostCommand"].as_str().unwrap();
    assert!(command.contains("/system-agent-install.sh"), "{command}");
    let token = registration["token"].as_str().unwrap().to_owned();
    let root = dir.join("root");

    // A wrong checksum stops the script before it fetches or writes anything, naming both.
    let wrong = "0".repeat(64);
    let out = install(
        &hub,
        &format!(
            "--token {token} --ca-checksum {wrong} --all-roles --no-systemd --root {}",
            root.display()
        ),
    )
    .wait_with_output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&wrong) && stderr.contains(&hub.ca_checksum),
        "{stderr}"
    );
    assert!(
        !root.exists(),
        "nothing is written after a checksum mismatch"
    );

    // Flags that make no sense are named.
    let out = install(
        &hub,
        &format!(
            "--token {token} --taint dedicated=gpu --root {}",
            root.display()
        ),
    )
    .wait_with_output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--taint dedicated=gpu"));

    let flags = format!(
        "--token {token} --ca-checksum {} --etcd --controlplane --node-name edge-1 \
         --address 192.0.2.10 --internal-address 10.0.0.10 --label rack=r1 --label zone=a \
         --taint dedicated=infra:NoSchedule --no-systemd --root {}",
        hub.ca_checksum,
        root.display()
    );
    let first = install(&hub, &flags);
    let host = host_connected(&hub, &admin, true).await;
    let spec = &host["spec"];
    assert_eq!(spec["cluster"], "edge");
    assert_eq!(spec["nodeName"], "edge-1");
    assert_eq!(spec["address"], "192.0.2.10");
    assert_eq!(spec["internalAddress"], "10.0.0.10");
    assert_eq!(
        spec["roles"],
        json!({"etcd": true, "controlPlane": true, "worker": false})
    );
    assert_eq!(spec["nodeLabels"], json!({"rack": "r1", "zone": "a"}));
    assert_eq!(spec["taints"], json!(["dedicated=infra:NoSchedule"]));
    let name = host["metadata"]["name"].clone();

    let installed = files(&root);
    for path in [
        "usr/local/bin/drover-system-agent",
        "usr/local/bin/drover-system-agent-uninstall.sh",
        "etc/drover/system-agent.env",
        "var/lib/drover/system-agent/id",
        "var/lib/drover/system-agent/registration.json",
    ] {
        assert!(
            installed.contains_key(Path::new(path)),
            "{path} missing: {:?}",
            installed.keys()
        );
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(root.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(
        mode("etc/drover/system-agent.env"),
        0o600,
        "the config holds the token"
    );
    assert_eq!(mode("var/lib/drover/system-agent/registration.json"), 0o600);

    // Again, with the same flags: nothing changes, and it is still the same one host.
    stop_agent(&root);
    let _ = first.wait_with_output().await;
    host_connected(&hub, &admin, false).await;
    let before = files(&root);
    let second = install(&hub, &flags);
    let host = host_connected(&hub, &admin, true).await;
    assert_eq!(host["metadata"]["name"], name);
    let mut after = files(&root);
    let mut before = before;
    let pid = PathBuf::from("var/lib/drover/system-agent/agent.pid");
    assert_ne!(before.remove(&pid), None);
    after.remove(&pid);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (path, (content, modified)) in &before {
        assert!(after[path].0 == *content, "{} changed", path.display());
        assert_eq!(after[path].1, *modified, "{} was rewritten", path.display());
    }

    // The uninstall script stops the agent and removes everything the install put there.
    let out = std::process::Command::new("sh")
        .arg(root.join("usr/local/bin/drover-system-agent-uninstall.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = tokio::time::timeout(Duration::from_secs(10), second.wait_with_output())
        .await
        .expect("the agent stops when uninstalled")
        .unwrap();
    assert!(status.status.success() || status.status.code().is_none());
    host_connected(&hub, &admin, false).await;
    assert!(
        files(&root).is_empty(),
        "left behind: {:?}",
        files(&root).keys()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
