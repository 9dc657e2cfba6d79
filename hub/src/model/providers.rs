//! Auth providers: where users who are not the hub's own sign in (a company directory), and
//! how a provider's user is linked to the hub's User.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A directory users sign in with. Admins only; its secret (the bind password) is write-only:
/// never returned by the API, kept when an update leaves it out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthProviderSpec {
    #[serde(rename = "type")]
    pub provider_type: ProviderType,
    /// Offered at login. A disabled provider signs no one in; its users' existing tokens stay
    /// until they expire or are revoked.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// The name the login page shows (the object's name if empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    /// For `ldap` and `activedirectory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ldap: Option<LdapSpec>,
    /// For `oidc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<OidcSpec>,
    /// For `github`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github: Option<GithubSpec>,
    /// Who may sign in at all: nobody listed means everyone the provider authenticates;
    /// otherwise only these login names and members of these groups (the directory's names,
    /// without the provider's prefix).
    #[serde(default, skip_serializing_if = "Allowed::is_empty")]
    pub allowed: Allowed,
}

fn enabled() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderType {
    /// OpenLDAP and other RFC 4511 directories: groups by `member`, nested ones by walking it.
    Ldap,
    /// Active Directory: `sAMAccountName` or a UPN to log in, `memberOf` and its chain for
    /// groups, disabled accounts (`userAccountControl`) refused.
    ActiveDirectory,
    /// An OpenID Connect provider (Keycloak, Dex, Okta, Entra ID, Google): the authorization
    /// code flow with PKCE in the user's browser.
    Oidc,
    /// GitHub or GitHub Enterprise Server: an OAuth app; the user's organisations and teams
    /// are their groups.
    Github,
}

impl ProviderType {
    pub fn label(self) -> &'static str {
        match self {
            ProviderType::Ldap => "ldap",
            ProviderType::ActiveDirectory => "activedirectory",
            ProviderType::Oidc => "oidc",
            ProviderType::Github => "github",
        }
    }

    /// Whether users sign in at the provider's own page (in a browser) rather than by giving
    /// the hub their password.
    pub fn redirects(self) -> bool {
        matches!(self, ProviderType::Oidc | ProviderType::Github)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allowed {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

impl Allowed {
    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && self.groups.is_empty()
    }
}

/// How to reach and search an LDAP directory. Defaults follow the provider's type (OpenLDAP's
/// `uid`/`groupOfNames`, or AD's `sAMAccountName`/`group`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LdapSpec {
    /// `ldaps://host[:636]`, or `ldap://host[:389]` with `startTls` (or `allowInsecure`).
    pub url: String,
    /// Upgrade an `ldap://` connection with StartTLS before anything is sent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_tls: bool,
    /// Allow `ldap://` without StartTLS: passwords cross the network in the clear.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_insecure: bool,
    /// PEM CA certificates to trust for the directory's TLS (the system's CAs otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_certs: String,
    /// Connect and per-operation timeout, seconds.
    #[serde(default = "timeout_seconds")]
    pub timeout_seconds: u64,
    /// The service account that searches the directory.
    pub bind_dn: String,
    /// Write-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_password: Option<String>,
    pub user_search_base: String,
    /// Which entries are users (combined with the login attribute's match).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user_filter: String,
    /// The attribute a login name is matched against (`uid`; AD: `sAMAccountName`, and a
    /// name with `@` against `userPrincipalName`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub login_attribute: String,
    /// The attribute shown as the user's name (`cn`; AD: `displayName`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name_attribute: String,
    /// Where groups are searched (the user search base if empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group_search_base: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group_filter: String,
    /// A group's name as role bindings use it, after the provider's prefix (`cn`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group_name_attribute: String,
    /// The attribute of a group listing its members' DNs (`member`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub member_attribute: String,
    /// Groups in groups count (a member of `dev`, itself in `eng`, is in both).
    #[serde(default = "enabled")]
    pub nested_groups: bool,
    /// Entries per page of a search (RFC 2696): directories cap a search's answer (slapd and AD
    /// at 500 and 1,000), a page does not.
    #[serde(default = "page_size")]
    pub page_size: u32,
}

fn timeout_seconds() -> u64 {
    10
}

fn page_size() -> u32 {
    500
}

