//! Who is calling, and what they may do. A request carries a bearer token (API token) or the
//! dashboard's session cookie; both name a Token object whose secret hash must match. What the
//! caller may do comes from their RoleBindings: the rules of the global roles, role templates
//! on clusters and on projects they grant (`crate::roles`). Every request is checked, every
//! time.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

use http::HeaderMap;
use serde_json::Value;

use crate::{
    model::{Granted, HUB_GROUP, Kind, PolicyRule, RoleBindingSpec, TokenSpec, UserSpec, expired},
    roles::{Catalog, builtin},
    store::{LabelSelector, Object, Store, StoreError},
};

pub mod known;
pub mod lifetimes;
pub mod providers;
pub mod secret;
pub mod streams;

/// The dashboard's session cookie.
pub const SESSION_COOKIE: &str = "drover_session";

/// What a user holds in one place (a cluster, a project, or every cluster): the templates
/// and their rules, with what those inherit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    pub templates: BTreeSet<String>,
    pub rules: Vec<PolicyRule>,
}

impl Access {
    fn add(&mut self, catalog: &Catalog, template: &str) {
        if !self.templates.insert(template.to_owned()) {
            return;
        }
        for rule in catalog.rules_of(template) {
            if !self.rules.contains(&rule) {
                self.rules.push(rule);
            }
        }
    }

    fn merge(&mut self, other: &Access) {
        self.templates.extend(other.templates.iter().cloned());
        for rule in &other.rules {
            if !self.rules.contains(rule) {
                self.rules.push(rule.clone());
            }
        }
    }

    /// Whether these rules allow `verb` on the hub's object `name` of `kind`.
    pub fn allows_hub(&self, verb: &str, kind: Kind, name: Option<&str>) -> bool {
        crate::roles::allows(&self.rules, verb, HUB_GROUP, kind.plural(), name)
    }

    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }
}

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

/// What a user may do, from the role bindings of the user and of their groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles {
    pub admin: bool,
    pub global: Vec<PolicyRule>,
    pub everywhere: Access,
    pub clusters: BTreeMap<String, Access>,
    /// Project → (its cluster, what is held on it).
    pub projects: BTreeMap<String, (String, Access)>,
}

/// Whether `binding` names `user` or one of `groups`.
fn binds(binding: &Object, user: &str, groups: &[String]) -> bool {
    let named = |field: &str| binding.spec.get(field).and_then(Value::as_str);
    named("user") == Some(user) || named("group").is_some_and(|g| groups.iter().any(|m| m == g))
}

/// Whether `rules` allow everything, as the `admin` global role does.
fn all_allowed(rules: &[PolicyRule]) -> bool {
    crate::roles::allows(rules, "*", "*", "*", None) && crate::roles::allows_url(rules, "*", "*")
}

/// The roles `user`, a member of `groups`, holds through `bindings` (live ones: see
/// `crate::refs`), their templates and global roles as `catalog` defines them. A binding to a
/// template or global role that does not exist grants nothing; so does a cluster template
/// bound on a project or a project template bound on a cluster.
pub fn roles_of(bindings: &[Object], catalog: &Catalog, user: &str, groups: &[String]) -> Roles {
    use crate::model::TemplateContext;
    let mut roles = Roles::default();
    let add_global = |roles: &mut Roles, name: &str| {
        let Some(global) = catalog.global(name) else {
            return;
        };
        for rule in &global.rules {
            if !roles.global.contains(rule) {
                roles.global.push(rule.clone());
            }
        }
        for template in &global.inherited_cluster_roles {
            if catalog
                .template(template)
                .is_some_and(|t| t.context == TemplateContext::Cluster)
            {
                roles.everywhere.add(catalog, template);
            }
        }
    };
    add_global(&mut roles, builtin::EVERYONE);
    for binding in bindings {
        if !binds(binding, user, groups) {
            continue;
        }
        let Ok(spec) = serde_json::from_value::<RoleBindingSpec>(binding.spec.clone()) else {
            continue;
        };
        let Some(granted) = spec.granted() else {
            continue;
        };
        let template = match granted {
            Granted::Global(name) => {
                add_global(&mut roles, &name);
                continue;
            }
            Granted::Template(name) => name,
        };
        let Some(context) = catalog.template(&template).map(|t| t.context) else {
            continue;
        };
        match (context, spec.cluster, spec.project) {
            (TemplateContext::Project, Some(cluster), Some(project)) => {
                let entry = roles
                    .projects
                    .entry(project)
                    .or_insert_with(|| (cluster, Access::default()));
                entry.1.add(catalog, &template);
            }
            (TemplateContext::Cluster, Some(cluster), None) => {
                roles
                    .clusters
                    .entry(cluster)
                    .or_default()
                    .add(catalog, &template);
            }
            _ => {}
        }
    }
    roles.admin = all_allowed(&roles.global);
    roles
}

