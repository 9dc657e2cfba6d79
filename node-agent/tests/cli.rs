//! `drover-node-agent` started wrongly, as an operator might. (Being an integration test of
//! this package also makes `cargo test --workspace` build the binary for the end-to-end tests.)

#![allow(clippy::expect_used)]

use std::process::Command;

fn agent(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_drover-node-agent"));
    command.env_clear();
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("run drover-node-agent");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_setting_exits_2_naming_it() {
    let (code, stderr) = agent(&[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("DROVER_NODE_NAME"), "{stderr}");
    let (code, stderr) = agent(&[("DROVER_NODE_NAME", "a/b")]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("no '/'"), "{stderr}");
    // Outside a pod it needs a kubeconfig for the cluster's API server.
    let (code, stderr) = agent(&[("DROVER_NODE_NAME", "node-0")]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("KUBECONFIG"), "{stderr}");
}
