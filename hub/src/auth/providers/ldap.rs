//! Signing in against an LDAP directory (OpenLDAP and the like) or Active Directory: the
//! service account binds and finds the user, the user's own bind checks the password, and the
//! service account then collects the user's groups, nested ones too, a page at a time.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use ldap3::{
    Ldap, LdapConnAsync, LdapConnSettings, Scope, SearchEntry,
    adapters::{Adapter, EntriesOnly, PagedResults},
    ldap_escape,
};

use super::{DirectoryError, Identity};
use crate::model::{LdapSpec, ProviderType};

/// AD's `LDAP_MATCHING_RULE_IN_CHAIN`: every group a DN is in, through any depth, in one
/// search (AD only; other directories answer it with nothing, and the groups are walked).
const IN_CHAIN: &str = "1.2.840.113556.1.4.1941";
/// AD's `userAccountControl` bit of a disabled account.
const ACCOUNTDISABLE: u64 = 0x2;
/// How deep nested groups are followed: deeper is a loop or a mistake.
const MAX_DEPTH: usize = 16;
/// DNs per `(|(member=…)…)` filter while walking nested groups.
const DNS_PER_FILTER: usize = 50;

/// The settings of one directory, with its type's defaults filled in.
#[derive(Debug, Clone)]
pub struct Directory {
    pub kind: ProviderType,
    pub spec: LdapSpec,
}

