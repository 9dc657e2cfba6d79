//! Auth providers: users of a company directory sign in with it, become hub Users linked to
//! their directory identity at their first login, and carry the directory's groups (prefixed
//! with the provider's name, `corp:ops`) into role bindings and, impersonated, into every
//! cluster. The groups are read again at each login and on a schedule (setting
//! `auth-refresh-interval`), so a user taken out of a group loses what it gave within that
//! period.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{
    model::{AuthProviderSpec, Kind, PrincipalRef, ProviderType, UserSpec},
    store::{LabelSelector, Object, Store, StoreError},
};

pub use crate::model::{LOCAL, RESERVED};

pub mod github;
pub mod http;
pub mod jwt;
pub mod ldap;
pub mod oidc;

/// The label linking a User to its directory identity: a hash of the provider and the id
/// (label values cannot hold a DN).
pub const PRINCIPAL_LABEL: &str = "drover.io/principal";

/// The setting saying how often directory users' groups are read again, and its default.
pub const REFRESH_SETTING: &str = "auth-refresh-interval";
const REFRESH_DEFAULT: &str = "1h";

/// A user as a directory knows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// What the link is made by, the provider's stable id: the LDAP DN (compared ignoring
    /// case, as the directory does), an OpenID provider's issuer and subject as
    /// `<issuer>#<sub>` (exact), GitHub's numeric user id. Never a name that can change hands.
    pub id: String,
    pub login: String,
    pub display_name: String,
    /// The directory's group names (unprefixed).
    pub groups: Vec<String>,
    /// An email address the provider says it verified (OpenID's `email_verified`): the only
    /// email `allowed.users` may match.
    pub verified_email: Option<String>,
}

/// Whether a provider's ids compare ignoring case: an LDAP DN does (`uid=Alice` and
/// `uid=alice` name one entry); an OpenID subject and a GitHub id do not.
pub fn ids_ignore_case(provider_type: ProviderType) -> bool {
    matches!(
        provider_type,
        ProviderType::Ldap | ProviderType::ActiveDirectory
    )
}

/// A login under way: what the callback must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub url: String,
    pub state: String,
    pub nonce: String,
    pub verifier: String,
}

/// The user a finished login found, and what lets the hub read their groups again.
#[derive(Debug, Clone)]
pub struct Finished {
    pub identity: Identity,
    /// What the scheduled refresh reads their groups with: an OpenID refresh token, a GitHub
    /// access token (kept in the store, never shown).
    pub refresh_token: Option<String>,
}

/// What went wrong talking to a directory, in the words the test-connection action shows.
/// Logins report the user's own failures as one "wrong username or password".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    #[error("{0}")]
    Connect(String),
    #[error("bind refused: {0}")]
    ServiceBind(String),
    #[error("user not found: {0}")]
    UserNotFound(String),
    /// A redirecting provider's answer refused for this login: which check failed, in words
    /// (a grant the provider refused, an ID token for another client, expired, from another
    /// issuer or signed by another key).
    #[error("{0}")]
    Refused(String),
    #[error("wrong password")]
    WrongPassword,
    /// Too many failed sign-ins for the account the login name resolved to: its password is
    /// not tried.
    #[error("too many failed sign-ins for this account")]
    Blocked,
    #[error("the account {0:?} is disabled in the directory")]
    Disabled(String),
    #[error("{0}")]
    Search(String),
}

impl DirectoryError {
    /// The step of a login that failed.
    pub fn step(&self) -> &'static str {
        match self {
            DirectoryError::Connect(_) => "connect",
            DirectoryError::ServiceBind(_) => "bind",
            DirectoryError::UserNotFound(_)
            | DirectoryError::Refused(_)
            | DirectoryError::Blocked
            | DirectoryError::WrongPassword
            | DirectoryError::Disabled(_) => "user",
            DirectoryError::Search(_) => "groups",
        }
    }

    /// Whether the directory could not be used at all (rather than refusing this user).
    pub fn unavailable(&self) -> bool {
        matches!(
            self,
            DirectoryError::Connect(_) | DirectoryError::ServiceBind(_) | DirectoryError::Search(_)
        )
    }
}

