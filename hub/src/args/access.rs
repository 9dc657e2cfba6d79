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
    /// Give a user or a group a role: admin (global), cluster-owner, cluster-member or
    /// read-only (with --cluster), project-owner, project-member or read-only (with --cluster
    /// and --project)
    Grant(Grant),
    /// Take a role away (the same flags as it was granted with)
    Revoke(Grant),
    /// List who holds which role
    List,
}

#[derive(clap::Args, Debug)]
pub(super) struct Grant {
    #[arg(long, conflicts_with = "group", required_unless_present = "group")]
    user: Option<String>,
    #[arg(long)]
    group: Option<String>,
    #[arg(long)]
    role: String,
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long, requires = "cluster")]
    project: Option<String>,
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
        RoleCommand::Grant(grant) => Request::RoleGrant {
            name: binding_name(&grant),
            user: grant.user,
            group: grant.group,
            role: grant.role,
            cluster: grant.cluster,
            project: grant.project,
        },
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
    crate::cli::object_name(&format!("{subject}-{}-{scope}", grant.role))
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
            role: role.into(),
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
