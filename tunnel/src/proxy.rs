//! An HTTP proxy between an agent and its hub: the agent asks the proxy to `CONNECT` it to the
//! hub, then speaks TLS to the hub through the opened pipe, so the proxy sees only the hub's
//! name and ciphertext. Registration, the CA fetch and the tunnel all go this way.
//!
//! Which proxy and when follows the environment's conventions as Go's `httpproxy` reads them
//! (K3s, RKE2, containerd and Rancher's agents are Go programs, so one set of variables means
//! the same to all of them on a host): the hub is always reached over `https://`, so
//! `HTTPS_PROXY` (or `https_proxy`) names the proxy; `NO_PROXY` lists where to go direct; and
//! loopback is never proxied.

use std::{fmt, net::IpAddr, time::Duration};

use base64::Engine as _;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

/// Largest proxy answer to `CONNECT` read (status line and headers).
const MAX_ANSWER: usize = 16 * 1024;

/// The proxy settings of an agent: where to send connections to the hub, and which hosts to
/// reach directly.
#[derive(Clone, Default)]
pub struct ProxySettings {
    proxy: Option<Proxy>,
    no_proxy: Vec<NoProxy>,
}

#[derive(Clone)]
struct Proxy {
    host: String,
    port: u16,
    /// `Basic …`, from the URL's user and password.
    authorization: Option<String>,
    /// The proxy as messages name it: without its password.
    shown: String,
    user: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
enum NoProxy {
    All,
    /// An address or network, with the port it applies to (`None`: every port).
    Net(IpAddr, u8, Option<u16>),
    /// `example.com` (and its subdomains) or, with `subdomains_only`, `.example.com`.
    Domain {
        name: String,
        subdomains_only: bool,
        port: Option<u16>,
    },
}

impl fmt::Debug for ProxySettings {
    // Never the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxySettings")
            .field("proxy", &self.proxy.as_ref().map(|p| &p.shown))
            .field("no_proxy", &self.no_proxy)
            .finish()
    }
}

impl ProxySettings {
    /// No proxy: every connection goes direct.
    pub fn none() -> Self {
        Self::default()
    }

