//! GitRepos: the leader reads each repository with `git` (Debian's), every polling interval or
//! at once when its webhook is called, and turns each of its paths at the commit it found into
//! a Bundle (`GITREPO` for the whole repository, `GITREPO-PATH` for a path).
//!
//! - **Reading.** One bare mirror per GitRepo in the hub's data directory, fetched
//!   (`git fetch`), the commit checked out into a scratch tree. Secrets never reach a command
//!   line or a log: an HTTPS login is given to git by an askpass script reading the git
//!   process's own environment; an SSH key is written for the one command (0600, in a 0700
//!   directory, removed after), with the credential's `knownHosts` as the only hosts trusted
//!   (`StrictHostKeyChecking=yes`). An HTTPS remote is verified against the credential's
//!   `caBundle` when it has one (a private server's CA), else the system's CAs.
//! - **A path** holds YAML and JSON manifests (any depth; files that are not regular files,
//!   symlinks among them, are skipped) and an optional `drover.yaml`. A `Chart.yaml` is refused:
//!   Helm charts are not rendered.
//! - **Failures** say which step and git's own words, and are tried again after 5 s, doubling
//!   up to the polling interval.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::content;
use crate::{
    model::{
        BundleSpec, CloudCredentialSpec, Customization, GitCredential, GitRepoSpec, Kind, Rollout,
        interval,
    },
    store::{LabelSelector, Modifier, Object, Op, Store, StoreError},
};

/// On each bundle made from a GitRepo: the GitRepo, and the commit it was made from.
pub const GITREPO_LABEL: &str = "drover.io/gitrepo";
pub const COMMIT_ANNOTATION: &str = "drover.io/commit";
/// Set by the webhook: a fetch is wanted now.
pub const WEBHOOK_ANNOTATION: &str = "drover.io/webhook-at";
/// The most a path's manifests may hold.
const MAX_BUNDLE_BYTES: u64 = 64 << 20;
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
const FIRST_RETRY: Duration = Duration::from_secs(5);

/// A path's `drover.yaml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathOptions {
    #[serde(default)]
    pub default_namespace: String,
    #[serde(default)]
    pub depends_on: Vec<String>,
    #[serde(default)]
    pub customizations: Vec<Customization>,
    #[serde(default)]
    pub correct_drift: bool,
    #[serde(default)]
    pub rollout: Option<Rollout>,
}

/// One path's bundle, as read from a checkout.
#[derive(Debug, Clone)]
pub struct PathBundle {
    pub name: String,
    pub objects: Vec<Value>,
    pub options: PathOptions,
}

/// The bundle name of `path` of GitRepo `repo`.
pub fn bundle_name(repo: &str, path: &str) -> Result<String, String> {
    let path = path.trim_matches('/');
    if path.is_empty() || path == "." {
        return Ok(repo.to_owned());
    }
    let slug: String = path
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let slug = slug
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    let name = format!("{repo}-{slug}");
    crate::model::validate_name(Kind::Bundle, &name)
        .map(|()| name.clone())
        .map_err(|_| format!("path {path:?} makes the bundle name {name:?}, which is not a valid name (at most 63 lowercase letters, digits and '-'): use a shorter GitRepo name or path"))
}

