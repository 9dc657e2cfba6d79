//! The agents' images: `scripts/images` builds them here (with Debian's buildah, which
//! `scripts/test` installs) from this build's binaries, twice, with the same digests; each
//! image runs as a non-root user with no shell; and the cluster-agent, run from the image's
//! own root filesystem (unpacked from its OCI archive and entered with chroot as the image's
//! user, since no container runtime works on these machines), registers with a hub and serves
//! an imported simulated cluster. Needs root (chroot).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::{
    collections::BTreeMap,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;
use sim::cluster::SimConfig;
use tests::{
    hosts::skip_without_root,
    imported::{Imported, issued_kubeconfig, kubectl_ok},
    wait_for_event,
};

/// Runs `scripts/images` into `out`, with buildah's storage under `storage` (so a test leaves
/// nothing in the machine's); returns each image's tag and digest as the script prints them.
fn build(out: &Path, storage: &Path) -> BTreeMap<String, String> {
    std::fs::create_dir_all(storage).unwrap();
    let conf = storage.join("storage.conf");
    std::fs::write(
        &conf,
        format!(
            "[storage]\ndriver = \"vfs\"\nrunroot = \"{0}/run\"\ngraphroot = \"{0}/graph\"\n",
            storage.display()
        ),
    )
    .unwrap();
    let bin_dir = tests::binary("drover-cluster-agent")
        .parent()
        .unwrap()
        .to_owned();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/images");
    let output = Command::new(script)
        .args(["--tool", "buildah", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(out)
        .env("CONTAINERS_STORAGE_CONF", &conf)
        .env("BUILDAH_ISOLATION", "chroot")
        .output()
        .expect("scripts/images");
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    printed
        .lines()
        .map(|l| {
            let mut words = l.split_whitespace();
            (
                words.next().unwrap().to_owned(),
                words.next().unwrap().to_owned(),
            )
        })
        .collect()
}

/// An OCI archive's image: its configuration and its root filesystem, unpacked into `rootfs`.
fn unpack(archive: &Path, dir: &Path) -> (Value, PathBuf) {
    let layout = dir.join("layout");
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&layout).unwrap();
    std::fs::create_dir_all(&rootfs).unwrap();
    tests::sh(&format!(
        "tar -xf {} -C {}",
        archive.display(),
        layout.display()
    ));
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let json =
        |path: PathBuf| -> Value { serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap() };
    let index = json(layout.join("index.json"));
    let manifest = json(blob(index["manifests"][0]["digest"].as_str().unwrap()));
    let config = json(blob(manifest["config"]["digest"].as_str().unwrap()));
    for layer in manifest["layers"].as_array().unwrap() {
        let gzip = layer["mediaType"].as_str().unwrap().ends_with("+gzip");
        tests::sh(&format!(
            "tar -x{}f {} -C {} --same-owner --numeric-owner",
            if gzip { "z" } else { "" },
            blob(layer["digest"].as_str().unwrap()).display(),
            rootfs.display()
        ));
    }
    (config, rootfs)
}

/// This machine's architecture as the images are named for it.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    }
}

