//! A certified OpenID provider for the tests: npm's `oidc-provider` (pinned in
//! `tests/oidc/package-lock.json`, installed by `scripts/test`), run by Node.js from
//! `tests/oidc/provider.mjs` over HTTPS with a CA of the test's own. Its sign-in page takes
//! any password for a user it knows; the hub's side of the flow is what is tested.

use std::{net::SocketAddr, path::Path, time::Duration};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// Runs `node script` with `config` (JSON) in the environment variable `variable`, in `dir`;
/// returns it once it has printed its first line (JSON: where it listens).
pub(crate) async fn node_server(
    script: &Path,
    variable: &str,
    config: &Value,
    dir: &Path,
) -> (Child, Value) {
    let mut child = Command::new("node")
        .arg(script)
        .env(variable, config.to_string())
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start node (Node.js) with {}: {e}", script.display()));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{} up within 30 s", script.display()))
        .unwrap()
        .unwrap_or_else(|| panic!("{} exited before it was up", script.display()));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, serde_json::from_str(&first).unwrap())
}

/// A running provider; stopped when dropped.
#[derive(Debug)]
pub struct OpenIdProvider {
    _child: Child,
    pub issuer: String,
    pub addr: SocketAddr,
    /// The CA that signed the provider's certificate.
    pub ca_pem: String,
}

impl OpenIdProvider {
    /// Starts the provider with one confidential client (`client_id`, `secret`) redirecting
    /// to `redirect_uri`, and these users (login → claims).
    pub async fn start(
        dir: &Path,
        client_id: &str,
        secret: &str,
        redirect_uri: &str,
        users: Value,
    ) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc");
        assert!(
            script.join("node_modules/oidc-provider").exists(),
            "{}/node_modules is missing: run scripts/test (it runs npm ci there)",
            script.display()
        );
        let ca = tunnel::tls::CertificateAuthority::generate("test OpenID provider CA").unwrap();
        let served = ca.issue_server(&["127.0.0.1".to_owned()]).unwrap();
        let config = json!({
            "cert": served.cert_pem,
            "key": served.key_pem,
            "clients": [{
                "client_id": client_id,
                "client_secret": secret,
                "redirect_uris": [redirect_uri],
                "post_logout_redirect_uris": [redirect_uri.split("/v1/").next().unwrap().to_owned() + "/login"],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
            }],
            "users": users,
        });
        let (child, first) =
            node_server(&script.join("provider.mjs"), "OIDC_CONFIG", &config, dir).await;
        let issuer = first["issuer"].as_str().unwrap().to_owned();
        let addr = issuer.trim_start_matches("https://").parse().unwrap();
        OpenIdProvider {
            _child: child,
            issuer,
            addr,
            ca_pem: ca.pem().cert_pem.clone(),
        }
    }

    /// Replaces the provider's users.
    pub async fn set_users(&self, users: Value) {
        let (status, _) = crate::api(self.addr, "POST", "/__test/users", None, Some(users)).await;
        assert_eq!(status, 204);
    }

    /// Alters the ID tokens the token endpoint sends from now on (`""` stops): see
    /// `provider.mjs`.
    pub async fn tamper(&self, mode: &str) {
        let (status, _) = crate::api(
            self.addr,
            "POST",
            "/__test/tamper",
            None,
            Some(json!({"mode": mode})),
        )
        .await;
        assert_eq!(status, 204);
    }
}