/// The bundles of `paths` in the checkout at `tree`.
pub fn read_paths(repo: &str, tree: &Path, paths: &[String]) -> Result<Vec<PathBundle>, String> {
    let defaults = [".".to_owned()];
    let paths = if paths.is_empty() {
        &defaults[..]
    } else {
        paths
    };
    let mut out = Vec::new();
    for path in paths {
        let dir = tree.join(path.trim_start_matches("./"));
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            return Err(format!(
                "path {path:?}: there is no such directory in the repository"
            ));
        }
        let mut files = Vec::new();
        collect_files(&dir, &mut files).map_err(|e| format!("path {path:?}: {e}"))?;
        files.sort();
        if let Some(chart) = files
            .iter()
            .find(|f| f.file_name().is_some_and(|n| n == "Chart.yaml"))
        {
            return Err(format!(
                "path {path:?} holds a Helm chart ({}): the hub does not render Helm charts (no renderer can be had for it); commit the rendered manifests instead",
                chart.strip_prefix(tree).unwrap_or(chart).display()
            ));
        }
        let mut options = PathOptions::default();
        let mut objects = Vec::new();
        let mut bytes = 0u64;
        for file in &files {
            let shown = file
                .strip_prefix(tree)
                .unwrap_or(file)
                .display()
                .to_string();
            let text = std::fs::read_to_string(file).map_err(|e| format!("{shown}: {e}"))?;
            bytes += text.len() as u64;
            if bytes > MAX_BUNDLE_BYTES {
                return Err(format!(
                    "path {path:?}: its manifests pass {} MiB",
                    MAX_BUNDLE_BYTES >> 20
                ));
            }
            if file.file_name().is_some_and(|n| n == "drover.yaml") {
                if file.parent() != Some(dir.as_path()) {
                    // Read as a manifest it would fail for want of a kind: say what it is.
                    return Err(format!(
                        "{shown}: a drover.yaml is read only at the top of a path, and path {path:?} starts above it; name its directory in spec.paths to make it a bundle of its own"
                    ));
                }
                options = serde_saphyr::from_str(&text).map_err(|e| format!("{shown}: {e}"))?;
                continue;
            }
            objects.extend(content::parse_manifests(&text).map_err(|e| format!("{shown}: {e}"))?);
        }
        if objects.is_empty() {
            return Err(format!(
                "path {path:?}: no Kubernetes objects in its YAML or JSON files"
            ));
        }
        out.push(PathBundle {
            name: bundle_name(repo, path)?,
            objects,
            options,
        });
    }
    Ok(out)
}

/// Regular `.yaml`, `.yml` and `.json` files under `dir`, skipping hidden entries and anything
/// that is not a regular file or directory (a symlink could point out of the repository).
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let kind = entry.file_type()?;
        let path = entry.path();
        if kind.is_dir() {
            collect_files(&path, out)?;
        } else if kind.is_file()
            && path
                .extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
            || kind.is_file() && name == "Chart.yaml"
        {
            out.push(path);
        }
    }
    Ok(())
}

/// A step that failed: which, and git's own words.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure(pub String);

/// Runs git with `args` in `env`; its stdout, or which step failed and git's stderr.
async fn git(step: &str, args: &[&str], env: &[(String, String)]) -> Result<String, Failure> {
    let output = tokio::process::Command::new("git")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| {
            Failure(format!(
                "{step}: cannot run git ({e}); install git on the hub's machine"
            ))
        })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let said: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    Err(Failure(format!("{step}: {}", said.join(" / "))))
}

/// What git needs to reach the repository: its environment, and the files to remove after.
struct Access {
    env: Vec<(String, String)>,
    scratch: Option<PathBuf>,
}

