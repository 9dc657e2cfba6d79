//! `drover-hub user …` and `drover-hub role …`: the hub's users and who holds which role, from
//! the command line.

use clap::Subcommand;

use super::PasswordFrom;
use crate::cli::Request;

#[derive(Subcommand, Debug)]
pub(super) enum UserCommand {
    /// Create a local user (the password is asked for, or read with --password-stdin)
    Create {
        name: String,
        #[arg(long, default_value = "")]
        display_name: String,
        /// A group the user is in (repeat for several); role bindings of a group apply to it
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Read the password from stdin's first line
        #[arg(long)]
        password_stdin: bool,
    },
    /// List the users
    List,
    /// Delete a user (their tokens and role bindings go with them)
    Delete { name: String },
    /// Give a user a new password (asked for, or read with --password-stdin)
    SetPassword {
        name: String,
        #[arg(long)]
        password_stdin: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(super) enum RoleCommand {
    /// Give a user or a group a role: a builtin one by name (--role admin; cluster-owner,
    /// cluster-member or read-only with --cluster; project-owner, project-member or read-only
    /// with --cluster and --project), a role template (--template, with --cluster and, for a
    /// project template, --project) or a global role (--global)
    Grant(Grant),
    /// Take a role away (the same flags as it was granted with)
    Revoke(Grant),
    /// List who holds which role
    List,
    /// Role templates: the roles a binding grants on a cluster or a project
    Template {
        #[command(subcommand)]
        command: TemplateCommand,
    },
}

#[derive(clap::Args, Debug)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("granted").required(true).multiple(false)))]
pub(super) struct Grant {
    #[arg(long, conflicts_with = "group", required_unless_present = "group")]
    user: Option<String>,
    #[arg(long)]
    group: Option<String>,
    #[arg(long, group = "granted")]
    role: Option<String>,
    /// A RoleTemplate's name
    #[arg(long, group = "granted")]
    template: Option<String>,
    /// A GlobalRole's name
    #[arg(long, group = "granted")]
    global: Option<String>,
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long, requires = "cluster")]
    project: Option<String>,
}

impl Grant {
    /// The binding's field and the role it names.
    fn granted(&self) -> (&'static str, String) {
        match (&self.role, &self.template, &self.global) {
            (_, Some(template), _) => ("roleTemplate", template.clone()),
            (_, _, Some(global)) => ("globalRole", global.clone()),
            (role, _, _) => ("role", role.clone().unwrap_or_default()),
        }
    }
}

#[derive(Subcommand, Debug)]
pub(super) enum TemplateCommand {
    /// Create a role template from flags (or write one as YAML and `drover-hub apply -f` it)
    Create(TemplateCreate),
    /// List the role templates, builtin ones too
    List,
    /// Show a role template as YAML
    Get { name: String },
    /// Delete a role template (refused while a binding or another template names it)
    Delete { name: String },
}

#[derive(clap::Args, Debug)]
pub(super) struct TemplateCreate {
    name: String,
    /// Where it applies: cluster or project
    #[arg(long)]
    context: String,
    #[arg(long)]
    display_name: Option<String>,
    #[arg(long)]
    description: Option<String>,
    /// A template whose rules this one holds too (repeat for several)
    #[arg(long = "inherit")]
    inherits: Vec<String>,
    /// VERBS:RESOURCES, as kubectl names them: `get,list,patch:deployments.apps,pods/log`
    /// (a resource's API group after its first dot; none for the core group; `*` for all).
    /// Repeat for several.
    #[arg(long = "rule", value_parser = parse_rule)]
    rules: Vec<RuleArg>,
    /// Take no new bindings
    #[arg(long)]
    locked: bool,
}

/// The rules one `--rule` makes: one per API group it names.
#[derive(Debug, Clone)]
pub(super) struct RuleArg(Vec<serde_json::Value>);

/// Parses `VERBS:RESOURCES` (see [`TemplateCreate`]).
fn parse_rule(text: &str) -> Result<RuleArg, String> {
    let (verbs, resources) = text.split_once(':').ok_or_else(|| {
        format!("{text:?}: write VERBS:RESOURCES, e.g. get,list,patch:deployments.apps")
    })?;
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (verbs, resources) = (list(verbs), list(resources));
    if verbs.is_empty() || resources.is_empty() {
        return Err(format!(
            "{text:?}: name at least one verb and one resource, e.g. get,list:pods"
        ));
    }
    // `deployments.apps/scale`: resource `deployments/scale` of group `apps`.
    let mut by_group: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for resource in resources {
        let (name, sub) = match resource.split_once('/') {
            Some((name, sub)) => (name, Some(sub)),
            None => (resource.as_str(), None),
        };
        let (name, group) = match name.split_once('.') {
            Some((name, group)) => (name, group),
            None if name == "*" => ("*", "*"),
            None => (name, ""),
        };
        let name = match sub {
            Some(sub) => format!("{name}/{sub}"),
            None => name.to_owned(),
        };
        by_group.entry(group.to_owned()).or_default().push(name);
    }
    Ok(RuleArg(
        by_group
            .into_iter()
            .map(|(group, resources)| {
                serde_json::json!({"apiGroups": [group], "resources": resources, "verbs": verbs})
            })
            .collect(),
    ))
}

