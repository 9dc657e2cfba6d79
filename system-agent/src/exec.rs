//! Running one instruction: a program with arguments, or a shell script, with the plan's
//! environment added; its output captured up to a bound (the tail is what explains a failure).

use std::process::Stdio;

use proto::plan::v1::{Instruction, InstructionResult};
use tokio::io::{AsyncRead, AsyncReadExt};

/// How much of each of stdout and stderr is kept: the last 32 KiB.
pub const OUTPUT_LIMIT: usize = 32 * 1024;

/// How much of a running instruction's latest output is shown to people watching it.
pub const LIVE_LIMIT: usize = 4 * 1024;

/// What a running instruction has written lately (stdout and stderr as they came), for people
/// watching it; the last [`LIVE_LIMIT`] bytes, from a line's start.
#[derive(Debug, Default)]
pub struct Live {
    text: std::sync::Mutex<(u64, String)>,
    wrote: tokio::sync::Notify,
}

impl Live {
    /// Returns once the instruction has written something since the last [`Live::snapshot`]
    /// (or the last call of this).
    pub async fn wrote(&self) {
        self.wrote.notified().await;
    }

    fn push(&self, bytes: &[u8]) {
        let mut guard = self.text.lock().unwrap_or_else(|e| e.into_inner());
        let (version, text) = &mut *guard;
        text.push_str(&String::from_utf8_lossy(bytes));
        if text.len() > LIVE_LIMIT {
            let mut cut = text.len() - LIVE_LIMIT;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            // From the next line's start, when there is one in what is kept.
            if let Some(newline) = text[cut..].find('\n') {
                cut += newline + 1;
            }
            text.drain(..cut);
        }
        *version += 1;
        self.wrote.notify_one();
    }

    /// How many writes it has seen, and its whole lines now (a line still being written is
    /// shown once it ends, not in pieces).
    pub fn snapshot(&self) -> (u64, String) {
        let guard = self.text.lock().unwrap_or_else(|e| e.into_inner());
        let (writes, text) = &*guard;
        let whole = text.rfind('\n').map_or("", |end| &text[..=end]);
        (*writes, whole.to_owned())
    }
}

/// Checks an instruction before anything runs; the message names it.
pub fn check(instruction: &Instruction) -> Result<(), String> {
    let name = &instruction.name;
    match (
        instruction.command.is_empty(),
        instruction.script.is_empty(),
    ) {
        (true, true) => return Err(format!("instruction {name:?}: give a command or a script")),
        (false, false) => {
            return Err(format!(
                "instruction {name:?}: give a command or a script, not both"
            ));
        }
        _ => {}
    }
    if let Some(bad) = instruction.env.iter().find(|e| {
        e.split_once('=')
            .is_none_or(|(k, _)| k.is_empty() || k.contains('\0'))
    }) {
        return Err(format!(
            "instruction {name:?}: env entry {bad:?} must be KEY=value"
        ));
    }
    Ok(())
}

