//! Probes: an HTTP(S) GET whose 2xx/3xx answer counts as a success; a probe turns healthy after
//! `success_threshold` successes in a row and unhealthy after `failure_threshold` failures.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use proto::plan::v1::{Probe, ProbeStatus};
use tokio::net::TcpStream;

/// A probe's settings with the defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub timeout: Duration,
    pub initial_delay: Duration,
    pub period: Duration,
    pub successes: u32,
    pub failures: u32,
}

impl Timing {
    pub fn of(probe: &Probe) -> Timing {
        let or = |v: u32, d: u32| if v == 0 { d } else { v };
        Timing {
            timeout: Duration::from_secs(or(probe.timeout_seconds, 5).into()),
            initial_delay: Duration::from_secs(probe.initial_delay_seconds.into()),
            period: Duration::from_secs(or(probe.period_seconds, 5).into()),
            successes: or(probe.success_threshold, 1),
            failures: or(probe.failure_threshold, 3),
        }
    }
}

/// Checks a probe before anything runs; the message names it.
pub fn check(probe: &Probe) -> Result<(), String> {
    let uri: http::Uri = probe
        .url
        .parse()
        .map_err(|e| format!("probe {:?}: url {:?}: {e}", probe.name, probe.url))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(()),
        _ => Err(format!(
            "probe {:?}: url {:?} must be http:// or https:// with a host",
            probe.name, probe.url
        )),
    }
}

/// Folds one result into the probe's status; returns whether `healthy` flipped (or this is the
/// first verdict), which is when the status is worth recording.
pub fn fold(status: &mut ProbeStatus, timing: Timing, result: Result<(), String>) -> bool {
    let before = status.healthy;
    let first = status.successes == 0 && status.failures == 0 && status.message.is_empty();
    match result {
        Ok(()) => {
            status.successes += 1;
            status.failures = 0;
            if status.successes >= timing.successes {
                status.healthy = true;
            }
        }
        Err(message) => {
            status.failures += 1;
            status.successes = 0;
            status.message = message;
            if status.failures >= timing.failures {
                status.healthy = false;
            }
        }
    }
    status.healthy != before || (first && status.healthy)
}

/// One GET, bounded by the probe's timeout.
pub async fn once(probe: &Probe) -> Result<(), String> {
    check(probe)?;
    let timing = Timing::of(probe);
    match tokio::time::timeout(timing.timeout, get(probe)).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "{}: no answer within {:?}",
            probe.url, timing.timeout
        )),
    }
}

async fn get(probe: &Probe) -> Result<(), String> {
    let uri: http::Uri = probe.url.parse().map_err(|e| format!("{e}"))?;
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_owned();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", probe.url);
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| fail(&e))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let request = http::Request::get(path)
        .header(
            http::header::HOST,
            uri.authority().map_or("", |a| a.as_str()),
        )
        .header(http::header::USER_AGENT, "drover-system-agent")
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(&e))?;
    let status = if https {
        let tls = tls_config(probe)?;
        let name = rustls_pki_types::ServerName::try_from(host.clone()).map_err(|e| fail(&e))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| fail(&e))?;
        send(TokioIo::new(stream), request)
            .await
            .map_err(|e| fail(&e))?
    } else {
        send(TokioIo::new(tcp), request)
            .await
            .map_err(|e| fail(&e))?
    };
    if status.is_success() || status.is_redirection() {
        Ok(())
    } else {
        Err(format!("{}: HTTP {status}", probe.url))
    }
}

async fn send<T>(io: T, request: http::Request<Empty<Bytes>>) -> hyper::Result<http::StatusCode>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(connection);
    Ok(sender.send_request(request).await?.status())
}

fn tls_config(probe: &Probe) -> Result<Arc<rustls::ClientConfig>, String> {
    let read = |what: &str, path: &str| {
        std::fs::read(path).map_err(|e| format!("probe {:?}: {what} {path}: {e}", probe.name))
    };
    let roots = if probe.insecure {
        None
    } else if probe.ca_cert.is_empty() {
        Some(tunnel::tls::system_roots().map_err(|e| e.to_string())?)
    } else {
        Some(
            tunnel::tls::roots_from_pem(&read("CA", &probe.ca_cert)?)
                .map_err(|e| format!("probe {:?}: CA {}: {e}", probe.name, probe.ca_cert))?,
        )
    };
    let client = match (probe.client_cert.is_empty(), probe.client_key.is_empty()) {
        (true, true) => None,
        (false, false) => Some((
            read("client certificate", &probe.client_cert)?,
            read("client key", &probe.client_key)?,
        )),
        _ => {
            return Err(format!(
                "probe {:?}: give both clientCert and clientKey, or neither",
                probe.name
            ));
        }
    };
    tunnel::tls::probe_client_config(
        roots,
        client.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
    )
    .map_err(|e| format!("probe {:?}: {e}", probe.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_decide_health() {
        let probe = Probe {
            success_threshold: 2,
            failure_threshold: 2,
            ..Probe::default()
        };
        let t = Timing::of(&probe);
        let mut s = ProbeStatus::default();
        assert!(!fold(&mut s, t, Ok(())));
        assert!(fold(&mut s, t, Ok(())), "two successes make it healthy");
        assert!(s.healthy);
        assert!(!fold(&mut s, t, Err("down".into())));
        assert!(s.healthy, "one failure is not enough");
        assert!(fold(&mut s, t, Err("down".into())));
        assert!(!s.healthy);
        assert_eq!(s.message, "down");
        assert_eq!(Timing::of(&Probe::default()).failures, 3);
    }

    #[tokio::test]
    async fn an_http_answer_decides_and_nothing_listening_fails_fast() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for answer in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
                let reply = format!("HTTP/1.1 {answer}\r\ncontent-length: 0\r\n\r\n");
                tokio::io::AsyncWriteExt::write_all(&mut s, reply.as_bytes())
                    .await
                    .unwrap();
            }
        });
        let probe = Probe {
            name: "readyz".into(),
            url: format!("http://{addr}/readyz"),
            ..Probe::default()
        };
        assert_eq!(once(&probe).await, Ok(()));
        let err = once(&probe).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
        let err = once(&probe).await.unwrap_err();
        assert!(err.contains(&addr.to_string()), "{err}");
        assert!(
            check(&Probe {
                url: "ftp://x/".into(),
                ..Probe::default()
            })
            .is_err()
        );
    }
}