/// The request for a `role template` command.
fn template_request(command: TemplateCommand) -> Request {
    match command {
        TemplateCommand::Create(create) => {
            let mut spec = serde_json::json!({
                "context": create.context,
                "rules": create.rules.into_iter().flat_map(|r| r.0).collect::<Vec<_>>(),
            });
            for (field, value) in [
                ("displayName", create.display_name),
                ("description", create.description),
            ] {
                if let Some(value) = value {
                    spec[field] = value.into();
                }
            }
            if !create.inherits.is_empty() {
                spec["inherits"] = create.inherits.into();
            }
            if create.locked {
                spec["locked"] = true.into();
            }
            Request::TemplateCreate {
                name: create.name,
                spec,
            }
        }
        TemplateCommand::List => Request::TemplateList,
        TemplateCommand::Get { name } => Request::Get {
            kind: "roletemplates".into(),
            name: Some(name),
            selector: None,
        },
        TemplateCommand::Delete { name } => Request::TemplateDelete { name },
    }
}

/// The request for a `user` command, and where its password comes from.
pub(super) fn user_request(command: UserCommand) -> (Request, PasswordFrom) {
    let from = |stdin: bool| {
        if stdin {
            PasswordFrom::Stdin
        } else {
            PasswordFrom::Prompt
        }
    };
    match command {
        UserCommand::Create {
            name,
            display_name,
            groups,
            password_stdin,
        } => (
            Request::UserCreate {
                name,
                display_name,
                groups,
                password: tunnel::Secret::new(""),
            },
            from(password_stdin),
        ),
        UserCommand::List => (Request::UserList, PasswordFrom::Given),
        UserCommand::Delete { name } => (Request::UserDelete { name }, PasswordFrom::Given),
        UserCommand::SetPassword {
            name,
            password_stdin,
        } => (
            Request::UserSetPassword {
                name,
                password: tunnel::Secret::new(""),
            },
            from(password_stdin),
        ),
    }
}

/// The request for a `role` command.
pub(super) fn role_request(command: RoleCommand) -> Request {
    match command {
        RoleCommand::Grant(grant) => {
            let (field, role) = grant.granted();
            Request::RoleGrant {
                name: binding_name(&grant),
                user: grant.user,
                group: grant.group,
                field,
                role,
                cluster: grant.cluster,
                project: grant.project,
            }
        }
        RoleCommand::Template { command } => template_request(command),
        RoleCommand::Revoke(grant) => Request::RoleRevoke {
            name: binding_name(&grant),
        },
        RoleCommand::List => Request::RoleList,
    }
}

/// The RoleBinding a grant is kept as: named after its subject, role and scope, so the same
/// flags find it again to revoke it; a project role as `project add-member` names it (one per
/// subject and project). Characters a name may not hold become `-`.
fn binding_name(grant: &Grant) -> String {
    if let Some(project) = &grant.project {
        return crate::cli::member_binding(project, grant.user.as_deref(), grant.group.as_deref());
    }
    let subject = match (&grant.user, &grant.group) {
        (Some(user), _) => user.clone(),
        (None, Some(group)) => format!("group-{group}"),
        (None, None) => String::new(),
    };
    let scope = grant.cluster.as_deref().unwrap_or("global");
    crate::cli::object_name(&format!("{subject}-{}-{scope}", grant.granted().1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(
        user: Option<&str>,
        group: Option<&str>,
        role: &str,
        cluster: Option<&str>,
        project: Option<&str>,
    ) -> Grant {
        Grant {
            user: user.map(str::to_owned),
            group: group.map(str::to_owned),
            role: Some(role.into()),
            template: None,
            global: None,
            cluster: cluster.map(str::to_owned),
            project: project.map(str::to_owned),
        }
    }

    #[test]
    fn a_grant_is_kept_under_a_name_its_flags_find_again() {
        for (grant, name) in [
            (
                grant(Some("ann"), None, "admin", None, None),
                "ann-admin-global",
            ),
            (
                grant(Some("ann"), None, "read-only", Some("prod"), None),
                "ann-read-only-prod",
            ),
            (
                grant(None, Some("ops"), "cluster-member", Some("prod"), None),
                "group-ops-cluster-member-prod",
            ),
            (
                grant(
                    Some("bob@example.com"),
                    None,
                    "read-only",
                    Some("prod"),
                    None,
                ),
                "bob-example-com-read-only-prod",
            ),
            (
                grant(Some("9lives"), None, "admin", None, None),
                "u-9lives-admin-global",
            ),
        ] {
            assert_eq!(binding_name(&grant), name);
            crate::model::validate_name(crate::model::Kind::RoleBinding, name).unwrap();
        }
        // A project role is the binding `project add-member` makes, so either command finds it.
        let project = grant(
            Some("bob"),
            None,
            "project-owner",
            Some("prod"),
            Some("shop"),
        );
        assert_eq!(binding_name(&project), "shop-bob");
        let group = grant(None, Some("ops"), "read-only", Some("prod"), Some("shop"));
        assert_eq!(binding_name(&group), "shop-group-ops");
        let email = grant(
            Some("bob@example.com"),
            None,
            "project-member",
            Some("prod"),
            Some("shop"),
        );
        assert_eq!(binding_name(&email), "shop-bob-example-com");
    }
}
