//! Where a part's CPU goes, by stage of a proxied request: `perf record` samples this process
//! while the proxy is under load, and each sample of a part's threads (`bench-hub`,
//! `bench-agent`) is put in a stage by the function it was in (TLS, HTTP, the hub's
//! authentication, authorisation, audit and impersonation, the tunnel, the runtime, memory
//! allocation and copies, the kernel's networking and scheduling). A sample is counted where it
//! was taken, not in its callers: an allocation made to parse a header is "allocation", not
//! "HTTP". Needs `perf` (Debian's `linux-perf`) and the right to sample (root, or
//! `kernel.perf_event_paranoid` ≤ 1); without them the breakdown says why it is missing.

use std::{collections::BTreeMap, path::Path, process::Stdio};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// The stages, each with the text that puts a function in it; the first match wins, so the
/// hub's own stages come before the libraries they call.
const STAGES: [(&str, &[&str]); 13] = [
    ("kernel (TCP, syscalls, scheduling)", &["[k] "]),
    (
        "authentication (token lookup)",
        &[
            "hub::auth::known",
            "hub::auth::principal",
            "hub::auth::credential",
            "hub::auth::secret",
            "shared_principal",
        ],
    ),
    (
        "authorisation",
        &[
            "hub::auth::rights",
            "hub::proxy::authorize",
            "hub::proxy::read_only",
            "hub::proxy::reads",
        ],
    ),
    ("audit record", &["hub::audit"]),
    (
        "impersonation headers",
        &["hub::proxy::forwarded", "hub::proxy::impersonat"],
    ),
    (
        "proxy and routing (hub, axum, tower)",
        &["hub::", "axum::", "tower::", "tower_http::", "matchit::"],
    ),
    (
        "TLS (rustls, crypto)",
        &[
            "rustls::", "ring::", "aws_lc", "gcm", "aes", "chacha", "poly1305", "sha256", "sha512",
        ],
    ),
    (
        "HTTP parsing and writing (hyper, headers)",
        &["hyper::", "hyper_util::", "httparse::", "http::", "h2::"],
    ),
    (
        "tunnel (yamux, streams)",
        &["yamux::", "tunnel::", "cluster_agent::"],
    ),
    (
        "allocation",
        &[
            "malloc",
            "=free",
            "__libc_free",
            "cfree",
            "realloc",
            "calloc",
            "__rust_alloc",
            "__rust_dealloc",
            "alloc::raw_vec",
            "alloc::alloc",
            "_int_",
            "tcache",
            // mimalloc, every Drover binary's allocator: `mi_free`, `_mi_free_generic`,
            // `_mi_page_malloc_zero`, `mi_page_queue_find_free_ex`, …
            "mi_free",
            "_mi_",
            "mi_page",
            "mi_heap",
        ],
    ),
    (
        "memory copy and zeroing",
        &["memcpy", "memmove", "memset", "bytes::"],
    ),
    (
        "async runtime (tokio, wakeups, locks)",
        &[
            "tokio::",
            "futures",
            "parking_lot",
            "std::sync",
            "pthread",
            "__lll_",
            "syscall",
            "epoll",
        ],
    ),
    ("other", &[""]),
];

/// The stage a sampled function is in (`symbol` as perf prints it: `[.] name` or
/// `[k] name`). A mark is text the name holds, or with `=` the whole name.
fn stage_of(symbol: &str) -> &'static str {
    let name = symbol.get(4..).unwrap_or("");
    let fits = |mark: &&str| match mark.strip_prefix('=') {
        Some(whole) => name == whole,
        None => symbol.contains(mark),
    };
    STAGES
        .iter()
        .find(|(_, marks)| marks.iter().any(fits))
        .map_or("other", |(stage, _)| stage)
}

/// A `perf record` of this process under way.
pub(crate) struct Sampling {
    child: tokio::process::Child,
    file: std::path::PathBuf,
}

/// Starts sampling this process (999 times a second, user and kernel) into `dir`.
pub(crate) async fn start(dir: &Path) -> anyhow::Result<Sampling> {
    let file = dir.join("perf.data");
    let mut child = tokio::process::Command::new("perf")
        .args(["record", "-q", "-F", "999", "-p"])
        .arg(std::process::id().to_string())
        .arg("-o")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting perf (Debian's linux-perf) to sample the proxy's stages")?;
    // perf says nothing when it has started; give it a moment, and fail if it already ended.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    if let Some(status) = child.try_wait()? {
        let mut why = String::new();
        if let Some(mut err) = child.stderr.take() {
            tokio::io::AsyncReadExt::read_to_string(&mut err, &mut why).await?;
        }
        bail!("perf record ended at once ({status}): {}", why.trim());
    }
    Ok(Sampling { child, file })
}