/// An OpenID Connect provider and this hub's client there. The hub's redirect URI is
/// `<hub URL>/v1/login/<provider name>/callback`: register it with the provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OidcSpec {
    /// The issuer URL (`https://`); its `/.well-known/openid-configuration` says the rest.
    pub issuer: String,
    pub client_id: String,
    /// Write-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// Scopes asked for (`openid` is required; add `groups` or `offline_access` where the
    /// provider needs them for groups or for refreshing them).
    #[serde(default = "scopes")]
    pub scopes: Vec<String>,
    /// The claim holding the user's groups (from the ID token, else from the userinfo
    /// endpoint).
    #[serde(default = "groups_claim")]
    pub groups_claim: String,
    /// The claim used as the login name (`preferred_username`; then `email`, then `sub`).
    #[serde(default = "username_claim")]
    pub username_claim: String,
    /// PEM CA certificates to trust for the provider's TLS (the system's CAs otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_certs: String,
    /// How far the provider's clock may be from the hub's, seconds.
    #[serde(default = "clock_skew")]
    pub clock_skew_seconds: u64,
    #[serde(default = "timeout_seconds")]
    pub timeout_seconds: u64,
}

/// A GitHub OAuth app. Its callback URL is `<hub URL>/v1/login/<provider name>/callback`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GithubSpec {
    pub client_id: String,
    /// Write-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// GitHub Enterprise Server's address (`https://github.example.com`; its API is under
    /// `/api/v3`); github.com if empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub base_url: String,
    /// PEM CA certificates to trust for GitHub Enterprise Server's TLS.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_certs: String,
    #[serde(default = "timeout_seconds")]
    pub timeout_seconds: u64,
}

fn scopes() -> Vec<String> {
    vec!["openid".into(), "profile".into(), "email".into()]
}

fn groups_claim() -> String {
    "groups".into()
}

fn username_claim() -> String {
    "preferred_username".into()
}

fn clock_skew() -> u64 {
    60
}

/// Which provider identity a User is (set by the hub at the user's first login; the link is
/// the directory's identity, never the display name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrincipalRef {
    /// The AuthProvider.
    pub provider: String,
    /// The identity there (an LDAP DN; an OIDC subject).
    pub id: String,
    /// The name the user signs in with there.
    pub login: String,
}

/// The provider name of the hub's own users (a login without a provider).
pub const LOCAL: &str = "local";

/// Provider names that cannot be used: `local` is the hub's own users; a provider's groups
/// are `<name>:<group>` in every cluster, and `system:` groups are Kubernetes' own,
/// `drover:` ones the hub's (`drover:admin`).
pub const RESERVED: [&str; 3] = [LOCAL, "system", "drover"];

/// Checks an AuthProvider's name against [`RESERVED`].
pub fn validate_provider_name(name: &str) -> Result<(), String> {
    // `/v1/login/device/token` is the command line's sign-in, `/v1/login/providers` the list.
    if ["device", "providers"].contains(&name) {
        return Err(format!(
            "metadata.name: {name:?} is a path of the sign-in API (/v1/login/{name}); choose another"
        ));
    }
    if RESERVED.contains(&name) {
        return Err(format!(
            "metadata.name: {name:?} is reserved (local: the hub's own users; system: and drover: groups are Kubernetes' and the hub's); choose another"
        ));
    }
    Ok(())
}

/// Checks an AuthProvider's spec; the message names the field to fix.
pub fn validate_provider(spec: &AuthProviderSpec) -> Result<(), String> {
    let (wanted, given) = (
        match spec.provider_type {
            ProviderType::Ldap | ProviderType::ActiveDirectory => "ldap",
            ProviderType::Oidc => "oidc",
            ProviderType::Github => "github",
        },
        [
            ("ldap", spec.ldap.is_some()),
            ("oidc", spec.oidc.is_some()),
            ("github", spec.github.is_some()),
        ],
    );
    if let Some((other, _)) = given.iter().find(|(name, set)| *set && *name != wanted) {
        return Err(format!(
            "spec.{other} does not belong to a provider of type {}; its settings go in spec.{wanted}",
            spec.provider_type.label()
        ));
    }
    if spec.provider_type == ProviderType::Github
        && let Some(login) = spec
            .allowed
            .users
            .iter()
            .find(|u| u.parse::<u64>().is_err())
    {
        // A GitHub login can be renamed and then taken by someone else; the id cannot.
        return Err(format!(
            "spec.allowed.users: {login:?} is not a GitHub user id; name GitHub users by their numeric id (GET https://api.github.com/users/LOGIN shows it), as a login can change hands"
        ));
    }
    match spec.provider_type {
        ProviderType::Oidc => validate_oidc(spec.oidc.as_ref()),
        ProviderType::Github => validate_github(spec.github.as_ref()),
        ProviderType::Ldap | ProviderType::ActiveDirectory => validate_ldap(spec),
    }
}

