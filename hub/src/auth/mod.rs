//! Who is calling, and what they may do. A request carries a bearer token (API token) or the
//! dashboard's session cookie; both name a Token object whose secret hash must match. What the
//! caller may do comes from their RoleBindings: the rules of the global roles, role templates
//! on clusters and on projects they grant (`crate::roles`). Every request is checked, every
//! time.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

use http::HeaderMap;
use serde_json::Value;

use crate::{
    model::{Kind, PolicyRule, TokenSpec, UserSpec, expired},
    roles::Catalog,
    store::{LabelSelector, Store, StoreError},
};

pub mod known;
pub mod lifetimes;
pub mod providers;
mod rights;
pub mod secret;
pub mod streams;

pub use rights::*;

/// The dashboard's session cookie.
pub const SESSION_COOKIE: &str = "drover_session";

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user: String,
    /// The user's groups (downstream, the impersonated groups).
    pub groups: Vec<String>,
    /// Whether the global roles held allow everything.
    pub admin: bool,
    /// The rules of the global roles held (and of `user-base`, which everyone holds).
    pub global: Vec<PolicyRule>,
    /// The cluster templates the global roles grant on every cluster.
    pub everywhere: Access,
    /// The templates held on each cluster (bound there).
    pub clusters: BTreeMap<String, Access>,
    /// The templates held on each project, with the project's cluster.
    pub projects: BTreeMap<String, (String, Access)>,
    /// The Token object that authenticated this request.
    pub token: String,
    /// Where the user signs in: `local` (the hub's own users) or an AuthProvider's name.
    pub provider: String,
    /// The impersonation headers' values for this caller, made on first use.
    pub downstream: Downstream,
}

/// What [`Principal::impersonation_values`] keeps: made once per caller rather than on every
/// request the proxy sends for them.
#[derive(Debug, Clone, Default)]
pub struct Downstream(std::sync::OnceLock<Option<Vec<http::HeaderValue>>>);

impl Principal {
    /// The caller's `Impersonate-User` value, then their `Impersonate-Group` values: made the
    /// first time, then kept; `None` when a name cannot be a header's value.
    pub fn impersonation_values(&self) -> Option<&[http::HeaderValue]> {
        self.downstream
            .0
            .get_or_init(|| {
                std::iter::once(self.user.as_str())
                    .chain(downstream_groups(self.admin, &self.groups))
                    .map(|name| http::HeaderValue::from_bytes(name.as_bytes()).ok())
                    .collect()
            })
            .as_deref()
    }
}

// Made from the principal's other fields, which say whether two are equal.
impl PartialEq for Downstream {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Downstream {}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Delete,
}

impl Verb {
    fn reads(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }

    /// The verb as rules name it.
    pub fn rule_verb(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Delete => "delete",
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("store failure while authenticating: {0}")]
    Store(String),
}

/// Finds the token in the request: `Authorization: Bearer`, else the session cookie. A request
/// that sends an `Authorization` header is authenticated by that header alone (or not at
/// all): the browser's CSRF check is skipped for such requests, so the cookie must never
/// stand in for a header that did not authenticate.
pub fn credential(headers: &HeaderMap) -> Option<&str> {
    if headers.contains_key(http::header::AUTHORIZATION) {
        return tunnel::bearer_token(headers);
    }
    cookie(headers, SESSION_COOKIE)
}

/// The value of the cookie `name` the request carries.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(name)?.strip_prefix('='))
}

const BAD_TOKEN: &str =
    "the token is invalid, expired or revoked; log in again or create a new API token";

/// Resolves a token value to the user it acts for, with that user's roles.
pub async fn principal(store: &dyn Store, value: &str) -> Result<Principal, AuthError> {
    principal_until(store, value).await.map(|(p, _)| p)
}

/// As [`principal`], with the moment the token expires (if it does).
pub(crate) async fn principal_until(
    store: &dyn Store,
    value: &str,
) -> Result<(Principal, Option<time::OffsetDateTime>), AuthError> {
    let bad = || AuthError::Unauthenticated(BAD_TOKEN.into());
    let (secret::TokenKind::Token, name, token_secret) =
        secret::parse_token(value).ok_or_else(bad)?
    else {
        return Err(bad());
    };
    let token = match store.get(Kind::Token.name(), name).await {
        Ok(token) => token,
        Err(StoreError::NotFound { .. }) => return Err(bad()),
        Err(e) => return Err(AuthError::Store(e.to_string())),
    };
    let spec: TokenSpec = serde_json::from_value(token.spec.clone()).map_err(|_| bad())?;
    if !secret::same(
        secret::token_hash(token_secret).as_bytes(),
        spec.secret_hash.as_bytes(),
    ) || expired(&token.spec)
        || token.metadata.deletion_timestamp.is_some()
    {
        return Err(bad());
    }
    // Agent credentials open tunnels, not the API.
    let Some(user) = spec.user else {
        return Err(AuthError::Unauthenticated(
            "agent credentials cannot call the API".into(),
        ));
    };
    let store_error = |e: StoreError| AuthError::Store(e.to_string());
    let user_object = match store.get(Kind::User.name(), &user).await {
        Ok(u) => u,
        Err(StoreError::NotFound { .. }) => return Err(bad()),
        Err(e) => return Err(store_error(e)),
    };
    // The token must be of this very user, not of a deleted one whose name was reused.
    let mut liveness =
        crate::refs::Liveness::new(store).knowing(Kind::User, std::slice::from_ref(&user_object));
    if !liveness.live(&token).await.map_err(store_error)? {
        return Err(bad());
    }
    let mut user_spec: UserSpec = serde_json::from_value(user_object.spec).map_err(|_| bad())?;
    // A directory user's groups, as last read from the directory, count as theirs.
    let provider = user_spec
        .principal
        .as_ref()
        .map_or_else(|| crate::model::LOCAL.to_owned(), |p| p.provider.clone());
    let provider_groups = std::mem::take(&mut user_spec.provider_groups);
    user_spec.groups.extend(provider_groups);
    if user_spec.disabled {
        return Err(AuthError::Unauthenticated(format!(
            "user {user:?} is disabled"
        )));
    }
    let (bindings, _) = store
        .list(Kind::RoleBinding.name(), &LabelSelector::everything())
        .await
        .map_err(store_error)?;
    // Only bindings of this user (or its groups), and of them only those whose user, cluster
    // and project are still the objects they were made for.
    let mine = bindings
        .into_iter()
        .filter(|b| binds(b, &user, &user_spec.groups))
        .collect();
    let bindings = liveness.keep_live(mine).await.map_err(store_error)?;
    let catalog = Catalog::read(store).await.map_err(store_error)?;
    let Roles {
        admin,
        global,
        everywhere,
        clusters,
        projects,
    } = roles_of(&bindings, &catalog, &user, &user_spec.groups);
    let expires = token
        .spec
        .get("expiresAt")
        .and_then(Value::as_str)
        .and_then(crate::model::parse_time);
    Ok((
        Principal {
            user,
            groups: user_spec.groups,
            admin,
            global,
            everywhere,
            clusters,
            projects,
            token: token.metadata.name,
            provider,
            downstream: Downstream::default(),
        },
        expires,
    ))
}

