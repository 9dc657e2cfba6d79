//! The audit log, end to end: logins (refused ones too), API writes, token changes and
//! requests through the proxy (kubectl, as a user) are recorded with who, what, where and the
//! answer (and, at level `request`, the bodies of writes with their secrets redacted); admins
//! read them back by user, cluster and time; the log survives a restart and holds no password,
//! token or Secret value.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use sim::cluster::SimConfig;
use tests::{
    HubProcess, api,
    imported::{Imported, issued_kubeconfig, kubectl_ok, until_allowed},
    leaked_secrets, login,
};

/// The records the admin reads with `query`.
async fn records(hub: &HubProcess, admin: &str, query: &str) -> Vec<Value> {
    let (status, list) = api(
        hub.addr,
        "GET",
        &format!("/v1/audit{query}"),
        Some(admin),
        None,
    )
    .await;
    assert_eq!(status, 200, "{list}");
    list["items"].as_array().unwrap().clone()
}

fn has(records: &[Value], verb: &str, path_end: &str, code: u16) -> bool {
    records.iter().any(|r| {
        r["verb"] == verb && r["path"].as_str().unwrap().ends_with(path_end) && r["code"] == code
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_did_what_is_recorded_without_a_secret_and_survives_a_restart() {
    // At level `request`: writes' JSON bodies are kept, secrets redacted.
    let imported = Imported::start_with(
        "audit",
        SimConfig {
            nodes: 1,
            pods: 10,
            ..SimConfig::default()
        },
        &["--listen", "127.0.0.1:0", "--audit-level", "request"],
    )
    .await;
    let (hub, admin, dir) = (&imported.hub, imported.admin.clone(), imported.dir.clone());
    let config =
        cluster_agent::Config::from_env(&imported.agent_env("drover-cluster-agent-0").await)
            .unwrap();
    tokio::spawn(cluster_agent::run(config, imported.shutdown.child_token()));

    // A user, a refused login, a login, a kubeconfig, kubectl through the hub.
    let password = "pat's long enough password";
    let wrong = "not pat's password at all";
    for (path, body) in [
        (
            "/v1/users",
            json!({"metadata": {"name": "pat"}, "spec": {"password": password}}),
        ),
        (
            "/v1/rolebindings",
            json!({"metadata": {"name": "pat-member"}, "spec": {"user": "pat", "role": "cluster-member", "cluster": "prod"}}),
        ),
    ] {
        let (status, answer) = api(hub.addr, "POST", path, Some(&admin), Some(body)).await;
        assert_eq!(status, 201, "{answer}");
    }
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/login",
        None,
        Some(json!({"username": "pat", "password": wrong})),
    )
    .await;
    assert_eq!(status, 401);
    // A password typed into the name field is not recorded as the name.
    let typed = "Hunter2!NotAName";
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/login",
        None,
        Some(json!({"username": typed, "password": "whatever it is"})),
    )
    .await;
    assert_eq!(status, 401);
    let pat = login(hub.addr, "pat", password).await;
    let kubeconfig = issued_kubeconfig(hub, &pat, &dir, "pat", None).await;
    let kube_token = tests::imported::kubeconfig_token(&kubeconfig);
    until_allowed(&kubeconfig, &["create", "configmaps", "-n", "load-0"]).await;
    kubectl_ok(&kubeconfig, &["get", "pods", "-n", "load-0"]).await;
    kubectl_ok(
        &kubeconfig,
        &[
            "create",
            "configmap",
            "audited",
            "-n",
            "load-0",
            "--from-literal=k=v",
        ],
    )
    .await;
    // An API token made and revoked.
    let (status, made) = api(
        hub.addr,
        "POST",
        "/v1/tokens",
        Some(&pat),
        Some(json!({"spec": {"description": "ci"}})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let ci_token = made["token"].as_str().unwrap().to_owned();
    let ci_name = made["metadata"]["name"].as_str().unwrap().to_owned();
    let (status, _) = api(
        hub.addr,
        "DELETE",
        &format!("/v1/tokens/{ci_name}"),
        Some(&pat),
        None,
    )
    .await;
    assert!((200..300).contains(&status));

    // A Secret written as JSON through the proxy: its values never reach the log.
    let (status, answer) = api(
        hub.addr,
        "POST",
        "/k8s/clusters/prod/api/v1/namespaces/load-0/secrets",
        Some(&pat),
        Some(
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
                    "stringData": {"password": "the database's own password"},
                    "data": {"key": "dGhlIGRhdGFiYXNlJ3Mga2V5"}}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{answer}");

    // Secrets changed every way kubectl changes them: `apply` (again: a strategic merge patch
    // carrying the last-applied-configuration), `patch` (strategic and JSON), and a hub
    // project secret without `kind`, patched too; a registry credential's client key. None of
    // their values may reach the log, whatever the body's shape.
    let applied = dir.join("secret.yaml");
    let kubectl_secrets = [
        "first applied value",
        "second applied value",
        "strategic patch value",
        "json patch value",
    ];
    for value in &kubectl_secrets[..2] {
        std::fs::write(
            &applied,
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: applied\n  namespace: load-0\nstringData:\n  pw: {value}\n"
            ),
        )
        .unwrap();
        kubectl_ok(&kubeconfig, &["apply", "-f", applied.to_str().unwrap()]).await;
    }
    kubectl_ok(
        &kubeconfig,
        &[
            "patch",
            "secret",
            "applied",
            "-n",
            "load-0",
            "-p",
            &format!("{{\"stringData\": {{\"pw\": \"{}\"}}}}", kubectl_secrets[2]),
        ],
    )
    .await;
    kubectl_ok(
        &kubeconfig,
        &[
            "patch",
            "secret",
            "applied",
            "-n",
            "load-0",
            "--type=json",
            "-p",
            &format!(
                "[{{\"op\": \"add\", \"path\": \"/stringData\", \"value\": {{\"pw\": \"{}\"}}}}]",
                kubectl_secrets[3]
            ),
        ],
    )
    .await;
    for value in kubectl_secrets {
        tests::note_secret(value);
    }
    let (status, answer) = api(
        hub.addr,
        "POST",
        "/v1/projects",
        Some(&admin),
        Some(json!({"metadata": {"name": "lab"}, "spec": {"cluster": "prod"}})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    // A short value too: "czNj" is base64 of "s3c".
    let (status, answer) = api(
        hub.addr,
        "POST",
        "/v1/projectsecrets",
        Some(&admin),
        Some(json!({"metadata": {"name": "lab-db"},
                    "spec": {"cluster": "prod", "project": "lab", "data": {"pw": "czNj"}}})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = api(
        hub.addr,
        "PATCH",
        "/v1/projectsecrets/lab-db",
        Some(&admin),
        Some(json!({"spec": {"data": {"pw": "bmV3IHByb2plY3Qgc2VjcmV0"}}})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let client_key =
        "-----BEGIN PRIVATE KEY-----\nregistry client key\n-----END PRIVATE KEY-----\n";
    let (status, answer) = api(
        hub.addr,
        "POST",
        "/v1/cloudcredentials",
        Some(&admin),
        Some(
            json!({"metadata": {"name": "corp-pull"}, "spec": {"driver": "registry",
            "registry": {"username": "puller", "password": "registry password here",
                         "key": client_key}}}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{answer}");

    // What the admin reads back about pat.
    let mine = records(hub, &admin, "?user=pat").await;
    assert!(has(&mine, "login", "/v1/login", 401), "{mine:#?}");
    assert!(has(&mine, "login", "/v1/login", 200), "{mine:#?}");
    assert!(has(&mine, "create", "/v1/clusters/prod/kubeconfig", 201));
    assert!(
        has(&mine, "list", "/namespaces/load-0/pods", 200),
        "{mine:#?}"
    );
    assert!(
        has(&mine, "create", "/namespaces/load-0/configmaps", 201),
        "{mine:#?}"
    );
    assert!(has(&mine, "create", "/v1/tokens", 201));
    let revoked = format!("/v1/tokens/{ci_name}");
    assert!(has(&mine, "delete", &revoked, 200) || has(&mine, "delete", &revoked, 204));
    let created = mine
        .iter()
        .find(|r| r["verb"] == "create" && r["resource"] == "configmaps")
        .unwrap();
    assert_eq!(created["cluster"], "prod");
    assert_eq!(created["provider"], "local");
    assert!(
        created["source"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{created}"
    );
    assert!(!created["requestId"].as_str().unwrap().is_empty());
    assert!(mine.iter().all(|r| r["user"] == "pat"));
    // Bodies: the login's password and the Secret's values redacted, the rest kept.
    // A Secret's body is a summary: what it names, no value at all.
    let secret = mine
        .iter()
        .find(|r| r["verb"] == "create" && r["resource"] == "secrets")
        .unwrap();
    assert_eq!(secret["requestObject"]["metadata"]["name"], "db");
    assert_eq!(secret["requestObject"]["kind"], "Secret");
    assert!(
        secret["requestObject"].get("stringData").is_none(),
        "{secret}"
    );
    assert!(secret["requestObject"].get("data").is_none(), "{secret}");
    let patched = mine
        .iter()
        .filter(|r| r["verb"] == "patch" && r["resource"] == "secrets")
        .count();
    assert!(patched >= 3, "{mine:#?}");
    let login_record = mine.iter().find(|r| r["verb"] == "login").unwrap();
    assert_eq!(login_record["requestObject"]["username"], "pat");
    assert_eq!(login_record["requestObject"]["password"], "<redacted>");
    let nameless = records(hub, &admin, "?user=%3Cnot%20a%20user%20name%3E").await;
    assert!(has(&nameless, "login", "/v1/login", 401), "{nameless:#?}");
    // The admin's writes are the admin's; by cluster and time too.
    let admins = records(hub, &admin, "?user=admin").await;
    assert!(has(&admins, "create", "/v1/users", 201));
    let since = mine.iter().find(|r| r["verb"] == "list").unwrap()["time"]
        .as_str()
        .unwrap()
        .to_owned();
    let prod = records(hub, &admin, &format!("?cluster=prod&since={since}")).await;
    assert!(has(&prod, "create", "/namespaces/load-0/configmaps", 201));
    assert!(
        prod.iter()
            .all(|r| r["cluster"] == "prod" && r["time"].as_str().unwrap() >= since.as_str()),
        "{prod:#?}"
    );
    assert!(!has(&prod, "login", "/v1/login", 200));
    // Only admins read it; a bad time is named.
    let (status, _) = api(hub.addr, "GET", "/v1/audit", Some(&pat), None).await;
    assert_eq!(status, 403);
    let (status, answer) = api(
        hub.addr,
        "GET",
        "/v1/audit?since=yesterday",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 400, "{answer}");

    // No password or token in the log.
    let data_dir = dir.join("hub");
    let log_dir = data_dir.join("audit");
    let mut text = String::new();
    for entry in std::fs::read_dir(&log_dir).unwrap() {
        text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    let admin_password = hub.admin_password.clone().unwrap();
    let leaked = leaked_secrets(
        &text,
        &[
            password,
            wrong,
            &pat,
            &kube_token,
            &ci_token,
            &admin,
            &admin_password,
            "the database's own password",
            "dGhlIGRhdGFiYXNlJ3Mga2V5",
            typed,
            kubectl_secrets[0],
            kubectl_secrets[1],
            kubectl_secrets[2],
            kubectl_secrets[3],
            "bmV3IHByb2plY3Qgc2VjcmV0",
            "registry client key",
            "registry password here",
        ],
    );
    assert!(leaked.is_empty(), "the audit log holds {leaked:?}");
    assert!(
        !text.contains("\"czNj\""),
        "the audit log holds a project secret's value"
    );

    // After a restart the records are still there, and new ones follow them.
    let before = mine.len();
    imported.shutdown.cancel();
    let Imported { hub, .. } = imported;
    assert!(hub.terminate().await);
    let hub = HubProcess::start(&data_dir).await;
    login(hub.addr, "pat", password).await;
    let admin = login(hub.addr, "admin", &admin_password).await;
    let again = records(&hub, &admin, "?user=pat").await;
    assert_eq!(
        again[..before],
        mine[..],
        "the records from before the restart"
    );
    assert_eq!(
        again.len(),
        before + 1,
        "and the new login: {:#?}",
        &again[before..]
    );
}
