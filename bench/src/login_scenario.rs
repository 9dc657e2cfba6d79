//! Scenario `login`: signing in with a company directory, in one run. A hub (its own process,
//! the release binary) with an LDAP provider on a real slapd (LDAPS, the user in 20 groups,
//! one of them nested) and an OpenID provider (npm's oidc-provider):
//! - password logins per second and their latency with C concurrent clients, LDAP (connect,
//!   service bind, user search, user bind, group searches, the User updated) beside the hub's
//!   own users (an argon2id check) as the same-run baseline;
//! - the OpenID callback's handling time (discovery, token exchange, key set, ID token check,
//!   userinfo, the User and the session written), the flow before it driven over HTTP as a
//!   browser would (the provider's development sign-in and consent forms);
//! - and `bench audit`'s proxy requests per second with the audit log on and off.

use std::{collections::BTreeMap, net::SocketAddr, time::Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tests::{HubProcess, api, ldap::Slapd, oidc::OpenIdProvider, signin::create_provider};

use crate::load::percentile_us;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Concurrent clients logging in.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Logins per client and kind.
    #[arg(long, default_value_t = 50)]
    logins: usize,
    /// OpenID sign-ins timed.
    #[arg(long, default_value_t = 20)]
    oidc: usize,
    /// Rounds of `bench audit` (the proxy with the audit log on and off) in the same run; 0
    /// leaves it out.
    #[arg(long, default_value_t = 1)]
    audit_rounds: usize,
}

const PASSWORD: &str = "a bench user's password";

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let dir = tests::temp_dir("bench-login");
    let hub = HubProcess::start_at_own_url(&dir.join("hub")).await;
    let hub_url = hub.url();
    let admin = tests::login(
        hub.addr,
        "admin",
        hub.admin_password.as_deref().unwrap_or(""),
    )
    .await;
    let slapd_dir = dir.join("slapd");
    std::fs::create_dir_all(&slapd_dir)?;
    let slapd = Slapd::start(&slapd_dir).await;
    slapd.add_user("bench", "Bench User", PASSWORD);
    let member = tests::ldap::user_dn("bench");
    for n in 0..19 {
        slapd.add_group(&format!("team-{n:02}"), std::slice::from_ref(&member));
    }
    slapd.add_group(
        "all",
        &[format!("cn=team-00,ou=groups,{}", tests::ldap::BASE)],
    );
    create_provider(
        hub.addr,
        &admin,
        "corp",
        json!({"type": "ldap", "ldap": {
        "url": slapd.ldaps_url, "caCerts": slapd.ca_pem, "bindDn": tests::ldap::READER_DN,
        "bindPassword": tests::ldap::READER_PASSWORD,
        "userSearchBase": format!("ou=people,{}", tests::ldap::BASE),
        "groupSearchBase": format!("ou=groups,{}", tests::ldap::BASE)}}),
    )
    .await;
    let (status, answer) = api(
        hub.addr,
        "POST",
        "/v1/users",
        Some(&admin),
        Some(json!({"metadata": {"name": "local-bench"}, "spec": {"password": PASSWORD}})),
    )
    .await;
    anyhow::ensure!(status == 201, "creating the local user: {answer}");

    let ldap = logins(
        hub.addr,
        &args,
        json!({"username": "bench", "password": PASSWORD, "provider": "corp", "session": false}),
    )
    .await?;
    let local = logins(
        hub.addr,
        &args,
        json!({"username": "local-bench", "password": PASSWORD, "session": false}),
    )
    .await?;
    let (_, user) = api(hub.addr, "GET", "/v1/users/corp-bench", Some(&admin), None).await;
    let groups = user["spec"]["providerGroups"]
        .as_array()
        .map_or(0, Vec::len);

    let idp = OpenIdProvider::start(
        &dir,
        "drover",
        "bench client secret",
        &format!("{hub_url}/v1/login/sso/callback"),
        json!({"olivia": {"preferred_username": "olivia", "groups": ["admins", "ops"]}}),
    )
    .await;
    create_provider(
        hub.addr,
        &admin,
        "sso",
        json!({"type": "oidc", "oidc": {
        "issuer": idp.issuer, "clientId": "drover", "clientSecret": "bench client secret",
        "scopes": ["openid", "profile", "groups"], "caCerts": idp.ca_pem}}),
    )
    .await;
    let mut callbacks = Vec::new();
    for _ in 0..args.oidc.max(1) {
        callbacks.push(openid_callback(hub.addr, idp.addr, "olivia").await?);
    }
    // The provider alone, in the same run: what its discovery and key-set answers take
    // (the hub keeps both for five minutes; the token and userinfo endpoints it calls each
    // time cost at least as much).
    let mut alone = BTreeMap::new();
    for path in ["/.well-known/openid-configuration", "/jwks"] {
        let mut times = Vec::new();
        for _ in 0..20 {
            let begun = Instant::now();
            let answer = send(idp.addr, "GET", path, &BTreeMap::new(), None).await?;
            anyhow::ensure!(answer.status == 200, "{path}: {}", answer.status);
            times.push(begun.elapsed());
        }
        alone.insert(path, round3(percentile_us(&mut times, 50.0) / 1000.0));
    }
    let report = json!({
        "scenario": "login",
        "what": "password logins through the hub's API (LDAPS to slapd: the user in 20 groups, one nested; against the hub's own users' argon2id check in the same run), and the OpenID callback's handling (a certified provider, groups from userinfo)",
        "clients": args.clients,
        "ldap_groups_per_user": groups,
        "ldap": ldap,
        "local": local,
        "ldap_over_local_logins_per_s": round3(ldap["logins_per_s"].as_f64().unwrap_or(0.0) / local["logins_per_s"].as_f64().unwrap_or(1.0).max(0.001)),
        "oidc_callback_ms": {
            "p50": round3(percentile_us(&mut callbacks, 50.0) / 1000.0),
            "p99": round3(percentile_us(&mut callbacks, 99.0) / 1000.0),
            "count": callbacks.len(),
        },
        "provider_alone_p50_ms": alone,
    });
    drop((slapd, idp, hub));
    let _ = std::fs::remove_dir_all(&dir);
    let mut report = report;
    if args.audit_rounds > 0 {
        // What every login and proxied request then costs: the audit log on and off.
        report["audit"] = crate::audit_scenario::run(crate::audit_scenario::Args {
            clients: 64,
            seconds: 5,
            rounds: args.audit_rounds,
            pods: 100,
        })
        .await?;
    }
    Ok(report)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `clients` concurrent clients each logging in `logins` times with `body`.
