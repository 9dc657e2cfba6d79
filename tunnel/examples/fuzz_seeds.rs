//! Writes the binary seed corpora of the fuzz targets in `fuzz/` (the JSON and text seeds are
//! written by hand): a real agent's opening bytes for `hub_intake`, stream headers for
//! `stream_header`, and a plan shaped like the planner's install plans for `plan_protobuf`.
//!
//! `cargo run -p tunnel --example fuzz_seeds -- fuzz/seeds`

#![allow(clippy::expect_used, clippy::print_stdout)]

use std::path::{Path, PathBuf};

use prost::Message as _;
use proto::{
    plan::v1::{File, Instruction, PeriodicInstruction, Plan, Probe},
    tunnel::v1::{ControlChannel, Dial, ServiceStream, StreamHeader, stream_header::Kind},
};

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).expect("seed directory");
    std::fs::write(dir.join(name), bytes).expect("seed file");
    println!("{target}/{name}: {} bytes", bytes.len());
}

fn header(kind: Kind) -> Vec<u8> {
    StreamHeader { kind: Some(kind) }.encode_length_delimited_to_vec()
}

fn install_plan() -> Plan {
    Plan {
        files: vec![
            File {
                path: "/etc/rancher/k3s/config.yaml".into(),
                content: b"token: abc\nnode-label:\n  - drover.io/host=h1\n".to_vec(),
                permissions: "0600".into(),
                ..File::default()
            },
            File {
                path: "/var/lib/drover/bin".into(),
                directory: true,
                ..File::default()
            },
        ],
        instructions: vec![Instruction {
            name: "install".into(),
            command: "sh".into(),
            args: vec!["-c".into(), "install.sh".into()],
            env: vec!["INSTALL_K3S_SKIP_DOWNLOAD=true".into()],
            save_output: true,
            ..Instruction::default()
        }],
        periodic: vec![PeriodicInstruction {
            instruction: Some(Instruction {
                name: "nodes".into(),
                command: "kubectl".into(),
                args: vec!["get".into(), "nodes".into()],
                ..Instruction::default()
            }),
            period_seconds: 60,
        }],
        probes: vec![Probe {
            name: "kube-apiserver".into(),
            url: "https://127.0.0.1:6443/readyz".into(),
            insecure: true,
            timeout_seconds: 5,
            period_seconds: 5,
            success_threshold: 1,
            failure_threshold: 3,
            ..Probe::default()
        }],
        max_failures: 3,
        ..Plan::default()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("fuzz/seeds"), PathBuf::from);
    write(
        &dir,
        "hub_intake",
        "agent-opening",
        &tunnel::testing::agent_opening().await,
    );
    write(
        &dir,
        "stream_header",
        "dial",
        &header(Kind::Dial(Dial {
            network: "tcp".into(),
            address: "10.0.0.1:6443".into(),
        })),
    );
    write(
        &dir,
        "stream_header",
        "control",
        &header(Kind::Control(ControlChannel {})),
    );
    write(
        &dir,
        "stream_header",
        "service",
        &header(Kind::Service(ServiceStream {
            name: "kube-api".into(),
        })),
    );
    write(
        &dir,
        "plan_protobuf",
        "install",
        &install_plan().encode_to_vec(),
    );
}