impl Directory {
    pub fn new(kind: ProviderType, spec: &LdapSpec) -> Self {
        let mut spec = spec.clone();
        let ad = kind == ProviderType::ActiveDirectory;
        let default = |field: &mut String, ldap: &str, active_directory: &str| {
            if field.is_empty() {
                *field = if ad { active_directory } else { ldap }.to_owned();
            }
        };
        default(
            &mut spec.user_filter,
            "(objectClass=inetOrgPerson)",
            "(&(objectClass=user)(objectCategory=person))",
        );
        default(&mut spec.login_attribute, "uid", "sAMAccountName");
        default(&mut spec.display_name_attribute, "cn", "displayName");
        default(
            &mut spec.group_filter,
            "(objectClass=groupOfNames)",
            "(objectClass=group)",
        );
        default(&mut spec.group_name_attribute, "cn", "cn");
        default(&mut spec.member_attribute, "member", "member");
        if spec.group_search_base.is_empty() {
            spec.group_search_base = spec.user_search_base.clone();
        }
        Directory { kind, spec }
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.spec.timeout_seconds.clamp(1, 300))
    }

    /// Connects (TLS as configured) and binds the service account.
    async fn connect(&self) -> Result<Ldap, DirectoryError> {
        let url = &self.spec.url;
        let cannot = |e: String| DirectoryError::Connect(format!("cannot connect to {url}: {e}"));
        let roots = if self.spec.ca_certs.trim().is_empty() {
            tunnel::tls::system_roots()
        } else {
            tunnel::tls::roots_from_pem(self.spec.ca_certs.as_bytes())
        }
        .map_err(|e| cannot(format!("the CA certificates: {e}")))?;
        let mut tls = (*tunnel::tls::client_config(roots)).clone();
        // LDAP is not HTTP: offer no application protocol.
        tls.alpn_protocols.clear();
        let settings = LdapConnSettings::new()
            .set_conn_timeout(self.timeout())
            .set_starttls(self.spec.start_tls)
            .set_config(Arc::new(tls));
        let (conn, mut ldap) =
            tokio::time::timeout(self.timeout(), LdapConnAsync::with_settings(settings, url))
                .await
                .map_err(|_| cannot(format!("no answer in {} s", self.timeout().as_secs())))?
                .map_err(|e| cannot(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.drive().await {
                tracing::debug!(error = %e, "LDAP connection ended");
            }
        });
        let password = self.spec.bind_password.as_deref().unwrap_or_default();
        if password.is_empty() {
            // An empty password is an anonymous bind that LDAP servers accept as success.
            return Err(DirectoryError::ServiceBind(
                "spec.ldap.bindPassword is not set".into(),
            ));
        }
        self.bind(&mut ldap, &self.spec.bind_dn, password)
            .await
            .map_err(|e| {
                DirectoryError::ServiceBind(format!(
                    "the service account {:?} could not bind: {e}",
                    self.spec.bind_dn
                ))
            })?;
        Ok(ldap)
    }

    async fn bind(&self, ldap: &mut Ldap, dn: &str, password: &str) -> Result<(), String> {
        let result = tokio::time::timeout(self.timeout(), ldap.simple_bind(dn, password))
            .await
            .map_err(|_| "the directory did not answer the bind".to_owned())?
            .map_err(|e| e.to_string())?;
        match result.rc {
            0 => Ok(()),
            49 => Err("invalid credentials".into()),
            rc => Err(format!("result code {rc} {}", result.text)),
        }
    }

    /// Every entry `filter` finds under `base`, a page at a time.
    async fn search(
        &self,
        ldap: &mut Ldap,
        base: &str,
        scope: Scope,
        filter: &str,
        attrs: Vec<String>,
    ) -> Result<Vec<SearchEntry>, DirectoryError> {
        let failed = |e: String| DirectoryError::Search(format!("searching {base:?}: {e}"));
        let page = i32::try_from(self.spec.page_size.clamp(1, 10_000)).unwrap_or(500);
        let work = async {
            let adapters: Vec<Box<dyn Adapter<'_, String, Vec<String>>>> = vec![
                Box::new(EntriesOnly::new()),
                Box::new(PagedResults::new(page)),
            ];
            let mut stream = ldap
                .streaming_search_with(adapters, base, scope, filter, attrs)
                .await
                .map_err(|e| failed(e.to_string()))?;
            let mut entries = Vec::new();
            while let Some(entry) = stream.next().await.map_err(|e| failed(e.to_string()))? {
                entries.push(SearchEntry::construct(entry));
            }
            let result = stream.finish().await;
            match result.rc {
                // 32: the base does not exist, which for a search is "nothing here".
                0 | 32 => Ok(entries),
                rc => Err(failed(format!("result code {rc} {}", result.text))),
            }
        };
        // A page per round trip: the whole search gets a few timeouts' worth.
        tokio::time::timeout(self.timeout() * 4, work)
            .await
            .map_err(|_| failed("the directory did not answer in time".into()))?
    }

    /// The filter matching `login` among users: the login attribute, or for AD a UPN
    /// (`bob@corp.example`) or a down-level name (`CORP\bob`).
    fn user_filter(&self, login: &str) -> String {
        let (attribute, value) = match self.kind {
            ProviderType::ActiveDirectory if login.contains('@') => ("userPrincipalName", login),
            ProviderType::ActiveDirectory => (
                self.spec.login_attribute.as_str(),
                login.rsplit_once('\\').map_or(login, |(_, name)| name),
            ),
            ProviderType::Ldap | ProviderType::Oidc | ProviderType::Github => {
                (self.spec.login_attribute.as_str(), login)
            }
        };
        format!(
            "(&{}({attribute}={}))",
            self.spec.user_filter,
            ldap_escape(value)
        )
    }

    fn user_attrs(&self) -> Vec<String> {
        let mut attrs = vec![
            self.spec.login_attribute.clone(),
            self.spec.display_name_attribute.clone(),
        ];
        if self.kind == ProviderType::ActiveDirectory {
            attrs.extend(["userAccountControl".into(), "memberOf".into()]);
        }
        attrs
    }

    /// The one user `login` names; none, or several, is an error that says so.
    async fn find_user(&self, ldap: &mut Ldap, login: &str) -> Result<SearchEntry, DirectoryError> {
        let filter = self.user_filter(login);
        let mut found = self
            .search(
                ldap,
                &self.spec.user_search_base,
                Scope::Subtree,
                &filter,
                self.user_attrs(),
            )
            .await?;
        match found.len() {
            0 => Err(DirectoryError::UserNotFound(format!(
                "no user {login:?} under {:?} (filter {filter})",
                self.spec.user_search_base
            ))),
            1 => Ok(found.remove(0)),
            n => Err(DirectoryError::UserNotFound(format!(
                "{n} entries match {login:?} (filter {filter}); a login must name one user"
            ))),
        }
    }

    fn disabled(&self, user: &SearchEntry) -> bool {
        self.kind == ProviderType::ActiveDirectory
            && first(user, "userAccountControl")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|flags| flags & ACCOUNTDISABLE != 0)
    }

    fn identity(&self, user: &SearchEntry, groups: Vec<String>) -> Identity {
        let login = first(user, &self.spec.login_attribute)
            .unwrap_or_default()
            .to_owned();
        Identity {
            id: user.dn.clone(),
            display_name: first(user, &self.spec.display_name_attribute)
                .unwrap_or(&login)
                .to_owned(),
            login,
            groups,
            verified_email: None,
        }
    }

    /// Checks `login`'s password and returns who it is, with their groups. `may_try` is asked
    /// with the entry's DN once the user is found and before their password is tried: the
    /// failures that count are the account's, however its name was spelled (`ALICE`,
    /// `DOMAIN\alice`, a UPN). The attempt's DN is returned with the outcome, when one was
    /// found.
    pub async fn authenticate(
        &self,
        login: &str,
        password: &str,
        may_try: &(dyn Fn(&str) -> bool + Sync),
    ) -> (Option<String>, Result<Identity, DirectoryError>) {
        // An empty password would be an unauthenticated bind, which succeeds.
        if login.is_empty() || password.is_empty() {
            return (None, Err(DirectoryError::WrongPassword));
        }
        let mut dn = None;
        let outcome = self
            .steps(login, Some(password), may_try, &mut dn)
            .await
            .and_then(|found| found.ok_or(DirectoryError::WrongPassword));
        (dn, outcome)
    }

    /// The user with DN `id` as the directory has them now (for refreshing their groups);
    /// `None` if they are gone or disabled.
    pub async fn lookup(&self, id: &str) -> Result<Option<Identity>, DirectoryError> {
        let mut ldap = self.connect().await?;
        let found = self
            .search(
                &mut ldap,
                id,
                Scope::Base,
                &self.spec.user_filter,
                self.user_attrs(),
            )
            .await?;
        let Some(user) = found.into_iter().next() else {
            let _ = ldap.unbind().await;
            return Ok(None);
        };
        if self.disabled(&user) {
            let _ = ldap.unbind().await;
            return Ok(None);
        }
        let groups = self.groups(&mut ldap, &user).await?;
        let _ = ldap.unbind().await;
        Ok(Some(self.identity(&user, groups)))
    }

    /// Checks each step a login takes (connect, service bind, and with a login: find the
    /// user, check the password if given, and their groups), stopping at the first that
    /// fails. Without a login, `None` once the service account is bound.
    pub async fn test(
        &self,
        login: Option<&str>,
        password: Option<&str>,
    ) -> Result<Option<Identity>, DirectoryError> {
        let Some(login) = login.filter(|l| !l.is_empty()) else {
            let mut ldap = self.connect().await?;
            let _ = ldap.unbind().await;
            return Ok(None);
        };
        self.steps(login, password, &|_| true, &mut None).await
    }

    /// The steps of a login: connect, bind the service account, find `login` (its DN noted in
    /// `dn`), ask `may_try`, check the password if given, read the groups.
    async fn steps(
        &self,
        login: &str,
        password: Option<&str>,
        may_try: &(dyn Fn(&str) -> bool + Sync),
        dn: &mut Option<String>,
    ) -> Result<Option<Identity>, DirectoryError> {
        let mut ldap = self.connect().await?;
        let user = self.find_user(&mut ldap, login).await?;
        *dn = Some(user.dn.clone());
        if self.disabled(&user) {
            return Err(DirectoryError::Disabled(user.dn));
        }
        if !may_try(&user.dn) {
            let _ = ldap.unbind().await;
            return Err(DirectoryError::Blocked);
        }
        if let Some(password) = password.filter(|p| !p.is_empty()) {
            if self.bind(&mut ldap, &user.dn, password).await.is_err() {
                let _ = ldap.unbind().await;
                return Err(DirectoryError::WrongPassword);
            }
            // Back to the service account for the group search (the user may not read
            // groups).
            let service_password = self.spec.bind_password.as_deref().unwrap_or_default();
            self.bind(&mut ldap, &self.spec.bind_dn, service_password)
                .await
                .map_err(DirectoryError::ServiceBind)?;
        }
        let groups = self.groups(&mut ldap, &user).await?;
        let _ = ldap.unbind().await;
        Ok(Some(self.identity(&user, groups)))
    }

    /// The names of the groups `user` is in (directly, and through groups when
    /// `nestedGroups`).
    async fn groups(
        &self,
        ldap: &mut Ldap,
        user: &SearchEntry,
    ) -> Result<Vec<String>, DirectoryError> {
        let name_attr = self.spec.group_name_attribute.clone();
        let mut found: BTreeMap<String, String> = BTreeMap::new();
        if self.kind == ProviderType::ActiveDirectory && self.spec.nested_groups {
            // AD answers the whole chain in one search.
            let filter = format!(
                "(&{}({}:{IN_CHAIN}:={}))",
                self.spec.group_filter,
                self.spec.member_attribute,
                ldap_escape(user.dn.as_str())
            );
            let chain = self
                .search(
                    ldap,
                    &self.spec.group_search_base,
                    Scope::Subtree,
                    &filter,
                    vec![name_attr.clone()],
                )
                .await?;
            let direct: BTreeSet<String> = all(user, "memberOf")
                .iter()
                .map(|dn| dn.to_lowercase())
                .collect();
            let names: BTreeMap<String, String> = chain
                .iter()
                .filter_map(|g| Some((g.dn.to_lowercase(), first(g, &name_attr)?.to_owned())))
                .collect();
            // A directory without the rule answers nothing: walk the groups instead.
            if !names.is_empty() && direct.iter().all(|dn| names.contains_key(dn)) {
                return Ok(names
                    .into_values()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect());
            }
        }
        let mut frontier = vec![user.dn.clone()];
        for _ in 0..MAX_DEPTH {
            let mut next = Vec::new();
            for chunk in frontier.chunks(DNS_PER_FILTER) {
                let members: String = chunk
                    .iter()
                    .map(|dn| {
                        format!(
                            "({}={})",
                            self.spec.member_attribute,
                            ldap_escape(dn.as_str())
                        )
                    })
                    .collect();
                let filter = format!("(&{}(|{members}))", self.spec.group_filter);
                let groups = self
                    .search(
                        ldap,
                        &self.spec.group_search_base,
                        Scope::Subtree,
                        &filter,
                        vec![name_attr.clone()],
                    )
                    .await?;
                for group in groups {
                    let Some(name) = first(&group, &name_attr).map(str::to_owned) else {
                        continue;
                    };
                    if found.insert(group.dn.to_lowercase(), name).is_none() {
                        next.push(group.dn);
                    }
                }
            }
            if !self.spec.nested_groups || next.is_empty() {
                break;
            }
            frontier = next;
        }
        Ok(found
            .into_values()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }
}

