//! What runs on a machine: the host command (as SSH runs it, or as user data), and the
//! system-agent's uninstall.

use crate::model::MachinePool;

/// User data that cloud-init runs as a script at first boot.
pub(super) fn user_data(command: &str) -> String {
    format!("#!/bin/sh\n# Drover: install the system-agent and register with the hub.\n{command}\n")
}

/// Runs the system-agent's uninstall script where the install put it (under `--root DIR`
/// when the template's flags give one), if it is there.
pub(super) fn uninstall_command(install_flags: &[String]) -> String {
    let root = install_flags
        .iter()
        .position(|f| f == "--root")
        .and_then(|i| install_flags.get(i + 1))
        .map_or("", String::as_str);
    let script = format!("{root}/usr/local/bin/drover-system-agent-uninstall.sh");
    format!("if [ -x {0} ]; then {0}; fi", quote(&script))
}

/// `text` as one word for `sh`.
pub(super) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The host command for a machine of `pool`: the hub's install script with the pool's roles,
/// labels and taints, the machine's name as the node name and its address. With
/// `--no-systemd` among the template's flags the agent runs in the foreground, so the command
/// starts it detached (its output in `/var/log/drover-bootstrap.log`).
pub(super) fn host_command(
    server: &str,
    token: &str,
    ca_checksum: &str,
    pool: &MachinePool,
    machine: &str,
    address: Option<&str>,
    install_flags: &[String],
) -> String {
    let mut flags = vec![
        "--server".to_owned(),
        quote(server),
        "--token".to_owned(),
        quote(token),
        "--ca-checksum".to_owned(),
        quote(ca_checksum),
    ];
    for (on, flag) in [
        (pool.roles.etcd, "--etcd"),
        (pool.roles.control_plane, "--controlplane"),
        (pool.roles.worker, "--worker"),
    ] {
        if on {
            flags.push(flag.to_owned());
        }
    }
    flags.extend([
        "--node-name".to_owned(),
        quote(machine),
        "--address".to_owned(),
    ]);
    // A machine whose address is not known when the command is written (a cloud's, booting
    // its user data) takes the one it reaches the network from.
    flags.push(address.map_or_else(
        || r#""$(ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')""#.to_owned(),
        quote,
    ));
    for (k, v) in &pool.labels {
        flags.extend(["--label".to_owned(), quote(&format!("{k}={v}"))]);
    }
    for taint in &pool.taints {
        flags.extend(["--taint".to_owned(), quote(taint)]);
    }
    flags.extend(install_flags.iter().map(|f| quote(f)));
    let install = format!(
        "curl --insecure -fsSL {}/system-agent-install.sh | sh -s - {}",
        quote(server.trim_end_matches('/')),
        flags.join(" ")
    );
    if install_flags.iter().any(|f| f == "--no-systemd") {
        format!(
            "setsid sh -c {} </dev/null >/var/log/drover-bootstrap.log 2>&1 &",
            quote(&install)
        )
    } else {
        install
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn the_host_command_carries_the_pools_roles_and_quotes_every_value() {
        let pool: MachinePool = serde_json::from_value(json!({"name": "w", "quantity": 1,
            "roles": {"etcd": true, "worker": true}, "template": "t",
            "labels": {"rack": "r'1"}, "taints": ["gpu=yes:NoSchedule"]}))
        .unwrap();
        let command = host_command(
            "https://hub:8443",
            "drr_tabc.s3cret",
            "ab12",
            &pool,
            "edge-w-x1y2z",
            Some("10.0.0.5"),
            &[],
        );
        assert_eq!(
            command,
            "curl --insecure -fsSL 'https://hub:8443'/system-agent-install.sh | sh -s - --server 'https://hub:8443' --token 'drr_tabc.s3cret' --ca-checksum 'ab12' --etcd --worker --node-name 'edge-w-x1y2z' --address '10.0.0.5' --label 'rack=r'\\''1' --taint 'gpu=yes:NoSchedule'"
        );
        let detached = host_command(
            "https://hub",
            "t",
            "c",
            &pool,
            "m",
            None,
            &["--no-systemd".into()],
        );
        assert!(detached.starts_with("setsid sh -c 'curl"), "{detached}");
        // No address given: the machine's own, from its route out, in the command's shell.
        assert!(
            detached.contains(r#"--address "$(ip -4 route get 1.1.1.1 |"#),
            "{detached}"
        );
        assert!(
            detached.ends_with(">/var/log/drover-bootstrap.log 2>&1 &"),
            "{detached}"
        );
    }
}
