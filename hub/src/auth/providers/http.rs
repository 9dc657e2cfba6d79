//! The one HTTPS request at a time a provider's flow needs (discovery, keys, the token and
//! userinfo endpoints): TLS always, the provider's CA or the system's, a timeout, and a cap
//! on what is read.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

/// The most of an answer read: discovery documents, key sets and tokens are a few KiB.
const MAX_ANSWER: usize = 1 << 20;

/// A TLS client configuration trusting `ca_pem` (PEM), or the system's CAs if it is empty.
pub fn tls(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let roots = if ca_pem.trim().is_empty() {
        tunnel::tls::system_roots()
    } else {
        tunnel::tls::roots_from_pem(ca_pem.as_bytes())
    }
    .map_err(|e| format!("the CA certificates: {e}"))?;
    Ok(tunnel::tls::client_config(roots))
}

/// Sends one request to the `https://` URL `url`; returns the status and the body.
pub async fn send(
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<(&str, String)>,
    timeout: Duration,
) -> Result<(u16, Bytes), String> {
    let uri: http::Uri = url.parse().map_err(|_| format!("{url:?} is not a URL"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("{url}: only https:// URLs are used"));
    }
    let host = uri
        .host()
        .ok_or_else(|| format!("{url}: no host"))?
        .trim_matches(['[', ']'])
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_else(|| host.clone());
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let work = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect to {authority}: {e}"))?;
        // A request's head and body leave as separate writes: with Nagle's algorithm the
        // body waits for the head's (delayed) acknowledgement, 40 ms on Linux.
        let _ = tcp.set_nodelay(true);
        let name = rustls_pki_types::ServerName::try_from(host.clone())
            .map_err(|e| format!("{host}: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {authority}: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("{authority}: {e}"))?;
        tokio::spawn(conn);
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &authority)
            .header(http::header::ACCEPT, "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let payload = match body {
            Some((content_type, text)) => {
                request = request.header(http::header::CONTENT_TYPE, content_type);
                Bytes::from(text)
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(payload))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("{authority}: {e}"))?;
        let status = response.status().as_u16();
        let bytes = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("{authority}: reading the answer: {e}"))?
            .to_bytes();
        Ok((status, bytes))
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| format!("{authority} did not answer in {} s", timeout.as_secs()))?
}

/// `application/x-www-form-urlencoded` of these pairs.
pub fn form(pairs: &[(&str, &str)]) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        out.append_pair(k, v);
    }
    out.finish()
}
