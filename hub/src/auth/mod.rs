//! Who is calling, and what they may do. A request carries a bearer token (API token) or the
//! dashboard's session cookie; both name a Token object whose secret hash must match. Roles
//! come from RoleBindings: `admin` everywhere, or `cluster-owner`, `cluster-member`,
//! `read-only` on one cluster. Every request is checked, every time.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

use http::HeaderMap;
use serde_json::Value;

use crate::{
    model::{Kind, Role, RoleBindingSpec, TokenSpec, UserSpec, expired},
    store::{LabelSelector, Object, Store, StoreError},
};

pub mod known;
pub mod lifetimes;
pub mod providers;
pub mod secret;
pub mod streams;

/// The dashboard's session cookie.
pub const SESSION_COOKIE: &str = "drover_session";

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user: String,
    /// The user's groups (downstream, the impersonated groups).
    pub groups: Vec<String>,
    pub admin: bool,
    /// The strongest cluster role held on each cluster.
    pub clusters: BTreeMap<String, Role>,
    /// The strongest role held on each project, with the project's cluster.
    pub projects: BTreeMap<String, (String, Role)>,
    /// The Token object that authenticated this request.
    pub token: String,
    /// Where the user signs in: `local` (the hub's own users) or an AuthProvider's name.
    pub provider: String,
}

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
    let Roles {
        admin,
        clusters,
        projects,
    } = roles_of(&bindings, &user, &user_spec.groups);
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
            clusters,
            projects,
            token: token.metadata.name,
            provider,
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
pub fn downstream_groups(admin: bool, groups: &[String]) -> Vec<String> {
    let mut all = vec![format!("{GROUP_PREFIX}authenticated")];
    if admin {
        all.push(format!("{GROUP_PREFIX}admin"));
    }
    all.extend(groups.iter().cloned());
    all
}

/// How much a role may do; a user with several roles on a cluster (or a project) has the
/// strongest.
fn rank(role: Role) -> u8 {
    match role {
        Role::Admin => 4,
        Role::ClusterOwner | Role::ProjectOwner => 3,
        Role::ClusterMember | Role::ProjectMember => 2,
        Role::ReadOnly => 1,
    }
}

/// What a user may do, from the role bindings of the user and of their groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles {
    pub admin: bool,
    pub clusters: BTreeMap<String, Role>,
    /// Project → (its cluster, role).
    pub projects: BTreeMap<String, (String, Role)>,
}

fn keep_stronger(entry: &mut Role, role: Role) {
    if rank(role) > rank(*entry) {
        *entry = role;
    }
}

/// Whether `binding` names `user` or one of `groups`.
fn binds(binding: &Object, user: &str, groups: &[String]) -> bool {
    let named = |field: &str| binding.spec.get(field).and_then(Value::as_str);
    named("user") == Some(user) || named("group").is_some_and(|g| groups.iter().any(|m| m == g))
}

/// The roles `user`, a member of `groups`, holds through `bindings` (live ones: see
/// `crate::refs`).
pub fn roles_of(bindings: &[Object], user: &str, groups: &[String]) -> Roles {
    let mut roles = Roles::default();
    for binding in bindings {
        if !binds(binding, user, groups) {
            continue;
        }
        let Ok(spec) = serde_json::from_value::<RoleBindingSpec>(binding.spec.clone()) else {
            continue;
        };
        match (spec.role, spec.cluster, spec.project) {
            (Role::Admin, _, _) => roles.admin = true,
            (role, Some(cluster), Some(project)) => {
                let entry = roles.projects.entry(project).or_insert((cluster, role));
                keep_stronger(&mut entry.1, role);
            }
            (role, Some(cluster), None) => {
                keep_stronger(roles.clusters.entry(cluster).or_insert(role), role);
            }
            (_, None, _) => {}
        }
    }
    roles
}

impl Roles {
    /// Whether these roles reach `cluster`: admin, or any role on it or one of its projects.
    pub fn reaches(&self, cluster: &str) -> bool {
        self.admin
            || self.clusters.contains_key(cluster)
            || self.projects.values().any(|(c, _)| c == cluster)
    }
}

impl Principal {
    /// Whether the user holds any role in `cluster`, on it or on one of its projects: what it
    /// takes to reach the cluster through the proxy (its own RBAC decides the rest).
    pub fn reaches(&self, cluster: &str) -> bool {
        self.admin
            || self.clusters.contains_key(cluster)
            || self.projects.values().any(|(c, _)| c == cluster)
    }

    /// The role held on `project`, if any.
    pub fn project_role(&self, project: &str) -> Option<Role> {
        self.projects.get(project).map(|(_, role)| *role)
    }
}

fn spec_str<'a>(object: &'a Object, field: &str) -> Option<&'a str> {
    object.spec.get(field).and_then(Value::as_str)
}

