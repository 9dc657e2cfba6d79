//! Scenario `endpoint`: the authorized cluster endpoint against the hub, in one run.
//!
//! A custom cluster (paused: no hosts are planned) with the endpoint on, its cluster-agent on a
//! simulated API server (`drover-sim`, standing in for kube-apiserver) whose token webhook
//! points at `drover-kube-api-auth`'s code, each part on a runtime of its own. A
//! `cluster-member` of the hub GETs one pod with the token of the kubeconfig the hub issued:
//!
//! - through the hub's proxy and straight to the API server (the direct context), latency on
//!   one kept-alive connection (alternating rounds) and throughput with many clients;
//! - what an uncached token costs: a `TokenReview` sent to the authenticator as the API server
//!   sends one on a cache miss, round-trip time and the authenticator's CPU per review; and the
//!   reviews the API server did send during the GETs (its cache keeps answers for the TTL).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sim::cluster::{ADMIN_TOKEN, Identity, Serving, SimCluster, SimConfig, webhook::TokenWebhook};
use tokio_util::sync::CancellationToken;

use crate::{
    load::percentile_us,
    proxy_scenario::{
        POD, Target, admin_with_cluster, hub_config, import_into, latencies, proxied, round1,
        runtime, threads_cpu, throughput,
    },
};

const AGENT_TOKEN: &str = "bench-agent-token";

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Sequential GETs per path for the latency figures.
    #[arg(long, default_value_t = 3_000)]
    requests: usize,
    /// Concurrent clients for the throughput figures.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Seconds each path is loaded for the throughput figures.
    #[arg(long, default_value_t = 4)]
    seconds: u64,
    /// Token reviews sent straight to the authenticator.
    #[arg(long, default_value_t = 5_000)]
    reviews: usize,
}

