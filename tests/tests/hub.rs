//! The real `drover-hub` binary, as an operator and an agent meet it.

#![allow(clippy::unwrap_used)]

use tests::{HubProcess, https_get, temp_dir};
use tunnel::{ConnectError, Connector, ConnectorConfig, Peer, Secret, tls::Trust};

#[tokio::test]
async fn the_hub_serves_its_ca_refuses_unknown_agents_and_keeps_its_ca_across_restarts() {
    let data = temp_dir("hub");
    let hub = HubProcess::start(&data).await;

    let (status, body) = https_get(hub.addr, "/healthz").await;
    assert_eq!((status, &body[..]), (200, &b"ok\n"[..]));
    let (status, ca) = https_get(hub.addr, "/cacerts").await;
    assert_eq!(status, 200);
    assert_eq!(
        tunnel::tls::ca_checksum(&ca),
        hub.ca_checksum,
        "the printed checksum is that of /cacerts"
    );

    // An agent pinning that checksum gets through TLS and is refused at the credential.
    let identity = Peer {
        id: "cluster/c-1".into(),
        kind: "cluster-agent".into(),
    };
    let config = ConnectorConfig::new(
        hub.url(),
        Secret::new("made-up"),
        identity,
        Trust::CaChecksum(hub.ca_checksum.clone()),
    );
    match Connector::new(config).unwrap().connect().await {
        Err(ConnectError::Unauthorized { status: 401, .. }) => {}
        other => panic!("expected 401, got {other:?}"),
    }

    let checksum = hub.ca_checksum.clone();
    assert!(hub.terminate().await, "SIGTERM stops the hub cleanly");
    let again = HubProcess::start(&data).await;
    assert_eq!(again.ca_checksum, checksum, "a restart keeps the CA");
    assert!(again.terminate().await);
    std::fs::remove_dir_all(&data).unwrap();
}
