//! `bench recording`: what recording shell sessions costs a shell. A hub with an imported
//! (simulated) cluster and its real cluster-agent (as `bench proxy` starts them), and
//! `kubectl exec -i … -- sh` through the hub: each `echo` line's round trip to its output,
//! in sessions alternately recorded and not (the setting `session-recording` switched through
//! the API between them), in the same run. Reports each side's median, p90 and max, and the
//! recordings' bytes per line. `--spdy`: kubectl speaks SPDY/3.1, as kubectls before 1.31 do.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{
    explorer_scenario::{kubeconfig, kubectl_exec_round_trips, spread},
    proxy_scenario::setup,
};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Sessions of each kind (recorded, not recorded), alternating.
    #[arg(long, default_value_t = 6)]
    sessions: usize,
    /// Lines sent in each session.
    #[arg(long, default_value_t = 100)]
    lines: usize,
    /// kubectl speaks SPDY/3.1 (as kubectls before 1.31 do) instead of WebSocket.
    #[arg(long)]
    spdy: bool,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let setup = setup(10).await?;
    let measured = measure(&setup, &args).await;
    setup.shutdown.cancel();
    let _ = std::fs::remove_dir_all(&setup.data_dir);
    for runtime in setup.runtimes {
        runtime.shutdown_background();
    }
    measured
}

async fn measure(setup: &crate::proxy_scenario::Setup, args: &Args) -> anyhow::Result<Value> {
    let dir = setup.data_dir.join("recording");
    std::fs::create_dir_all(&dir)?;
    let through_hub = kubeconfig(
        &dir,
        "hub",
        &format!("https://{}/k8s/clusters/prod", setup.hub.addr),
        &setup.hub.token,
    )?;
    setup
        .hub_api
        .call(
            "POST",
            "/v1/settings",
            Some(json!({"metadata": {"name": "session-recording"}, "spec": {"value": "on"}})),
            201,
        )
        .await?;
    let set = |value: &'static str| async move {
        setup
            .hub_api
            .call(
                "PATCH",
                "/v1/settings/session-recording",
                Some(json!({"spec": {"value": value}})),
                200,
            )
            .await
    };
    // A first session of each, not measured: kubectl's and the agent's first connections.
    for value in ["off", "on"] {
        set(value).await?;
        kubectl_exec_round_trips(&through_hub, 5, args.spdy).await?;
    }
    let (mut recorded, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..args.sessions.max(1) {
        set("off").await?;
        plain.extend(kubectl_exec_round_trips(&through_hub, args.lines, args.spdy).await?);
        set("on").await?;
        recorded.extend(kubectl_exec_round_trips(&through_hub, args.lines, args.spdy).await?);
    }
    // The recordings are written as their sessions end.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let list = setup
        .hub_api
        .call("GET", "/v1/recordings", None, 200)
        .await?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let bytes: u64 = items.iter().filter_map(|s| s["bytes"].as_u64()).sum();
    // The recorded sessions: the warm-up's 5 lines, then `lines` in each measured one.
    let lines = (5 + args.sessions.max(1) * args.lines).max(1);
    let median = |v: &Value| v["median"].as_f64().unwrap_or(0.0);
    let (on, off) = (spread(recorded), spread(plain));
    Ok(json!({
        "scenario": "recording",
        "what": "kubectl exec -i … -- sh through the hub: an echo line to its output, sessions alternately recorded and not, same run",
        "carrier": if args.spdy { "SPDY/3.1" } else { "WebSocket" },
        "sessions_each": args.sessions,
        "lines_per_session": args.lines,
        "round_trip_ms": {
            "recorded": on,
            "not_recorded": off,
            "median_difference_ms": crate::health_scenario::round(median(&on) - median(&off), 2),
        },
        "recordings": items.len(),
        "recording_bytes_per_line": crate::health_scenario::round(bytes as f64 / lines as f64, 1),
    }))
}
