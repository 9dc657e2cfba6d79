//! `drover-sim` as the tests and an operator meet it (and, being an integration test, this
//! makes `cargo test --workspace` build the binary the end-to-end tests run).

#![allow(clippy::unwrap_used)]

#[test]
fn the_stand_in_installer_needs_the_version_as_the_real_one_does() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_drover-sim"))
        .args(["install", "k3s"])
        .env_remove("INSTALL_K3S_VERSION")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("INSTALL_K3S_VERSION"), "{stderr}");
}

#[test]
fn an_unknown_distribution_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_drover-sim"))
        .args(["install", "microk8s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("k3s") && stderr.contains("rke2"),
        "{stderr}"
    );
}
