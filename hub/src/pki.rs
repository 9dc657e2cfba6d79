//! The hub's certificate authority and serving certificate. The CA is created on first start
//! and kept in the data directory (its key readable by the hub's user only); agents pin it by
//! checksum. The serving certificate is issued afresh at every start for the names the hub is
//! reached by, so changing `--server-url` needs no manual step.

use std::{io, path::Path, sync::Arc};

use rustls::RootCertStore;
use tunnel::tls::{self, CertificateAuthority};

use crate::{
    fsutil::write_atomic,
    store::{Object, Store, StoreError},
};

/// Where in the data directory the CA lives, and its two files.
pub const TLS_DIR: &str = "tls";
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";

/// What the listener and `/cacerts` need.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate exactly as served at `/cacerts`.
    pub ca_pem: Arc<str>,
    /// sha256 of `ca_pem`, the value agents are installed with.
    pub ca_checksum: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    // Causes are sources, printed after the message once (not in it as well).
    #[error("cannot read or write {path}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    /// A file an operator named cannot be read.
    #[error("cannot read {flag} {path}")]
    Given {
        flag: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "the CA in {dir} cannot be used: restore ca.pem and ca-key.pem from a backup, or move them away to create a new CA (agents must then be re-registered)"
    )]
    BadCa {
        dir: String,
        #[source]
        source: tls::TlsError,
    },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot keep the hub's CA in the store: {0}")]
    Store(StoreError),
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> PkiError + '_ {
    move |source| PkiError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Uses an operator's certificate chain and key. `/cacerts` then serves the chain's last
/// certificate (its CA, when the file holds the chain), which agents pin by checksum.
pub fn from_files(cert: &Path, key: &Path) -> Result<Pki, PkiError> {
    files_serving(cert, key, None)
}

/// As [`from_files`]; with `clients`, the listener also verifies client certificates from
/// those roots.
fn files_serving(cert: &Path, key: &Path, clients: Option<RootCertStore>) -> Result<Pki, PkiError> {
    fn given<'a>(flag: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PkiError + 'a {
        move |source| PkiError::Given {
            flag,
            path: path.display().to_string(),
            source,
        }
    }
    let chain = std::fs::read(cert).map_err(given("--tls-cert", cert))?;
    let key_pem = std::fs::read(key).map_err(given("--tls-key", key))?;
    let text = String::from_utf8_lossy(&chain);
    let last = text
        .rfind("-----BEGIN CERTIFICATE-----")
        .map(|i| text[i..].trim_end().to_owned() + "\n")
        .unwrap_or_default();
    Ok(Pki {
        ca_checksum: tls::ca_checksum(last.as_bytes()),
        ca_pem: last.into(),
        server_config: server_config(&chain, &key_pem, clients)?,
    })
}

fn server_config(
    chain: &[u8],
    key: &[u8],
    clients: Option<RootCertStore>,
) -> Result<Arc<rustls::ServerConfig>, PkiError> {
    Ok(match clients {
        Some(roots) => tls::server_config_with_clients(chain, key, roots)?,
        None => tls::server_config(chain, key)?,
    })
}

/// The CA kept in `dir` (`ca.pem`, `ca-key.pem`), if there is one.
fn ca_in(dir: &Path) -> Result<Option<CertificateAuthority>, PkiError> {
    let cert_path = dir.join(CA_CERT);
    if !cert_path.exists() {
        return Ok(None);
    }
    let key_path = dir.join(CA_KEY);
    let cert = std::fs::read_to_string(&cert_path).map_err(io_error(&cert_path))?;
    let key = std::fs::read_to_string(&key_path).map_err(io_error(&key_path))?;
    CertificateAuthority::from_pem(&cert, &key)
        .map(Some)
        .map_err(|source| PkiError::BadCa {
            dir: dir.display().to_string(),
            source,
        })
}

/// Loads the CA from `data_dir/tls`, creating it on first start, and issues a serving
/// certificate for `names` (DNS names or IP addresses).
pub fn load_or_create(data_dir: &Path, names: &[String]) -> Result<Pki, PkiError> {
    let dir = data_dir.join(TLS_DIR);
    std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
    let ca = match ca_in(&dir)? {
        Some(ca) => ca,
        None => {
            let ca = CertificateAuthority::generate("Drover hub CA")?;
            let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
            // Key first: a crash between the two writes leaves no CA certificate without its key.
            write_atomic(&key_path, ca.pem().key_pem.as_bytes(), 0o600)
                .map_err(io_error(&key_path))?;
            write_atomic(&cert_path, ca.pem().cert_pem.as_bytes(), 0o644)
                .map_err(io_error(&cert_path))?;
            tracing::info!(dir = %dir.display(), "created the hub's certificate authority");
            ca
        }
    };
    serving(&ca, names, None)
}

/// A serving certificate from `ca` for `names`; with `clients`, the listener also verifies
/// client certificates from those roots.
fn serving(
    ca: &CertificateAuthority,
    names: &[String],
    clients: Option<RootCertStore>,
) -> Result<Pki, PkiError> {
    let leaf = ca.issue_server(names)?;
    let server_config = server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes(), clients)?;
    let ca_pem: Arc<str> = ca.pem().cert_pem.clone().into();
    Ok(Pki {
        ca_checksum: tls::ca_checksum(ca_pem.as_bytes()),
        ca_pem,
        server_config,
    })
}

