//! Bundles from git: a real git server (Debian's `git daemon` on loopback) with commits the test
//! pushes; the hub reads it, turns a path into a bundle, and the simulated cluster gets it. A
//! push reaches the cluster through the webhook at once (a wrong signature is answered as
//! "not found") and by polling without one; a file removed from git is pruned; a path holding
//! a Helm chart is refused with the reason. Over SSH (Debian's `openssh-server` in a
//! network-namespace host, root only): the host key pinned in the credential is the only one
//! trusted, so a wrong pin fails with ssh's own words and the right one reads the repository.
//! Over HTTPS (`git http-backend` behind a TLS server with basic auth, as a private GitLab is
//! reached): the server's CA must be given in the credential, and the login is what lets git
//! read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};
use sim::cluster::SimConfig;
use tests::{
    api, create,
    delivery::{found, image, manifests, until},
    git_http::GitHttps,
    hosts::{Host, Network, skip_without_root},
    imported::Imported,
    sshd::{KeyPair, Sshd},
};

/// Runs git in `dir` (a commit's author set); panics with its stderr if it fails.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=dev",
            "-c",
            "user.email=dev@example.org",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git must be installed (scripts/test installs it)");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A bare repository `shop.git` under `root`, served by `git daemon` on a free loopback port,
/// and a clone to commit in.
struct Server {
    daemon: std::process::Child,
    url: String,
    /// The bare repository (an SSH remote's path).
    bare: PathBuf,
    work: PathBuf,
}

