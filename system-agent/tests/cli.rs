//! The binary as an operator meets it (and, since this is an integration test,
//! `cargo test --workspace` builds `drover-system-agent` for the end-to-end tests).

#![allow(clippy::unwrap_used)]

#[test]
fn without_a_hub_or_local_plans_it_says_what_to_set_and_exits_2() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_drover-system-agent"))
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DROVER_SERVER"), "{stderr}");
}

#[test]
fn a_bad_role_is_named() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_drover-system-agent"))
        .env_clear()
        .env("DROVER_SERVER", "https://hub.example:8443")
        .env("DROVER_ROLES", "etcd,master")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"master\""), "{stderr}");
}