    /// From `HTTPS_PROXY`/`https_proxy` and `NO_PROXY`/`no_proxy` (the upper-case name first, as
    /// Go reads them). An error names the variable and what to write instead.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let var = |upper: &str, lower: &str| {
            [upper, lower].into_iter().find_map(|name| {
                get(name)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (name.to_owned(), v))
            })
        };
        let proxy = var("HTTPS_PROXY", "https_proxy")
            .map(|(name, url)| Proxy::parse(url.trim()).map_err(|e| format!("{name}: {e}")))
            .transpose()?;
        let no_proxy = var("NO_PROXY", "no_proxy")
            .map(|(_, list)| parse_no_proxy(&list))
            .unwrap_or_default();
        Ok(Self { proxy, no_proxy })
    }

    /// The proxy, without its password, if one is set.
    pub fn shown(&self) -> Option<&str> {
        self.proxy.as_ref().map(|p| p.shown.as_str())
    }

    /// Whether a connection to `host:port` goes through the proxy.
    pub fn applies_to(&self, host: &str, port: u16) -> bool {
        if self.proxy.is_none() {
            return false;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip = host.parse::<IpAddr>().ok();
        if host.eq_ignore_ascii_case("localhost") || ip.is_some_and(|ip| ip.is_loopback()) {
            return false;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        !self.no_proxy.iter().any(|entry| match entry {
            NoProxy::All => true,
            NoProxy::Net(net, bits, p) => {
                p.is_none_or(|p| p == port) && ip.is_some_and(|ip| in_network(ip, *net, *bits))
            }
            NoProxy::Domain {
                name,
                subdomains_only,
                port: p,
            } => {
                p.is_none_or(|p| p == port)
                    && ip.is_none()
                    && (host.ends_with(&format!(".{name}")) || (!subdomains_only && host == *name))
            }
        })
    }

    /// A TCP connection to `host:port`: through the proxy's `CONNECT` when it applies, else
    /// direct (`None`: the caller connects as it would without a proxy).
    pub(crate) async fn connect(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Option<Result<TcpStream, ProxyError>> {
        if !self.applies_to(host, port) {
            return None;
        }
        let proxy = self.proxy.as_ref()?;
        let attempt = proxy.open(host, port);
        Some(match tokio::time::timeout(timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(ProxyError {
                proxy: proxy.shown.clone(),
                reason: format!("no answer to CONNECT within {timeout:?}"),
            }),
        })
    }
}

/// Why a connection through the proxy failed; the message says what to check.
#[derive(Debug, thiserror::Error)]
#[error("through the proxy {proxy} (HTTPS_PROXY): {reason}")]
pub struct ProxyError {
    proxy: String,
    reason: String,
}

impl Proxy {
    fn parse(url: &str) -> Result<Self, String> {
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some((scheme, _)) => {
                return Err(format!(
                    "a {scheme}:// proxy is not supported; give an HTTP proxy as http://[USER:PASSWORD@]HOST:PORT"
                ));
            }
            // As Go reads it: a bare HOST:PORT is an http:// proxy.
            None => url,
        };
        let rest = rest.split('/').next().unwrap_or_default();
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, rest),
        };
        let (host, port) = split_host_port(hostport).ok_or_else(|| {
            "expected http://[USER:PASSWORD@]HOST[:PORT] (a proxy's URL)".to_owned()
        })?;
        let port = port.unwrap_or(80);
        let (user, authorization) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let user =
                    percent_decode(user).ok_or("the user name has a bad %-escape".to_owned())?;
                let password =
                    percent_decode(password).ok_or("the password has a bad %-escape".to_owned())?;
                let basic =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                (Some(user), Some(format!("Basic {basic}")))
            }
        };
        let shown = match &user {
            Some(user) => format!("http://{user}@{host}:{port}"),
            None => format!("http://{host}:{port}"),
        };
        Ok(Self {
            host,
            port,
            authorization,
            shown,
            user,
        })
    }

    async fn open(&self, host: &str, port: u16) -> Result<TcpStream, ProxyError> {
        let fail = |reason: String| ProxyError {
            proxy: self.shown.clone(),
            reason,
        };
        let mut tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| fail(format!("cannot reach the proxy: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let target = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(authorization) = &self.authorization {
            request.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
        }
        request.push_str("\r\n");
        tcp.write_all(request.as_bytes())
            .await
            .map_err(|e| fail(format!("the proxy closed the connection: {e}")))?;
        // Byte by byte up to the blank line: after it the pipe belongs to TLS, and not one
        // byte of the hub's may be read here.
        let mut answer = Vec::with_capacity(256);
        while !answer.ends_with(b"\r\n\r\n") {
            if answer.len() >= MAX_ANSWER {
                return Err(fail("its answer to CONNECT is too long".into()));
            }
            let byte = tcp.read_u8().await.map_err(|e| {
                fail(format!(
                    "the proxy closed the connection before answering CONNECT: {e}"
                ))
            })?;
            answer.push(byte);
        }
        let text = String::from_utf8_lossy(&answer);
        let status_line = text.lines().next().unwrap_or_default();
        let mut words = status_line.splitn(3, ' ');
        let version = words.next().unwrap_or_default();
        let status = words.next().and_then(|s| s.parse::<u16>().ok());
        let reason = words.next().unwrap_or_default().trim();
        match status {
            Some(200..=299) if version.starts_with("HTTP/1.") => Ok(tcp),
            // 407 is HTTP's answer; tinyproxy answers a wrong password with 401.
            Some(status @ (401 | 407)) => Err(fail(match &self.user {
                None => format!(
                    "the proxy asks for credentials (HTTP {status} {reason}); give them in the proxy's URL: http://USER:PASSWORD@HOST:PORT"
                ),
                Some(user) => format!(
                    "the proxy refused the password of user {user:?} (HTTP {status} {reason}); check the user and password in the proxy's URL"
                ),
            })),
            Some(status) => Err(fail(format!(
                "the proxy would not connect to the hub at {target}: HTTP {status} {reason}"
            ))),
            None => Err(fail(format!(
                "the proxy's answer to CONNECT is not HTTP: {status_line:?}"
            ))),
        }
    }
}