impl Roles {
    /// Whether these roles reach `cluster`: admin, or any role on it or one of its projects.
    pub fn reaches(&self, cluster: &str) -> bool {
        self.admin
            || !self.everywhere.is_empty()
            || self.clusters.contains_key(cluster)
            || self.projects.values().any(|(c, _)| c == cluster)
    }
}

impl Principal {
    /// Whether the user holds any role in `cluster`, on it or on one of its projects: what it
    /// takes to reach the cluster through the proxy (its own RBAC decides the rest).
    pub fn reaches(&self, cluster: &str) -> bool {
        self.admin
            || !self.everywhere.is_empty()
            || self.clusters.contains_key(cluster)
            || self.projects.values().any(|(c, _)| c == cluster)
    }

    /// What is held on the whole of `cluster`: its own templates and those held everywhere.
    pub fn on_cluster(&self, cluster: &str) -> Access {
        let mut access = self.everywhere.clone();
        if let Some(own) = self.clusters.get(cluster) {
            access.merge(own);
        }
        access
    }

    /// What is held on `project`, if anything.
    pub fn on_project(&self, project: &str) -> Option<&Access> {
        self.projects.get(project).map(|(_, access)| access)
    }

    /// Whether any role held on `cluster`, or on one of its projects, writes to the cluster
    /// (anything but get, list and watch on its resources).
    pub fn writes_in(&self, cluster: &str) -> bool {
        self.admin
            || crate::roles::writes_downstream(&self.on_cluster(cluster).rules)
            || self
                .projects
                .values()
                .any(|(c, a)| c == cluster && crate::roles::writes_downstream(&a.rules))
    }

    /// Whether the global roles held allow `verb` on the hub's objects of `kind` (named
    /// `name`, or all of them).
    pub fn may_globally(&self, verb: &str, kind: Kind, name: Option<&str>) -> bool {
        self.admin || crate::roles::allows(&self.global, verb, HUB_GROUP, kind.plural(), name)
    }

    /// Whether the global roles held allow `verb` on the hub resource `resource` that is no
    /// kind of object (`audit`).
    pub fn may_hub(&self, verb: &str, resource: &str) -> bool {
        self.admin || crate::roles::allows(&self.global, verb, HUB_GROUP, resource, None)
    }
}

#[cfg(test)]
impl Principal {
    /// A caller `user` holding builtin roles: `admin`, on clusters, and `(project, its
    /// cluster, role)` on projects, as bindings by their old names would give.
    pub fn holding(
        user: &str,
        admin: bool,
        clusters: &[(&str, crate::model::Role)],
        projects: &[(&str, &str, crate::model::Role)],
    ) -> Principal {
        let binding = |spec: Value| Object::new(Kind::RoleBinding.name(), "b", spec);
        let mut bindings: Vec<Object> = clusters
            .iter()
            .map(|(c, r)| binding(serde_json::json!({"user": user, "role": r.label(), "cluster": c})))
            .chain(projects.iter().map(|(p, c, r)| {
                binding(serde_json::json!({"user": user, "role": r.label(), "cluster": c, "project": p}))
            }))
            .collect();
        if admin {
            bindings.push(binding(serde_json::json!({"user": user, "role": "admin"})));
        }
        let roles = roles_of(&bindings, &Catalog::new(&[], &[]), user, &[]);
        Principal {
            user: user.into(),
            groups: Vec::new(),
            admin: roles.admin,
            global: roles.global,
            everywhere: roles.everywhere,
            clusters: roles.clusters,
            projects: roles.projects,
            token: "t".into(),
            provider: "local".into(),
        }
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
        | Kind::MachineTemplate
        | Kind::RoleTemplate
        | Kind::GlobalRole => None,
    }
}

