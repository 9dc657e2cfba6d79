//! The cluster's facts the hub shows (version, nodes, capacity): the version from the API
//! server, the nodes from the agent's watch-driven cache (no list of every node each time),
//! reported over the control channel at connect and then every half minute.

use std::time::Duration;

use proto::cluster::v1::{ClusterFacts, cluster_agent_client::ClusterAgentClient};
use serde_json::Value;
use tunnel::AgentSession;

use crate::cache::Caches;

/// How often facts are reported after the first time.
const EVERY: Duration = Duration::from_secs(30);

/// A Kubernetes quantity (`500m`, `4`, `16Gi`, `8000Mi`, `1e3`), scaled by `unit` (1000 for
/// millicores, 1 for bytes).
pub(crate) fn quantity(text: &str, unit: f64) -> Option<f64> {
    let text = text.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suffix, factor) in suffixes {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<f64>().ok().map(|n| n * factor * unit);
        }
    }
    text.parse::<f64>().ok().map(|n| n * unit)
}

pub(crate) async fn collect(
    client: &::kube::Client,
    caches: &Caches,
    ca_pem: &str,
) -> Result<ClusterFacts, String> {
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| format!("GET /version: {e}"))?;
    let items = caches.nodes().await.map_err(|e| e.to_string())?;
    let ready = items
        .iter()
        .filter(|n| {
            n.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        })
        .count();
    let sum = |field: &str, unit: f64| -> u64 {
        items
            .iter()
            .filter_map(|n| {
                n.pointer(&format!("/status/capacity/{field}"))
                    .and_then(Value::as_str)
            })
            .filter_map(|q| quantity(q, unit))
            .sum::<f64>() as u64
    };
    Ok(ClusterFacts {
        kubernetes_version: version.git_version,
        nodes_total: items.len() as u32,
        nodes_ready: ready as u32,
        cpu_millicores: sum("cpu", 1000.0),
        memory_bytes: sum("memory", 1.0),
        ca_pem: ca_pem.to_owned(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
    })
}

/// Reports facts for the life of `session`.
pub(crate) async fn report(
    session: AgentSession,
    kube: ::kube::Client,
    caches: Caches,
    ca_pem: String,
) {
    let mut hub = ClusterAgentClient::new(session.channel.clone());
    loop {
        match collect(&kube, &caches, &ca_pem).await {
            Ok(facts) => {
                if let Err(e) = hub.report_facts(facts).await {
                    tracing::warn!(error = %e, "the hub did not take the cluster's facts");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the cluster's facts"),
        }
        tokio::select! {
            _ = session.session.ended() => return,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::quantity;

    #[test]
    fn quantities_scale_as_kubernetes_writes_them() {
        assert_eq!(quantity("4", 1000.0), Some(4000.0));
        assert_eq!(quantity("500m", 1000.0), Some(500.0));
        assert_eq!(quantity("16Gi", 1.0), Some(16.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("8000Mi", 1.0), Some(8000.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("2k", 1.0), Some(2000.0));
        assert_eq!(quantity("lots", 1.0), None);
    }
}
