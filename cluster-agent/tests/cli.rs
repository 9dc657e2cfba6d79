//! `drover-cluster-agent` started wrongly, as an operator might. (Being an integration test of
//! this package also makes `cargo test --workspace` build the binary for the end-to-end tests.)

#![allow(clippy::expect_used)]

use std::process::Command;

fn agent(env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_drover-cluster-agent"));
    command.env_clear();
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("run drover-cluster-agent")
}

#[test]
fn without_a_cluster_to_talk_to_it_exits_2_saying_what_to_set() {
    let out = agent(&[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("KUBECONFIG"), "{stderr}");
}
