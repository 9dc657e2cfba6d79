//! A host that shares its machine with others (`drover-sim host`, a test's hosts, a laptop):
//! a private root directory under which every path a plan names lands, and a loopback address
//! of its own for what the plan's probes and services expect on `127.0.0.1`.
//!
//! The plan itself stays the one a real host gets; [`Root::place`] moves it under the root
//! before it is applied (files, transfers, probes' certificates and URLs), and instructions run
//! with `DROVER_ROOT` (the planner's scripts put it before every path they name),
//! `$DROVER_ROOT/usr/local/bin` first on `PATH`, a temp directory inside the root, and the root
//! as their working directory. What they and everything they start may write is confined to
//! the root by Landlock, so a plan that would write outside it fails with the tool's own error
//! naming the path (`Permission denied`), instead of touching the machine's `/etc`.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use proto::plan::v1::Plan;

/// Where a plan lands: the machine itself (the default), or a root directory and a loopback
/// address of the host's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Root {
    /// Every absolute path of a plan is taken under this directory.
    pub dir: Option<PathBuf>,
    /// What a plan addresses as `127.0.0.1` (probes) is this address (another of 127.0.0.0/8,
    /// so that several hosts on one machine each have their own ports).
    pub loopback: Option<Ipv4Addr>,
}

impl Root {
    /// `plan` as it applies here: its paths under the root, its probes at the loopback address,
    /// its instructions told where the root is.
    pub fn place(&self, mut plan: Plan) -> Plan {
        if *self == Root::default() {
            return plan;
        }
        for file in &mut plan.files {
            file.path = self.path(&file.path);
        }
        for download in &mut plan.downloads {
            download.path = self.path(&download.path);
        }
        for upload in &mut plan.uploads {
            upload.path = self.path(&upload.path);
        }
        for probe in &mut plan.probes {
            probe.url = self.url(&probe.url);
            for path in [
                &mut probe.ca_cert,
                &mut probe.client_cert,
                &mut probe.client_key,
            ] {
                if !path.is_empty() {
                    *path = self.path(path);
                }
            }
        }
        let env = self.env();
        let instructions = plan.instructions.iter_mut().chain(
            plan.periodic
                .iter_mut()
                .filter_map(|p| p.instruction.as_mut()),
        );
        for instruction in instructions {
            // Last, so that the plan's own entries cannot move the root.
            instruction.env.extend(env.iter().cloned());
        }
        plan
    }

    /// An absolute path of a plan, under the root. Paths that are not absolute or that climb
    /// are left alone: the plan's checks refuse them, naming them as the plan gave them.
    fn path(&self, path: &str) -> String {
        let Some(dir) = &self.dir else {
            return path.to_owned();
        };
        match path.strip_prefix('/') {
            Some(rest)
                if !Path::new(rest)
                    .components()
                    .any(|c| c == std::path::Component::ParentDir) =>
            {
                dir.join(rest).display().to_string()
            }
            _ => path.to_owned(),
        }
    }

    /// A probe's URL with `127.0.0.1` (or `localhost`) as the host's own loopback address.
    fn url(&self, url: &str) -> String {
        let Some(address) = self.loopback else {
            return url.to_owned();
        };
        for local in ["127.0.0.1", "localhost"] {
            for scheme in ["http://", "https://"] {
                let prefix = format!("{scheme}{local}");
                if let Some(rest) = url.strip_prefix(&prefix)
                    && (rest.is_empty() || rest.starts_with([':', '/']))
                {
                    return format!("{scheme}{address}{rest}");
                }
            }
        }
        url.to_owned()
    }

    /// What an instruction is told: `DROVER_ROOT` (empty on the machine itself),
    /// `DROVER_LOOPBACK`, and inside a root its `PATH` and `TMPDIR`.
    fn env(&self) -> Vec<String> {
        let mut env = Vec::new();
        match &self.dir {
            None => env.push("DROVER_ROOT=".to_owned()),
            Some(dir) => {
                let path = std::env::var("PATH").unwrap_or_else(|_| {
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
                });
                env.push(format!("DROVER_ROOT={}", dir.display()));
                env.push(format!(
                    "PATH={}:{path}",
                    dir.join("usr/local/bin").display()
                ));
                env.push(format!("TMPDIR={}", dir.join("tmp").display()));
            }
        }
        if let Some(address) = self.loopback {
            env.push(format!("DROVER_LOOPBACK={address}"));
        }
        env
    }

    /// Runs `work` on a thread of its own that, inside a root, may write only beneath it (and
    /// to `/dev/null`); a process started there inherits that, and so does everything it
    /// starts. On the machine itself, `work` runs unconfined.
    pub fn confined<T: Send>(
        &self,
        work: impl FnOnce() -> Result<T, String> + Send,
    ) -> Result<T, String> {
        let Some(dir) = &self.dir else {
            return work();
        };
        // A fresh thread: Landlock confines the thread that asks and what it starts, and this
        // one ends with the work (a pooled thread would stay confined).
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    confine(dir)?;
                    work()
                })
                .join()
                .unwrap_or_else(|_| Err("a confined step panicked".to_owned()))
        })
    }

    /// Makes the root's own directories (the temp directory instructions are given).
    pub fn prepare(&self) -> Result<(), String> {
        if let Some(dir) = &self.dir {
            let tmp = dir.join("tmp");
            std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        }
        Ok(())
    }
}

