//! `drover-hub cluster watch NAME`: a custom cluster's provisioning as lines, as they happen:
//! the cluster's and each host's state when it changes, and the running step's output as the
//! host's agent reports it (like `kubectl logs -f`). Ends once the cluster is active.

use std::collections::HashMap;

use serde_json::Value;

use super::{CliError, Saved, connection::Client, refused, render::text};

/// How often the hub is asked: its agents report a running step's output every two seconds.
const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What has been said of one host.
#[derive(Debug, Default)]
struct Said {
    state: String,
    /// The running step (name and start) whose output was shown, and that output.
    step: (String, String),
    output: String,
}

/// Watches cluster `name` until it is active (the lines go to stdout as they come).
pub(super) async fn run(client: &Client, saved: &Saved, name: &str) -> Result<String, CliError> {
    let mut cluster_said = String::new();
    let mut hosts_said: HashMap<String, Said> = HashMap::new();
    loop {
        let cluster = get(client, saved, &format!("/v1/clusters/{name}")).await?;
        let hosts = get(client, saved, "/v1/hosts").await?;
        // Plans are for the cluster's owners: others see the hosts' states only.
        let plans = get(client, saved, "/v1/plans").await.unwrap_or(Value::Null);
        let mut lines = Vec::new();
        let mut mine: Vec<&Value> = hosts["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|h| h["spec"]["cluster"] == name)
            .collect();
        mine.sort_by_key(|h| text(&h["spec"]["nodeName"]));
        for host in mine {
            let id = text(&host["metadata"]["name"]);
            let label = match text(&host["spec"]["nodeName"]) {
                node if node.is_empty() => id.clone(),
                node => node,
            };
            let said = hosts_said.entry(id.clone()).or_default();
            let state = state_line(host);
            if state != said.state {
                lines.push(format!("{label}: {state}"));
                said.state = state;
            }
            let plan = plans["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["metadata"]["name"] == id.as_str());
            let current = plan.map_or(&Value::Null, |p| &p["status"]["current"]);
            if current.is_object() {
                let step = (text(&current["name"]), text(&current["startedAt"]));
                if step != said.step {
                    said.step = step;
                    said.output.clear();
                }
                let output = text(&current["output"]);
                for line in new_lines(&said.output, &output) {
                    lines.push(format!("{label} | {line}"));
                }
                said.output = output;
            }
        }
        let state = state_line(&cluster);
        if state != cluster_said {
            lines.push(format!("cluster {name}: {state}"));
            cluster_said = state;
        }
        if !lines.is_empty() {
            #[allow(clippy::print_stdout)]
            {
                println!("{}", lines.join("\n"));
            }
        }
        if cluster["state"]["state"] == "active" {
            return Ok(String::new());
        }
        tokio::time::sleep(EVERY).await;
    }
}

async fn get(client: &Client, saved: &Saved, path: &str) -> Result<Value, CliError> {
    let (status, bytes) = client.send("GET", path, Some(&saved.token), None).await?;
    if !(200..300).contains(&status) {
        return Err(refused(status, &bytes));
    }
    serde_json::from_slice(&bytes).map_err(|e| CliError::Refused(format!("unreadable answer: {e}")))
}

/// An object's state and its message, as one line.
fn state_line(object: &Value) -> String {
    let (state, message) = (
        text(&object["state"]["state"]),
        text(&object["state"]["message"]),
    );
    if message.is_empty() {
        state
    } else {
        format!("{state} — {message}")
    }
}

/// The lines of `now` that were not in `before`: both are the tail of one growing output, so
/// `now` continues `before` from where some suffix of it begins.
fn new_lines<'a>(before: &str, now: &'a str) -> Vec<&'a str> {
    let old: Vec<&str> = before.lines().collect();
    let new: Vec<&'a str> = now.lines().collect();
    // The longest end of `old` that `new` starts with is what was shown already.
    let shown = (0..=old.len().min(new.len()))
        .rev()
        .find(|&k| old[old.len() - k..] == new[..k])
        .unwrap_or(0);
    new[shown..]
        .iter()
        .copied()
        .filter(|l| !l.trim().is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::new_lines;

    #[test]
    fn only_the_lines_not_shown_before_are_printed() {
        assert_eq!(new_lines("", "a\nb\n"), ["a", "b"]);
        assert_eq!(new_lines("a\nb\n", "a\nb\nc\n"), ["c"]);
        // The tail moved on: its first lines dropped out of the window.
        assert_eq!(new_lines("a\nb\nc\n", "b\nc\nd\ne\n"), ["d", "e"]);
        assert_eq!(new_lines("a\nb\n", "a\nb\n"), Vec::<&str>::new());
        // Nothing in common: all of it is new.
        assert_eq!(new_lines("x\n", "y\nz\n"), ["y", "z"]);
    }
}
