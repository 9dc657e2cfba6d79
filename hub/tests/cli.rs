//! The `drover-hub` command line as a user meets it. (Being an integration test of this
//! package also makes `cargo test --workspace` build the binary for the end-to-end tests.)

#![allow(clippy::expect_used)]

use std::process::Command;

fn hub(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_drover-hub"));
    command.args(args).env_remove("DROVER_LISTEN");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("run drover-hub")
}

#[test]
fn a_bad_listen_address_exits_2_naming_the_flag_and_the_variable() {
    let out = hub(&["serve"], &[("DROVER_LISTEN", "8443")]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--listen") && stderr.contains("DROVER_LISTEN"),
        "{stderr}"
    );
}

#[test]
fn help_lists_the_serve_flags_and_exits_0() {
    let out = hub(&["serve", "--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for flag in ["--data-dir", "--listen", "--server-url"] {
        assert!(stdout.contains(flag), "{flag} missing from:\n{stdout}");
    }
}
