//! A private git server over HTTPS: `tests/git-http/server.mjs` (Node.js) with a certificate
//! from a CA of the test's own and a basic-auth login, answering git's smart HTTP protocol by
//! running `git http-backend` (Debian's git) as a CGI program.

use std::path::Path;

use serde_json::json;
use tokio::process::Child;

/// A running server; stopped when dropped.
#[derive(Debug)]
pub struct GitHttps {
    _child: Child,
    /// `https://127.0.0.1:PORT`; a repository `R.git` below the root is at `URL/R.git`.
    pub url: String,
    /// The CA that signed the server's certificate, which no system trusts.
    pub ca_pem: String,
}

impl GitHttps {
    /// Serves the repositories below `root` to `username` with `password` only.
    pub async fn start(dir: &Path, root: &Path, (username, password): (&str, &str)) -> Self {
        let ca = tunnel::tls::CertificateAuthority::generate("test git server CA").unwrap();
        let served = ca.issue_server(&["127.0.0.1".to_owned()]).unwrap();
        let config = json!({
            "cert": served.cert_pem, "key": served.key_pem, "root": root,
            "username": username, "password": password,
        });
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("git-http/server.mjs");
        let (child, first) =
            crate::oidc::node_server(&script, "GIT_HTTP_CONFIG", &config, dir).await;
        GitHttps {
            _child: child,
            url: first["url"].as_str().unwrap().to_owned(),
            ca_pem: ca.pem().cert_pem.clone(),
        }
    }
}