async fn logins(addr: SocketAddr, args: &Args, body: Value) -> anyhow::Result<Value> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.clients.max(1) {
        let body = body.clone();
        let count = args.logins.max(1);
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::with_capacity(count);
            for _ in 0..count {
                let begun = Instant::now();
                let (status, answer) =
                    api(addr, "POST", "/v1/login", None, Some(body.clone())).await;
                anyhow::ensure!(status == 200, "login: {status} {answer}");
                times.push(begun.elapsed());
            }
            anyhow::Ok(times)
        }));
    }
    let mut times = Vec::new();
    for task in tasks {
        times.extend(task.await??);
    }
    let elapsed = start.elapsed();
    Ok(json!({
        "logins": times.len(),
        "logins_per_s": round3(times.len() as f64 / elapsed.as_secs_f64()),
        "p50_ms": round3(percentile_us(&mut times, 50.0) / 1000.0),
        "p99_ms": round3(percentile_us(&mut times, 99.0) / 1000.0),
    }))
}

/// A response's status, headers and body.
struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Bytes,
}

/// One HTTPS request to `addr` (certificates not verified: both ends are this run's own).
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    cookies: &BTreeMap<String, String>,
    form: Option<String>,
) -> anyhow::Result<Answer> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(tunnel::tls::unverified_client_config())
        .connect("127.0.0.1".try_into()?, tcp)
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let cookie: Vec<String> = cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::COOKIE, cookie.join("; "));
    if form.is_some() {
        request = request.header(
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        );
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::from(form.unwrap_or_default())))?)
        .await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await?.to_bytes();
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn keep_cookies(jar: &mut BTreeMap<String, String>, headers: &http::HeaderMap) {
    for value in headers.get_all(http::header::SET_COOKIE) {
        if let Some((name, rest)) = value.to_str().unwrap_or_default().split_once('=') {
            let value = rest.split(';').next().unwrap_or_default();
            if value.is_empty() {
                jar.remove(name);
            } else {
                jar.insert(name.to_owned(), value.to_owned());
            }
        }
    }
}

/// Path and query of a `Location`, and which server it is on.
fn location(answer: &Answer) -> anyhow::Result<String> {
    Ok(answer
        .headers
        .get(http::header::LOCATION)
        .ok_or_else(|| anyhow::anyhow!("no Location in a {} answer", answer.status))?
        .to_str()?
        .to_owned())
}

/// Signs in as `login` at the provider (its development forms, as a browser would) and
/// returns how long the hub took to answer the callback.
async fn openid_callback(
    hub: SocketAddr,
    idp: SocketAddr,
    login: &str,
) -> anyhow::Result<std::time::Duration> {
    let mut hub_jar = BTreeMap::new();
    let mut idp_jar = BTreeMap::new();
    let started = send(hub, "GET", "/v1/login/sso/start", &hub_jar, None).await?;
    keep_cookies(&mut hub_jar, &started.headers);
    let mut next = location(&started)?;
    let idp_base = format!("https://{idp}");
    // Follow the provider's redirects and fill in its forms until it sends the browser back.
    for _ in 0..12 {
        let path = next
            .strip_prefix(&idp_base)
            .map(str::to_owned)
            .unwrap_or_else(|| next.clone());
        if !path.starts_with('/') {
            break;
        }
        let answer = send(idp, "GET", &path, &idp_jar, None).await?;
        keep_cookies(&mut idp_jar, &answer.headers);
        if answer.status == 200 {
            // A form: sign in, or consent.
            let page = String::from_utf8_lossy(&answer.body);
            let action = page
                .split("action=\"")
                .nth(1)
                .and_then(|a| a.split('"').next())
                .ok_or_else(|| anyhow::anyhow!("no form on the provider's page"))?
                .to_owned();
            let form = if page.contains("name=\"login\"") {
                format!("prompt=login&login={login}&password=x")
            } else {
                "prompt=consent".to_owned()
            };
            let posted = send(idp, "POST", &action, &idp_jar, Some(form)).await?;
            keep_cookies(&mut idp_jar, &posted.headers);
            next = location(&posted)?;
        } else {
            next = location(&answer)?;
        }
        if next.contains("/v1/login/sso/callback") {
            let path = next
                .split_once("/v1/")
                .map(|(_, rest)| format!("/v1/{rest}"))
                .unwrap_or_default();
            let begun = Instant::now();
            let answer = send(hub, "GET", &path, &hub_jar, None).await?;
            let took = begun.elapsed();
            anyhow::ensure!(
                answer.status == 200,
                "the callback answered {} {:?}",
                answer.status,
                answer.headers.get(http::header::LOCATION)
            );
            return Ok(took);
        }
    }
    anyhow::bail!("the provider never sent the browser back (last at {next})")
}