impl Drop for Access {
    fn drop(&mut self) {
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn ssh_url(repo: &str) -> bool {
    repo.starts_with("ssh://") || (!repo.contains("://") && repo.contains('@'))
}

fn access(
    repo: &str,
    credential: Option<&GitCredential>,
    scratch: &Path,
) -> Result<Access, Failure> {
    use std::os::unix::fs::PermissionsExt;
    let mut access = Access {
        env: Vec::new(),
        scratch: None,
    };
    let Some(credential) = credential else {
        if ssh_url(repo) {
            return Err(Failure("credential: an SSH remote needs a git credential with the host's key pinned (spec.git.knownHosts)".into()));
        }
        return Ok(access);
    };
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch)
        .and_then(|()| std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| {
            Failure(format!(
                "credential: cannot make {}: {e}",
                scratch.display()
            ))
        })?;
    access.scratch = Some(scratch.to_owned());
    let write = |name: &str, text: &str, mode: u32| -> Result<PathBuf, Failure> {
        let path = scratch.join(name);
        std::fs::write(&path, text)
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)))
            .map_err(|e| Failure(format!("credential: cannot write {}: {e}", path.display())))?;
        Ok(path)
    };
    if ssh_url(repo) {
        if credential.known_hosts.trim().is_empty() {
            return Err(Failure("credential: an SSH remote needs its host's key pinned in the credential's spec.git.knownHosts (ssh-keyscan prints it)".into()));
        }
        let known = write("known_hosts", &credential.known_hosts, 0o600)?;
        let mut command = format!(
            "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile={} -o GlobalKnownHostsFile=/dev/null",
            known.display()
        );
        if !credential.private_key.is_empty() {
            let mut key = credential.private_key.trim().to_owned();
            key.push('\n');
            let key = write("key", &key, 0o600)?;
            command.push_str(&format!(" -o IdentitiesOnly=yes -i {}", key.display()));
        }
        access.env.push(("GIT_SSH_COMMAND".into(), command));
        return Ok(access);
    }
    if !credential.ca_bundle.trim().is_empty() {
        // In place of the system's CAs, not beside them.
        let ca = write("ca.pem", &credential.ca_bundle, 0o600)?;
        access
            .env
            .push(("GIT_SSL_CAINFO".into(), ca.display().to_string()));
    }
    if !credential.username.is_empty() {
        // git asks for the user name, then the password; the script answers from the git
        // process's environment, so neither is on a command line or on disk.
        let script = "#!/bin/sh\ncase \"$1\" in\n  Username*) printf '%s\\n' \"$DROVER_GIT_USERNAME\" ;;\n  *) printf '%s\\n' \"$DROVER_GIT_PASSWORD\" ;;\nesac\n";
        let askpass = write("askpass", script, 0o700)?;
        access.env.extend([
            ("GIT_ASKPASS".into(), askpass.display().to_string()),
            ("DROVER_GIT_USERNAME".into(), credential.username.clone()),
            ("DROVER_GIT_PASSWORD".into(), credential.password.clone()),
        ]);
    }
    Ok(access)
}

/// Fetches `spec`'s repository into the mirror under `dir` and returns the commit to apply and
/// the checkout of it.
async fn fetch(
    dir: &Path,
    spec: &GitRepoSpec,
    credential: Option<&GitCredential>,
) -> Result<(String, PathBuf), Failure> {
    let mirror = dir.join("mirror.git");
    let tree = dir.join("tree");
    let access = access(&spec.repo, credential, &dir.join("access"))?;
    let m = mirror.display().to_string();
    if !mirror.join("HEAD").exists() {
        std::fs::create_dir_all(dir).map_err(|e| Failure(format!("mirror: {e}")))?;
        git("making the mirror", &["init", "--quiet", "--bare", &m], &[]).await?;
    }
    let branch = if spec.branch.is_empty() {
        "main"
    } else {
        &spec.branch
    };
    let refspec = format!("+refs/heads/{branch}:refs/heads/{branch}");
    let step = format!("fetching branch {branch} of {}", spec.repo);
    git(
        &step,
        &[
            "--git-dir",
            &m,
            "fetch",
            "--quiet",
            "--prune",
            "--no-tags",
            "--",
            &spec.repo,
            &refspec,
        ],
        &access.env,
    )
    .await?;
    drop(access);
    let wanted = if spec.revision.is_empty() {
        format!("refs/heads/{branch}")
    } else {
        spec.revision.clone()
    };
    let commit = git(
        "finding the commit",
        &[
            "--git-dir",
            &m,
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{wanted}^{{commit}}"),
        ],
        &[],
    )
    .await
    .map_err(|_| {
        Failure(format!(
            "finding the commit: {wanted} is not a commit of branch {branch} of {}",
            spec.repo
        ))
    })?
    .trim()
    .to_owned();
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree).map_err(|e| Failure(format!("checking out: {e}")))?;
    let t = tree.display().to_string();
    git(
        "checking out",
        &[
            "--git-dir",
            &m,
            "--work-tree",
            &t,
            "checkout",
            "--quiet",
            "--force",
            &commit,
            "--",
            ".",
        ],
        &[],
    )
    .await?;
    Ok((commit, tree))
}

