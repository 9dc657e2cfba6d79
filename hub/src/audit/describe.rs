//! Which requests are audited, and what a record says was done to what.

use axum::http::Method;

/// The hub's kinds as kubectl reaches them (`/apis/management.drover.io/v1/…`) are the same
/// API as `/v1/…`: audited, described and kept from secrets as it is.
pub(super) fn as_v1(path: &str) -> std::borrow::Cow<'_, str> {
    match path.strip_prefix("/apis/management.drover.io/v1/") {
        Some(rest) => format!("/v1/{rest}").into(),
        None => path.into(),
    }
}

/// Whether a request is audited: writes to the API, logins and logouts, and everything
/// through the proxy. Reads of the hub's own objects, the dashboard's pages, the agents'
/// endpoints (their paths carry tokens) and health checks are not.
pub(super) fn audited(method: &Method, path: &str) -> bool {
    let path = &*as_v1(path);
    if path.starts_with("/k8s/clusters/") {
        return true;
    }
    // A provider's callback (a GET) is where its users' logins end.
    let callback = path.starts_with("/v1/login/") && path.ends_with("/callback");
    // The login page's form, when its script did not run, and a command line's sign-in
    // confirmed (or denied) on its page.
    let form_login =
        (path == "/login" || path == "/login/device/confirm") && *method == Method::POST;
    // A command line asking whether it was confirmed: every two seconds, its body the device
    // code (a secret); the confirmation is what is recorded.
    let poll = path == "/v1/login/device/token";
    callback
        || form_login
        || (path.starts_with("/v1/")
            && !poll
            && !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS))
}

/// What a path says: the verb, cluster, resource and name.
pub(super) fn describe(
    method: &Method,
    path: &str,
    query: &str,
) -> (String, String, String, String) {
    let path = as_v1(path);
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let ["k8s", "clusters", cluster, rest @ ..] = segments.as_slice() {
        let (resource, name) = kube_resource(rest);
        let watch = query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1");
        let verb = match *method {
            Method::GET if watch => "watch",
            Method::GET if name.is_empty() => "list",
            Method::GET | Method::HEAD => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "other",
        };
        return (verb.into(), (*cluster).to_owned(), resource, name);
    }
    let verb = match (method, segments.as_slice()) {
        (_, ["v1", "login"] | ["v1", "login", _, "callback"] | ["login"]) => "login",
        (_, ["v1", "login", _, "start" | "device"]) => "login-start",
        (_, ["login", "device", "confirm"]) => "login",
        (_, ["v1", "logout"]) => "logout",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "other",
    };
    let (cluster, resource, name) = match segments.as_slice() {
        ["v1", "clusters", cluster, action, ..] => (
            (*cluster).to_owned(),
            "clusters".to_owned(),
            format!("{cluster}/{action}"),
        ),
        ["v1", "clusters", name] => (
            (*name).to_owned(),
            "clusters".to_owned(),
            (*name).to_owned(),
        ),
        ["v1", plural, name, ..] => (String::new(), (*plural).to_owned(), (*name).to_owned()),
        ["v1", plural] => (String::new(), (*plural).to_owned(), String::new()),
        ["login"] => (String::new(), "login".to_owned(), String::new()),
        _ => Default::default(),
    };
    (verb.into(), cluster, resource, name)
}

/// The resource and object name of a Kubernetes API path (`api/v1/namespaces/x/pods/y`).
pub(super) fn kube_resource(rest: &[&str]) -> (String, String) {
    let after_version = match rest {
        ["api", _, tail @ ..] => tail,
        ["apis", _, _, tail @ ..] => tail,
        _ => return (String::new(), String::new()),
    };
    let tail = match after_version {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    match tail {
        [resource] => ((*resource).to_owned(), String::new()),
        [resource, name, sub @ ..] => {
            let resource = match sub.first() {
                Some(sub) => format!("{resource}/{sub}"),
                None => (*resource).to_owned(),
            };
            (resource, (*name).to_owned())
        }
        _ => (String::new(), String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_say_what_was_done_to_what() {
        let d = |m: Method, p: &str, q: &str| describe(&m, p, q);
        assert_eq!(
            d(
                Method::GET,
                "/k8s/clusters/prod/api/v1/namespaces/shop/pods",
                ""
            ),
            ("list".into(), "prod".into(), "pods".into(), String::new())
        );
        assert_eq!(
            d(
                Method::GET,
                "/k8s/clusters/prod/api/v1/pods",
                "watch=1&resourceVersion=5"
            )
            .0,
            "watch"
        );
        assert_eq!(
            d(
                Method::POST,
                "/k8s/clusters/prod/api/v1/namespaces/shop/pods/web-0/exec",
                "command=sh"
            ),
            (
                "create".into(),
                "prod".into(),
                "pods/exec".into(),
                "web-0".into()
            )
        );
        assert_eq!(
            d(
                Method::DELETE,
                "/k8s/clusters/prod/apis/apps/v1/namespaces/shop/deployments/web",
                ""
            ),
            (
                "delete".into(),
                "prod".into(),
                "deployments".into(),
                "web".into()
            )
        );
        assert_eq!(
            d(Method::GET, "/k8s/clusters/prod/api/v1/nodes/n1", ""),
            ("get".into(), "prod".into(), "nodes".into(), "n1".into())
        );
        assert_eq!(
            d(Method::POST, "/v1/login", ""),
            ("login".into(), String::new(), "login".into(), String::new())
        );
        assert_eq!(
            d(Method::DELETE, "/v1/tokens/drt_tabc", ""),
            (
                "delete".into(),
                String::new(),
                "tokens".into(),
                "drt_tabc".into()
            )
        );
        assert_eq!(
            d(Method::POST, "/v1/clusters/prod/kubeconfig", ""),
            (
                "create".into(),
                "prod".into(),
                "clusters".into(),
                "prod/kubeconfig".into()
            )
        );
        assert!(audited(&Method::GET, "/k8s/clusters/prod/api/v1/pods"));
        assert!(audited(&Method::POST, "/v1/users"));
        assert!(!audited(&Method::GET, "/v1/users"));
        // kubectl's writes to the hub's kinds, as the same API's.
        assert!(audited(
            &Method::PATCH,
            "/apis/management.drover.io/v1/clusters/edge"
        ));
        assert!(!audited(
            &Method::GET,
            "/apis/management.drover.io/v1/clusters"
        ));
        assert_eq!(
            describe(
                &Method::PATCH,
                "/apis/management.drover.io/v1/clusters/edge",
                ""
            ),
            (
                "patch".into(),
                "edge".into(),
                "clusters".into(),
                "edge".into()
            )
        );
        assert!(!audited(&Method::GET, "/v3/import/drr_secret.yaml"));
        assert!(!audited(&Method::POST, "/v3/register"));
    }
}
