//! What every browser-facing answer carries, and the check that keeps another site from
//! writing with a user's session.
//!
//! - Headers: a Content-Security-Policy that allows only the hub's own script and stylesheet
//!   (no inline script, no framing, no foreign forms), HSTS (the hub only speaks HTTPS),
//!   `nosniff`, no referrer.
//! - CSRF: a write (`POST`, `PUT`, `PATCH`, `DELETE`, or an upgrade such as the dashboard
//!   shell's WebSocket) authenticated by the session cookie alone
//!   must come from the hub's own pages: the browser's `Origin` must be the hub's, or its
//!   `Sec-Fetch-Site` must say `same-origin`. The cookie is `SameSite=Strict` as well; this holds
//!   even for a browser that ignores that. Requests with `Authorization: Bearer` (the CLI,
//!   kubectl, scripts) carry no ambient credential and are not affected.

use axum::{
    extract::Request,
    http::{HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::auth::SESSION_COOKIE;

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
                   frame-ancestors 'none'";

/// The policy of a page whose script makes `<style>` elements (the shell's terminal: xterm
/// writes its dimensions and theme into them as the window and font change): `CSP`, and style
/// elements that carry this response's `nonce`, and style attributes (xterm colours a cell
/// by one). Scripts stay the hub's own files alone; a style cannot run code, and with images
/// and connections limited to the hub a style can send nothing elsewhere.
pub fn policy_with_style_nonce(nonce: &str) -> String {
    CSP.replace(
        "style-src 'self';",
        &format!("style-src 'self' 'nonce-{nonce}'; style-src-attr 'unsafe-inline';"),
    )
}

fn has_session_cookie(request: &Request) -> bool {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .any(|c| {
            c.trim()
                .strip_prefix(SESSION_COOKIE)
                .is_some_and(|rest| rest.starts_with('='))
        })
}

/// Whether a cookie-authenticated write comes from the hub's own pages.
fn same_origin(request: &Request) -> bool {
    same_origin_headers(request.headers())
}

/// Whether a request with these headers comes from the hub's own pages: a browser's
/// `Sec-Fetch-Site`, else its `Origin` against the `Host` it asked.
pub fn same_origin_headers(headers: &axum::http::HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        return site == "same-origin";
    }
    match (text("origin"), text("host")) {
        (Some(origin), Some(host)) => origin.strip_prefix("https://") == Some(host),
        _ => false,
    }
}

/// The answer to a cookie-authenticated write that does not come from the hub's own pages, if
/// `request` is one.
pub fn refusal(request: &Request) -> Option<Response> {
    // An upgrade (the browser's shell: a WebSocket exec) acts on a workload: it is a write,
    // whatever its method, and a browser sends Origin on every WebSocket handshake.
    let writes = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) || request.headers().contains_key(header::UPGRADE);
    let refused = writes
        && has_session_cookie(request)
        && !request.headers().contains_key(header::AUTHORIZATION)
        && !same_origin(request);
    if !refused {
        return None;
    }
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
        "reason": "Forbidden",
        "message": "a write with the dashboard's session must come from the hub's own pages \
                    (Origin or Sec-Fetch-Site); scripts send Authorization: Bearer <token>",
    });
    Some(
        (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response(),
    )
}

/// Puts the headers every answer carries on `response` (those a handler set stay).
pub fn secure(response: &mut Response) {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (
            header::STRICT_TRANSPORT_SECURITY,
            "max-age=31536000; includeSubDomains",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers
            .entry(name)
            .or_insert(HeaderValue::from_static(value));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_nonce_admits_style_elements_and_nothing_else_changes() {
        let policy = policy_with_style_nonce("abc123");
        assert!(
            policy.contains("style-src 'self' 'nonce-abc123'; style-src-attr 'unsafe-inline';"),
            "{policy}"
        );
        // Scripts, frames and everything else as on every page.
        assert_eq!(
            policy.replace(" 'nonce-abc123'; style-src-attr 'unsafe-inline';", ";"),
            CSP
        );
    }

    use axum::{Router, body::Body, routing::post};
    use tower::ServiceExt;

    use super::*;

    use axum::middleware::Next;

    /// [`refusal`] and [`secure`] as a layer, as `routes::edge` runs them on the hub's routes.
    async fn layer(request: Request, next: Next) -> Response {
        let mut response = match refusal(&request) {
            Some(refused) => refused,
            None => next.run(request).await,
        };
        secure(&mut response);
        response
    }

    fn app() -> Router {
        Router::new()
            .route(
                "/v1/things",
                post(|| async { "written" }).get(|| async { "read" }),
            )
            .layer(axum::middleware::from_fn(layer))
    }

    async fn send(method: &str, headers: &[(&str, &str)]) -> (StatusCode, http::HeaderMap) {
        let mut request = Request::builder().method(method).uri("/v1/things");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = app()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        (response.status(), response.headers().clone())
    }

    #[tokio::test]
    async fn a_cross_site_write_with_the_session_cookie_is_refused() {
        let cookie = ("cookie", "drover_session=drt_x.y");
        let host = ("host", "hub.example:8443");
        assert_eq!(
            send("POST", &[cookie, host, ("origin", "https://evil.example")])
                .await
                .0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            send("POST", &[cookie, host, ("sec-fetch-site", "cross-site")])
                .await
                .0,
            StatusCode::FORBIDDEN
        );
        // Neither header: not a page of ours.
        assert_eq!(
            send("DELETE", &[cookie, host]).await.0,
            StatusCode::FORBIDDEN
        );
        // The hub's own pages.
        assert_eq!(
            send(
                "POST",
                &[cookie, host, ("origin", "https://hub.example:8443")]
            )
            .await
            .0,
            StatusCode::OK
        );
        assert_eq!(
            send("POST", &[cookie, host, ("sec-fetch-site", "same-origin")])
                .await
                .0,
            StatusCode::OK
        );
        // Reads, and bearer tokens, are not affected.
        assert_eq!(send("GET", &[cookie, host]).await.0, StatusCode::OK);
        assert_eq!(
            send("POST", &[cookie, host, ("authorization", "Bearer drt_x.y")])
                .await
                .0,
            StatusCode::OK
        );
        assert_eq!(send("POST", &[host]).await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_cross_site_websocket_with_the_session_cookie_is_refused() {
        let cookie = ("cookie", "drover_session=drt_x.y");
        let host = ("host", "hub.example:8443");
        let upgrade = ("upgrade", "websocket");
        // Another site's page opening the shell's WebSocket with the user's cookie.
        assert_eq!(
            send(
                "GET",
                &[cookie, host, upgrade, ("origin", "https://evil.example")]
            )
            .await
            .0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            send("GET", &[cookie, host, upgrade]).await.0,
            StatusCode::FORBIDDEN
        );
        // The hub's own page.
        assert_eq!(
            send(
                "GET",
                &[
                    cookie,
                    host,
                    upgrade,
                    ("origin", "https://hub.example:8443")
                ]
            )
            .await
            .0,
            StatusCode::OK
        );
        // kubectl exec: a bearer token, no cookie.
        assert_eq!(
            send("GET", &[host, upgrade, ("authorization", "Bearer drt_x.y")])
                .await
                .0,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn answers_carry_the_security_headers() {
        let (_, headers) = send("GET", &[]).await;
        let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
        assert!(headers.contains_key(header::STRICT_TRANSPORT_SECURITY));
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    }
}