/// The prefix of the groups the hub itself gives users downstream.
pub const GROUP_PREFIX: &str = "drover:";

/// The groups a user acts with in a cluster: `drover:authenticated`, `drover:admin` for the
/// hub's admins, and the user's own (local and the directory's): what the cluster's RBAC, as
/// the cluster-agent keeps it in step with the hub's role bindings, binds besides the user.
/// The authorized endpoint's token copies carry the same.
pub fn downstream_groups(admin: bool, groups: &[String]) -> impl Iterator<Item = &str> {
    // Borrowed, not collected: the proxy sets them as headers on every request.
    let own = if admin {
        &["drover:authenticated", "drover:admin"][..]
    } else {
        &["drover:authenticated"][..]
    };
    own.iter().copied().chain(groups.iter().map(String::as_str))
}

/// Failed logins allowed per account in one window; per address (an office or an ingress
/// may put many people behind one) many more.
const LOGIN_FAILURES: u32 = 5;
const ADDRESS_FAILURES: u32 = 100;
const LOGIN_WINDOW: Duration = Duration::from_secs(60);

/// The source a request is counted against: an IPv4 address, or an IPv6 address's /64 (one
/// host usually holds a whole /64).
pub fn source_of(addr: Option<IpAddr>) -> String {
    match addr {
        Some(IpAddr::V4(v4)) => v4.to_string(),
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        None => "unknown".to_owned(),
    }
}

/// How failed logins of a name are counted: the name as the provider would match it
/// (trimmed, lowercased; an Active Directory `DOMAIN\name` as `name`), so spelling it
/// another way gets no fresh count. A directory's user is counted by their DN as well, once
/// found, which also catches a UPN or another login attribute.
pub fn login_key(provider: &str, name: &str) -> String {
    let name = name.trim().to_lowercase();
    let name = name.rsplit_once('\\').map_or(name.as_str(), |(_, n)| n);
    format!("{provider}:{name}")
}

/// The failure key of a directory entry (DNs compare ignoring case).
pub fn entry_key(provider: &str, dn: &str) -> String {
    format!("{provider}:dn:{}", dn.to_lowercase())
}

/// Counts failed logins per account (every key that names it) and per client address; past
/// its limit, logins for that account (or from that address) are refused until the window
/// ends, even with the right password.
#[derive(Debug, Default)]
pub struct LoginLimiter {
    windows: Mutex<HashMap<String, (Instant, u32)>>,
}

impl LoginLimiter {
    fn keys<'a>(
        accounts: &'a [String],
        addr: Option<IpAddr>,
    ) -> impl Iterator<Item = (String, u32)> + 'a {
        accounts
            .iter()
            .map(|a| (format!("account:{a}"), LOGIN_FAILURES))
            .chain(addr.map(|a| (format!("addr:{}", source_of(Some(a))), ADDRESS_FAILURES)))
    }

    /// `Err(retry_after)` if logins for any of these accounts, or from this address, are
    /// blocked now.
    pub fn check(&self, accounts: &[String], addr: Option<IpAddr>) -> Result<(), Duration> {
        let now = Instant::now();
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for (key, limit) in Self::keys(accounts, addr) {
            if let Some((start, failures)) = windows.get(&key)
                && *failures >= limit
                && now.duration_since(*start) < LOGIN_WINDOW
            {
                return Err(LOGIN_WINDOW - now.duration_since(*start));
            }
        }
        Ok(())
    }

    pub fn failed(&self, accounts: &[String], addr: Option<IpAddr>) {
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        // Forget old windows so the map cannot grow without bound.
        windows.retain(|_, (start, _)| now.duration_since(*start) < LOGIN_WINDOW);
        for (key, _) in Self::keys(accounts, addr) {
            let entry = windows.entry(key).or_insert((now, 0));
            entry.1 += 1;
        }
    }

    pub fn succeeded(&self, accounts: &[String]) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for (key, _) in Self::keys(accounts, None) {
            windows.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests;