/// Confines the calling thread's writes to beneath `dir` and to `/dev/null`.
fn confine(dir: &Path) -> Result<(), String> {
    use landlock::{
        ABI, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, path_beneath_rules,
    };
    let fail = |e: &dyn std::fmt::Display| {
        format!(
            "cannot confine the plan to DROVER_ROOT {}: {e}",
            dir.display()
        )
    };
    let write = AccessFs::from_write(ABI::V3);
    let status = Ruleset::default()
        .handle_access(write)
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules([dir], write)))
        .and_then(|r| {
            r.add_rules(path_beneath_rules(
                ["/dev/null"],
                AccessFs::WriteFile | AccessFs::Truncate,
            ))
        })
        .and_then(|r| r.restrict_self())
        .map_err(|e| fail(&e))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(fail(
            &"this kernel has no Landlock (Linux 5.13 or later, with landlock among its security modules), so nothing would keep the plan inside the root",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proto::plan::v1::{File, Instruction, Probe, Upload};

    use super::*;

    fn contained() -> Root {
        Root {
            dir: Some("/srv/host-1".into()),
            loopback: Some(Ipv4Addr::new(127, 0, 0, 11)),
        }
    }

    #[test]
    fn a_plan_is_placed_under_the_root_and_at_the_loopback_address() {
        let plan = Plan {
            files: vec![File {
                path: "/etc/rancher/k3s/config.yaml".into(),
                ..File::default()
            }],
            instructions: vec![Instruction {
                name: "install".into(),
                env: vec!["DROVER_ROOT=/".into()],
                ..Instruction::default()
            }],
            probes: vec![
                Probe {
                    url: "https://127.0.0.1:6443/readyz".into(),
                    ca_cert: "/var/lib/rancher/k3s/server/tls/server-ca.crt".into(),
                    ..Probe::default()
                },
                Probe {
                    url: "http://localhost/healthz".into(),
                    ..Probe::default()
                },
                Probe {
                    url: "http://10.0.0.5:10248/healthz".into(),
                    ..Probe::default()
                },
            ],
            uploads: vec![Upload {
                path: "/var/lib/rancher/k3s/server/db/snapshots/s-*".into(),
                name: "s".into(),
            }],
            ..Plan::default()
        };
        let placed = contained().place(plan.clone());
        assert_eq!(
            placed.files[0].path,
            "/srv/host-1/etc/rancher/k3s/config.yaml"
        );
        assert_eq!(
            placed.uploads[0].path,
            "/srv/host-1/var/lib/rancher/k3s/server/db/snapshots/s-*"
        );
        assert_eq!(placed.probes[0].url, "https://127.0.0.11:6443/readyz");
        assert_eq!(
            placed.probes[0].ca_cert,
            "/srv/host-1/var/lib/rancher/k3s/server/tls/server-ca.crt"
        );
        assert_eq!(placed.probes[1].url, "http://127.0.0.11/healthz");
        assert_eq!(placed.probes[2].url, "http://10.0.0.5:10248/healthz");
        assert!(placed.probes[1].ca_cert.is_empty());
        // The root's word is the last: the plan cannot move it.
        let env = &placed.instructions[0].env;
        let root = env.iter().rev().find(|e| e.starts_with("DROVER_ROOT="));
        assert_eq!(root.map(String::as_str), Some("DROVER_ROOT=/srv/host-1"));
        assert!(
            env.contains(&"TMPDIR=/srv/host-1/tmp".to_owned()),
            "{env:?}"
        );
        assert!(
            env.contains(&"DROVER_LOOPBACK=127.0.0.11".to_owned()),
            "{env:?}"
        );
        assert!(
            env.iter()
                .any(|e| e.starts_with("PATH=/srv/host-1/usr/local/bin:")),
            "{env:?}"
        );

        // On the machine itself the plan is what the hub sent.
        assert_eq!(Root::default().place(plan.clone()), plan);
        // A path that climbs is left for the plan's checks to refuse by its own name.
        let climbing = contained().place(Plan {
            files: vec![File {
                path: "/etc/../x".into(),
                ..File::default()
            }],
            ..Plan::default()
        });
        assert_eq!(climbing.files[0].path, "/etc/../x");
    }

    #[test]
    fn confined_work_writes_inside_the_root_and_nowhere_else() {
        let base = crate::testing::tempdir();
        let (dir, outside) = (base.join("root"), base.join("outside"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let root = Root {
            dir: Some(dir.clone()),
            loopback: None,
        };
        let (inside_file, outside_file) = (dir.join("etc/x"), outside.join("x"));
        let written = root.confined(|| {
            std::fs::create_dir_all(inside_file.parent().unwrap()).map_err(|e| e.to_string())?;
            std::fs::write(&inside_file, "in").map_err(|e| e.to_string())?;
            std::fs::write("/dev/null", "discarded").map_err(|e| e.to_string())?;
            Ok(std::fs::write(&outside_file, "out").map_err(|e| e.to_string()))
        });
        assert_eq!(std::fs::read_to_string(&inside_file).unwrap(), "in");
        let refused = written.unwrap().unwrap_err();
        assert!(refused.contains("Permission denied"), "{refused}");
        assert!(!outside_file.exists());
        // This thread was never confined.
        std::fs::write(&outside_file, "out").unwrap();
        std::fs::remove_dir_all(base).unwrap();
    }
}