/// The store object that holds the hub's CA when replicas share an etcd store. No API route
/// serves this kind.
pub const CA_KIND: &str = "HubCertificateAuthority";

/// What a replica needs to call its peers: a client configuration that trusts their serving
/// certificates and presents this replica's own certificate from the hub's CA.
#[derive(Debug, Clone)]
pub struct PeerTls {
    pub client: Arc<rustls::ClientConfig>,
}

/// With replicas on one etcd store: the CA is the store's (the first replica puts it there,
/// taking this data directory's if it has one, else creating one), so every replica serves
/// certificates agents trust by one checksum. The listener also verifies client certificates
/// from that CA (replicas present one to each other); `tls` is an operator's serving chain and
/// key, used instead of one from the CA.
pub async fn shared(
    store: &dyn Store,
    data_dir: &Path,
    names: &[String],
    tls_files: Option<(&Path, &Path)>,
) -> Result<(Pki, PeerTls), PkiError> {
    let ca = shared_ca(store, data_dir).await?;
    // The listener verifies peers' client certificates against the hub's CA.
    let clients = Some(tls::roots_from_pem(ca.pem().cert_pem.as_bytes())?);
    let pki = match tls_files {
        Some((cert, key)) => files_serving(cert, key, clients)?,
        None => serving(&ca, names, clients)?,
    };
    // Peers are trusted by the hub's CA and by whatever the served chain ends in.
    let mut roots = tls::roots_from_pem(ca.pem().cert_pem.as_bytes())?;
    for cert in tls::certs_from_pem(pki.ca_pem.as_bytes())? {
        let _ = roots.add(cert);
    }
    let me = ca.issue_client("drover-hub-replica")?;
    let client = tls::client_config_with_cert(roots, &me)?;
    Ok((pki, PeerTls { client }))
}

async fn shared_ca(store: &dyn Store, data_dir: &Path) -> Result<CertificateAuthority, PkiError> {
    let from_store = |object: &Object| {
        let text = |field: &str| object.spec[field].as_str().unwrap_or_default().to_owned();
        CertificateAuthority::from_pem(&text("certPem"), &text("keyPem")).map_err(|source| {
            PkiError::BadCa {
                dir: "the store".into(),
                source,
            }
        })
    };
    match store.get(CA_KIND, "hub").await {
        Ok(object) => return from_store(&object),
        Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(PkiError::Store(e)),
    }
    // A hub that ran on its own before: its agents already trust its CA.
    let ca = match ca_in(&data_dir.join(TLS_DIR))? {
        Some(ca) => ca,
        None => CertificateAuthority::generate("Drover hub CA")?,
    };
    let object = Object::new(
        CA_KIND,
        "hub",
        serde_json::json!({"certPem": ca.pem().cert_pem, "keyPem": ca.pem().key_pem}),
    );
    let store_ref: &dyn Store = store;
    match store_ref.create(object).await {
        Ok(_) => {
            tracing::info!("put the hub's certificate authority in the shared store");
            Ok(ca)
        }
        // Another replica was first: use its CA.
        Err(StoreError::AlreadyExists { .. }) => {
            let object = store.get(CA_KIND, "hub").await.map_err(PkiError::Store)?;
            from_store(&object)
        }
        Err(e) => Err(PkiError::Store(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operators_chain_serves_its_last_certificate_for_pinning() {
        let dir = std::env::temp_dir().join(format!("drover-pki-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = tls::CertificateAuthority::generate("operator CA").unwrap();
        let leaf = ca.issue_server(&["hub.example.com".into()]).unwrap();
        std::fs::write(dir.join("hub.pem"), &leaf.cert_pem).unwrap();
        std::fs::write(dir.join("hub-key.pem"), &leaf.key_pem).unwrap();
        let pki = from_files(&dir.join("hub.pem"), &dir.join("hub-key.pem")).unwrap();
        assert_eq!(&*pki.ca_pem, ca.pem().cert_pem.as_str());
        assert_eq!(
            pki.ca_checksum,
            tls::ca_checksum(ca.pem().cert_pem.as_bytes())
        );
        std::fs::write(dir.join("hub-key.pem"), "garbage").unwrap();
        assert!(from_files(&dir.join("hub.pem"), &dir.join("hub-key.pem")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_ca_survives_a_restart_and_a_broken_one_is_reported() {
        let dir = std::env::temp_dir().join(format!("drover-pki-{}", std::process::id()));
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let first = load_or_create(&dir, &names).unwrap();
        let second = load_or_create(&dir, &names).unwrap();
        assert_eq!(first.ca_checksum, second.ca_checksum);

        std::fs::write(dir.join("tls/ca-key.pem"), "not a key").unwrap();
        let err = load_or_create(&dir, &names).unwrap_err().to_string();
        assert!(err.contains("restore ca.pem and ca-key.pem"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