/// An attribute's values; attribute names are case-insensitive in LDAP.
fn all<'a>(entry: &'a SearchEntry, attribute: &str) -> &'a [String] {
    entry
        .attrs
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(attribute))
        .map_or(&[], |(_, values)| values.as_slice())
}

fn first<'a>(entry: &'a SearchEntry, attribute: &str) -> Option<&'a str> {
    all(entry, attribute).first().map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> LdapSpec {
        serde_json::from_value(serde_json::json!({
            "url": "ldaps://ldap.example.org",
            "bindDn": "cn=reader,dc=example,dc=org",
            "userSearchBase": "ou=people,dc=example,dc=org",
        }))
        .unwrap()
    }

    #[test]
    fn a_login_cannot_change_the_filter_it_is_put_in() {
        let ldap = Directory::new(ProviderType::Ldap, &spec());
        assert_eq!(
            ldap.user_filter("alice"),
            "(&(objectClass=inetOrgPerson)(uid=alice))"
        );
        assert_eq!(
            ldap.user_filter("*)(uid=*"),
            "(&(objectClass=inetOrgPerson)(uid=\\2a\\29\\28uid=\\2a))"
        );
        let ad = Directory::new(ProviderType::ActiveDirectory, &spec());
        assert_eq!(
            ad.user_filter("bob@corp.example"),
            "(&(&(objectClass=user)(objectCategory=person))(userPrincipalName=bob@corp.example))"
        );
        assert_eq!(
            ad.user_filter("CORP\\bob"),
            "(&(&(objectClass=user)(objectCategory=person))(sAMAccountName=bob))"
        );
        // Groups default to the user search base.
        assert_eq!(ad.spec.group_search_base, "ou=people,dc=example,dc=org");
    }
}
