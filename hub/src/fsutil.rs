//! Files that must never be seen half-written: write a temporary file beside the target,
//! flush it to disk, then rename it over the target and flush the directory.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::Path,
};

/// Makes `dir` (created if missing, tightened if it exists) reachable by its owner only: the
/// hub's CA key and store live there, and nothing in it is then readable by another user
/// whatever its own mode.
pub(crate) fn owner_only_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Makes `path` readable and writable by its owner only, if it exists.
pub(crate) fn owner_only_file(path: &Path) -> io::Result<()> {
    match fs::set_permissions(path, fs::Permissions::from_mode(0o600)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Replaces `path` with `data` atomically; the file gets permission bits `mode`.
pub(crate) fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    // A bare file name's parent is "", which cannot be opened to flush: it is ".".
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // `mode` above is filtered by the umask; set it exactly.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(data)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_whole_file_with_the_given_mode() {
        let dir = std::env::temp_dir().join(format!("drover-fsutil-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret.pem");
        write_atomic(&path, b"first version, longer", 0o600).unwrap();
        write_atomic(&path, b"second", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary file left behind"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