/// A way to sign in that the login page offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Offered {
    pub name: String,
    #[serde(rename = "type")]
    pub provider_type: String,
    pub display_name: String,
    /// Signed in at the provider's page (`GET /v1/login/<name>/start`), not with a password.
    pub redirects: bool,
}

/// What the login page offers: the hub's own users, then each enabled provider by name.
pub async fn offered(store: &dyn Store) -> Result<Vec<Offered>, StoreError> {
    let (found, _) = store
        .list(Kind::AuthProvider.name(), &LabelSelector::everything())
        .await?;
    let mut offered = vec![Offered {
        name: LOCAL.to_owned(),
        provider_type: LOCAL.to_owned(),
        display_name: "Local users".to_owned(),
        redirects: false,
    }];
    for provider in found {
        let Ok(spec) = serde_json::from_value::<AuthProviderSpec>(provider.spec) else {
            continue;
        };
        if spec.enabled {
            offered.push(Offered {
                display_name: if spec.display_name.is_empty() {
                    provider.metadata.name.clone()
                } else {
                    spec.display_name
                },
                name: provider.metadata.name,
                provider_type: spec.provider_type.label().to_owned(),
                redirects: spec.provider_type.redirects(),
            });
        }
    }
    Ok(offered)
}

/// The directory an AuthProvider's spec describes.
pub fn directory(spec: &AuthProviderSpec) -> Option<ldap::Directory> {
    match spec.provider_type {
        ProviderType::Ldap | ProviderType::ActiveDirectory => spec
            .ldap
            .as_ref()
            .map(|l| ldap::Directory::new(spec.provider_type, l)),
        ProviderType::Oidc | ProviderType::Github => None,
    }
}

/// A provider whose users sign in at its own page.
#[derive(Debug, Clone)]
pub enum Redirecting {
    Oidc(oidc::Oidc),
    Github(github::Github),
}

impl Redirecting {
    /// Where to send the user's browser, and what the callback must match.
    pub async fn start(&self, redirect_uri: &str) -> Result<Started, DirectoryError> {
        match self {
            Redirecting::Oidc(c) => c.start(redirect_uri).await,
            Redirecting::Github(c) => c.start(redirect_uri).await,
        }
    }

    /// The user the callback's `code` is for.
    pub async fn finish(
        &self,
        redirect_uri: &str,
        code: &str,
        verifier: &str,
        nonce: &str,
    ) -> Result<Finished, DirectoryError> {
        match self {
            Redirecting::Oidc(c) => c.finish(redirect_uri, code, verifier, nonce).await,
            Redirecting::Github(c) => c.finish(redirect_uri, code, verifier).await,
        }
    }

    /// The user as the provider has them now, with what [`Finished::refresh_token`] kept;
    /// `Ok(None)` if the provider no longer accepts it.
    pub async fn refresh(&self, kept: &str) -> Result<Option<Finished>, DirectoryError> {
        match self {
            Redirecting::Oidc(c) => c.refresh(kept).await,
            Redirecting::Github(c) => c.refresh(kept).await,
        }
    }

    /// Where the browser ends the provider's session too, if the provider says.
    pub async fn end_session(&self, after: &str) -> Option<String> {
        match self {
            Redirecting::Oidc(c) => c.end_session(after).await,
            Redirecting::Github(_) => None,
        }
    }
}

/// The client of a provider whose users sign in at its own page, if `spec` is one.
pub fn redirecting(spec: &AuthProviderSpec) -> Option<Result<Redirecting, DirectoryError>> {
    match spec.provider_type {
        ProviderType::Oidc => spec
            .oidc
            .as_ref()
            .map(|o| oidc::Oidc::new(o).map(Redirecting::Oidc)),
        ProviderType::Github => spec
            .github
            .as_ref()
            .map(|g| github::Github::new(g).map(Redirecting::Github)),
        ProviderType::Ldap | ProviderType::ActiveDirectory => None,
    }
}

