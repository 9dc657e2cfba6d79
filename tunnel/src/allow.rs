//! What the accepting side of a session may be asked to dial. An agent sets its own list (the
//! cluster-agent: its API server); anything else fails its stream with "not allowed".

use std::fmt;

/// A list of `host:port` targets; `host:*` allows any port of a host. Hosts compare without
/// regard to case. The empty list allows nothing.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

#[derive(Clone, PartialEq, Eq)]
struct Entry {
    host: String,
    port: Option<u16>,
}

/// An allow-list entry that is not `host:port` or `host:*`.
#[derive(Debug, thiserror::Error)]
#[error("allow-list entry {0:?} must be HOST:PORT or HOST:* (IPv6 hosts in brackets)")]
pub struct BadEntry(String);

impl AllowList {
    /// Allows nothing.
    pub fn none() -> Self {
        Self::default()
    }

    /// Parses entries such as `10.43.0.1:443`, `kubernetes.default.svc:443`, `[::1]:6443`,
    /// `127.0.0.1:*`.
    pub fn new<I, S>(entries: I) -> Result<Self, BadEntry>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let entries = entries
            .into_iter()
            .map(|e| {
                let raw = e.as_ref();
                let (host, port) = split_host_port(raw).ok_or_else(|| BadEntry(raw.to_owned()))?;
                let port = match port {
                    "*" => None,
                    p => Some(p.parse().map_err(|_| BadEntry(raw.to_owned()))?),
                };
                Ok(Entry {
                    host: host.to_ascii_lowercase(),
                    port,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// Whether `address` (`host:port`) may be dialled.
    pub fn allows(&self, address: &str) -> bool {
        let Some((host, port)) = split_host_port(address) else {
            return false;
        };
        let Ok(port) = port.parse::<u16>() else {
            return false;
        };
        let host = host.to_ascii_lowercase();
        self.entries
            .iter()
            .any(|e| e.host == host && e.port.is_none_or(|p| p == port))
    }
}

impl fmt::Debug for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| match e.port {
                Some(p) => format!("{}:{p}", e.host),
                None => format!("{}:*", e.host),
            }))
            .finish()
    }
}

/// Splits `host:port`, `[v6]:port`; the host keeps no brackets.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':')?)
    } else {
        let (host, port) = s.rsplit_once(':')?;
        if host.contains(':') {
            return None; // an IPv6 address must be bracketed
        }
        (host, port)
    };
    (!host.is_empty() && !port.is_empty()).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_entries_allow_only_that_host_and_port() {
        let list = AllowList::new(["10.43.0.1:443", "API.example.com:6443"]).unwrap();
        assert!(list.allows("10.43.0.1:443"));
        assert!(list.allows("api.EXAMPLE.com:6443"));
        assert!(!list.allows("10.43.0.1:444"));
        assert!(!list.allows("10.43.0.2:443"));
        assert!(!list.allows("10.43.0.1"));
    }

    #[test]
    fn a_star_port_allows_every_port_of_the_host() {
        let list = AllowList::new(["127.0.0.1:*", "[::1]:6443"]).unwrap();
        assert!(list.allows("127.0.0.1:1"));
        assert!(list.allows("127.0.0.1:65535"));
        assert!(list.allows("[::1]:6443"));
        assert!(!list.allows("[::1]:6444"));
        assert!(!list.allows("::1:6443"));
    }

    #[test]
    fn the_empty_list_allows_nothing() {
        assert!(!AllowList::none().allows("127.0.0.1:80"));
    }

    #[test]
    fn malformed_entries_are_rejected_with_the_entry_named() {
        for bad in [
            "localhost",
            ":80",
            "host:",
            "host:http",
            "::1:80",
            "[::1]80",
        ] {
            let err = AllowList::new([bad]).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