impl Sampling {
    /// Stops sampling and returns each part's share of its own samples by stage.
    pub(crate) async fn stop(
        mut self,
        parts: &[&str],
    ) -> anyhow::Result<BTreeMap<String, BTreeMap<&'static str, f64>>> {
        let id = self.child.id().context("perf already ended")?;
        // perf record writes its file when interrupted.
        let interrupted = tokio::process::Command::new("kill")
            .args(["-INT", &id.to_string()])
            .status()
            .await?;
        anyhow::ensure!(interrupted.success(), "could not stop perf record");
        let _ = self.child.wait().await?;
        let report = tokio::process::Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "-q",
                "--sort",
                "comm,sym",
                "--percent-limit",
                "0",
                "-i",
            ])
            .arg(&self.file)
            .output()
            .await?;
        let _ = std::fs::remove_file(&self.file);
        anyhow::ensure!(
            report.status.success(),
            "perf report: {}",
            String::from_utf8_lossy(&report.stderr).trim()
        );
        Ok(shares(&String::from_utf8_lossy(&report.stdout), parts))
    }
}

/// Each part's stages as shares of the part's samples, from `perf report`'s lines
/// (`  12.34%  bench-hub  [.] symbol`).
fn shares(report: &str, parts: &[&str]) -> BTreeMap<String, BTreeMap<&'static str, f64>> {
    let mut out: BTreeMap<String, BTreeMap<&'static str, f64>> = BTreeMap::new();
    for line in report.lines() {
        let mut words = line.split_whitespace();
        let (Some(percent), Some(comm)) = (words.next(), words.next()) else {
            continue;
        };
        let Some(percent) = percent
            .strip_suffix('%')
            .and_then(|p| p.parse::<f64>().ok())
        else {
            continue;
        };
        // The hub's audit writer is the hub's too.
        let Some(part) = crate::proxy_scenario::part_of(comm).filter(|p| parts.contains(p)) else {
            continue;
        };
        let symbol = words.collect::<Vec<_>>().join(" ");
        // All the writer does is the audit log, whatever function it is in.
        let stage = if comm == hub::audit::WRITER_THREAD {
            "audit record"
        } else {
            stage_of(&symbol)
        };
        *out.entry(part.to_owned())
            .or_default()
            .entry(stage)
            .or_default() += percent;
    }
    for stages in out.values_mut() {
        let total: f64 = stages.values().sum();
        if total > 0.0 {
            for share in stages.values_mut() {
                *share /= total;
            }
        }
    }
    out
}

/// A part's CPU per request split by its stages' shares, in µs, largest first.
pub(crate) fn breakdown(shares: &BTreeMap<&'static str, f64>, us_per_request: f64) -> Value {
    let mut stages: Vec<(&str, f64)> = shares.iter().map(|(s, share)| (*s, *share)).collect();
    stages.sort_by(|a, b| b.1.total_cmp(&a.1));
    Value::Array(
        stages
            .into_iter()
            .map(|(stage, share)| {
                json!({
                    "stage": stage,
                    "us_per_request": crate::proxy_scenario::round1(share * us_per_request),
                    "share": (share * 1000.0).round() / 1000.0,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_fall_in_their_stage_and_parts_are_kept_apart() {
        let report = "\
    20.00%  bench-hub    [k] tcp_sendmsg
    10.00%  bench-hub    [.] rustls::conn::ConnectionCommon<T>::read_tls
    10.00%  bench-hub    [.] <hyper::proto::h1::role::Server as hyper::proto::h1::Http1Transaction>::parse
     5.00%  bench-hub    [.] hub::audit::layer::{{closure}}
     3.00%  bench-hub    [.] malloc
     1.00%  bench-hub    [.] free
     1.00%  bench-hub    [.] mi_free
    25.00%  audit-log    [.] serde_json::ser::format_escaped_str
    30.00%  bench-agent  [.] yamux::connection::Connection<T>::poll_next_inbound
     5.00%  bench-agent  [.] __memmove_avx_unaligned_erms
     5.00%  bench-agent  [.] bytes::bytes_mut::BytesMut::freeze
    10.00%  tokio-rt-wor [.] hyper::client::conn
";
        let got = shares(report, &["hub", "agent"]);
        let hub = &got["hub"];
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // The hub's 75 %: its runtime's threads' 50 and the audit writer's 25.
        assert!(
            close(hub["kernel (TCP, syscalls, scheduling)"], 20.0 / 75.0),
            "{hub:?}"
        );
        assert!(close(hub["TLS (rustls, crypto)"], 10.0 / 75.0));
        assert!(close(
            hub["HTTP parsing and writing (hyper, headers)"],
            10.0 / 75.0
        ));
        assert!(close(hub["audit record"], 30.0 / 75.0));
        assert!(close(hub["allocation"], 5.0 / 75.0));
        let agent = &got["agent"];
        assert!(close(agent["tunnel (yamux, streams)"], 0.75), "{agent:?}");
        assert!(close(agent["memory copy and zeroing"], 0.25));
        assert_eq!(got.len(), 2, "the client's threads are not a part");
    }
}