/// The bundles a GitRepo's commit makes, written to the store; the ones it made before and no
/// longer does are deleted. A bundle of the same name not made from this GitRepo is not touched.
async fn write_bundles(
    store: &dyn Store,
    repo: &Object,
    spec: &GitRepoSpec,
    commit: &str,
    bundles: Vec<PathBundle>,
) -> Result<Vec<String>, Failure> {
    let name = &repo.metadata.name;
    let failed = |e: StoreError| Failure(format!("writing the bundles: {e}"));
    let selector = LabelSelector::parse(&format!("{GITREPO_LABEL}={name}"))
        .map_err(|e| Failure(e.to_string()))?;
    let (mine, _) = store
        .list(Kind::Bundle.name(), &selector)
        .await
        .map_err(failed)?;
    let mut made = Vec::new();
    for bundle in bundles {
        let content = content::store_objects(store, &bundle.objects)
            .await
            .map_err(failed)?;
        let options = bundle.options;
        let new = BundleSpec {
            content: Some(content),
            default_namespace: options.default_namespace,
            targets: spec.targets.clone(),
            customizations: options.customizations,
            depends_on: options.depends_on,
            correct_drift: options.correct_drift,
            rollout: options.rollout,
            ..BundleSpec::default()
        };
        crate::model::validate_bundle(&new)
            .map_err(|e| Failure(format!("bundle {}: {e}", bundle.name)))?;
        let value = serde_json::to_value(&new).map_err(|e| Failure(e.to_string()))?;
        let op = match store.get(Kind::Bundle.name(), &bundle.name).await {
            Ok(found) if found.metadata.labels.get(GITREPO_LABEL) != Some(name) => {
                return Err(Failure(format!(
                    "writing the bundles: a bundle {:?} exists that was not made from this GitRepo; rename one of them",
                    bundle.name
                )));
            }
            Ok(found) => {
                // Paused stays as the operator set it on the bundle.
                let paused = found.spec.get("paused").cloned();
                let commit = commit.to_owned();
                Op::Modify {
                    kind: Kind::Bundle.name().into(),
                    name: bundle.name.clone(),
                    change: Modifier::new(move |o| {
                        o.spec = value.clone();
                        if let (Some(p), Value::Object(map)) = (&paused, &mut o.spec) {
                            map.insert("paused".into(), p.clone());
                        }
                        o.metadata
                            .annotations
                            .insert(COMMIT_ANNOTATION.into(), commit.clone());
                    }),
                }
            }
            Err(StoreError::NotFound { .. }) => {
                let mut object = Object::new(Kind::Bundle.name(), &bundle.name, value);
                object
                    .metadata
                    .labels
                    .insert(GITREPO_LABEL.into(), name.clone());
                object
                    .metadata
                    .annotations
                    .insert(COMMIT_ANNOTATION.into(), commit.to_owned());
                Op::Create(object)
            }
            Err(e) => return Err(failed(e)),
        };
        store.transact(vec![op]).await.map_err(failed)?;
        made.push(bundle.name);
    }
    for old in mine.iter().filter(|b| !made.contains(&b.metadata.name)) {
        match store
            .delete(Kind::Bundle.name(), &old.metadata.name, None)
            .await
        {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(made)
}

/// When each GitRepo was last looked at, and how it went.
#[derive(Debug, Default)]
struct Tracked {
    next: Option<Instant>,
    failures: u32,
    /// The generation and webhook call last acted on.
    seen: (u64, String),
}

/// The leader's GitRepo controller, until `stop`.
pub async fn run(store: Arc<dyn Store>, dir: PathBuf, stop: CancellationToken) {
    let mut tracked: HashMap<String, Tracked> = HashMap::new();
    let mut changes = None;
    loop {
        if changes.is_none() {
            match store.revision().await {
                Ok(from) => {
                    changes = store
                        .watch(Some(Kind::GitRepo.name()), Some(from))
                        .await
                        .ok();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "GitRepos: cannot read the store; trying again in 1 s")
                }
            }
        }
        let next = pass(store.as_ref(), &dir, &mut tracked).await;
        let wait = next.map_or(Duration::from_secs(60), |n| {
            n.saturating_duration_since(Instant::now())
        });
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait.max(Duration::from_millis(50))) => {}
            event = async {
                match &mut changes {
                    Some(c) => c.next().await,
                    None => { tokio::time::sleep(Duration::from_secs(1)).await; None }
                }
            } => {
                if !matches!(event, Some(Ok(_))) {
                    changes = None;
                }
            }
        }
    }
}

