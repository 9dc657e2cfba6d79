//! Agents meeting the real hub: registration, credentials, the Connected condition, revocation.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::{HubProcess, api, login, temp_dir, wait_for_event};
use tunnel::{AgentSession, ConnectError, Connector, ConnectorConfig, Peer, Secret, tls::Trust};

fn agent(hub: &HubProcess, credential: &str, id: &str, kind: &str) -> Connector {
    let identity = Peer {
        id: id.into(),
        kind: kind.into(),
    };
    let config = ConnectorConfig::new(
        hub.url(),
        Secret::new(credential),
        identity,
        Trust::CaChecksum(hub.ca_checksum.clone()),
    );
    Connector::new(config).unwrap()
}

/// A hub on a fresh data directory, and its admin's API token.
async fn hub_with_admin(label: &str) -> (std::path::PathBuf, HubProcess, String) {
    let data = temp_dir(label);
    let hub = HubProcess::start(&data).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    (data, hub, admin)
}

/// Stops the hub (it must stop cleanly) and removes its data.
async fn finish(hub: HubProcess, data: &std::path::Path) {
    assert!(hub.terminate().await);
    std::fs::remove_dir_all(data).unwrap();
}

async fn register(hub: &HubProcess, registration_token: &str, kind: &str) -> (u16, Value) {
    tests::api_as_agent(hub.addr, registration_token, json!({"kind": kind})).await
}

fn connected(event: &Value, cluster: &str, value: &str) -> bool {
    let object = &event["object"];
    object["metadata"]["name"] == cluster
        && object["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Connected" && c["status"] == value)
        })
}

/// Waits, in the background, for cluster `prod` to show `Connected` = `value`.
fn watch_connected(
    hub: &HubProcess,
    admin: &str,
    value: &'static str,
) -> tokio::task::JoinHandle<Value> {
    let (addr, admin) = (hub.addr, admin.to_owned());
    tokio::spawn(async move {
        let within = Duration::from_secs(30);
        wait_for_event(addr, "/v1/clusters?watch=true", &admin, within, |e| {
            connected(e, "prod", value)
        })
        .await
    })
}