/// Whether `identity` may sign in with a provider whose `allowed` is as given. A user is
/// named by what cannot change hands: a directory's DN or login name (ignoring case, as the
/// directory does); an OpenID subject (exactly) or an email the provider verified; GitHub's
/// numeric id. A GitHub login or an unverified email matches nothing.
pub fn allowed(spec: &AuthProviderSpec, identity: &Identity) -> bool {
    let allowed = &spec.allowed;
    let named = |u: &String| {
        if ids_ignore_case(spec.provider_type) {
            u.eq_ignore_ascii_case(&identity.id) || u.eq_ignore_ascii_case(&identity.login)
        } else {
            let subject = identity.id.split_once('#').map(|(_, sub)| sub);
            *u == identity.id
                || subject == Some(u.as_str())
                || identity
                    .verified_email
                    .as_ref()
                    .is_some_and(|e| e.eq_ignore_ascii_case(u))
        }
    };
    allowed.is_empty()
        || allowed.users.iter().any(named)
        || allowed
            .groups
            .iter()
            .any(|g| identity.groups.iter().any(|m| m.eq_ignore_ascii_case(g)))
}

/// The groups a user of `provider` carries: the directory's names, prefixed, sorted.
pub fn prefixed(provider: &str, groups: &[String]) -> Vec<String> {
    groups
        .iter()
        .map(|g| format!("{provider}:{g}"))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The label value linking a User to `id` of `provider`: a hash (label values cannot hold a
/// DN), of the id lowercased where the provider's ids ignore case.
fn principal_key(provider: &str, id: &str, ignore_case: bool) -> String {
    let id = if ignore_case {
        id.to_lowercase()
    } else {
        id.to_owned()
    };
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{provider}\n{id}").as_bytes(),
    );
    digest
        .as_ref()
        .iter()
        .take(20)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The (label value, stored id) pairs under which a User linked to `id` may be found: its own
/// key, and for an exact id what hubs before 2026-12 stored (every id's key lowercased; an
/// OpenID user's id the bare subject), still compared exactly.
fn link_keys(provider: &str, id: &str, ignore_case: bool) -> Vec<(String, String)> {
    let mut keys = vec![(principal_key(provider, id, ignore_case), id.to_owned())];
    if !ignore_case {
        keys.push((principal_key(provider, id, true), id.to_owned()));
        if let Some((_, subject)) = id.split_once('#') {
            keys.push((principal_key(provider, subject, true), subject.to_owned()));
        }
    }
    keys.dedup();
    keys
}

/// The User linked to `id` of `provider`, if one is: the id compared as the provider compares
/// it, so `00U7kX9qBa` never finds the user of the OpenID subject `00u7Kx9QbA`.
async fn linked(
    store: &dyn Store,
    provider: &str,
    id: &str,
    ignore_case: bool,
) -> Result<Option<Object>, StoreError> {
    for (key, stored) in link_keys(provider, id, ignore_case) {
        let selector = LabelSelector::parse(&format!("{PRINCIPAL_LABEL}={key}"))
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let (users, _) = store.list(Kind::User.name(), &selector).await?;
        let found = users.into_iter().find(|u| {
            let same_id = |i: &str| {
                if ignore_case {
                    i.eq_ignore_ascii_case(&stored)
                } else {
                    i == stored
                }
            };
            u.spec
                .pointer("/principal/provider")
                .and_then(Value::as_str)
                == Some(provider)
                && u.spec
                    .pointer("/principal/id")
                    .and_then(Value::as_str)
                    .is_some_and(same_id)
        });
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

/// A User name for a new directory user: `<provider>-<login>` made a valid name, or with a
/// number when taken.
fn candidate_names(provider: &str, login: &str) -> Vec<String> {
    let mut base = crate::cli::object_name(&format!("{provider}-{login}"));
    base.truncate(58);
    let base = base.trim_end_matches('-').to_owned();
    let mut names = vec![base.clone()];
    names.extend((2..10).map(|n| format!("{base}-{n}")));
    names
}

/// Makes sure `identity` of `provider` is a hub User (created at the first login), with its
/// groups as of now. Returns the user's name.
pub async fn link(
    store: &dyn Store,
    provider: &str,
    provider_type: ProviderType,
    identity: &Identity,
) -> Result<String, StoreError> {
    let ignore_case = ids_ignore_case(provider_type);
    let key = principal_key(provider, &identity.id, ignore_case);
    let groups = prefixed(provider, &identity.groups);
    let principal = PrincipalRef {
        provider: provider.to_owned(),
        id: identity.id.clone(),
        login: identity.login.clone(),
    };
    // A concurrent change to the user (a refresh, an admin's edit) is read again and retried.
    for _ in 0..5 {
        if let Some(mut user) = linked(store, provider, &identity.id, ignore_case).await? {
            let mut spec: UserSpec = serde_json::from_value(user.spec.clone())
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            // A user linked by an older hub gets the id and key of now.
            spec.principal = Some(principal.clone());
            user.metadata
                .labels
                .insert(PRINCIPAL_LABEL.to_owned(), key.clone());
            spec.provider_groups.clone_from(&groups);
            spec.groups_refreshed_at = Some(crate::store::now_rfc3339());
            if spec.display_name.is_empty() {
                spec.display_name.clone_from(&identity.display_name);
            }
            user.spec =
                serde_json::to_value(&spec).map_err(|e| StoreError::Backend(e.to_string()))?;
            match store.update(user).await {
                Ok(user) => return Ok(user.metadata.name),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        let spec = UserSpec {
            display_name: identity.display_name.clone(),
            disabled: false,
            password: None,
            password_hash: String::new(),
            groups: Vec::new(),
            principal: Some(principal.clone()),
            provider_groups: groups.clone(),
            groups_refreshed_at: Some(crate::store::now_rfc3339()),
        };
        let spec = serde_json::to_value(&spec).map_err(|e| StoreError::Backend(e.to_string()))?;
        for name in candidate_names(provider, &identity.login) {
            if crate::model::validate_name(Kind::User, &name).is_err() {
                continue;
            }
            let mut user = Object::new(Kind::User.name(), &name, spec.clone());
            user.metadata
                .labels
                .insert(PRINCIPAL_LABEL.to_owned(), key.clone());
            match store.create(user).await {
                Ok(user) => {
                    tracing::info!(user = %name, provider, "a directory user signed in for the first time");
                    return Ok(user.metadata.name);
                }
                // Taken by another user (or this one, created meanwhile: looked up again).
                Err(StoreError::AlreadyExists { .. }) => {
                    if linked(store, provider, &identity.id, ignore_case)
                        .await?
                        .is_some()
                    {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
    Err(StoreError::Backend(format!(
        "could not link {:?} of provider {provider:?} to a user",
        identity.login
    )))
}

/// How often directory users' groups are read again: the setting, or an hour.
async fn refresh_interval(store: &dyn Store) -> Duration {
    let text = crate::registration::setting(store, REFRESH_SETTING, REFRESH_DEFAULT.to_owned())
        .await
        .unwrap_or_else(|_| REFRESH_DEFAULT.to_owned());
    parse_interval(&text).unwrap_or(Duration::from_secs(3600))
}

/// An interval as the setting writes it: `30s`, `15m`, `1h` (at least 10 s: each refresh
/// searches the directory once per user).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = || {
        format!("{text:?} is not an interval; write seconds, minutes or hours, as 30s, 15m or 1h")
    };
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let count: u64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => count,
        "m" => count * 60,
        "h" => count * 3600,
        _ => return Err(bad()),
    };
    if !(10..=7 * 24 * 3600).contains(&seconds) {
        return Err(format!("{text:?} is out of range: from 10s to 168h"));
    }
    Ok(Duration::from_secs(seconds))
}

/// Reads every directory user's groups again when they are older than the interval, until
/// `shutdown` (the leader runs it). A user the directory no longer has (or has disabled)
/// keeps no groups, and their tokens are revoked.
pub async fn run_refresher(store: Arc<dyn Store>, shutdown: CancellationToken) {
    loop {
        let interval = refresh_interval(store.as_ref()).await;
        if let Err(e) = sweep_pending(store.as_ref()).await {
            tracing::warn!(error = %e, "deleting abandoned logins failed; retrying");
        }
        if let Err(e) = refresh_due(store.as_ref(), interval).await {
            tracing::warn!(error = %e, "refreshing directory users' groups failed; retrying");
        }
        // Wake for the next due user, or sooner when the interval setting changes.
        let settings = store
            .watch(
                Some(Kind::Setting.name()),
                Some(store.revision().await.unwrap_or(0)),
            )
            .await;
        let changed = async {
            match settings {
                Ok(mut events) => {
                    while let Some(event) = events.next().await {
                        if event.is_ok_and(|e| e.object.metadata.name == REFRESH_SETTING) {
                            return;
                        }
                    }
                    std::future::pending::<()>().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval.min(Duration::from_secs(60)) / 2) => {}
            () = changed => {}
        }
    }
}

/// Deletes logins under way that were never finished (their time is up): browsers' and
/// command lines'.
async fn sweep_pending(store: &dyn Store) -> Result<(), StoreError> {
    for kind in [PENDING_KIND, DEVICE_KIND] {
        let (pending, _) = store.list(kind, &LabelSelector::everything()).await?;
        for login in pending.iter().filter(|p| crate::model::expired(&p.spec)) {
            match store.delete(kind, &login.metadata.name, None).await {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Refreshes the directory users whose groups are older than `interval`; how many.
pub async fn refresh_due(store: &dyn Store, interval: Duration) -> Result<usize, StoreError> {
    let (users, _) = store
        .list(Kind::User.name(), &LabelSelector::everything())
        .await?;
    let now = time::OffsetDateTime::now_utc();
    let mut refreshed = 0;
    for user in users {
        let Ok(spec) = serde_json::from_value::<UserSpec>(user.spec.clone()) else {
            continue;
        };
        let Some(principal) = &spec.principal else {
            continue;
        };
        let due = spec
            .groups_refreshed_at
            .as_deref()
            .and_then(crate::model::parse_time)
            .is_none_or(|at| now - at >= interval);
        if !due || spec.disabled {
            continue;
        }
        match refresh(store, principal).await {
            Ok(()) => refreshed += 1,
            Err(e) => {
                tracing::warn!(user = %user.metadata.name, provider = %principal.provider, error = %e, "could not refresh the user's groups; keeping them until the directory answers")
            }
        }
    }
    Ok(refreshed)
}

/// Reads one directory user's groups again.
async fn refresh(store: &dyn Store, principal: &PrincipalRef) -> Result<(), String> {
    let provider = store
        .get(Kind::AuthProvider.name(), &principal.provider)
        .await;
    let mut ignore_case = false;
    let found = match provider {
        Ok(provider) => {
            let spec: AuthProviderSpec =
                serde_json::from_value(provider.spec).map_err(|e| e.to_string())?;
            ignore_case = ids_ignore_case(spec.provider_type);
            let found = match spec.provider_type {
                ProviderType::Ldap | ProviderType::ActiveDirectory => {
                    let directory =
                        directory(&spec).ok_or("the provider has no directory settings")?;
                    directory
                        .lookup(&principal.id)
                        .await
                        .map_err(|e| e.to_string())?
                }
                ProviderType::Oidc | ProviderType::Github => {
                    match refresh_redirecting(store, &spec, principal).await? {
                        Some(found) => found,
                        // Nothing to refresh with (the provider gave no refresh token): the
                        // groups of the last login stay until the next one.
                        None => return Ok(()),
                    }
                }
            };
            found.filter(|identity| allowed(&spec, identity))
        }
        // The provider is gone: its users keep nothing it gave.
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.to_string()),
    };
    for _ in 0..5 {
        // `principal` is the user's own, as stored: found by its id exactly.
        let Some(mut user) = linked(store, &principal.provider, &principal.id, false)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(());
        };
        let mut spec: UserSpec =
            serde_json::from_value(user.spec.clone()).map_err(|e| e.to_string())?;
        let name = user.metadata.name.clone();
        // A user linked by an older hub (an OpenID subject without its issuer) gets the id
        // and key of now.
        if let (Some(identity), Some(linked_to)) = (&found, &mut spec.principal) {
            linked_to.id.clone_from(&identity.id);
            user.metadata.labels.insert(
                PRINCIPAL_LABEL.to_owned(),
                principal_key(&principal.provider, &identity.id, ignore_case),
            );
        }
        spec.provider_groups = found
            .as_ref()
            .map(|identity| prefixed(&principal.provider, &identity.groups))
            .unwrap_or_default();
        spec.groups_refreshed_at = Some(crate::store::now_rfc3339());
        user.spec = serde_json::to_value(&spec).map_err(|e| e.to_string())?;
        match store.update(user).await {
            Ok(_) => {}
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.to_string()),
        }
        if found.is_none() {
            // Gone from the directory (or disabled there, or no longer allowed): the tokens
            // issued while they were there end now. Restored, they sign in again.
            let revoked = revoke_tokens(store, &name)
                .await
                .map_err(|e| e.to_string())?;
            tracing::info!(user = %name, provider = %principal.provider, tokens = revoked, "the directory no longer has this user (or disabled them, or they may no longer sign in): their groups are cleared and their tokens revoked");
        }
        return Ok(());
    }
    Err("the user kept changing while its groups were refreshed".into())
}

/// The hidden store kinds of sign-in (no API route serves them): a browser login under way,
/// and what lets the hub read a redirecting provider's user's groups again (an OpenID refresh
/// token, a GitHub access token).
pub const PENDING_KIND: &str = "PendingLogin";
/// A command line's sign-in waiting for a person to confirm it (`api::device`), named by its
/// user code.
pub const DEVICE_KIND: &str = "DeviceLogin";
pub const SESSION_KIND: &str = "ProviderSession";

/// How long a login may take at the provider's page.
pub const PENDING_FOR: time::Duration = time::Duration::minutes(10);

/// A user of a redirecting provider as the provider has them now (`Some(None)`: gone), by
/// what their login left (an OpenID refresh token, a GitHub access token); `None` if there is
/// nothing to refresh with.
async fn refresh_redirecting(
    store: &dyn Store,
    spec: &AuthProviderSpec,
    principal: &PrincipalRef,
) -> Result<Option<Option<Identity>>, String> {
    let session = match store.get(SESSION_KIND, &session_name(principal)).await {
        Ok(session) => session,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let Some(refresh_token) = session.spec.get("refreshToken").and_then(Value::as_str) else {
        return Ok(None);
    };
    let client = redirecting(spec)
        .ok_or("the provider has no settings for its type")?
        .map_err(|e| e.to_string())?;
    match client
        .refresh(refresh_token)
        .await
        .map_err(|e| e.to_string())?
    {
        Some(finished) if same_subject(&finished.identity.id, &principal.id) => {
            let now = PrincipalRef {
                id: finished.identity.id.clone(),
                ..principal.clone()
            };
            keep_session(store, &now, finished.refresh_token.as_deref())
                .await
                .map_err(|e| e.to_string())?;
            if session_name(&now) != session_name(principal) {
                let _ = store
                    .delete(SESSION_KIND, &session_name(principal), None)
                    .await;
            }
            Ok(Some(Some(finished.identity)))
        }
        Some(_) => Err("the provider refreshed another subject".into()),
        None => {
            let _ = store
                .delete(SESSION_KIND, &session_name(principal), None)
                .await;
            Ok(Some(None))
        }
    }
}

/// Whether the id a provider answers with `now` is the user stored as `stored`: the same id,
/// or (stored by a hub before 2026-12) the same OpenID subject, then kept without its issuer.
fn same_subject(now: &str, stored: &str) -> bool {
    now == stored
        || now
            .split_once('#')
            .is_some_and(|(_, subject)| subject == stored)
}

/// The name of a redirecting provider's user's kept session. Sessions kept before 2026-12,
/// whose OpenID ids had no issuer, are named by the lowercased id; ids with an issuer exactly.
fn session_name(principal: &PrincipalRef) -> String {
    let legacy = !principal.id.contains('#');
    format!(
        "{}-{}",
        principal.provider,
        principal_key(&principal.provider, &principal.id, legacy)
    )
}

/// Keeps (or, with none, forgets) the refresh token of a provider's user.
pub async fn keep_session(
    store: &dyn Store,
    principal: &PrincipalRef,
    refresh_token: Option<&str>,
) -> Result<(), StoreError> {
    let name = session_name(principal);
    let Some(token) = refresh_token else {
        return match store.delete(SESSION_KIND, &name, None).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        };
    };
    let spec = serde_json::json!({"provider": principal.provider, "refreshToken": token});
    match store.get(SESSION_KIND, &name).await {
        Ok(mut session) => {
            session.spec = spec;
            store.update(session).await.map(drop)
        }
        Err(StoreError::NotFound { .. }) => store
            .create(Object::new(SESSION_KIND, &name, spec))
            .await
            .map(drop),
        Err(e) => Err(e),
    }
}

/// Deletes every token of `user`; how many.
async fn revoke_tokens(store: &dyn Store, user: &str) -> Result<usize, StoreError> {
    let selector = LabelSelector::parse(&format!("{}={user}", super::lifetimes::USER_LABEL))
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    let (tokens, _) = store.list(Kind::Token.name(), &selector).await?;
    let mut revoked = 0;
    for token in tokens {
        if token.spec.get("user").and_then(Value::as_str) != Some(user) {
            continue;
        }
        match store
            .delete(Kind::Token.name(), &token.metadata.name, None)
            .await
        {
            Ok(_) => revoked += 1,
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(revoked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{validate_provider as validate, validate_provider_name as validate_name};

    fn oidc_identity(sub: &str, email: Option<&str>) -> Identity {
        Identity {
            id: format!("https://idp.example.com#{sub}"),
            login: sub.to_lowercase(),
            display_name: String::new(),
            groups: Vec::new(),
            verified_email: email.map(str::to_owned),
        }
    }

    #[tokio::test]
    async fn an_openid_subject_that_differs_only_in_case_is_another_person() {
        let sqlite =
            crate::store::sqlite::SqliteStore::open(std::path::Path::new(":memory:")).unwrap();
        let store: &dyn Store = &sqlite;
        let sign_in = async |provider: &str, provider_type, identity: &Identity| {
            link(store, provider, provider_type, identity)
                .await
                .unwrap()
        };
        let first = sign_in(
            "sso",
            ProviderType::Oidc,
            &oidc_identity("00u7Kx9QbA", None),
        )
        .await;
        let other = sign_in(
            "sso",
            ProviderType::Oidc,
            &oidc_identity("00U7kX9qBa", None),
        )
        .await;
        assert_ne!(first, other);
        let again = sign_in(
            "sso",
            ProviderType::Oidc,
            &oidc_identity("00u7Kx9QbA", None),
        )
        .await;
        assert_eq!(again, first);
        let user = store.get(Kind::User.name(), &first).await.unwrap();
        assert_eq!(
            user.spec["principal"]["id"],
            "https://idp.example.com#00u7Kx9QbA"
        );
        // A directory's DN names one entry however it is cased.
        let dn = |dn: &str| Identity {
            id: dn.to_owned(),
            login: "alice".into(),
            display_name: String::new(),
            groups: Vec::new(),
            verified_email: None,
        };
        let alice = sign_in("corp", ProviderType::Ldap, &dn("uid=alice,dc=example")).await;
        let shouted = sign_in("corp", ProviderType::Ldap, &dn("UID=Alice,DC=example")).await;
        assert_eq!(alice, shouted);
    }

    #[tokio::test]
    async fn a_user_an_older_hub_linked_by_its_bare_subject_is_found_and_relinked_exactly() {
        let sqlite =
            crate::store::sqlite::SqliteStore::open(std::path::Path::new(":memory:")).unwrap();
        let store: &dyn Store = &sqlite;
        // As hubs before 2026-12 stored them: the subject alone, its key lowercased.
        for (name, sub) in [("sso-mixed", "00u7Kx9QbA"), ("sso-other", "00U7kX9qBa")] {
            let mut user = Object::new(
                Kind::User.name(),
                name,
                serde_json::json!({"principal": {"provider": "sso", "id": sub, "login": name}}),
            );
            user.metadata
                .labels
                .insert(PRINCIPAL_LABEL.to_owned(), principal_key("sso", sub, true));
            store.create(user).await.unwrap();
        }
        for (name, sub) in [("sso-mixed", "00u7Kx9QbA"), ("sso-other", "00U7kX9qBa")] {
            let linked_to = link(store, "sso", ProviderType::Oidc, &oidc_identity(sub, None))
                .await
                .unwrap();
            assert_eq!(linked_to, name, "{sub}");
            let user = store.get(Kind::User.name(), name).await.unwrap();
            assert_eq!(
                user.spec["principal"]["id"],
                format!("https://idp.example.com#{sub}")
            );
        }
    }

    #[test]
    fn allowed_users_are_named_by_what_cannot_change_hands() {
        let spec = |provider_type: &str, users: &[&str]| -> AuthProviderSpec {
            serde_json::from_value(serde_json::json!({"type": provider_type,
                "allowed": {"users": users}}))
            .unwrap()
        };
        let oidc = spec("oidc", &["00u7Kx9QbA", "mallory@example.com"]);
        assert!(allowed(&oidc, &oidc_identity("00u7Kx9QbA", None)));
        assert!(!allowed(&oidc, &oidc_identity("00U7kX9qBa", None)));
        // An email names someone only when the provider verified it.
        assert!(allowed(
            &oidc,
            &oidc_identity("m-1", Some("Mallory@example.com"))
        ));
        let unverified = Identity {
            login: "mallory@example.com".into(),
            ..oidc_identity("m-2", None)
        };
        assert!(!allowed(&oidc, &unverified));
        // GitHub: the numeric id, never the login (renamed, then taken by someone else).
        let github = spec("github", &["583231"]);
        let octocat = |id: &str| Identity {
            id: id.into(),
            login: "octocat".into(),
            display_name: String::new(),
            groups: Vec::new(),
            verified_email: None,
        };
        assert!(allowed(&github, &octocat("583231")));
        assert!(!allowed(&github, &octocat("999")));
        assert!(!allowed(&spec("github", &["octocat"]), &octocat("999")));
        assert!(
            crate::model::validate_provider(&spec("github", &["octocat"]))
                .unwrap_err()
                .contains("numeric id")
        );
        // A directory: its DN or login name, ignoring case as the directory does.
        let ldap = spec("ldap", &["ALICE", "uid=bob,dc=example"]);
        let entry = |dn: &str, login: &str| Identity {
            id: dn.into(),
            login: login.into(),
            display_name: String::new(),
            groups: Vec::new(),
            verified_email: None,
        };
        assert!(allowed(&ldap, &entry("uid=alice,dc=example", "alice")));
        assert!(allowed(&ldap, &entry("UID=Bob,dc=example", "bob")));
        assert!(!allowed(&ldap, &entry("uid=carol,dc=example", "carol")));
    }

    #[test]
    fn new_users_get_valid_names_from_their_login() {
        assert_eq!(candidate_names("corp", "alice")[0], "corp-alice");
        assert_eq!(
            candidate_names("corp", "Bob.Builder@Corp")[0],
            "corp-bob-builder-corp"
        );
        assert_eq!(candidate_names("corp", "alice")[1], "corp-alice-2");
        assert!(candidate_names("corp", &"x".repeat(100))[0].len() <= 63);
    }

    #[test]
    fn intervals_are_seconds_minutes_or_hours_within_bounds() {
        assert_eq!(parse_interval("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_interval("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "5s", "1d", "1.5h", "soon", "169h"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reserved_names_and_insecure_urls_are_refused_with_what_to_fix() {
        assert!(validate_name("local").is_err());
        assert!(validate_name("system").is_err());
        assert!(validate_name("drover").is_err());
        assert!(validate_name("corp").is_ok());
        let spec = |ldap: Value| -> AuthProviderSpec {
            serde_json::from_value(serde_json::json!({"type": "ldap", "ldap": ldap})).unwrap()
        };
        let base = serde_json::json!({"url": "ldap://ldap.example.org", "bindDn": "cn=r",
            "userSearchBase": "dc=example"});
        let refused = validate(&spec(base.clone())).unwrap_err();
        assert!(refused.contains("allowInsecure"), "{refused}");
        let mut tls = base.clone();
        tls["startTls"] = true.into();
        assert_eq!(validate(&spec(tls)), Ok(()));
        let mut both = base.clone();
        both["url"] = "ldaps://ldap.example.org".into();
        both["startTls"] = true.into();
        assert!(
            validate(&spec(both))
                .unwrap_err()
                .contains("spec.ldap.startTls")
        );
        let mut filter = base;
        filter["allowInsecure"] = true.into();
        filter["userFilter"] = "objectClass=person".into();
        assert!(
            validate(&spec(filter))
                .unwrap_err()
                .contains("spec.ldap.userFilter")
        );
        let none: AuthProviderSpec =
            serde_json::from_value(serde_json::json!({"type": "ldap"})).unwrap();
        assert!(validate(&none).unwrap_err().contains("spec.ldap"));
    }
}