impl Server {
    fn start(root: &Path) -> Self {
        let repos = root.join("repos");
        std::fs::create_dir_all(repos.join("shop.git")).unwrap();
        git(&repos.join("shop.git"), &["init", "--quiet", "--bare"]);
        let port = tests::free_port();
        // Its own process group: `git daemon` runs git-daemon as a child, and both must go.
        let daemon = std::process::Command::new("git")
            .args([
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--listen=127.0.0.1",
                &format!("--port={port}"),
                &format!("--base-path={}", repos.display()),
                &repos.display().to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let work = root.join("work");
        std::fs::create_dir_all(&work).unwrap();
        git(&work, &["init", "--quiet"]);
        git(
            &work,
            &[
                "remote",
                "add",
                "origin",
                &repos.join("shop.git").display().to_string(),
            ],
        );
        Self {
            daemon,
            url: format!("git://127.0.0.1:{port}/shop.git"),
            bare: repos.join("shop.git"),
            work,
        }
    }

    /// Writes `files` (a `None` text removes the file), commits and pushes; the new commit.
    fn push(&self, message: &str, files: &[(&str, Option<&str>)]) -> String {
        for (file, text) in files {
            let path = self.work.join(file);
            match text {
                Some(text) => {
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::write(&path, text).unwrap();
                }
                None => std::fs::remove_file(&path).unwrap(),
            }
        }
        git(&self.work, &["add", "-A"]);
        git(&self.work, &["commit", "--quiet", "-m", message]);
        git(
            &self.work,
            &["push", "--quiet", "origin", "HEAD:refs/heads/main"],
        );
        git(&self.work, &["rev-parse", "HEAD"])
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let group = format!("-{}", self.daemon.id());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
        let _ = self.daemon.wait();
    }
}

/// `sha256=HEX` of `body` with `secret`, as GitHub signs a webhook.
fn signature(secret: &str, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_path_becomes_a_bundle_and_pushes_reach_the_cluster() {
    let imported = Imported::start("gitrepos", SimConfig::default()).await;
    let (hub, admin) = (&imported.hub, imported.admin.as_str());
    let mut env = imported.agent_env("drover-cluster-agent-0").await;
    env.insert("DROVER_DRIFT_SECONDS".into(), "1".into());
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/clusters/prod",
        Some(admin),
        Some(json!({"metadata": {"labels": {"env": "prod", "region": "eu"}}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let server = Server::start(&imported.dir);
    let settings =
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {mode: fast}\n";
    let first = server.push(
        "shop v1",
        &[
            ("apps/web/web.yaml", Some(&manifests("nginx:1.27", false))),
            ("apps/web/settings.yaml", Some(settings)),
            ("apps/web/drover.yaml", Some("defaultNamespace: shop\n")),
            (
                "charts/db/Chart.yaml",
                Some("apiVersion: v2\nname: db\nversion: 0.1.0\n"),
            ),
            ("charts/db/templates/db.yaml", Some(settings)),
        ],
    );
    let secret = "hook s3cret";
    create(
        hub,
        admin,
        "gitrepos",
        json!({"metadata": {"name": "shop"}, "spec": {
            "repo": server.url, "paths": ["apps/web"], "pollingInterval": "1h",
            "webhookSecret": secret,
            "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
        }}),
    )
    .await;
    let repo = async || {
        api(hub.addr, "GET", "/v1/gitrepos/shop", Some(admin), None)
            .await
            .1
    };
    let read = until("the first commit read", repo, |r| {
        r["status"]["commit"] == first
    })
    .await;
    assert_eq!(
        read["status"]["bundles"],
        json!(["shop-apps-web"]),
        "{read:#}"
    );
    assert!(
        read["spec"].get("webhookSecret").is_none(),
        "the secret is write-only: {read:#}"
    );
    let k = &imported.sim_admin;
    until(
        "the Deployment and ConfigMap from git in the cluster",
        async || {
            json!([
                image(&found(k, "deployment", "web").await),
                found(k, "configmap", "settings").await.is_null()
            ])
        },
        |v| v == &json!(["nginx:1.27", false]),
    )
    .await;
    until("the GitRepo counts its clusters", repo, |r| {
        r["status"]["summary"] == "1 of 1 clusters ready"
            && r["status"]["targets"][0]["summary"] == "1 of 1 clusters ready"
    })
    .await;
    // The dashboard's Continuous Delivery page shows the commit and the count.
    let (code, rows) =
        tests::api_text(hub.addr, "GET", "/delivery?part=gitrepos", Some(admin)).await;
    assert_eq!(code, 200, "{rows}");
    assert!(
        rows.contains(&format!(r#"<code title="{first}">{}</code>"#, &first[..12]))
            && rows.contains("1 of 1 clusters ready"),
        "{rows}"
    );
    let cli = imported.cli_login();
    let listed = tests::hub_cli(&cli, &["gitrepo", "list"], "");
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let words: Vec<&str> = listed
        .stdout
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        words[..3],
        ["shop", server.url.as_str(), &first[..12]],
        "{}",
        listed.stdout
    );
    assert_eq!(
        words[3..7],
        ["1", "of", "1", "clusters"],
        "{}",
        listed.stdout
    );
    let bundle = api(
        hub.addr,
        "GET",
        "/v1/bundles/shop-apps-web",
        Some(admin),
        None,
    )
    .await
    .1;
    assert_eq!(bundle["metadata"]["annotations"]["drover.io/commit"], first);

    // A push, announced by the webhook: read at once (the poll is an hour away). The image
    // changes and the ConfigMap's file is gone from git: pruned.
    let second = server.push(
        "shop v2",
        &[
            ("apps/web/web.yaml", Some(&manifests("nginx:1.28", false))),
            ("apps/web/settings.yaml", None),
        ],
    );
    let payload = serde_json::to_vec(&json!({"ref": "refs/heads/main", "after": second})).unwrap();
    let call = async |sig: &str| {
        tests::post_raw(
            hub.addr,
            "/v1/gitrepos/shop/webhook",
            &[
                ("x-hub-signature-256", sig),
                ("content-type", "application/json"),
            ],
            payload.clone(),
        )
        .await
    };
    let (status, answer) = call(&signature("wrong", &payload)).await;
    assert_eq!(
        status, 404,
        "a wrong signature is answered as missing: {answer}"
    );
    let (status, answer) = call(&signature(secret, &payload)).await;
    assert_eq!(status, 202, "{answer}");
    until("the pushed commit read", repo, |r| {
        r["status"]["commit"] == second
    })
    .await;
    until(
        "the new image, the ConfigMap pruned",
        async || {
            json!([
                image(&found(k, "deployment", "web").await),
                found(k, "configmap", "settings").await
            ])
        },
        |v| v == &json!(["nginx:1.28", null]),
    )
    .await;

    // Polling alone picks up a push too.
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/gitrepos/shop",
        Some(admin),
        Some(json!({"spec": {"pollingInterval": "5s"}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let generation = body["metadata"]["generation"].clone();
    // The changed spec is read at once; what comes after it only by polling.
    until("the new spec acted on", repo, |r| {
        r["status"]["observedGeneration"] == generation
    })
    .await;
    let third = server.push(
        "shop v3",
        &[("apps/web/web.yaml", Some(&manifests("nginx:1.29", false)))],
    );
    until("the third commit polled", repo, |r| {
        r["status"]["commit"] == third
    })
    .await;
    until(
        "the third image",
        async || json!(image(&found(k, "deployment", "web").await)),
        |v| v == "nginx:1.29",
    )
    .await;

    // A Helm chart is refused, with the reason; a repository that is not there says git's words.
    create(
        hub,
        admin,
        "gitrepos",
        json!({"metadata": {"name": "charts"}, "spec": {
            "repo": server.url, "paths": ["charts/db"],
            "targets": [{"clusterName": "prod"}],
        }}),
    )
    .await;
    let refused = until(
        "the chart refused",
        async || {
            api(hub.addr, "GET", "/v1/gitrepos/charts", Some(admin), None)
                .await
                .1
        },
        |r| r["status"]["error"].is_string(),
    )
    .await;
    let error = refused["status"]["error"].as_str().unwrap();
    assert!(
        error.contains(
            "holds a Helm chart (charts/db/Chart.yaml): the hub does not render Helm charts"
        ),
        "{error}"
    );
    create(
        hub,
        admin,
        "gitrepos",
        json!({"metadata": {"name": "gone"}, "spec": {
            "repo": server.url.replace("shop.git", "nothing.git"),
            "targets": [{"clusterName": "prod"}],
        }}),
    )
    .await;
    let gone = until(
        "the missing repository said",
        async || {
            api(hub.addr, "GET", "/v1/gitrepos/gone", Some(admin), None)
                .await
                .1
        },
        |r| r["status"]["error"].is_string(),
    )
    .await;
    let error = gone["status"]["error"].as_str().unwrap();
    assert!(
        error.starts_with("fetching branch main of git://")
            && error.contains("trying again in 5 s"),
        "{error}"
    );
    let (_, rows) = tests::api_text(hub.addr, "GET", "/delivery?part=gitrepos", Some(admin)).await;
    assert!(
        rows.contains("access denied or repository not exported: /nothing.git"),
        "the page shows git's error: {rows}"
    );

    // The GitRepo deleted: its bundles go, and what they applied.
    let (status, body) = api(hub.addr, "DELETE", "/v1/gitrepos/shop", Some(admin), None).await;
    assert_eq!(status, 200, "{body}");
    until(
        "the bundle's objects removed",
        async || found(k, "deployment", "web").await,
        Value::is_null,
    )
    .await;
    imported.shutdown.cancel();
    agent.await.unwrap().unwrap();
}

/// The cluster's agent started, the cluster labelled `region=eu` (the manifests name it), and
/// the repository's first commit: the web Deployment in `shop`.
async fn shop_in_eu(
    imported: &Imported,
) -> (
    tokio::task::JoinHandle<Result<(), cluster_agent::AgentError>>,
    Server,
    String,
) {
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let (status, body) = api(
        imported.hub.addr,
        "PATCH",
        "/v1/clusters/prod",
        Some(&imported.admin),
        Some(json!({"metadata": {"labels": {"region": "eu"}}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let server = Server::start(&imported.dir);
    let commit = server.push(
        "shop v1",
        &[
            ("apps/web/web.yaml", Some(&manifests("nginx:1.27", false))),
            ("apps/web/drover.yaml", Some("defaultNamespace: shop\n")),
        ],
    );
    (agent, server, commit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssh_remote_is_read_only_with_its_host_key_pinned() {
    if skip_without_root("sshd in a network namespace needs root") {
        return;
    }
    let imported = Imported::start("gitrepos-ssh", SimConfig::default()).await;
    let (hub, admin) = (&imported.hub, imported.admin.as_str());
    let _net = Network::new(1);
    let host = Host::new(&imported.dir, 1);
    let client = KeyPair::new(&imported.dir, "client");
    let sshd = Sshd::start(&host, &client);
    let (agent, server, commit) = shop_in_eu(&imported).await;
    let url = format!("ssh://root@{}{}", sshd.address, server.bare.display());

    // Pinned to a key the server does not hold: git stops at the host check, saying so.
    let impostor = KeyPair::new(&imported.dir, "impostor");
    let pin = |key: &KeyPair| {
        let mut words = key.public.split_whitespace();
        format!(
            "{} {} {}\n",
            sshd.address,
            words.next().unwrap(),
            words.next().unwrap()
        )
    };
    create(
        hub,
        admin,
        "cloudcredentials",
        json!({"metadata": {"name": "shop-deploy-key"}, "spec": {"driver": "git", "git": {
            "privateKey": client.private, "knownHosts": pin(&impostor),
        }}}),
    )
    .await;
    let cli = imported.cli_login();
    let made = tests::hub_cli(
        &cli,
        &[
            "gitrepo",
            "create",
            "shop",
            "--repo",
            &url,
            "--path",
            "apps/web",
            "--credential",
            "shop-deploy-key",
            "--cluster",
            "prod",
        ],
        "",
    );
    assert_eq!(
        (made.code, made.stdout.as_str()),
        (0, "GitRepo shop created.\n"),
        "{}",
        made.stderr
    );
    let repo = async || {
        api(hub.addr, "GET", "/v1/gitrepos/shop", Some(admin), None)
            .await
            .1
    };
    let refused = until("the wrong pin refused", repo, |r| {
        r["status"]["error"].is_string()
    })
    .await;
    let error = refused["status"]["error"].as_str().unwrap();
    assert!(
        error.contains("Host key verification failed") && error.contains("trying again in"),
        "{error}"
    );
    assert!(refused["status"].get("commit").is_none(), "{refused:#}");

    // The server's own key pinned: the next try reads the repository, the cluster gets it.
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/cloudcredentials/shop-deploy-key",
        Some(admin),
        Some(json!({"spec": {"git": {"knownHosts": pin(&sshd.host_key)}}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let read = until("the commit read over SSH", repo, |r| {
        r["status"]["commit"] == commit
    })
    .await;
    assert!(read["status"]["error"].is_null(), "{read:#}");
    let k = &imported.sim_admin;
    until(
        "the Deployment from the SSH remote in the cluster",
        async || json!(image(&found(k, "deployment", "web").await)),
        |v| v == "nginx:1.27",
    )
    .await;
    sshd.stop();
    imported.shutdown.cancel();
    agent.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_https_remote_is_read_with_its_ca_and_login() {
    let imported = Imported::start("gitrepos-https", SimConfig::default()).await;
    let (hub, admin) = (&imported.hub, imported.admin.as_str());
    let (agent, server, commit) = shop_in_eu(&imported).await;
    let password = "glpat-s3cret-deploy-token";
    let https = GitHttps::start(
        &imported.dir,
        server.bare.parent().unwrap(),
        ("deploy", password),
    )
    .await;
    let url = format!("{}/shop.git", https.url);

    // The login, but not the server's CA: git refuses the certificate, saying so.
    create(
        hub,
        admin,
        "cloudcredentials",
        json!({"metadata": {"name": "shop-https"}, "spec": {"driver": "git", "git": {
            "username": "deploy", "password": password,
        }}}),
    )
    .await;
    let gitrepo = |name: &str, credential: &str| {
        json!({"metadata": {"name": name}, "spec": {
            "repo": url, "paths": ["apps/web"], "credential": credential,
            "targets": [{"clusterName": "prod"}],
        }})
    };
    create(hub, admin, "gitrepos", gitrepo("shop", "shop-https")).await;
    let repo = async |name: &str| {
        api(
            hub.addr,
            "GET",
            &format!("/v1/gitrepos/{name}"),
            Some(admin),
            None,
        )
        .await
        .1
    };
    let refused = until(
        "the unknown CA refused",
        async || repo("shop").await,
        |r| r["status"]["error"].is_string(),
    )
    .await;
    let error = refused["status"]["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("unable to access '{url}/'"))
            && error.contains("certificate")
            && error.contains("trying again in")
            && !error.contains(password),
        "{error}"
    );

    // The server's CA given: the next try logs in and reads the commit; the cluster gets it.
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/cloudcredentials/shop-https",
        Some(admin),
        Some(json!({"spec": {"git": {"caBundle": https.ca_pem}}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let read = until(
        "the commit read over HTTPS",
        async || repo("shop").await,
        |r| r["status"]["commit"] == commit,
    )
    .await;
    assert!(read["status"]["error"].is_null(), "{read:#}");
    let k = &imported.sim_admin;
    until(
        "the Deployment from the HTTPS remote in the cluster",
        async || json!(image(&found(k, "deployment", "web").await)),
        |v| v == "nginx:1.27",
    )
    .await;

    // The CA alone, without the login: the server answers 401 and git says it has no login to
    // give (the login above was what let it read).
    create(
        hub,
        admin,
        "cloudcredentials",
        json!({"metadata": {"name": "ca-only"}, "spec": {"driver": "git", "git": {
            "caBundle": https.ca_pem,
        }}}),
    )
    .await;
    create(hub, admin, "gitrepos", gitrepo("anonymous", "ca-only")).await;
    let refused = until(
        "the read without a login refused",
        async || repo("anonymous").await,
        |r| r["status"]["error"].is_string(),
    )
    .await;
    let error = refused["status"]["error"].as_str().unwrap();
    assert!(
        error.contains("could not read Username") && error.contains("trying again in"),
        "{error}"
    );
    // A CA that is not PEM is refused with what to give.
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/cloudcredentials/ca-only",
        Some(admin),
        Some(json!({"spec": {"git": {"caBundle": "not a certificate"}}})),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("spec.git.caBundle"), "{body}");
    imported.shutdown.cancel();
    agent.await.unwrap().unwrap();
}
