//! A stand-in for GitHub (it cannot be reached from these machines): `tests/github/standin.mjs`,
//! run by Node.js over HTTPS with a CA of the test's own, answering the OAuth app flow and the
//! REST endpoints the hub calls with GitHub's documented shapes, as GitHub Enterprise Server
//! serves them (the API under `/api/v3`).

use std::{net::SocketAddr, path::Path};

use serde_json::{Value, json};
use tokio::process::Child;

/// A running stand-in; stopped when dropped.
#[derive(Debug)]
pub struct GithubStandIn {
    _child: Child,
    /// What the provider's `baseUrl` is.
    pub url: String,
    pub addr: SocketAddr,
    pub ca_pem: String,
}

impl GithubStandIn {
    /// Starts it with one OAuth app and these users (login → {id, name, orgs, teams}); the
    /// browser is signed in as `signed_in`.
    pub async fn start(
        dir: &Path,
        (client_id, secret): (&str, &str),
        users: Value,
        signed_in: &str,
    ) -> Self {
        let ca = tunnel::tls::CertificateAuthority::generate("test GitHub CA").unwrap();
        let served = ca.issue_server(&["127.0.0.1".to_owned()]).unwrap();
        let config = json!({
            "cert": served.cert_pem, "key": served.key_pem,
            "clientId": client_id, "clientSecret": secret,
            "users": users, "signedIn": signed_in,
        });
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("github/standin.mjs");
        let (child, first) = crate::oidc::node_server(&script, "GITHUB_CONFIG", &config, dir).await;
        let url = first["url"].as_str().unwrap().to_owned();
        GithubStandIn {
            _child: child,
            addr: url.trim_start_matches("https://").parse().unwrap(),
            url,
            ca_pem: ca.pem().cert_pem.clone(),
        }
    }

    /// Replaces its users.
    pub async fn set_users(&self, users: Value) {
        let (status, _) = crate::api(self.addr, "POST", "/__test/users", None, Some(users)).await;
        assert_eq!(status, 204);
    }
}
