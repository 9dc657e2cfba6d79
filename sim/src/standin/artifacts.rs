//! The stand-in distribution as a hub's air-gap artifacts: what `install-source` = `hub` makes
//! hosts fetch (the distribution's binary or tarball, its images and its install script, and
//! the agents' image archives), with the binary and the script being `drover-sim`'s stand-ins.

use std::path::{Path, PathBuf};

use super::{Distribution, binary_script};

/// The distribution a version names: RKE2's carry `+rke2r`, K3s's `+k3s`.
pub fn distribution_of(version: &str) -> Distribution {
    if version.contains("+rke2") {
        Distribution::Rke2
    } else {
        Distribution::K3s
    }
}

/// Writes the stand-in's artifacts for `version` into `artifacts` (a hub's
/// `<data-dir>/artifacts`), as `sim` (this `drover-sim` binary) runs them; returns the files
/// written. The agents' image archives are stand-ins too: the stand-in runs the agents from
/// the binaries beside `sim`.
pub fn write(artifacts: &Path, version: &str, sim: &Path) -> Result<Vec<PathBuf>, String> {
    let dist = distribution_of(version);
    let install = format!(
        "#!/bin/sh\nexec {} install {}\n",
        sim.display(),
        dist.name()
    );
    let files: Vec<(String, Vec<u8>)> = match dist {
        Distribution::K3s => vec![
            ("k3s".into(), binary_script(dist, sim, version).into_bytes()),
            ("k3s-airgap-images-amd64.tar.zst".into(), b"images".to_vec()),
            ("k3s-install.sh".into(), install.into_bytes()),
        ],
        Distribution::Rke2 => vec![
            (
                "rke2.linux-amd64.tar.gz".into(),
                b"the stand-in writes its own binary".to_vec(),
            ),
            ("rke2-images.linux-amd64.tar.zst".into(), b"images".to_vec()),
            ("sha256sum-amd64.txt".into(), b"checksums".to_vec()),
            ("rke2-install.sh".into(), install.into_bytes()),
        ],
    };
    let mut written = Vec::new();
    let mut write = |dir: PathBuf, name: String, bytes: Vec<u8>| {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
        Ok::<(), String>(())
    };
    for (name, bytes) in files {
        write(artifacts.join(version), name, bytes)?;
    }
    for image in ["cluster-agent", "node-agent"] {
        write(
            artifacts.join("drover"),
            format!("drover-{image}-{}-amd64.oci.tar", env!("CARGO_PKG_VERSION")),
            format!("{image} image").into_bytes(),
        )?;
    }
    Ok(written)
}
