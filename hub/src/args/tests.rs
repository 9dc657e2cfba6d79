//! The command line as a user types it: flags, environment and defaults in, a command or a
//! clear error out.

use super::*;
use crate::config::{DEFAULT_HEARTBEAT, DEFAULT_MAX_HANDSHAKES, StoreLocation, url_host};

fn serve(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let argv = ["drover-hub", "serve"]
        .iter()
        .chain(args)
        .map(|s| s.to_string());
    match parse(argv, &env)? {
        Command::Serve(c) => Ok(c),
        other => panic!("expected serve, got {other:?}"),
    }
}

#[test]
fn no_flags_gives_the_documented_defaults() {
    let config = serve(&[], &[("HOSTNAME", "hub1")]).unwrap();
    assert_eq!(config.data_dir, PathBuf::from("./drover-data"));
    assert_eq!(config.listen, "0.0.0.0:8443".parse().unwrap());
    assert_eq!(config.server_url_for(8443), "https://hub1:8443");
    assert_eq!(config.heartbeat, DEFAULT_HEARTBEAT);
}

#[test]
fn the_heartbeat_interval_is_whole_seconds_in_range() {
    let config = serve(&["--heartbeat-seconds", "2"], &[]).unwrap();
    assert_eq!(config.heartbeat, std::time::Duration::from_secs(2));
    assert_eq!(serve(&[], &[]).unwrap().store, StoreLocation::Sqlite);
    assert_eq!(
        serve(&[], &[]).unwrap().max_handshakes,
        DEFAULT_MAX_HANDSHAKES
    );
    assert_eq!(
        serve(&["--max-handshakes", "0"], &[])
            .unwrap()
            .max_handshakes,
        0
    );
    assert!(serve(&["--max-handshakes", "lots"], &[]).is_err());
    assert_eq!(
        serve(&["--store", "etcd://10.0.0.1:2379,10.0.0.2:2379"], &[])
            .unwrap()
            .store,
        StoreLocation::Etcd("etcd://10.0.0.1:2379,10.0.0.2:2379".into())
    );
    assert_eq!(
        serve(&[], &[("DROVER_STORE", "etcd://etcd:2379/hubs/eu")])
            .unwrap()
            .store,
        StoreLocation::Etcd("etcd://etcd:2379/hubs/eu".into())
    );
    let err = serve(&["--store", "postgres://db"], &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--store") && err.contains("etcd://HOST:PORT"),
        "{err}"
    );
    for bad in ["0", "301", "1.5", "ten"] {
        let err = serve(&[], &[("DROVER_HEARTBEAT_SECONDS", bad)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--heartbeat-seconds") && err.contains("1 to 300"),
            "{err}"
        );
    }
}

#[test]
fn flags_beat_environment_variables() {
    let env = [
        ("DROVER_LISTEN", "127.0.0.1:9000"),
        ("DROVER_DATA_DIR", "/var/lib/drover"),
    ];
    let config = serve(&["--listen", "127.0.0.1:9443"], &env).unwrap();
    assert_eq!(config.listen, "127.0.0.1:9443".parse().unwrap());
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/drover"));
}

#[test]
fn a_bad_value_names_the_flag_and_the_variable() {
    let err = serve(&[], &[("DROVER_LISTEN", "8443")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--listen") && err.contains("DROVER_LISTEN"),
        "{err}"
    );
    let err = serve(&["--server-url", "http://hub"], &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--server-url") && err.contains("https://"),
        "{err}"
    );
}

#[test]
fn a_certificate_needs_its_key() {
    let err = serve(&["--tls-cert", "/etc/hub.pem"], &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("--tls-key"), "{err}");
    let config = serve(
        &[],
        &[("DROVER_TLS_CERT", "/c.pem"), ("DROVER_TLS_KEY", "/k.pem")],
    )
    .unwrap();
    assert_eq!(
        config.tls,
        Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
    );
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    assert!(matches!(
        serve(&["--lisen", "x"], &[]),
        Err(ConfigError::Usage(_))
    ));
}

#[test]
fn url_host_strips_ipv6_brackets() {
    assert_eq!(url_host("https://[::1]:8443").as_deref(), Some("::1"));
    assert_eq!(
        url_host("https://hub.example.com").as_deref(),
        Some("hub.example.com")
    );
}

fn client(args: &[&str]) -> Result<crate::cli::Request, ConfigError> {
    let argv = std::iter::once("drover-hub")
        .chain(args.iter().copied())
        .map(str::to_owned);
    match parse(argv, &HashMap::new())? {
        Command::Client { request, .. } => Ok(request),
        other => panic!("expected a client command, got {other:?}"),
    }
}

#[test]
fn the_authorized_endpoint_is_turned_on_or_off_never_both() {
    let on = client(&[
        "cluster",
        "endpoint",
        "edge",
        "--enable",
        "--fqdn",
        "api.example.com",
    ]);
    assert!(
        matches!(&on, Ok(crate::cli::Request::ClusterEndpoint { cluster, enabled: true, fqdn, ca_certs: None })
            if cluster == "edge" && fqdn == "api.example.com"),
        "{on:?}"
    );
    let off = client(&["cluster", "endpoint", "edge", "--disable"]);
    assert!(
        matches!(
            off,
            Ok(crate::cli::Request::ClusterEndpoint { enabled: false, .. })
        ),
        "{off:?}"
    );
    for wrong in [
        &["cluster", "endpoint", "edge"][..],
        &["cluster", "endpoint", "edge", "--enable", "--disable"],
        &[
            "cluster",
            "endpoint",
            "edge",
            "--disable",
            "--fqdn",
            "x.example.com",
        ],
    ] {
        assert!(client(wrong).is_err(), "{wrong:?}");
    }
}

#[test]
fn role_templates_are_made_from_kubectl_style_rules() {
    let made = client(&[
        "role",
        "template",
        "create",
        "deployer",
        "--context",
        "project",
        "--rule",
        "get,list,watch,patch:deployments.apps,deployments.apps/scale",
        "--rule",
        "get,list:pods,pods/log",
        "--inherit",
        "project-read-only",
    ]);
    let Ok(crate::cli::Request::TemplateCreate { name, spec }) = made else {
        panic!("{made:?}");
    };
    assert_eq!(name, "deployer");
    assert_eq!(
        spec,
        serde_json::json!({"context": "project", "inherits": ["project-read-only"], "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}]})
    );
    let bad = client(&[
        "role",
        "template",
        "create",
        "x",
        "--context",
        "cluster",
        "--rule",
        "pods",
    ]);
    let message = format!("{}", bad.unwrap_err());
    assert!(message.contains("VERBS:RESOURCES"), "{message}");
}

#[test]
fn a_grant_names_one_role_a_template_or_a_global_role() {
    let grant = client(&[
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
    ]);
    assert!(
        matches!(&grant, Ok(crate::cli::Request::RoleGrant { field: "roleTemplate", role, .. }) if role == "deployer"),
        "{grant:?}"
    );
    let global = client(&[
        "role",
        "grant",
        "--user",
        "ann",
        "--global",
        "clusters-create",
    ]);
    assert!(
        matches!(&global, Ok(crate::cli::Request::RoleGrant { field: "globalRole", name, .. }) if name == "ann-clusters-create-global"),
        "{global:?}"
    );
    assert!(client(&["role", "grant", "--user", "ann"]).is_err());
    assert!(
        client(&[
            "role", "grant", "--user", "ann", "--role", "admin", "--global", "admin"
        ])
        .is_err()
    );
}

#[test]
fn a_gitrepo_is_created_from_flags_with_its_targets_in_order() {
    let made = client(&[
        "gitrepo",
        "create",
        "shop",
        "--repo",
        "ssh://git@git.example.org/shop.git",
        "--branch",
        "release",
        "--path",
        "apps/web",
        "--path",
        "apps/db",
        "--credential",
        "deploy-key",
        "--cluster",
        "edge-1",
        "--selector",
        "env=prod, region=eu",
        "--group",
        "canaries",
    ]);
    let Ok(crate::cli::Request::GitrepoCreate { name, spec }) = made else {
        panic!("{made:?}");
    };
    assert_eq!(name, "shop");
    assert_eq!(
        spec,
        serde_json::json!({
            "repo": "ssh://git@git.example.org/shop.git", "branch": "release",
            "paths": ["apps/web", "apps/db"], "credential": "deploy-key",
            "targets": [
                {"clusterName": "edge-1"},
                {"clusterSelector": {"matchLabels": {"env": "prod", "region": "eu"}}},
                {"clusterGroup": "canaries"}]})
    );
    for (bad, says) in [
        ("env!=prod", "KEY=VALUE"),
        ("env", "KEY=VALUE"),
        (",", "at least one label"),
    ] {
        let made = client(&[
            "gitrepo",
            "create",
            "x",
            "--repo",
            "git://h/r",
            "--selector",
            bad,
        ]);
        let message = format!("{}", made.unwrap_err());
        assert!(message.contains(says), "{bad}: {message}");
    }
    let both = client(&[
        "gitrepo",
        "create",
        "x",
        "--repo",
        "git://h/r",
        "--branch",
        "a",
        "--revision",
        "b",
    ]);
    assert!(
        both.is_err(),
        "a branch and a revision are one or the other"
    );
}