/// `host[:port]` and `[v6]:port`; `None` when there is no host or the port is not a number.
fn split_host_port(s: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else if s.matches(':').count() > 1 {
        // A bare IPv6 address.
        (s, None)
    } else {
        match s.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    Some((host.to_owned(), port))
}

fn parse_no_proxy(list: &str) -> Vec<NoProxy> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .filter_map(|entry| {
            if entry == "*" {
                return Some(NoProxy::All);
            }
            if let Some((net, bits)) = entry.split_once('/') {
                let net: IpAddr = net.parse().ok()?;
                let bits: u8 = bits.parse().ok()?;
                let max = if net.is_ipv4() { 32 } else { 128 };
                return (bits <= max).then_some(NoProxy::Net(net, bits, None));
            }
            if let Ok(ip) = entry.trim_matches(['[', ']']).parse::<IpAddr>() {
                let bits = if ip.is_ipv4() { 32 } else { 128 };
                return Some(NoProxy::Net(ip, bits, None));
            }
            let (host, port) = split_host_port(entry)?;
            if let Ok(ip) = host.parse::<IpAddr>() {
                let bits = if ip.is_ipv4() { 32 } else { 128 };
                return Some(NoProxy::Net(ip, bits, port));
            }
            // `*.example.com` as Go reads it: `.example.com`.
            let host = host.strip_prefix('*').unwrap_or(&host).to_ascii_lowercase();
            let subdomains_only = host.starts_with('.');
            Some(NoProxy::Domain {
                name: host
                    .trim_start_matches('.')
                    .trim_end_matches('.')
                    .to_owned(),
                subdomains_only,
                port,
            })
        })
        .collect()
}

fn in_network(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// `s` with each `%XX` decoded; `None` for a bad escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(proxy: &str, no_proxy: &str) -> ProxySettings {
        let env = [("HTTPS_PROXY", proxy), ("NO_PROXY", no_proxy)];
        ProxySettings::from_env(|name| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
        .unwrap()
    }

    #[test]
    fn no_proxy_follows_the_go_conventions() {
        let s = settings(
            "http://proxy.corp:3128",
            "hub.corp, .internal.corp,10.0.0.0/8, 192.168.1.5, *.svc, api.corp:8443",
        );
        // A name and its subdomains.
        assert!(!s.applies_to("hub.corp", 443));
        assert!(!s.applies_to("a.hub.corp", 443));
        assert!(s.applies_to("xhub.corp", 443));
        // A leading dot: subdomains only.
        assert!(!s.applies_to("a.internal.corp", 443));
        assert!(s.applies_to("internal.corp", 443));
        assert!(!s.applies_to("kubernetes.default.svc", 443));
        // Networks and addresses.
        assert!(!s.applies_to("10.1.2.3", 443));
        assert!(s.applies_to("11.1.2.3", 443));
        assert!(!s.applies_to("192.168.1.5", 443));
        assert!(s.applies_to("192.168.1.6", 443));
        // A port makes the entry that port's only.
        assert!(!s.applies_to("api.corp", 8443));
        assert!(s.applies_to("api.corp", 443));
        // Loopback is never proxied.
        assert!(!s.applies_to("127.0.0.1", 443));
        assert!(!s.applies_to("localhost", 443));
        assert!(!s.applies_to("[::1]", 443));
        assert!(s.applies_to("hub.example.com", 443));
        assert!(!settings("http://p:1", "*").applies_to("hub.example.com", 443));
        assert!(!ProxySettings::none().applies_to("hub.example.com", 443));
    }

    #[test]
    fn a_proxy_url_is_read_as_go_reads_it_and_shown_without_its_password() {
        let s = settings("http://drover%40corp:pa%3Ass@proxy.corp:3128/", "");
        let proxy = s.proxy.as_ref().unwrap();
        assert_eq!((proxy.host.as_str(), proxy.port), ("proxy.corp", 3128));
        assert_eq!(s.shown(), Some("http://drover@corp@proxy.corp:3128"));
        let basic = base64::engine::general_purpose::STANDARD.encode("drover@corp:pa:ss");
        assert_eq!(
            proxy.authorization.as_deref(),
            Some(&*format!("Basic {basic}"))
        );
        assert!(!format!("{s:?}").contains("pa"));
        // No scheme: http; no port: 80.
        let bare = settings("proxy.corp", "");
        assert_eq!(bare.shown(), Some("http://proxy.corp:80"));
        let err =
            ProxySettings::from_env(|n| (n == "https_proxy").then(|| "socks5://p:1080".into()))
                .unwrap_err();
        assert!(
            err.starts_with("https_proxy: a socks5:// proxy is not supported"),
            "{err}"
        );
        let err = ProxySettings::from_env(|n| (n == "HTTPS_PROXY").then(|| "http://p:port".into()))
            .unwrap_err();
        assert!(err.contains("HOST[:PORT]"), "{err}");
    }
}
