//! The `etcd://` URL a hub is given for its store.

/// A parsed `etcd://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// `host:port` of each member.
    pub endpoints: Vec<String>,
    /// Where Drover's keys live, e.g. `/drover`.
    pub prefix: String,
}

impl EtcdUrl {
    /// Parses `etcd://HOST:PORT[,HOST:PORT…][/PREFIX]`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url.strip_prefix("etcd://").ok_or_else(|| {
            format!("{url:?} is not an etcd URL: write etcd://HOST:PORT[,HOST:PORT…][/PREFIX]")
        })?;
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let prefix = if prefix.is_empty() { "/drover" } else { prefix };
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let valid = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !valid {
                return Err(format!(
                    "{host:?} in {url:?} is not HOST:PORT (etcd's client port is usually 2379)"
                ));
            }
            endpoints.push(host.to_owned());
        }
        Ok(Self {
            endpoints,
            prefix: prefix.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::EtcdUrl;

    #[test]
    fn an_etcd_url_names_members_and_an_optional_prefix() {
        let url = EtcdUrl::parse("etcd://10.0.0.1:2379,10.0.0.2:2379").unwrap();
        assert_eq!(url.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(url.prefix, "/drover");
        let url = EtcdUrl::parse("etcd://etcd.internal:2379/teams/a/").unwrap();
        assert_eq!(url.endpoints, ["etcd.internal:2379"]);
        assert_eq!(url.prefix, "/teams/a");
        for bad in [
            "http://x:2379",
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://a:1,,b:2",
        ] {
            let err = EtcdUrl::parse(bad).unwrap_err();
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
    }
}
