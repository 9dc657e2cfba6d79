//! Compiles Kubernetes' own protobuf schema (`proto/k8s.io`, vendored unchanged) into one
//! descriptor set, with a vendored `protoc`, so the simulated cluster can read and answer
//! protobuf bodies as kube-apiserver does without a hand-written reader per kind.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "k8s.io/api/core/v1/generated.proto",
        "k8s.io/api/apps/v1/generated.proto",
        "k8s.io/api/rbac/v1/generated.proto",
        "k8s.io/api/coordination/v1/generated.proto",
        "k8s.io/api/authorization/v1/generated.proto",
        "k8s.io/api/authentication/v1/generated.proto",
        "k8s.io/api/policy/v1/generated.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("kubernetes.bin");
    let status = std::process::Command::new(protoc_bin_vendored::protoc_bin_path()?)
        .arg("--proto_path=proto")
        .arg("--include_imports")
        .arg(format!("--descriptor_set_out={}", out.display()))
        .args(files)
        .status()?;
    if !status.success() {
        return Err(format!("protoc failed on sim/proto: {status}").into());
    }
    Ok(())
}