#[tokio::test]
async fn an_imported_clusters_agent_registers_connects_and_is_cut_off_when_revoked() {
    let (data, hub, admin) = hub_with_admin("agents").await;
    let registration = tests::create_imported_cluster(hub.addr, &admin, "prod").await;

    // The registration token does not open a tunnel by itself.
    let err = agent(&hub, &registration, "cluster/prod", "cluster-agent")
        .connect()
        .await
        .unwrap_err();
    match err {
        ConnectError::Unauthorized {
            status: 401,
            message,
        } => assert!(message.contains("/v3/register"), "{message}"),
        other => panic!("expected 401, got {other}"),
    }

    // Exchanged, it yields the agent's own credential and identity.
    let (status, reply) = register(&hub, &registration, "cluster-agent").await;
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply["id"], "cluster/prod");
    let credential = reply["credential"].as_str().unwrap().to_owned();
    let (status, _) = register(&hub, "drr_tnothing.wrong", "cluster-agent").await;
    assert_eq!(status, 401);

    // A credential proves only its own identity.
    let err = agent(&hub, &credential, "cluster/staging", "cluster-agent")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Unauthorized { .. }), "{err}");

    let watch = watch_connected(&hub, &admin, "True");
    let session: AgentSession = agent(&hub, &credential, "cluster/prod/replica-1", "cluster-agent")
        .connect()
        .await
        .unwrap();
    let event = watch.await.unwrap();
    assert_eq!(event["object"]["state"]["state"], "active");

    // /metrics counts it, and the requests so far, by route template (never by object name).
    let (status, metrics) = tests::https_get(hub.addr, "/metrics").await;
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("drover_tunnel_sessions{kind=\"cluster-agent\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("drover_api_requests_total{route=\"/v1/{plural}\",code=\"201\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("drover_store_operation_seconds_count"),
        "{metrics}"
    );
    assert!(!metrics.contains("prod"), "no object names in labels");

    // Revoking the registration token leaves registered agents alone.
    let token_name = registration
        .trim_start_matches("drr_")
        .split('.')
        .next()
        .unwrap()
        .to_owned();
    let (status, _) = api(
        hub.addr,
        "DELETE",
        &format!("/v1/registrationtokens/{token_name}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200);
    agent(&hub, &credential, "cluster/prod/replica-2", "cluster-agent")
        .connect()
        .await
        .unwrap()
        .session
        .close();

    // Revoking the agent's credential ends its session, and the cluster shows it.
    let (_, tokens) = api(hub.addr, "GET", "/v1/tokens", Some(&admin), None).await;
    let credential_name = tokens["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["spec"]["agent"]["id"] == "cluster/prod")
        .map(|t| t["metadata"]["name"].as_str().unwrap().to_owned())
        .unwrap();
    let watch = watch_connected(&hub, &admin, "False");
    let (status, _) = api(
        hub.addr,
        "DELETE",
        &format!("/v1/tokens/{credential_name}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let reason = tokio::time::timeout(Duration::from_secs(10), session.session.ended())
        .await
        .expect("session closed after revocation");
    assert!(!reason.is_empty());
    let event = watch.await.unwrap();
    assert_eq!(event["object"]["state"]["state"], "disconnected");
    let err = agent(&hub, &credential, "cluster/prod", "cluster-agent")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Unauthorized { .. }), "{err}");

    finish(hub, &data).await;
}

#[tokio::test]
async fn a_host_registers_to_a_custom_cluster_and_becomes_a_host_object() {
    let (data, hub, admin) = hub_with_admin("hosts").await;
    let body = json!({"metadata": {"name": "edge"}, "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"}});
    let (_, cluster) = api(hub.addr, "POST", "/v1/clusters", Some(&admin), Some(body)).await;
    let registration = cluster["registration"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let host = json!({"kind": "system-agent", "hostId": "0123456789abcdef", "host": {"roles": {"etcd": true, "controlPlane": true}, "nodeName": "n1"}});
    let (status, reply) = tests::api_as_agent(hub.addr, &registration, host.clone()).await;
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply["id"], "host/h-0123456789abcdef");
    let (status, object) = api(
        hub.addr,
        "GET",
        "/v1/hosts/h-0123456789abcdef",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200, "{object}");
    assert_eq!(
        object["spec"]["roles"],
        json!({"etcd": true, "controlPlane": true, "worker": false})
    );

    // Registering again with the registration token alone is refused: every installer of the
    // cluster has that token, and it must not take over a registered host.
    let first = reply["credential"].as_str().unwrap().to_owned();
    let (status, refused) = tests::api_as_agent(hub.addr, &registration, host.clone()).await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("x-drover-host-credential"),
        "{refused}"
    );
    // With the host's own credential, it replaces that credential.
    let (status, again) = tests::api_with(
        hub.addr,
        "POST",
        "/v3/register",
        Some(&registration),
        Some(host),
        &[("x-drover-host-credential", &first)],
    )
    .await;
    assert_eq!(status, 201, "{again}");
    let err = agent(&hub, &first, "host/h-0123456789abcdef", "system-agent")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, ConnectError::Unauthorized { .. }),
        "the old credential is revoked: {err}"
    );
    let second = again["credential"].as_str().unwrap();
    agent(&hub, second, "host/h-0123456789abcdef", "system-agent")
        .connect()
        .await
        .unwrap()
        .session
        .close();

    // An imported cluster takes no hosts.
    let (_, imported) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({"metadata": {"name": "imp"}, "spec": {"type": "imported"}})),
    )
    .await;
    let token = imported["registration"]["token"].as_str().unwrap();
    let (status, reply) = tests::api_as_agent(
        hub.addr,
        token,
        json!({"kind": "system-agent", "hostId": "0123456789abcdef"}),
    )
    .await;
    assert_eq!(status, 422, "{reply}");
    finish(hub, &data).await;
}

