//! TLS for both ends: the hub's certificate authority and serving certificates, the agent's
//! trust (a pinned CA checksum or the system roots), and rustls configs that always use the
//! `ring` provider explicitly, so a second provider elsewhere in a build cannot make rustls panic.

use std::{fmt, sync::Arc};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::{
    ClientConfig, RootCertStore, ServerConfig, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};

/// Errors from loading or generating certificates and keys.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate found in the PEM text ({0})")]
    NoCertificate(String),
    #[error("cannot read the private key: {0}")]
    Key(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration rejected: {0}")]
    Config(#[from] rustls::Error),
    #[error("no usable system root certificates were found; pass a CA checksum instead")]
    NoSystemRoots,
}

/// The provider every config in Drover is built with.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The checksum an agent pins: sha256, lowercase hex, of the exact PEM bytes the hub serves at
/// `/cacerts` (the same convention as Rancher's `CATTLE_CA_CHECKSUM`).
pub fn ca_checksum(pem: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, pem);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// How an agent decides to trust the hub's certificate.
#[derive(Clone, PartialEq, Eq)]
pub enum Trust {
    /// Fetch the hub's CA from `/cacerts`, accept it only if its sha256 equals this checksum,
    /// then verify the hub's certificate against it.
    CaChecksum(String),
    /// Verify the hub's certificate against this CA, given as PEM.
    CaPem(Vec<u8>),
    /// Verify the hub's certificate against the operating system's roots.
    SystemRoots,
}

impl Trust {
    /// What an agent's `DROVER_CA_CHECKSUM` says: pin that checksum, or (empty) the system's
    /// roots.
    pub fn from_checksum(checksum: &str) -> Trust {
        if checksum.is_empty() {
            Trust::SystemRoots
        } else {
            Trust::CaChecksum(checksum.to_owned())
        }
    }
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trust::CaChecksum(sum) => write!(f, "CaChecksum({sum})"),
            Trust::CaPem(pem) => write!(f, "CaPem(sha256 {})", ca_checksum(pem)),
            Trust::SystemRoots => f.write_str("SystemRoots"),
        }
    }
}

/// Parses every certificate in a PEM text.
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::NoCertificate(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(
            "the text holds no CERTIFICATE block".into(),
        ));
    }
    Ok(certs)
}

/// A root store holding the certificates of a PEM text.
pub fn roots_from_pem(pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs_from_pem(pem)? {
        roots.add(cert)?;
    }
    Ok(roots)
}

/// A root store of the operating system's trusted CAs.
pub fn system_roots() -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let (added, _ignored) =
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if added == 0 {
        return Err(TlsError::NoSystemRoots);
    }
    Ok(roots)
}

/// A client config verifying servers against `roots`, speaking HTTP/1.1 (the WebSocket upgrade
/// needs it). TLS 1.2 and 1.3 only: rustls offers nothing older.
pub fn client_config(roots: RootCertStore) -> Arc<ClientConfig> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        // The ring provider supports the default versions; this cannot fail.
        .unwrap_or_else(|_| unreachable!("ring supports TLS 1.2 and 1.3"));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A client config that accepts any certificate chain but still checks the handshake
/// signature. Used only to download `/cacerts`, whose bytes are then checked against the
/// pinned checksum before anything is trusted.
pub fn unverified_client_config() -> Arc<ClientConfig> {
    let provider = provider();
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyChain(provider)))
                .with_no_client_auth()
        })
        .unwrap_or_else(|_| unreachable!("ring supports TLS 1.2 and 1.3"));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A client config for checking someone else's HTTPS endpoint (a plan's probe): servers