/// Every file under `root`, relative, sorted.
fn files(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                found.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_images_build_reproducibly_and_the_cluster_agent_runs_from_its_image() {
    if skip_without_root("running an image's root filesystem needs chroot, so root") {
        return;
    }
    let dir = tests::temp_dir("images");
    let first = build(&dir.join("first"), &dir.join("storage-1"));
    let second = build(&dir.join("second"), &dir.join("storage-2"));
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        first.keys().cloned().collect::<Vec<_>>(),
        [
            format!("drover/cluster-agent:{version}"),
            format!("drover/hub:{version}"),
            format!("drover/node-agent:{version}"),
        ]
    );
    assert_eq!(first, second, "the same binaries give the same images");

    for (image, binaries) in [
        (
            "cluster-agent",
            &["drover-cluster-agent", "drover-kube-api-auth"][..],
        ),
        ("node-agent", &["drover-node-agent"][..]),
        ("hub", &["drover-hub"][..]),
    ] {
        let archive = dir
            .join("first")
            .join(format!("drover-{image}-{version}-{}.oci.tar", arch()));
        let (config, rootfs) = unpack(&archive, &dir.join("unpacked").join(image));
        let config = &config["config"];
        assert_eq!(
            config["User"], "65532:65532",
            "{image} runs as a non-root user"
        );
        assert_eq!(
            config["Entrypoint"],
            serde_json::json!([format!("/usr/local/bin/{}", binaries[0])]),
            "{image}"
        );
        let all = files(&rootfs);
        let programs: Vec<&String> = all.iter().filter(|f| f.starts_with("usr/")).collect();
        let wanted: Vec<String> = {
            let mut w: Vec<String> = binaries
                .iter()
                .map(|b| format!("usr/local/bin/{b}"))
                .collect();
            w.sort();
            w
        };
        assert_eq!(
            programs,
            wanted.iter().collect::<Vec<_>>(),
            "{image}: {all:#?}"
        );
        // No shell, nothing else to run: the binaries, the C runtime, passwd/group, CA roots.
        assert!(!rootfs.join("bin/sh").exists(), "{image}");
        for file in &all {
            let ok = file.starts_with("usr/local/bin/")
                || file.starts_with("lib")
                || matches!(
                    file.as_str(),
                    "etc/passwd" | "etc/group" | "etc/ssl/certs/ca-certificates.crt"
                );
            assert!(ok, "{image}: {file} should not be in the image");
        }
        // Each binary starts in the image's root filesystem as its user (its libraries are
        // the image's own).
        for binary in binaries {
            let out = Command::new("/usr/sbin/chroot")
                .args(["--userspec=65532:65532"])
                .arg(&rootfs)
                .arg(format!("/usr/local/bin/{binary}"))
                .arg("--version")
                .env_clear()
                .output()
                .unwrap();
            assert!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains(version),
                "{image}: {binary} --version: {out:?}"
            );
        }
    }

    // The cluster-agent from its image serves an imported cluster: registered, connected,
    // reporting the cluster's nodes, and proxying kubectl through the hub.
    let imported = Imported::start("images-import", SimConfig::default()).await;
    let rootfs = dir.join("unpacked/cluster-agent/rootfs");
    let mut env = imported.agent_env("drover-cluster-agent-0").await;
    // As Kubernetes would mount them: the service account's kubeconfig and a writable state
    // directory inside the container.
    let inside = rootfs.join("tmp/agent");
    std::fs::create_dir_all(inside.join("state")).unwrap();
    std::fs::copy(&env["KUBECONFIG"], inside.join("kubeconfig")).unwrap();
    std::fs::set_permissions(
        inside.join("kubeconfig"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    tests::sh(&format!("chown -R 65532:65532 {}", inside.display()));
    env.insert("KUBECONFIG".into(), "/tmp/agent/kubeconfig".into());
    env.insert("DROVER_STATE_DIR".into(), "/tmp/agent/state".into());
    let connected = tokio::spawn({
        let (addr, admin) = (imported.hub.addr, imported.admin.clone());
        async move {
            wait_for_event(
                addr,
                "/v1/clusters?watch=true",
                &admin,
                Duration::from_secs(60),
                |e| {
                    let status = &e["object"]["status"];
                    status["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Connected" && c["status"] == "True")
                    }) && status["nodes"]["total"].as_u64().is_some_and(|n| n > 0)
                },
            )
            .await
        }
    });
    let mut agent = tokio::process::Command::new("/usr/sbin/chroot")
        .args(["--userspec=65532:65532"])
        .arg(&rootfs)
        .arg("/usr/local/bin/drover-cluster-agent")
        .env_clear()
        .envs(&env)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("agent.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let cluster = connected.await.unwrap();
    assert_eq!(cluster["object"]["metadata"]["name"], "prod");
    let kubeconfig = issued_kubeconfig(&imported.hub, &imported.admin, &dir, "admin", None).await;
    let nodes = kubectl_ok(&kubeconfig, &["get", "nodes", "-o", "name"]).await;
    assert!(nodes.lines().count() > 0, "{nodes}");
    // What it kept is in the container's state directory, owned by its user.
    assert!(inside.join("state/registration.json").exists());
    let _ = agent.kill().await;
    imported.shutdown.cancel();
}
