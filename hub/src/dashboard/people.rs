//! Users and role bindings (admins only), and the caller's API tokens (a new one is shown once).

use std::fmt::Write as _;

use axum::{
    extract::State,
    http::HeaderMap,
    response::{IntoResponse, Response},
};

use super::{Dash, caller, escape, page, text};
use crate::{
    api::{ApiError, present},
    model::Kind,
    store::LabelSelector,
};

pub(super) async fn users(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let principal = match caller(&dash.api, &headers, "/users").await {
        Ok(p) => p,
        Err(response) => return response,
    };
    if !principal.may_globally("list", Kind::User, None) {
        return page(
            "Users",
            Some(&principal),
            "users",
            r#"<section class="card"><h1>Users</h1><p>Only admins, and those a global role lets (users-manage), manage users.</p></section>"#,
        );
    }
    let store = &dash.api.store;
    let everything = LabelSelector::everything();
    let (users, bindings, clusters) = match (
        store.list(Kind::User.name(), &everything).await,
        store.list(Kind::RoleBinding.name(), &everything).await,
        store.list(Kind::Cluster.name(), &everything).await,
    ) {
        (Ok((u, _)), Ok((b, _)), Ok((c, _))) => (u, b, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return ApiError::from(e).into_response();
        }
    };
    let mut user_rows = String::new();
    for user in users {
        let shown = present(Kind::User, user);
        let name = text(&shown["metadata"]["name"]);
        let _ = write!(
            user_rows,
            r#"<tr data-name="{n}"><td data-label="User">{n}</td><td data-label="Display name">{d}</td><td data-label="State">{s}</td></tr>"#,
            n = escape(&name),
            d = escape(&text(&shown["spec"]["displayName"])),
            s = escape(&text(&shown["state"]["state"])),
        );
    }
    let catalog = match crate::roles::Catalog::read(store.as_ref()).await {
        Ok(c) => c,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let role_options = format!(
        "{}{}",
        super::roles::template_options(&catalog, crate::model::TemplateContext::Cluster),
        super::roles::global_options(&catalog)
    );
    let mut binding_rows = String::new();
    // Of the bindings, those the caller may read (all, for an admin).
    for binding in bindings.into_iter().filter(|b| {
        crate::auth::authorize(&principal, crate::auth::Verb::List, Kind::RoleBinding, b).is_ok()
    }) {
        let name = binding.metadata.name.clone();
        let spec = &binding.spec;
        let who = if spec["user"].is_string() {
            text(&spec["user"])
        } else {
            format!("group {}", text(&spec["group"]))
        };
        let cluster = text(&spec["cluster"]);
        let _ = write!(
            binding_rows,
            r#"<tr data-name="{n}"><td data-label="Who">{who}</td><td data-label="Role">{role}</td><td data-label="Cluster">{cluster}</td><td><button type="button" class="danger delete" data-path="/v1/rolebindings/{n}" aria-label="Remove the role binding {n}">Remove</button></td></tr>"#,
            n = escape(&name),
            who = escape(&who),
            role = escape(&role_of(spec)),
            cluster = escape(if cluster.is_empty() {
                "all (global)"
            } else {
                &cluster
            }),
        );
    }
    let options: String = clusters
        .iter()
        .map(|c| {
            format!(
                r#"<option value="{n}">{n}</option>"#,
                n = escape(&c.metadata.name)
            )
        })
        .collect();
    let content = format!(
        r#"<div class="bar"><h1>Users</h1></div>
<table class="list" id="users"><thead><tr><th scope="col">User</th><th scope="col">Display name</th><th scope="col">State</th></tr></thead><tbody>{user_rows}</tbody></table>
<section class="card">
<h2>New user</h2>
<form id="create-user">
<label for="user-name">User name</label><input id="user-name" name="name" required autocomplete="off">
<label for="user-password">Password (12 characters or more)</label><input id="user-password" name="password" type="password" minlength="12" required autocomplete="new-password">
<p class="error" role="alert" id="user-error"></p>
<button type="submit">Create user</button>
</form>
</section>
<h2>Role bindings</h2>
<table class="list" id="bindings"><thead><tr><th scope="col">Who</th><th scope="col">Role</th><th scope="col">Cluster</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead><tbody>{binding_rows}</tbody></table>
<section class="card">
<h2>Grant a role</h2>
<form id="create-binding">
<label for="binding-user">User</label><input id="binding-user" name="user" required autocomplete="off">
<label for="binding-role">Role</label>
<select id="binding-role" name="role">{role_options}</select>
<label for="binding-cluster">Cluster</label>
<select id="binding-cluster" name="cluster">{options}</select>
<p class="error" role="alert" id="binding-error"></p>
<button type="submit">Grant</button>
</form>
</section>"#
    );
    page("Users", Some(&principal), "users", &content)
}

/// The role a binding grants, as the pages show it: a template by name, a global role with
/// "(global)".
pub(super) fn role_of(spec: &serde_json::Value) -> String {
    match (
        spec["role"].as_str(),
        spec["roleTemplate"].as_str(),
        spec["globalRole"].as_str(),
    ) {
        (Some(role), _, _) => role.to_owned(),
        (_, Some(template), _) => template.to_owned(),
        (_, _, Some(global)) => format!("{global} (global)"),
        _ => String::new(),
    }
}

pub(super) async fn tokens(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let principal = match caller(&dash.api, &headers, "/tokens").await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let (tokens, _) = match dash
        .api
        .store
        .list(Kind::Token.name(), &LabelSelector::everything())
        .await
    {
        Ok(list) => list,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut rows = String::new();
    for token in tokens
        .into_iter()
        .filter(|t| t.spec["user"].as_str() == Some(principal.user.as_str()))
    {
        let shown = present(Kind::Token, token);
        let name = text(&shown["metadata"]["name"]);
        let kind = if shown["spec"]["session"] == true {
            "login session"
        } else {
            "API token"
        };
        let current = if name == principal.token {
            " (this session)"
        } else {
            ""
        };
        let _ = write!(
            rows,
            r#"<tr data-name="{n}"><td data-label="Description">{d}{current}</td><td data-label="Kind">{kind}</td><td data-label="Expires">{e}</td><td data-label="State">{s}</td><td><button type="button" class="danger delete" data-path="/v1/tokens/{n}" aria-label="Revoke the token {d}">Revoke</button></td></tr>"#,
            n = escape(&name),
            d = escape(&text(&shown["spec"]["description"])),
            e = escape(&text(&shown["spec"]["expiresAt"])),
            s = escape(&text(&shown["state"]["state"])),
        );
    }
    let content = format!(
        r#"<div class="bar"><h1>API tokens</h1></div>
<table class="list" id="tokens"><thead><tr><th scope="col">Description</th><th scope="col">Kind</th><th scope="col">Expires</th><th scope="col">State</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead><tbody>{rows}</tbody></table>
<section class="card">
<h2>New API token</h2>
<form id="create-token">
<label for="token-description">Description</label><input id="token-description" name="description" required autocomplete="off">
<p class="error" role="alert" id="token-error"></p>
<button type="submit">Create token</button>
</form>
<div id="token-created" hidden>
<p>Copy it now: it is shown this once (the hub keeps only its hash).</p>
<div class="command"><code id="token-value"></code><button type="button" class="copy" data-copy="token-value" aria-label="Copy the token">Copy</button></div>
</div>
</section>"#
    );
    page("API tokens", Some(&principal), "tokens", &content)
}