fn validate_github(github: Option<&GithubSpec>) -> Result<(), String> {
    let Some(github) = github else {
        return Err(
            "spec.github: a github provider needs its OAuth app's clientId and clientSecret".into(),
        );
    };
    if github.client_id.trim().is_empty() {
        return Err("spec.github.clientId must not be empty".into());
    }
    if !github.base_url.is_empty() {
        let url: Option<http::Uri> = github.base_url.parse().ok();
        if !url.is_some_and(|u| u.scheme_str() == Some("https") && u.host().is_some()) {
            return Err(format!(
                "spec.github.baseUrl: {:?} is not an https:// URL; give GitHub Enterprise Server's address, or leave it out for github.com",
                github.base_url
            ));
        }
    }
    if !github.ca_certs.trim().is_empty() {
        tunnel::tls::roots_from_pem(github.ca_certs.as_bytes())
            .map_err(|e| format!("spec.github.caCerts: {e}"))?;
    }
    if !(1..=300).contains(&github.timeout_seconds) {
        return Err("spec.github.timeoutSeconds: from 1 to 300".into());
    }
    Ok(())
}

fn validate_oidc(oidc: Option<&OidcSpec>) -> Result<(), String> {
    let Some(oidc) = oidc else {
        return Err(
            "spec.oidc: an oidc provider needs its issuer, clientId and clientSecret".into(),
        );
    };
    let issuer: Option<http::Uri> = oidc.issuer.parse().ok();
    if !issuer.is_some_and(|u| u.scheme_str() == Some("https") && u.host().is_some()) {
        return Err(format!(
            "spec.oidc.issuer: {:?} is not an https:// URL; give the provider's issuer as its discovery document names it",
            oidc.issuer
        ));
    }
    if oidc.client_id.trim().is_empty() {
        return Err("spec.oidc.clientId must not be empty".into());
    }
    if !oidc.scopes.iter().any(|s| s == "openid") {
        return Err("spec.oidc.scopes must include openid".into());
    }
    if !oidc.ca_certs.trim().is_empty() {
        tunnel::tls::roots_from_pem(oidc.ca_certs.as_bytes())
            .map_err(|e| format!("spec.oidc.caCerts: {e}"))?;
    }
    for (field, value) in [
        ("groupsClaim", &oidc.groups_claim),
        ("usernameClaim", &oidc.username_claim),
    ] {
        if value.trim().is_empty() {
            return Err(format!("spec.oidc.{field} must not be empty"));
        }
    }
    if !(1..=300).contains(&oidc.timeout_seconds) {
        return Err("spec.oidc.timeoutSeconds: from 1 to 300".into());
    }
    if oidc.clock_skew_seconds > 600 {
        return Err("spec.oidc.clockSkewSeconds: at most 600".into());
    }
    Ok(())
}

fn validate_ldap(spec: &AuthProviderSpec) -> Result<(), String> {
    let Some(ldap) = &spec.ldap else {
        return Err(format!(
            "spec.ldap: a provider of type {} needs its directory's settings (url, bindDn, bindPassword, userSearchBase)",
            spec.provider_type.label()
        ));
    };
    let (scheme, rest) = ldap.url.split_once("://").unwrap_or(("", ""));
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    if host.is_empty() || !matches!(scheme, "ldap" | "ldaps") {
        return Err(format!(
            "spec.ldap.url: {:?} is not an LDAP URL; write ldaps://host[:636] or ldap://host[:389]",
            ldap.url
        ));
    }
    match (scheme, ldap.start_tls, ldap.allow_insecure) {
        ("ldaps", true, _) => {
            return Err(
                "spec.ldap.startTls: an ldaps:// URL is TLS already; StartTLS is for ldap:// URLs"
                    .into(),
            );
        }
        ("ldap", false, false) => {
            return Err(
                "spec.ldap.url: ldap:// without StartTLS sends passwords in the clear; use ldaps://, set startTls, or set allowInsecure if you mean it"
                    .into(),
            );
        }
        _ => {}
    }
    if !ldap.ca_certs.trim().is_empty() {
        tunnel::tls::roots_from_pem(ldap.ca_certs.as_bytes())
            .map_err(|e| format!("spec.ldap.caCerts: {e}"))?;
    }
    for (field, value) in [
        ("bindDn", &ldap.bind_dn),
        ("userSearchBase", &ldap.user_search_base),
    ] {
        if value.trim().is_empty() {
            return Err(format!("spec.ldap.{field} must not be empty"));
        }
    }
    for (field, value) in [
        ("userFilter", &ldap.user_filter),
        ("groupFilter", &ldap.group_filter),
    ] {
        let filter = value.starts_with('(') && value.ends_with(')');
        if !value.is_empty() && !filter {
            return Err(format!(
                "spec.ldap.{field}: {value:?} is not an LDAP filter; write it in parentheses, as (objectClass=inetOrgPerson)"
            ));
        }
    }
    if !(1..=300).contains(&ldap.timeout_seconds) {
        return Err("spec.ldap.timeoutSeconds: from 1 to 300".into());
    }
    if !(1..=10_000).contains(&ldap.page_size) {
        return Err("spec.ldap.pageSize: from 1 to 10000".into());
    }
    Ok(())
}
