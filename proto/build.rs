//! Generates the Rust types and gRPC stubs from `proto/` at build time with a vendored
//! `protoc`, so a fresh machine needs nothing installed to build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/drover/tunnel/v1/tunnel.proto",
        "proto/drover/cluster/v1/cluster.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(config, &files, &["proto"])?;
    Ok(())
}