/// One `TokenReview` after another on one kept-alive connection to the authenticator: each
/// round trip.
async fn reviews(
    addr: std::net::SocketAddr,
    token: &str,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(connection);
    let body = Bytes::from(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "spec": {"token": token}})
        .to_string(),
    );
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        sender.ready().await?;
        let request = http::Request::post("/v1/authenticate")
            .header(http::header::HOST, addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.clone()))?;
        let start = Instant::now();
        let response = sender.send_request(request).await?;
        let answer = response.into_body().collect().await?.to_bytes();
        times.push(start.elapsed());
        let answer: Value = serde_json::from_slice(&answer)?;
        if answer["status"]["authenticated"] != true {
            bail!("the authenticator refused the member's token: {answer}");
        }
    }
    Ok(times)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let shutdown = CancellationToken::new();
    let parts = ["sim", "hub", "agent", "auth"]
        .iter()
        .map(|p| runtime(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let [sim_rt, hub_rt, agent_rt, auth_rt] = [&parts[0], &parts[1], &parts[2], &parts[3]];
    let data_dir =
        std::env::temp_dir().join(format!("drover-bench-endpoint-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    std::fs::create_dir_all(&data_dir)?;

    // The webhook's configuration, as the planner writes it, at a port of this run.
    let auth_addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?
    };
    let webhook_file = data_dir.join("kube-api-authn-webhook.yaml");
    std::fs::write(
        &webhook_file,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n  - name: auth\n    cluster:\n      server: http://{auth_addr}/v1/authenticate\n\
             users:\n  - name: apiserver\n    user: {{}}\ncontexts:\n  - name: webhook\n    context: {{cluster: auth, user: apiserver}}\n\
             current-context: webhook\n"
        ),
    )?;
    let ttl = Duration::from_secs(10);
    let webhook =
        TokenWebhook::from_config_file(&webhook_file, "v1", ttl).map_err(anyhow::Error::msg)?;
    let sim = Arc::new(
        sim_rt
            .spawn(SimCluster::start_with(
                SimConfig {
                    nodes: 10,
                    pods: 100,
                    ..SimConfig::default()
                },
                Serving {
                    webhook: Some(webhook),
                    ..Serving::default()
                },
                shutdown.clone(),
            ))
            .await??,
    );
    sim.add_token(
        AGENT_TOKEN,
        Identity {
            user: "system:serviceaccount:drover-system:drover-agent".into(),
            groups: vec!["system:serviceaccounts".into(), "system:masters".into()],
        },
    );
    let hub = hub_rt
        .spawn(hub::Hub::start(
            hub_config(&data_dir.join("hub")),
            shutdown.clone(),
        ))
        .await??;
    let (admin, registration) = admin_with_cluster(
        &hub,
        json!({"metadata": {"name": "prod"},
               "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
                        "paused": true, "authorizedEndpoint": {"enabled": true}}}),
    )
    .await?;
    let agent = import_into(
        &hub,
        &sim,
        AGENT_TOKEN,
        registration,
        &data_dir,
        "drover-system",
    )
    .await?;
    agent_rt.spawn(cluster_agent::run(agent, shutdown.clone()));
    let auth = cluster_agent::api_auth::Config {
        listen: auth_addr,
        namespace: "drover-system".into(),
        kube: cluster_agent::KubeTarget::from_kubeconfig_text(
            &sim.kubeconfig(ADMIN_TOKEN),
            "the simulated cluster",
        )?,
    };
    auth_rt.spawn(cluster_agent::api_auth::run(auth, shutdown.clone()));

    // A cluster-member and the kubeconfig token the hub issues them.
    let password = "a long enough password";
    admin
        .call(
            "POST",
            "/v1/users",
            Some(json!({"metadata": {"name": "member"}, "spec": {"password": password}})),
            201,
        )
        .await?;
    admin
        .call(
            "POST",
            "/v1/rolebindings",
            Some(json!({"metadata": {"name": "member"},
                        "spec": {"user": "member", "role": "cluster-member", "cluster": "prod"}})),
            201,
        )
        .await?;
    let mut member = Target {
        addr: hub.local_addr(),
        token: String::new(),
    };
    let login = member
        .call(
            "POST",
            "/v1/login",
            Some(json!({"username": "member", "password": password, "session": false})),
            200,
        )
        .await?;
    member.token = login["token"].as_str().context("login token")?.to_owned();
    let kubeconfig = member
        .call_text("POST", "/v1/clusters/prod/kubeconfig", 201)
        .await?;
    let token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .context("the kubeconfig has a token")?
        .trim_matches('"')
        .to_owned();
    let through_hub = Target {
        addr: hub.local_addr(),
        token: token.clone(),
    };
    let direct = Target {
        addr: sim.addr(),
        token: token.clone(),
    };
    // Until the agent has connected, synced RBAC and copied the token, one path or the other
    // refuses; the first refusals are cached by the API server for the TTL.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (target, path) in [(&through_hub, proxied(POD)), (&direct, POD.to_owned())] {
        loop {
            if target.call("GET", &path, None, 200).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("GET {path} did not succeed within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let mut hub_times = Vec::new();
    let mut direct_times = Vec::new();
    let rounds = 4;
    let calls_before = sim.webhook_calls();
    for _ in 0..rounds {
        hub_times.extend(latencies(&through_hub, &proxied(POD), args.requests / rounds).await?);
        direct_times.extend(latencies(&direct, POD, args.requests / rounds).await?);
    }
    let webhook_calls = sim.webhook_calls() - calls_before;
    let gets = direct_times.len() as u64;
    let (hub_rps, hub_cpu) = throughput(
        &through_hub,
        &proxied(POD),
        args.clients,
        Duration::from_secs(args.seconds),
    )
    .await?;
    let (direct_rps, direct_cpu) = throughput(
        &direct,
        POD,
        args.clients,
        Duration::from_secs(args.seconds),
    )
    .await?;

    // What a cache miss adds: one review at the authenticator.
    let auth_cpu = || threads_cpu(|name| name.starts_with("bench-auth"));
    let cpu_before = auth_cpu();
    let mut review_times = reviews(auth_addr, &token, args.reviews).await?;
    let auth_us = auth_cpu().saturating_sub(cpu_before).as_secs_f64() * 1e6 / args.reviews as f64;
    let review_total: Duration = review_times.iter().sum();

    shutdown.cancel();
    let result = json!({
        "scenario": "endpoint",
        "stand_in": "drover-sim's API server stands in for kube-apiserver (its token webhook as kube-apiserver's: TokenReview, answers cached for the TTL)",
        "webhook_cache_ttl_s": ttl.as_secs(),
        "get_latency_us": {
            "direct": {"p50": percentile_us(&mut direct_times, 50.0), "p99": percentile_us(&mut direct_times, 99.0)},
            "through_hub": {"p50": percentile_us(&mut hub_times, 50.0), "p99": percentile_us(&mut hub_times, 99.0)},
        },
        "get_per_second": {
            "clients": args.clients,
            "direct": round1(direct_rps),
            "through_hub": round1(hub_rps),
            "direct_over_hub": round1(direct_rps / hub_rps.max(1.0) * 10.0) / 10.0,
            "cpu_us_per_request": {"direct": direct_cpu.json(), "through_hub": hub_cpu.json()},
        },
        "webhook_reviews_sent_during_direct_latency_gets": webhook_calls,
        "direct_latency_gets": gets,
        "uncached_review": {
            "reviews": args.reviews,
            "round_trip_us": {"p50": percentile_us(&mut review_times, 50.0), "p99": percentile_us(&mut review_times, 99.0)},
            "per_second_one_connection": round1(args.reviews as f64 / review_total.as_secs_f64()),
            "authenticator_cpu_us": round1(auth_us),
        },
    });
    let _ = std::fs::remove_dir_all(&data_dir);
    for runtime in parts {
        runtime.shutdown_background();
    }
    Ok(result)
}
