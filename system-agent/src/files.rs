//! A plan's files: written atomically with their permissions and owner, directories created,
//! paths removed.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Component, Path},
};

use proto::plan::v1::File;

use crate::record::write_file_atomically;

/// Checks a file entry before anything is written; the message names the path.
pub fn check(file: &File) -> Result<(), String> {
    let path = Path::new(&file.path);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "file {:?}: the path must be absolute and free of '..'",
            file.path
        ));
    }
    if path.parent().is_none() {
        return Err(format!("file {:?}: cannot write the root", file.path));
    }
    permissions(file)?;
    Ok(())
}

/// The mode to give the path: the plan's octal `permissions`, else 0644 (0755 for directories).
fn permissions(file: &File) -> Result<u32, String> {
    if file.permissions.is_empty() {
        return Ok(if file.directory { 0o755 } else { 0o644 });
    }
    let digits = file.permissions.trim_start_matches("0o");
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| {
            format!(
                "file {:?}: permissions {:?} must be octal, e.g. \"0644\"",
                file.path, file.permissions
            )
        })
}

/// Makes the host match one file entry.
pub fn apply(file: &File) -> Result<(), String> {
    check(file)?;
    let path = Path::new(&file.path);
    let fail = |what: &str, e: std::io::Error| format!("file {:?}: {what}: {e}", file.path);
    if file.delete {
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
        return match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(fail("removing", e)),
            _ => Ok(()),
        };
    }
    let mode = permissions(file)?;
    if file.directory {
        std::fs::create_dir_all(path).map_err(|e| fail("creating the directory", e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| fail("setting permissions", e))?;
    } else {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| fail("creating its directory", e))?;
        }
        write_file_atomically(path, &file.content, mode).map_err(|e| fail("writing", e))?;
        // The temp file's mode was filtered by the umask; set it exactly.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| fail("setting permissions", e))?;
    }
    if file.uid.is_some() || file.gid.is_some() {
        std::os::unix::fs::chown(path, file.uid, file.gid)
            .map_err(|e| fail("setting the owner", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_with_their_mode_and_replaced_whole() {
        let dir = crate::testing::tempdir();
        let path = dir.join("etc/k3s/config.yaml");
        let mut file = File {
            path: path.display().to_string(),
            content: b"token: one\n".to_vec(),
            permissions: "0600".into(),
            ..File::default()
        };
        apply(&file).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"token: one\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        file.content = b"token: two\n".to_vec();
        apply(&file).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"token: two\n");
        // No temp file left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["config.yaml"]);

        let sub = dir.join("data");
        apply(&File {
            path: sub.display().to_string(),
            directory: true,
            permissions: "0700".into(),
            ..File::default()
        })
        .unwrap();
        let mode = std::fs::metadata(&sub).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);

        for target in [&path, &sub] {
            apply(&File {
                path: target.display().to_string(),
                delete: true,
                ..File::default()
            })
            .unwrap();
            assert!(!target.exists());
        }
        // Removing what is already gone is fine.
        apply(&File {
            path: path.display().to_string(),
            delete: true,
            ..File::default()
        })
        .unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_entries_are_refused_with_the_path_named() {
        for (path, permissions, expect) in [
            ("relative/x", "", "absolute"),
            ("/etc/../x", "", "absolute"),
            ("/tmp/x", "rw-r--r--", "octal"),
            ("/tmp/x", "17777", "octal"),
        ] {
            let err = check(&File {
                path: path.into(),
                permissions: permissions.into(),
                ..File::default()
            })
            .unwrap_err();
            assert!(err.contains(expect) && err.contains(path), "{err}");
        }
    }
}
