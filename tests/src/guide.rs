//! The guides in `docs/guides/`, run as written: each guide's `sh` blocks, in order, in bash,
//! in a directory and home of the test's own, with the workspace's binaries first on the
//! `PATH`. The test does between blocks what the guide leaves to the reader's machine (a pod
//! the simulated cluster does not run, a hub stopped), and checks what the guide says you
//! should see.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

/// The `sh` blocks of `docs/guides/<name>.md`, in order.
pub fn blocks(name: &str) -> Vec<String> {
    sh_blocks(&read_doc(&format!("guides/{name}.md")))
}

/// The `sh` blocks of the guide that opens `docs/<file>`: those before its `## Reference`.
pub fn guide_blocks(file: &str) -> Vec<String> {
    let text = read_doc(file);
    let guide = text.split("\n## Reference\n").next().unwrap_or_default();
    assert!(
        guide.len() < text.len(),
        "docs/{file} has no `## Reference` after its guide"
    );
    sh_blocks(guide)
}

fn read_doc(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sh_blocks(text: &str) -> Vec<String> {
    // A block may be indented under a numbered step: its lines lose the fence's indent.
    let mut found = Vec::new();
    let mut open: Option<(usize, Vec<&str>)> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        match &mut open {
            None if line.trim() == "```sh" => open = Some((indent, Vec::new())),
            Some(_) if line.trim() == "```" => {
                let (_, lines) = open.take().unwrap();
                found.push(lines.join("\n"));
            }
            Some((fence, lines)) => lines.push(line.get(*fence..).unwrap_or(line.trim_start())),
            None => {}
        }
    }
    found
}

/// A bash session's settings: where blocks run and with what environment. Every block's
/// process group (what it left running in the background too) is ended when this is dropped.
#[derive(Debug)]
pub struct Shell {
    pub dir: PathBuf,
    env: Vec<(String, String)>,
    groups: Vec<u32>,
}

/// What a block printed.
#[derive(Debug)]
pub struct Ran {
    pub stdout: String,
    pub stderr: String,
}

impl Shell {
    /// Blocks run in `dir`, with `HOME` there too (the CLI's login lives under it).
    pub fn new(dir: &Path) -> Self {
        let bin = crate::binary("drover-hub").parent().unwrap().to_owned();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        std::fs::create_dir_all(dir.join("home")).unwrap();
        Self {
            dir: dir.to_owned(),
            env: vec![
                ("PATH".into(), path),
                ("HOME".into(), dir.join("home").display().to_string()),
            ],
            groups: Vec::new(),
        }
    }

    /// Sets `name` for the blocks run after this.
    pub fn set(&mut self, name: &str, value: &str) {
        self.env.retain(|(n, _)| n != name);
        self.env.push((name.to_owned(), value.to_owned()));
    }

    /// Runs `block` with `bash -e`; panics (with what it printed) if it fails or takes longer
    /// than `within`.
    pub async fn run(&mut self, block: &str, within: Duration) -> Ran {
        let out = self.dir.join("block.out");
        let err = self.dir.join("block.err");
        let mut child = tokio::process::Command::new("bash")
            .args(["-e", "-c", block])
            .current_dir(&self.dir)
            .env_remove("KUBECONFIG")
            .env_remove("DROVER_CONFIG")
            .env_remove("DROVER_LOG")
            .env_remove("DROVER_DATA_DIR")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        self.groups.push(child.id().unwrap());
        let status = tokio::time::timeout(within, child.wait()).await;
        let ran = Ran {
            stdout: std::fs::read_to_string(&out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err).unwrap_or_default(),
        };
        match status {
            Ok(Ok(status)) if status.success() => ran,
            Ok(status) => panic!(
                "the guide's block failed ({status:?}):\n{block}\n--- stdout\n{}\n--- stderr\n{}",
                ran.stdout, ran.stderr
            ),
            Err(_) => panic!(
                "the guide's block did not finish in {within:?}:\n{block}\n--- stdout\n{}\n--- stderr\n{}",
                ran.stdout, ran.stderr
            ),
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        for group in &self.groups {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", "--", &format!("-{group}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}