/// The cluster an object belongs to, for cluster roles.
fn cluster_of(kind: Kind, object: &Object) -> Option<&str> {
    match kind {
        Kind::Cluster => Some(&object.metadata.name),
        Kind::Host
        | Kind::RegistrationToken
        | Kind::RoleBinding
        | Kind::Plan
        | Kind::Project
        | Kind::ProjectSecret
        | Kind::EtcdSnapshot
        | Kind::Machine => spec_str(object, "cluster"),
        Kind::Token => object
            .spec
            .get("agent")
            .and_then(|a| a.get("cluster"))
            .and_then(Value::as_str),
        Kind::User
        | Kind::Setting
        | Kind::AuthProvider
        | Kind::CloudCredential
        | Kind::MachineTemplate => None,
    }
}

/// May `principal` do `verb` to `object` of `kind`? For `List`/`Watch`, call per item and keep
/// the allowed ones; for `Create`, pass the object to be created.
pub fn authorize(
    principal: &Principal,
    verb: Verb,
    kind: Kind,
    object: &Object,
) -> Result<(), AuthError> {
    if principal.admin {
        return Ok(());
    }
    let role = cluster_of(kind, object)
        .and_then(|c| principal.clusters.get(c))
        .copied();
    let owner = role == Some(Role::ClusterOwner);
    let allowed = match kind {
        // Creating clusters and hosts is for admins (hosts arrive through registration).
        Kind::Cluster | Kind::Host => match verb {
            // Project members see their project's cluster (not its hosts).
            v if v.reads() => {
                role.is_some()
                    || (kind == Kind::Cluster && principal.reaches(&object.metadata.name))
            }
            Verb::Update | Verb::Delete => owner,
            _ => false,
        },
        Kind::RegistrationToken => owner,
        // The hub makes machines from pools; the cluster's people see them, its owners may
        // delete one (it is replaced).
        Kind::Machine => match verb {
            v if v.reads() => role.is_some(),
            Verb::Delete => owner,
            _ => false,
        },
        // A project's owner manages its members; a cluster's owner, everyone's.
        Kind::RoleBinding => {
            let project_owner = spec_str(object, "project")
                .is_some_and(|p| principal.project_role(p) == Some(Role::ProjectOwner));
            match verb {
                v if v.reads() => role.is_some() || project_owner,
                _ => owner || project_owner,
            }
        }
        // Projects: their members see them; the cluster's owner makes and changes them.
        Kind::Project => match verb {
            v if v.reads() => {
                role.is_some() || principal.project_role(&object.metadata.name).is_some()
            }
            _ => owner,
        },
        // A project's secrets are its owners' (and the cluster's owners') to read and write.
        Kind::ProjectSecret => {
            owner
                || spec_str(object, "project")
                    .is_some_and(|p| principal.project_role(p) == Some(Role::ProjectOwner))
        }
        // The cluster's people see its snapshots; its owners take and delete them (the hub
        // writes what a snapshot holds: there is nothing to update).
        Kind::EtcdSnapshot => match verb {
            v if v.reads() => role.is_some(),
            Verb::Create | Verb::Delete => owner,
            _ => false,
        },
        // Plans carry the cluster's join token: its owners may read them, no one else.
        Kind::Plan => verb.reads() && owner,
        Kind::User => verb == Verb::Get && object.metadata.name == principal.user,
        Kind::Token => {
            let mine = spec_str(object, "user") == Some(principal.user.as_str());
            let agent = object.spec.get("agent").is_some();
            match verb {
                Verb::Update => false,
                Verb::Create => mine,
                _ => mine || (agent && owner),
            }
        }
        Kind::Setting => verb.reads(),
        // A directory's settings and service account are admins' alone; so are a cloud's keys.
        Kind::AuthProvider | Kind::CloudCredential => false,
        // What a machine is made from holds no secret: anyone signed in may read it.
        Kind::MachineTemplate => verb.reads(),
    };
    if allowed {
        Ok(())
    } else {
        Err(AuthError::Forbidden(forbidden_message(
            principal, verb, kind, object,
        )))
    }
}

/// Whether `principal` may list or watch `kind` at all. Lists are filtered to the objects the
/// caller may read; a kind whose objects a non-admin can never list (users, directories,
/// cloud credentials) is refused outright, as Kubernetes refuses a list, so a client says
/// "not allowed" rather than showing an empty list.
pub fn may_list(principal: &Principal, kind: Kind) -> Result<(), AuthError> {
    match kind {
        Kind::User | Kind::AuthProvider | Kind::CloudCredential if !principal.admin => {
            Err(AuthError::Forbidden(format!(
                "user {:?} may not list {}: that needs the admin role",
                principal.user,
                kind.plural()
            )))
        }
        _ => Ok(()),
    }
}

fn forbidden_message(principal: &Principal, verb: Verb, kind: Kind, object: &Object) -> String {
    let what = format!("{:?} {} {:?}", verb, kind.name(), object.metadata.name).to_lowercase();
    match cluster_of(kind, object) {
        Some(cluster) => format!(
            "user {:?} may not {what}: that needs {} on cluster {cluster:?}; ask an admin or the cluster's owner",
            principal.user,
            if verb.reads() {
                "a role"
            } else {
                "the cluster-owner role"
            }
        ),
        None => format!(
            "user {:?} may not {what}: that needs the admin role",
            principal.user
        ),
    }
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
