//! Generates the Rust types and gRPC stubs from `proto/` at build time with a vendored
//! `protoc`, so a fresh machine needs nothing installed to build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/drover/tunnel/v1/tunnel.proto",
        "proto/drover/cluster/v1/cluster.proto",
        "proto/drover/plan/v1/plan.proto",
        "proto/drover/health/v1/health.proto",
        "proto/drover/session/v1/session.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // Plans are also JSON for people (the hub's API, a host's local plan directory): camelCase,
    // every field optional, nothing unknown accepted, bytes as base64, enums by name.
    let messages = [
        "Plan",
        "File",
        "Instruction",
        "PeriodicInstruction",
        "Probe",
        "Upload",
        "Download",
        "InstructionResult",
        "ProbeStatus",
        "PlanStatus",
        "InstructionProgress",
    ];
    let mut builder = tonic_prost_build::configure()
        .codec_path("crate::codec::LeanCodec")
        // Maps compare and print in key order (a bundle's labels, images and variables).
        .btree_map(".drover.cluster.v1");
    for message in messages {
        builder = builder.message_attribute(
            format!(".drover.plan.v1.{message}"),
            "#[derive(serde::Serialize, serde::Deserialize)] \
             #[serde(rename_all = \"camelCase\", default, deny_unknown_fields)]",
        );
    }
    builder = builder
        .field_attribute(
            ".drover.plan.v1.File.content",
            "#[serde(with = \"crate::json::base64_bytes\")]",
        )
        .field_attribute(
            ".drover.plan.v1.PlanStatus.state",
            "#[serde(with = \"crate::json::plan_state\")]",
        );
    builder.compile_with_config(config, &files, &["proto"])?;

    // The hub's etcd store is an etcd client only; agents never build it.
    if std::env::var_os("CARGO_FEATURE_ETCD").is_some() {
        let file = "proto/etcd/etcd.proto";
        println!("cargo:rerun-if-changed={file}");
        let mut config = prost_build::Config::new();
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
        tonic_prost_build::configure()
            .build_server(false)
            .compile_with_config(config, &[file], &["proto"])?;
    }
    Ok(())
}