/// verified against `roots`, or not at all with `None` (the plan said `insecure`), and a client
/// certificate chain and key (PEM) when the endpoint asks for one.
pub fn probe_client_config(
    roots: Option<RootCertStore>,
    client: Option<(&[u8], &[u8])>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match roots {
        Some(roots) => builder.with_root_certificates(roots),
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyChain(provider))),
    };
    let mut config = match client {
        Some((chain, key)) => {
            let chain = certs_from_pem(chain)?;
            let key =
                PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Key(e.to_string()))?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[derive(Debug)]
struct AnyChain(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyChain {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A server config for a certificate chain and key in PEM, offering HTTP/2 and HTTP/1.1.
pub fn server_config(cert_chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<ServerConfig>, TlsError> {
    serving(cert_chain_pem, key_pem, None)
}

fn serving(
    cert_chain_pem: &[u8],
    key_pem: &[u8],
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certs_from_pem(cert_chain_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key(e.to_string()))?;
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// As [`server_config`], also asking clients for a certificate: one that chains to
/// `client_roots` is verified (and the handshake fails if it does not); a client without one
/// is let through, as agents, browsers and kubectl are. Hub replicas prove themselves to each
/// other this way.
pub fn server_config_with_clients(
    cert_chain_pem: &[u8],
    key_pem: &[u8],
    client_roots: RootCertStore,
) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(client_roots),
        provider(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| TlsError::Key(format!("client verifier: {e}")))?;
    serving(cert_chain_pem, key_pem, Some(verifier))
}

/// A client config verifying servers against `roots` and presenting `cert` (chain, PEM) with
/// its key, speaking HTTP/1.1.
pub fn client_config_with_cert(
    roots: RootCertStore,
    cert: &CertifiedKey,
) -> Result<Arc<ClientConfig>, TlsError> {
    let chain = certs_from_pem(cert.cert_pem.as_bytes())?;
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
        .map_err(|e| TlsError::Key(e.to_string()))?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for CertifiedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key never reaches a log.
        f.debug_struct("CertifiedKey")
            .field("cert_sha256", &ca_checksum(self.cert_pem.as_bytes()))
            .finish_non_exhaustive()
    }
}

/// A certificate authority that issues the hub's serving certificates.
pub struct CertificateAuthority {
    pem: CertifiedKey,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("pem", &self.pem)
            .finish()
    }
}

const DAY: time::Duration = time::Duration::days(1);

impl CertificateAuthority {
    /// A new self-signed CA, valid for ten years.
    pub fn generate(common_name: &str) -> Result<Self, TlsError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Drover");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - DAY;
        params.not_after = now + DAY * 3650;
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let pem = CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        Ok(Self {
            pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA saved earlier with [`CertificateAuthority::pem`].
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| TlsError::Key(e.to_string()))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(Self {
            pem: CertifiedKey {
                cert_pem: cert_pem.to_owned(),
                key_pem: key_pem.to_owned(),
            },
            issuer,
        })
    }

    /// The CA's certificate and key, for saving.
    pub fn pem(&self) -> &CertifiedKey {
        &self.pem
    }

    /// Issues a client certificate for `common_name`, valid for a year; `cert_pem` holds it
    /// followed by the CA.
    pub fn issue_client(&self, common_name: &str) -> Result<CertifiedKey, TlsError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - DAY;
        params.not_after = now + DAY * 365;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertifiedKey {
            cert_pem: format!("{}{}", cert.pem(), self.pem.cert_pem),
            key_pem: key.serialize_pem(),
        })
    }

    /// Issues a serving certificate for these DNS names and IP addresses, valid for a year.
    /// The returned `cert_pem` holds the leaf followed by the CA.
    pub fn issue_server(&self, names: &[String]) -> Result<CertifiedKey, TlsError> {
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(DnType::CommonName, first.as_str());
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - DAY;
        params.not_after = now + DAY * 365;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertifiedKey {
            cert_pem: format!("{}{}", cert.pem(), self.pem.cert_pem),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_sha256_hex_of_the_pem_bytes() {
        // sha256("abc"), a published test vector.
        assert_eq!(
            ca_checksum(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_saved_ca_reloads_and_issues_certificates_its_clients_accept() {
        let ca = CertificateAuthority::generate("test CA").unwrap();
        let reloaded =
            CertificateAuthority::from_pem(&ca.pem().cert_pem, &ca.pem().key_pem).unwrap();
        let leaf = reloaded
            .issue_server(&["localhost".into(), "127.0.0.1".into()])
            .unwrap();
        assert!(server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).is_ok());
        let roots = roots_from_pem(ca.pem().cert_pem.as_bytes()).unwrap();
        assert_eq!(roots.len(), 1);
    }

    #[test]
    fn pem_without_a_certificate_is_refused() {
        assert!(matches!(
            certs_from_pem(b"hello"),
            Err(TlsError::NoCertificate(_))
        ));
    }

    #[test]
    fn debug_output_never_contains_the_private_key() {
        let ca = CertificateAuthority::generate("test CA").unwrap();
        let shown = format!("{ca:?}");
        assert!(!shown.contains("PRIVATE KEY"));
    }
}