/// The project an object belongs to, for project roles.
fn project_of(kind: Kind, object: &Object) -> Option<&str> {
    match kind {
        Kind::Project => Some(&object.metadata.name),
        Kind::RoleBinding | Kind::ProjectSecret => spec_str(object, "project"),
        _ => None,
    }
}

/// May `principal` do `verb` to `object` of `kind`? For `List`/`Watch`, call per item and keep
/// the allowed ones; for `Create`, pass the object to be created.
///
/// The rules of the roles held decide, on `management.drover.io` and the kind's plural: the
/// global roles' on every object, the templates held on an object's cluster (or project) on
/// the objects of that cluster (or project). Some things no role grants but `admin`, as the
/// hub makes them itself (hosts, machines, plans, a snapshot's contents) or as they could
/// grant more than their author holds (roles); a user's own tokens and user are theirs.
pub fn authorize(
    principal: &Principal,
    verb: Verb,
    kind: Kind,
    object: &Object,
) -> Result<(), AuthError> {
    if principal.admin {
        return Ok(());
    }
    let name = object.metadata.name.as_str();
    let verbs: &[&str] = match verb {
        Verb::Update => &["update", "patch"],
        v => &[v.rule_verb()],
    };
    let by = |access: &Access| verbs.iter().any(|v| access.allows_hub(v, kind, Some(name)));
    let globally = verbs
        .iter()
        .any(|v| principal.may_globally(v, kind, Some(name)));
    let on_cluster = || cluster_of(kind, object).is_some_and(|c| by(&principal.on_cluster(c)));
    let on_project =
        || project_of(kind, object).is_some_and(|p| principal.on_project(p).is_some_and(by));
    let reserved = matches!(
        (kind, verb),
        (Kind::Host, Verb::Create)
            | (Kind::Machine, Verb::Create | Verb::Update)
            | (Kind::Plan, Verb::Create | Verb::Update | Verb::Delete)
            | (Kind::EtcdSnapshot, Verb::Update)
            | (
                Kind::RoleTemplate | Kind::GlobalRole,
                Verb::Create | Verb::Update | Verb::Delete
            )
            | (Kind::Token, Verb::Update)
    );
    let allowed = !reserved
        && match kind {
            // A cluster is made by those a global role lets (who then own it); the people of
            // a project see its cluster (not its hosts).
            Kind::Cluster if verb == Verb::Create => globally,
            Kind::Cluster => globally || on_cluster() || (verb.reads() && principal.reaches(name)),
            Kind::User => (verb == Verb::Get && name == principal.user) || globally,
            Kind::Token => {
                let mine = spec_str(object, "user") == Some(principal.user.as_str());
                let agent = object.spec.get("agent").is_some();
                mine || (agent && verb != Verb::Create && on_cluster())
            }
            _ => globally || on_cluster() || on_project(),
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
/// caller may read; a kind whose objects are no cluster's or project's (users, directories,
/// cloud credentials) is refused outright unless a global role lets the caller list it, as
/// Kubernetes refuses a list, so a client says "not allowed" rather than showing an empty list.
pub fn may_list(principal: &Principal, kind: Kind) -> Result<(), AuthError> {
    match kind {
        Kind::User | Kind::AuthProvider | Kind::CloudCredential
            if !principal.may_globally("list", kind, None) =>
        {
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
                "a role".to_owned()
            } else {
                format!(
                    "the cluster-owner role (or a role that allows {} {} in {HUB_GROUP})",
                    verb.rule_verb(),
                    kind.plural()
                )
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