/// Runs `instruction` to its end, in a process group of its own whose leader's pid goes to
/// `started` first, confined to `root` when the host has one (its working directory then).
/// Dropping the future kills the whole group.
pub async fn run(
    instruction: &Instruction,
    root: &crate::root::Root,
    live: Option<&Live>,
    started: impl FnOnce(u32),
) -> InstructionResult {
    let mut result = InstructionResult {
        name: instruction.name.clone(),
        exit_code: -1,
        ..InstructionResult::default()
    };
    if let Err(e) = check(instruction) {
        result.stderr = e;
        result.finished_at = crate::now();
        return result;
    }
    let mut command = if instruction.script.is_empty() {
        tokio::process::Command::new(&instruction.command)
    } else {
        let mut sh = tokio::process::Command::new("/bin/sh");
        // `$0` is the instruction's name, then the plan's args.
        sh.arg("-c").arg(&instruction.script).arg(&instruction.name);
        sh
    };
    command
        .args(&instruction.args)
        .envs(instruction.env.iter().filter_map(|e| e.split_once('=')))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &root.dir {
        command.current_dir(dir);
    }
    let what = if instruction.script.is_empty() {
        instruction.command.as_str()
    } else {
        "/bin/sh"
    };
    // Started from the confining thread, so the process is confined from its first step; the
    // runtime's context there lets tokio reap it.
    let runtime = tokio::runtime::Handle::current();
    let spawned = root.confined(|| {
        let _entered = runtime.enter();
        command
            .spawn()
            .map_err(|e| format!("cannot start {what}: {e}"))
    });
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            result.stderr = e;
            result.finished_at = crate::now();
            return result;
        }
    };
    let guard = child.id().map(|pid| {
        started(pid);
        Group(pid)
    });
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    // What it saves is data (a token, say), not progress: only the rest is shown as it comes.
    let shown = live.filter(|_| !instruction.save_output);
    let (out, err, status) = tokio::join!(tail(stdout, shown), tail(stderr, live), child.wait());
    // Ended by itself: what it left running in its group (a service it started in the
    // background, say) is its business.
    std::mem::forget(guard);
    result.stdout = out;
    result.stderr = err;
    result.exit_code = match status {
        Ok(status) => status.code().unwrap_or(-1),
        Err(e) => {
            result
                .stderr
                .push_str(&format!("\nwaiting for the process: {e}"));
            -1
        }
    };
    result.finished_at = crate::now();
    result
}

/// Kills a process group when dropped (an instruction cut short by a new plan or a shutdown).
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// SIGKILL to process group `pgid` (through `kill(1)`: this crate has no unsafe code).
pub fn kill_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// When process `pid` started (clock ticks after boot), if it runs and is not a zombie.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    // starttime is field 22 of the whole line, the 20th after the name.
    fields.get(19)?.parse().ok()
}