/// Looks at every GitRepo that is due (or changed, or whose webhook was called); returns when
/// the next one is due.
async fn pass(
    store: &dyn Store,
    dir: &Path,
    tracked: &mut HashMap<String, Tracked>,
) -> Option<Instant> {
    let repos = match store
        .list(Kind::GitRepo.name(), &LabelSelector::everything())
        .await
    {
        Ok((repos, _)) => repos,
        Err(e) => {
            tracing::warn!(error = %e, "GitRepos: cannot list them; trying again in 5 s");
            return Some(Instant::now() + FIRST_RETRY);
        }
    };
    tracked.retain(|name, _| repos.iter().any(|r| &r.metadata.name == name));
    // The bundles of a GitRepo that is gone go too (and with them what they applied).
    if let Ok(selector) = LabelSelector::parse(GITREPO_LABEL)
        && let Ok((made, _)) = store.list(Kind::Bundle.name(), &selector).await
    {
        for bundle in made {
            let from = bundle.metadata.labels.get(GITREPO_LABEL);
            if !repos.iter().any(|r| Some(&r.metadata.name) == from) {
                let _ = store
                    .delete(Kind::Bundle.name(), &bundle.metadata.name, None)
                    .await;
            }
        }
    }
    let mut next: Option<Instant> = None;
    for repo in &repos {
        let name = repo.metadata.name.clone();
        let Ok(spec) = serde_json::from_value::<GitRepoSpec>(repo.spec.clone()) else {
            continue;
        };
        let every = interval(&spec.polling_interval).unwrap_or(DEFAULT_INTERVAL);
        let state = tracked.entry(name.clone()).or_default();
        let seen = (
            repo.metadata.generation,
            repo.metadata
                .annotations
                .get(WEBHOOK_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
        );
        let due = state.next.is_none_or(|n| n <= Instant::now()) || state.seen != seen;
        if due && !spec.paused && repo.metadata.deletion_timestamp.is_none() {
            state.seen = seen;
            let outcome = sync(store, dir, repo, &spec).await;
            let status = match &outcome {
                Ok((commit, bundles)) => {
                    state.failures = 0;
                    state.next = Some(Instant::now() + every);
                    json!({"commit": commit, "bundles": bundles, "error": null,
                           "observedGeneration": repo.metadata.generation,
                           "fetchedAt": crate::store::now_rfc3339()})
                }
                Err(Failure(why)) => {
                    let wait =
                        (FIRST_RETRY * 2u32.saturating_pow(state.failures.min(16))).min(every);
                    state.failures += 1;
                    state.next = Some(Instant::now() + wait);
                    tracing::warn!(gitrepo = %name, error = %why, retry_in = ?wait, "GitRepo: failed");
                    json!({"error": format!("{why}; trying again in {} s", wait.as_secs()),
                           "failures": state.failures})
                }
            };
            let op = Op::Modify {
                kind: Kind::GitRepo.name().into(),
                name: name.clone(),
                change: Modifier::new(move |o| {
                    // A success clears the count of failures before it.
                    if status["error"].is_null()
                        && let Some(now) = o.status.as_object_mut()
                    {
                        now.remove("failures");
                    }
                    super::merge_status(&mut o.status, &status);
                }),
            };
            if let Err(e) = store.transact(vec![op]).await {
                tracing::warn!(gitrepo = %name, error = %e, "GitRepo: cannot record its status");
            }
        }
        if let Some(n) = state.next {
            next = Some(next.map_or(n, |m| m.min(n)));
        }
    }
    next
}

/// Reads one GitRepo at its commit and writes its bundles; the commit and bundle names.
async fn sync(
    store: &dyn Store,
    dir: &Path,
    repo: &Object,
    spec: &GitRepoSpec,
) -> Result<(String, Vec<String>), Failure> {
    let credential = if spec.credential.is_empty() {
        None
    } else {
        let found = store
            .get(Kind::CloudCredential.name(), &spec.credential)
            .await
            .map_err(|e| Failure(format!("credential {:?}: {e}", spec.credential)))?;
        let parsed: CloudCredentialSpec = serde_json::from_value(found.spec)
            .map_err(|e| Failure(format!("credential {:?}: {e}", spec.credential)))?;
        Some(parsed.git.ok_or_else(|| {
            Failure(format!(
                "credential {:?} is not a git credential (driver git)",
                spec.credential
            ))
        })?)
    };
    let here = dir.join(&repo.metadata.name);
    let (commit, tree) = fetch(&here, spec, credential.as_ref()).await?;
    let name = repo.metadata.name.clone();
    let paths = spec.paths.clone();
    let read = tokio::task::spawn_blocking(move || read_paths(&name, &tree, &paths))
        .await
        .map_err(|e| Failure(e.to_string()))?
        .map_err(|e| {
            Failure(format!(
                "reading commit {}: {e}",
                &commit[..12.min(commit.len())]
            ))
        })?;
    let made = write_bundles(store, repo, spec, &commit, read).await?;
    Ok((commit, made))
}

/// Whether `signature` (`sha256=HEX`, as GitHub and Gitea send `X-Hub-Signature-256`) is the
/// HMAC-SHA256 of `body` with `secret`.
pub fn signed(secret: &str, body: &[u8], signature: &str) -> bool {
    let Some(hex) = signature.strip_prefix("sha256=") else {
        return false;
    };
    let Some(tag) = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
    else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    ring::hmac::verify(&key, body, &tag).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn paths_become_bundles_and_a_chart_or_an_empty_path_is_refused() {
        let tree = std::env::temp_dir().join(format!("drover-git-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tree);
        for (file, text) in [
            (
                "apps/web/deploy.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n",
            ),
            (
                "apps/web/more/svc.json",
                r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}}"#,
            ),
            (
                "apps/web/drover.yaml",
                "defaultNamespace: shop\ndependsOn: [base]\n",
            ),
            ("apps/web/README.md", "not a manifest"),
            ("charts/db/Chart.yaml", "name: db\n"),
            ("empty/notes.txt", "nothing"),
        ] {
            let path = tree.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", tree.join("apps/web/passwd.yaml")).unwrap();
        let bundles = read_paths("shop", &tree, &["apps/web".into()]).unwrap();
        assert_eq!(bundles[0].name, "shop-apps-web");
        let names: Vec<&str> = bundles[0]
            .objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b", "web"], "the symlink is not followed");
        assert_eq!(bundles[0].options.default_namespace, "shop");
        assert_eq!(bundles[0].options.depends_on, ["base"]);
        let chart = read_paths("shop", &tree, &["charts/db".into()]).unwrap_err();
        assert!(
            chart.contains(
                "holds a Helm chart (charts/db/Chart.yaml): the hub does not render Helm charts"
            ),
            "{chart}"
        );
        assert_eq!(
            read_paths("shop", &tree, &["empty".into()]).unwrap_err(),
            "path \"empty\": no Kubernetes objects in its YAML or JSON files"
        );
        assert_eq!(
            read_paths("shop", &tree, &["gone".into()]).unwrap_err(),
            "path \"gone\": there is no such directory in the repository"
        );
        let nested = read_paths("shop", &tree, &["apps".into()]).unwrap_err();
        assert_eq!(
            nested,
            "apps/web/drover.yaml: a drover.yaml is read only at the top of a path, and path \"apps\" starts above it; name its directory in spec.paths to make it a bundle of its own"
        );
        assert_eq!(bundle_name("shop", ".").unwrap(), "shop");
        let _ = std::fs::remove_dir_all(&tree);
    }

    #[test]
    fn a_webhook_signature_is_the_bodys_hmac_with_the_secret() {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"s3cret");
        let tag = ring::hmac::sign(&key, b"{\"ref\":\"main\"}");
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert!(signed(
            "s3cret",
            b"{\"ref\":\"main\"}",
            &format!("sha256={hex}")
        ));
        assert!(!signed(
            "other",
            b"{\"ref\":\"main\"}",
            &format!("sha256={hex}")
        ));
        assert!(!signed(
            "s3cret",
            b"{\"ref\":\"evil\"}",
            &format!("sha256={hex}")
        ));
        assert!(!signed("s3cret", b"x", "sha1=00"));
    }
}