#[tokio::test]
async fn a_registration_token_of_one_cluster_cannot_take_over_a_host_of_another() {
    let (data, hub, admin) = hub_with_admin("takeover").await;
    let spec = json!({"distribution": "k3s", "version": "v1.33.4+k3s1"});
    let victim = tests::create_custom_cluster(hub.addr, &admin, "victim", spec.clone()).await;
    let attacker = tests::create_custom_cluster(hub.addr, &admin, "attacker", spec).await;
    let host = json!({"kind": "system-agent", "hostId": "feedfacefeedface", "host": {"roles": {"worker": true}}});
    let (status, reply) =
        tests::api_as_agent(hub.addr, victim["token"].as_str().unwrap(), host.clone()).await;
    assert_eq!(status, 201, "{reply}");
    let credential = reply["credential"].as_str().unwrap().to_owned();

    // The other cluster's token, with the victim host's id, with or without a credential.
    for headers in [
        vec![],
        vec![("x-drover-host-credential", "drt_tnope.secret")],
    ] {
        let (status, refused) = tests::api_with(
            hub.addr,
            "POST",
            "/v3/register",
            attacker["token"].as_str(),
            Some(host.clone()),
            &headers,
        )
        .await;
        assert_eq!(status, 409, "{refused}");
        assert!(
            refused["message"]
                .as_str()
                .unwrap()
                .contains("another cluster"),
            "{refused}"
        );
    }
    let (_, object) = api(
        hub.addr,
        "GET",
        "/v1/hosts/h-feedfacefeedface",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(object["spec"]["cluster"], "victim", "{object}");
    // The victim keeps its credential and its session.
    agent(&hub, &credential, "host/h-feedfacefeedface", "system-agent")
        .connect()
        .await
        .unwrap()
        .session
        .close();
    // And an admin cannot move it either: what a host was registered to is fixed.
    let (status, moved) = api(
        hub.addr,
        "PATCH",
        "/v1/hosts/h-feedfacefeedface",
        Some(&admin),
        Some(json!({"spec": {"cluster": "attacker"}})),
    )
    .await;
    assert_eq!(status, 422, "{moved}");
    finish(hub, &data).await;
}

#[tokio::test]
async fn a_removed_clusters_credentials_and_owner_do_not_pass_to_a_new_cluster_of_its_name() {
    let (data, hub, admin) = hub_with_admin("recycled").await;
    let registration = tests::create_imported_cluster(hub.addr, &admin, "prod").await;
    let (status, reply) = register(&hub, &registration, "cluster-agent").await;
    assert_eq!(status, 201, "{reply}");
    let credential = reply["credential"].as_str().unwrap().to_owned();
    let user =
        json!({"metadata": {"name": "olga"}, "spec": {"password": "a long enough password"}});
    assert_eq!(
        api(hub.addr, "POST", "/v1/users", Some(&admin), Some(user))
            .await
            .0,
        201
    );
    let binding = json!({"metadata": {"name": "olga-owns"}, "spec": {"user": "olga", "role": "cluster-owner", "cluster": "prod"}});
    assert_eq!(
        api(
            hub.addr,
            "POST",
            "/v1/rolebindings",
            Some(&admin),
            Some(binding)
        )
        .await
        .0,
        201
    );
    let owner = login(hub.addr, "olga", "a long enough password").await;

    // The owner cannot skip the clean-up by stripping the finalizer.
    let (status, refused) = api(
        hub.addr,
        "PATCH",
        "/v1/clusters/prod",
        Some(&owner),
        Some(json!({"metadata": {"finalizers": []}})),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    let (status, deleting) = api(hub.addr, "DELETE", "/v1/clusters/prod", Some(&owner), None).await;
    assert_eq!(status, 200);
    // The planner's clean-up runs (the agent is not connected: at once) and the cluster goes;
    // the watch starts from the deletion's revision, so it cannot miss that.
    let from = deleting["metadata"]["resourceVersion"].as_str().unwrap();
    tests::wait_for_event(
        hub.addr,
        &format!("/v1/clusters?watch=true&resourceVersion={from}"),
        &admin,
        Duration::from_secs(30),
        |e| e["type"] == "DELETED" && e["object"]["metadata"]["name"] == "prod",
    )
    .await;

    tests::create_imported_cluster(hub.addr, &admin, "prod").await;
    let err = agent(&hub, &credential, "cluster/prod", "cluster-agent")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Unauthorized { .. }), "{err}");
    let (status, _) = api(hub.addr, "GET", "/v1/clusters/prod", Some(&owner), None).await;
    assert_eq!(status, 404, "the old owner has no role on the new cluster");
    finish(hub, &data).await;
}

#[tokio::test]
async fn agents_connect_while_the_public_port_is_flooded_with_silent_connections() {
    let (data, hub, admin) = hub_with_admin("flood").await;
    let registration = tests::create_imported_cluster(hub.addr, &admin, "prod").await;
    // 300 connections from one address that never send a byte (no ClientHello).
    let mut flood = Vec::new();
    for _ in 0..300 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        flood.push(socket.connect(hub.addr).await.unwrap());
    }
    // Before, the silent ones held every handshake slot until their 10 s timeout: anyone
    // else waited that long. Now they hold none.
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(5),
        tests::https_get(hub.addr, "/healthz"),
    )
    .await
    .expect("served while flooded");
    assert_eq!(status, 200);
    let (status, reply) = register(&hub, &registration, "cluster-agent").await;
    assert_eq!(status, 201, "{reply}");
    let credential = reply["credential"].as_str().unwrap();
    let session = tokio::time::timeout(
        Duration::from_secs(5),
        agent(&hub, credential, "cluster/prod", "cluster-agent").connect(),
    )
    .await
    .expect("the agent connects while flooded")
    .unwrap();
    session.session.close();
    drop(flood);
    finish(hub, &data).await;
}