/// Reads `pipe` to its end, keeping the last [`OUTPUT_LIMIT`] bytes.
async fn tail(pipe: Option<impl AsyncRead + Unpin>, live: Option<&Live>) -> String {
    let Some(mut pipe) = pipe else {
        return String::new();
    };
    let mut kept = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(live) = live {
                    live.push(&chunk[..n]);
                }
                kept.extend_from_slice(&chunk[..n]);
                if kept.len() > 2 * OUTPUT_LIMIT {
                    kept.drain(..kept.len() - OUTPUT_LIMIT);
                }
            }
        }
    }
    if kept.len() > OUTPUT_LIMIT {
        kept.drain(..kept.len() - OUTPUT_LIMIT);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::root::Root;

    fn script(name: &str, script: &str) -> Instruction {
        Instruction {
            name: name.into(),
            script: script.into(),
            ..Instruction::default()
        }
    }

    #[tokio::test]
    async fn output_exit_code_args_and_env_are_seen() {
        let mut i = script("greet", "echo \"$0 $1 $GREETING\"; echo oops >&2; exit 3");
        i.args = vec!["world".into()];
        i.env = vec!["GREETING=hello=there".into()];
        let r = run(&i, &Root::default(), None, drop).await;
        assert_eq!(r.exit_code, 3);
        assert_eq!(r.stdout, "greet world hello=there\n");
        assert_eq!(r.stderr, "oops\n");
        assert!(!r.finished_at.is_empty());

        let r = run(
            &Instruction {
                name: "list".into(),
                command: "/bin/echo".into(),
                args: vec!["-n".into(), "a b".into()],
                ..Instruction::default()
            },
            &Root::default(),
            None,
            drop,
        )
        .await;
        assert_eq!((r.exit_code, r.stdout.as_str()), (0, "a b"));
    }

    #[tokio::test]
    async fn output_is_shown_as_it_comes_bounded_and_saved_output_is_not() {
        let live = Live::default();
        let mut i = script(
            "noisy",
            "echo token-on-stdout; i=0; while [ $i -lt 2000 ]; do echo progress-line-$i >&2; i=$((i+1)); done",
        );
        i.save_output = true;
        let r = run(&i, &Root::default(), Some(&live), drop).await;
        assert_eq!(r.stdout, "token-on-stdout\n");
        let (writes, text) = live.snapshot();
        assert!(writes > 0);
        assert!(text.len() <= LIVE_LIMIT, "{}", text.len());
        assert!(
            text.starts_with("progress-line-"),
            "from a line's start: {text:.40}"
        );
        assert!(text.ends_with("progress-line-1999\n"));
        assert!(!text.contains("token-on-stdout"));
        // Without saveOutput, stdout is progress too; a line is shown once it is whole.
        let live = Live::default();
        run(
            &script("say", "echo step one; printf 'half a li'"),
            &Root::default(),
            Some(&live),
            drop,
        )
        .await;
        assert_eq!(live.snapshot().1, "step one\n");
    }

    #[tokio::test]
    async fn output_is_bounded_to_its_tail() {
        let r = run(
            &script(
                "noisy",
                "i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done",
            ),
            &Root::default(),
            None,
            drop,
        )
        .await;
        assert_eq!(r.exit_code, 0);
        assert!(r.stdout.len() <= OUTPUT_LIMIT);
        assert!(r.stdout.ends_with("line-19999\n"));
        assert!(!r.stdout.contains("line-0\n"));
    }

    #[tokio::test]
    async fn a_cut_short_instruction_takes_its_children_with_it() {
        let dir = crate::testing::tempdir();
        let marker = dir.join("child-survived");
        let i = script(
            "slow",
            &format!("(sleep 1; touch {}) & sleep 30", marker.display()),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let root = Root::default();
        let run = run(&i, &root, None, move |pid| tx.send(pid).unwrap());
        let cut = tokio::time::timeout(std::time::Duration::from_millis(300), run).await;
        assert!(cut.is_err(), "still running when cut short");
        let pid = rx.recv().unwrap();
        // SIGKILL is delivered asynchronously: give the kernel a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while start_time(pid).is_some() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(start_time(pid).is_none(), "the leader is gone");
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        assert!(
            !marker.exists(),
            "the background child was killed with its group"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_missing_program_fails_with_a_reason() {
        let r = run(
            &Instruction {
                name: "x".into(),
                command: "/nonexistent/program".into(),
                ..Instruction::default()
            },
            &Root::default(),
            None,
            drop,
        )
        .await;
        assert_eq!(r.exit_code, -1);
        assert!(r.stderr.contains("/nonexistent/program"), "{}", r.stderr);
        let err = check(&Instruction {
            name: "y".into(),
            command: "a".into(),
            script: "b".into(),
            ..Instruction::default()
        })
        .unwrap_err();
        assert!(err.contains("not both"));
    }

    #[tokio::test]
    async fn inside_a_root_an_instruction_writes_there_and_a_write_outside_names_its_path() {
        let base = crate::testing::tempdir();
        let dir = base.join("root");
        std::fs::create_dir_all(&dir).unwrap();
        let root = Root {
            dir: Some(dir.clone()),
            loopback: None,
        };
        root.prepare().unwrap();
        let outside = base.join("escaped");
        let mut i = script(
            "install",
            &format!(
                "mkdir -p \"$DROVER_ROOT/etc/rancher\" && echo ok > \"$DROVER_ROOT/etc/rancher/x\" && \
                 (sleep 0.1; echo late > {0}) & wait; pwd; mktemp; echo out > {0}",
                outside.display()
            ),
        );
        i.env = root
            .place(proto::plan::v1::Plan {
                instructions: vec![i.clone()],
                ..Default::default()
            })
            .instructions[0]
            .env
            .clone();
        let r = run(&i, &root, None, drop).await;
        assert_ne!(r.exit_code, 0, "{r:?}");
        assert!(
            r.stderr.contains(&outside.display().to_string())
                && r.stderr.contains("Permission denied"),
            "{}",
            r.stderr
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("etc/rancher/x")).unwrap(),
            "ok\n"
        );
        // Its working directory and its temp files are in the root too.
        let mut lines = r.stdout.lines();
        assert_eq!(lines.next(), Some(dir.display().to_string().as_str()));
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with(&dir.join("tmp/").display().to_string())
        );
        // Neither it nor the child it left in the background wrote outside.
        assert!(!outside.exists());
        std::fs::remove_dir_all(base).unwrap();
    }
}
