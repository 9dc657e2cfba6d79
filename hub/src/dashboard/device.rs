//! `/login/device`: where a person confirms a command line's sign-in (`drover-hub login
//! --provider`, see `api::device`). Signed in with the provider the command line named, they
//! type the code it shows, see what asks for access (its id, its address, when it started) and
//! confirm or deny. Plain forms, rendered here: nothing to run in the browser, and each post is
//! checked to come from this hub's own page.

use axum::{
    extract::State,
    http::HeaderMap,
    response::{IntoResponse, Redirect, Response},
};

use super::{Dash, escape, page};
use crate::{
    api::device::{self, Decided, NotWaiting, Waiting},
    auth::Principal,
};

/// `GET /login/device`: the code form, or the way to sign in first.
pub(super) async fn form(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    match dash.api.principal(&headers).await {
        Ok(principal) => code_form(&principal, ""),
        Err(_) => sign_in_first(&dash, None).await,
    }
}

/// The ways to sign in, each coming back here: the providers that sign users in at their
/// page (only `only`, when the command line named it), and the hub's own login page.
async fn sign_in_first(dash: &Dash, only: Option<&str>) -> Response {
    let offered = crate::auth::providers::offered(dash.api.store.as_ref())
        .await
        .unwrap_or_default();
    let next: String =
        form_urlencoded::byte_serialize(device::VERIFICATION_PATH.as_bytes()).collect();
    let buttons: String = offered
        .iter()
        .filter(|o| o.redirects && only.is_none_or(|p| p == o.name))
        .map(|o| {
            format!(
                r#"<p><a class="button" data-provider="{name}" href="/v1/login/{name}/start?next={next}">Sign in with {display}</a></p>"#,
                name = escape(&o.name),
                display = escape(&o.display_name)
            )
        })
        .collect();
    let why = match only {
        Some(provider) => format!(
            "This command line signs in with {}: sign in with it here first.",
            escape(provider)
        ),
        None => "Sign in first, with the provider your command line named.".to_owned(),
    };
    let content = format!(
        r#"<section class="card narrow">
<h1>Sign in a command line</h1>
<p id="device-sign-in">{why}</p>
{buttons}</section>"#
    );
    page("Sign in a command line", None, "login", &content)
}

/// The form asking for the code the command line shows, with `error` if the last one led
/// nowhere.
fn code_form(principal: &Principal, error: &str) -> Response {
    let content = format!(
        r#"<section class="card narrow">
<h1>Sign in a command line</h1>
<p>Type the code your command line (<code>drover-hub login</code>) shows. It will be signed in as <strong>{user}</strong>.</p>
<form id="device-code" method="post" action="{path}">
<label for="user-code">Code</label>
<input id="user-code" name="code" autocomplete="off" autocapitalize="characters" spellcheck="false" placeholder="BCDF-GHJK" required>
<p class="error" role="alert" id="device-error">{error}</p>
<button type="submit">Continue</button>
</form>
</section>"#,
        user = escape(&principal.user),
        path = device::VERIFICATION_PATH,
        error = escape(error),
    );
    page("Sign in a command line", Some(principal), "", &content)
}

/// What the person is asked to confirm: who the command line will act as, and what it is.
fn confirm_form(principal: &Principal, waiting: &Waiting) -> Response {
    let content = format!(
        r#"<section class="card narrow">
<h1>Sign in this command line?</h1>
<p>A command line asks to act on this hub as <strong>{user}</strong>, with everything you may do, until its token expires or you revoke it (API tokens). Confirm only if you started it yourself just now.</p>
<dl id="device-request">
<dt>Code</dt><dd id="device-request-code">{code}</dd>
<dt>Command line</dt><dd id="device-request-client">{client}</dd>
<dt>From address</dt><dd id="device-request-address">{address}</dd>
<dt>Started</dt><dd id="device-request-started">{started}</dd>
<dt>Signing in with</dt><dd>{provider}</dd>
</dl>
<form id="device-confirm" method="post" action="{path}/confirm">
<input type="hidden" name="code" value="{code}">
<button type="submit" name="decision" value="approve" id="device-approve">Sign it in</button>
<button type="submit" name="decision" value="deny" id="device-deny" class="danger">Deny</button>
</form>
</section>"#,
        user = escape(&principal.user),
        code = escape(&waiting.code),
        client = escape(if waiting.client.is_empty() {
            "(no id given)"
        } else {
            &waiting.client
        }),
        address = escape(&waiting.address),
        started = escape(&waiting.started_at),
        provider = escape(&waiting.provider),
        path = device::VERIFICATION_PATH,
    );
    page("Sign in a command line", Some(principal), "", &content)
}

/// Why a code leads nowhere, as the page says it.
fn not_waiting_message(why: &NotWaiting) -> String {
    match why {
        NotWaiting::Unknown => "No command line waits for that code: check it, or run drover-hub login again (a code lasts 10 minutes and is used once).".to_owned(),
        NotWaiting::OtherProvider(provider) => format!("That command line signs in with {provider}, not with the account you are signed in with."),
        NotWaiting::TooMany(wait) => format!("Too many wrong codes: try again in {wait} s."),
    }
}

/// The person and the form's fields, if the post came from this hub's own page by someone
/// signed in; else where to go.
async fn posted(
    dash: &Dash,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Principal, std::collections::HashMap<String, String>), Response> {
    if !crate::websec::same_origin_headers(headers) {
        return Err(Redirect::to(device::VERIFICATION_PATH).into_response());
    }
    let principal = match dash.api.principal(headers).await {
        Ok(principal) => principal,
        Err(_) => return Err(sign_in_first(dash, None).await),
    };
    let fields = form_urlencoded::parse(body).into_owned().collect();
    Ok((principal, fields))
}

/// `POST /login/device`: the code typed; what asks for access, to confirm.
pub(super) async fn code(
    State(dash): State<Dash>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (principal, fields) = match posted(&dash, &headers, &body).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let typed = fields.get("code").map(String::as_str).unwrap_or_default();
    match device::waiting(&dash.api, &principal, typed).await {
        Ok(Ok((waiting, _))) => confirm_form(&principal, &waiting),
        Ok(Err(NotWaiting::OtherProvider(provider))) => sign_in_first(&dash, Some(&provider)).await,
        Ok(Err(why)) => code_form(&principal, &not_waiting_message(&why)),
        Err(e) => super::error_page(&principal, &e),
    }
}

/// `POST /login/device/confirm`: the person's decision.
pub(super) async fn confirm(
    State(dash): State<Dash>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (principal, fields) = match posted(&dash, &headers, &body).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let typed = fields.get("code").map(String::as_str).unwrap_or_default();
    let approve = fields.get("decision").map(String::as_str) == Some("approve");
    let (id, text) = match device::decide(&dash.api, &principal, typed, approve).await {
        Ok(Ok(Decided::Approved(user))) => (
            "cli-done",
            format!(
                "The command line is signed in as {}. You can close this tab.",
                escape(&user)
            ),
        ),
        Ok(Ok(Decided::Denied)) => (
            "cli-denied",
            "Denied: the command line is not signed in.".to_owned(),
        ),
        Ok(Err(why)) => return code_form(&principal, &not_waiting_message(&why)),
        Err(e) => return super::error_page(&principal, &e),
    };
    let content = format!(
        r#"<section class="card narrow">
<h1>Sign in a command line</h1>
<p id="{id}">{text}</p>
</section>"#
    );
    page("Sign in a command line", Some(&principal), "", &content)
}
