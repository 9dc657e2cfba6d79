//! Machine drivers against the real things. The `ssh` driver (docker-machine's "generic"):
//! OpenSSH's client to a real `sshd` (Debian's openssh-server) in a network-namespace host, key
//! authentication only: a command runs and its host key is recorded at first contact; from then
//! on only that key is accepted, so a rebuilt machine (new host key) is refused, not trusted; a
//! key the machine does not authorise and a machine not listening fail with errors that say so.
//! Needs root (CI runs as root); skipped, saying so, otherwise.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::time::Duration;

use drivers::ssh::{PrivateKey, SshError, Target, run};
use tests::{
    hosts::{Host, Network, is_root},
    sshd::{KeyPair, Sshd},
    temp_dir,
};

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn ssh_runs_commands_with_the_host_key_pinned_and_refuses_a_changed_one() {
    if !is_root() {
        eprintln!("SKIPPED: sshd in a network namespace needs root (CI runs as root)");
        return;
    }
    let dir = temp_dir("machines-ssh");
    let _net = Network::new(1);
    let host = Host::new(&dir, 1);
    let client = KeyPair::new(&dir, "client");
    let mut sshd = Sshd::start(&host, &client);
    let target = Target {
        address: sshd.address.clone(),
        port: 22,
        user: "root".into(),
    };
    let key = PrivateKey::new(client.private.clone());

    // First contact: the command runs (in the host's own network namespace), its input and
    // exit code come back, and the key the machine presented is recorded.
    let first = run(
        &target,
        &key,
        None,
        "read line; echo \"got $line\"; ip -4 -o addr show | grep -c 10.213.0.11; exit 3",
        b"hello\n",
        TIMEOUT,
    )
    .await
    .unwrap();
    assert_eq!(first.stdout, "got hello\n1\n");
    assert_eq!(first.exit_code, 3);
    assert_eq!(first.host_key, sshd.recorded_key());

    // Pinned: the same key is accepted.
    let again = run(
        &target,
        &key,
        Some(&first.host_key),
        "echo ok",
        b"",
        TIMEOUT,
    )
    .await
    .unwrap();
    assert_eq!((again.stdout.as_str(), again.exit_code), ("ok\n", 0));

    // A key the machine does not authorise.
    let stranger = PrivateKey::new(KeyPair::new(&dir, "stranger").private);
    let refused = run(
        &target,
        &stranger,
        Some(&first.host_key),
        "echo no",
        b"",
        TIMEOUT,
    )
    .await;
    assert_eq!(refused, Err(SshError::AuthRefused(target.address.clone())));

    // The machine comes back with another host key: refused, nothing run.
    sshd.rebuild(&host);
    assert_ne!(sshd.recorded_key(), first.host_key);
    let changed = run(
        &target,
        &key,
        Some(&first.host_key),
        "touch /tmp/ran",
        b"",
        TIMEOUT,
    )
    .await;
    assert!(
        matches!(&changed, Err(SshError::HostKeyChanged { .. })),
        "{changed:?}"
    );
    assert!(
        changed
            .unwrap_err()
            .to_string()
            .contains("not the one recorded")
    );

    // Nothing listening.
    sshd.stop();
    let down = run(&target, &key, Some(&first.host_key), "true", b"", TIMEOUT).await;
    assert!(
        matches!(&down, Err(SshError::Unreachable(_, why)) if why.contains("refused")),
        "{down:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
