//! Applying one plan slot: what to do with the plan given (apply it, retry it after a backoff,
//! leave it, or keep its periodic instructions and probes going), and doing it. Every step is
//! recorded before the next one starts, so a crash at any point is recovered from the record.

use std::{sync::Arc, time::Duration};

use futures::future::join_all;
use proto::plan::v1::{
    InstructionProgress, InstructionResult, Plan, PlanState, PlanStatus, ProbeStatus,
};
use tokio_util::sync::CancellationToken;

use crate::{exec, files, probe, record::Record, root::Root, transfer};

/// How often, at most, a running instruction's new output is recorded for people watching it.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// How failures are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts when the plan does not say (`maxFailures` 0).
    pub max_failures: u32,
    /// The wait after the first failure; it doubles with each failure after that.
    pub base: Duration,
    pub cap: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            max_failures: 5,
            base: Duration::from_secs(5),
            cap: Duration::from_secs(300),
        }
    }
}

impl Retry {
    fn max(&self, plan: &Plan) -> u32 {
        if plan.max_failures == 0 {
            self.max_failures
        } else {
            plan.max_failures
        }
    }

    /// The wait before attempt `failures + 1`.
    fn wait(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1).min(31))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// What the plan given calls for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// No plan, or it failed `max_failures` times: wait for a new one.
    Nothing,
    Apply,
    RetryAfter(Duration),
    /// Applied: keep its periodic instructions and probes going.
    Monitor,
}

fn next(checksum: &str, plan: &Plan, status: &PlanStatus, retry: &Retry) -> Next {
    if checksum.is_empty() {
        return Next::Nothing;
    }
    if status.applied_checksum == checksum {
        return Next::Monitor;
    }
    if status.checksum != checksum {
        return Next::Apply;
    }
    match PlanState::try_from(status.state).unwrap_or_default() {
        // Interrupted (a crash, a restart): run it again from the start.
        PlanState::InProgress | PlanState::Unspecified | PlanState::Applied => Next::Apply,
        PlanState::Failed if status.failure_count >= retry.max(plan) => Next::Nothing,
        PlanState::Failed => Next::RetryAfter(retry.wait(status.failure_count)),
    }
}

/// Drives `record`'s plan until `shutdown`: applies new plans, retries failed ones, and keeps
/// the applied one's periodic instructions and probes reporting.
/// `hub` moves the plans' files (`None`: plans that name files to move fail, as local plans
/// have no hub). `root` says where the plans land (see [`Root`]).
pub async fn drive(
    record: Arc<Record>,
    retry: Retry,
    hub: Option<transfer::Hub>,
    root: Root,
    shutdown: CancellationToken,
) {
    stop_leftover(&record);
    let mut desired = record.watch_desired();
    // Attempts in a row whose record could not be written.
    let mut unwritten = 0u32;
    loop {
        desired.borrow_and_update();
        let (checksum, plan) = record.desired();
        let plan = plan.unwrap_or_default();
        let step = next(&checksum, &plan, &record.status(), &retry);
        let work = async {
            match step {
                Next::Nothing => std::future::pending().await,
                Next::Apply => {
                    let attempt =
                        apply(&record, &checksum, &plan, &retry, hub.as_ref(), &root).await;
                    unwritten = after_attempt(attempt, unwritten, &retry).await;
                }
                Next::RetryAfter(wait) => {
                    tracing::info!(plan = %short(&checksum), ?wait, "retrying the failed plan after a wait");
                    tokio::time::sleep(wait).await;
                    let attempt =
                        apply(&record, &checksum, &plan, &retry, hub.as_ref(), &root).await;
                    unwritten = after_attempt(attempt, unwritten, &retry).await;
                }
                Next::Monitor => monitor(&record, &root.place(plan), &root).await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            // A new plan replaces whatever was going on (a running instruction is killed; the
            // record says in-progress for the old plan, which is no longer wanted).
            changed = desired.changed() => if changed.is_err() { return },
            () = work => {}
        }
    }
}

/// After an attempt whose record could not be written (a full disk, no file handles left):
/// says so and waits as after a failure, since the record still asks for the attempt and
/// would otherwise start it again at once, over and over. Returns the attempts in a row
/// whose record could not be written.
async fn after_attempt(attempt: Result<(), String>, unwritten: u32, retry: &Retry) -> u32 {
    let Err(why) = attempt else {
        return 0;
    };
    let unwritten = unwritten.saturating_add(1);
    let wait = retry.wait(unwritten);
    tracing::error!(
        attempt = unwritten,
        ?wait,
        "{why}; trying again after a wait"
    );
    tokio::time::sleep(wait).await;
    unwritten
}

/// After a crash, the instruction that was running may still be: stop its process group before
/// the plan runs again (if that pid still is that process).
fn stop_leftover(record: &Record) {
    if let Some(running) = record.running() {
        if exec::start_time(running.pid) == Some(running.start_time) {
            tracing::warn!(
                pid = running.pid,
                "stopping an instruction left running by a crash"
            );
            exec::kill_group(running.pid);
        }
        if let Err(e) = record.set_running(None) {
            tracing::warn!(error = %e, "cannot update the plan record");
        }
    }
}

fn short(checksum: &str) -> &str {
    checksum.get(..12).unwrap_or(checksum)
}

/// One attempt at a plan: record in-progress, write the files, run the instructions in order,
/// record applied or failed. `Err` says which record could not be written.
async fn apply(
    record: &Record,
    checksum: &str,
    plan: &Plan,
    retry: &Retry,
    hub: Option<&transfer::Hub>,
    root: &Root,
) -> Result<(), String> {
    let max = retry.max(plan);
    let recorded = record.record(|s| {
        if s.checksum != checksum {
            s.failure_count = 0;
        }
        // A retry keeps the last failure's message: while it runs, people still see why
        // the plan is being tried again.
        if s.failure_count == 0 {
            s.message.clear();
        }
        s.checksum = checksum.to_owned();
        s.state = PlanState::InProgress as i32;
        s.max_failures = max;
        s.results.clear();
        s.current = None;
        s.periodic.clear();
        s.probes.clear();
    });
    if let Err(e) = recorded {
        return Err(format!(
            "cannot record that the plan is in progress, so it is not applied: {e}"
        ));
    }
    tracing::info!(plan = %short(checksum), "applying a plan");
    let outcome = attempt(record, plan, hub, root).await;
    let finished = record.record(|s| match &outcome {
        Ok(()) => {
            s.state = PlanState::Applied as i32;
            s.applied_checksum = checksum.to_owned();
            s.failure_count = 0;
            s.message.clear();
        }
        Err(message) => {
            s.state = PlanState::Failed as i32;
            s.failure_count += 1;
            s.message = message.clone();
        }
    });
    match (finished, outcome) {
        (Err(e), _) => return Err(format!("cannot record the plan's outcome: {e}")),
        (Ok(_), Ok(())) => tracing::info!(plan = %short(checksum), "plan applied"),
        (Ok(s), Err(message)) => tracing::warn!(
            plan = %short(checksum), failures = s.failure_count, max, "plan failed: {message}"
        ),
    }
    Ok(())
}

/// Checks every entry of a plan without touching anything; the message names the bad entry.
/// Public for the fuzzer (`fuzz/fuzz_targets/plan_protobuf.rs`), which feeds it decoded bytes.
pub fn check_plan(plan: &Plan) -> Result<(), String> {
    plan.files.iter().try_for_each(files::check)?;
    plan.instructions.iter().try_for_each(exec::check)?;
    plan.periodic
        .iter()
        .filter_map(|p| p.instruction.as_ref())
        .try_for_each(exec::check)?;
    plan.probes.iter().try_for_each(probe::check)?;
    transfer::check(&plan.downloads, &plan.uploads)
}

async fn attempt(
    record: &Record,
    plan: &Plan,
    hub: Option<&transfer::Hub>,
    root: &Root,
) -> Result<(), String> {
    // Nothing is touched unless every entry makes sense, as the hub wrote it.
    check_plan(plan)?;
    root.prepare()?;
    let plan = &root.place(plan.clone());
    let moving = !plan.downloads.is_empty() || !plan.uploads.is_empty();
    if moving && hub.is_none() {
        return Err("this plan moves files to or from the hub, and it has no hub".into());
    }
    for download in &plan.downloads {
        if let Some(hub) = hub {
            transfer::download(hub, download).await?;
        }
    }
    root.confined(|| plan.files.iter().try_for_each(files::apply))?;
    for instruction in &plan.instructions {
        // The step and its latest output are in the status while it runs, for people watching
        // (at most every PROGRESS_EVERY, and only when it wrote something new).
        let live = exec::Live::default();
        let started_at = crate::now();
        let show = |output: String| {
            let current = InstructionProgress {
                name: instruction.name.clone(),
                started_at: started_at.clone(),
                output,
            };
            if let Err(e) = record.record(|s| s.current = Some(current)) {
                tracing::warn!(error = %e, "cannot record an instruction's progress");
            }
        };
        show(String::new());
        let run = exec::run(instruction, root, Some(&live), |pid| {
            let running =
                exec::start_time(pid).map(|start_time| crate::record::Running { pid, start_time });
            if let Err(e) = record.set_running(running) {
                tracing::warn!(error = %e, "cannot record the running instruction");
            }
        });
        tokio::pin!(run);
        // Its first words are shown at once, then at most every PROGRESS_EVERY.
        let mut next = tokio::time::Instant::now();
        let mut result = loop {
            tokio::select! {
                result = &mut run => break result,
                () = async {
                    live.wrote().await;
                    tokio::time::sleep_until(next).await;
                } => {
                    show(live.snapshot().1);
                    next = tokio::time::Instant::now() + PROGRESS_EVERY;
                }
            }
        };
        if let Err(e) = record.set_running(None) {
            tracing::warn!(error = %e, "cannot update the plan record");
        }
        let failed = result.exit_code != 0;
        if !failed && !instruction.save_output {
            result.stdout.clear();
            result.stderr.clear();
        }
        let message = format!(
            "instruction {:?} exited with {}: {}",
            result.name,
            result.exit_code,
            last_lines(&result.stderr)
        );
        record
            .record(|s| {
                s.current = None;
                s.results.push(result);
            })
            .map_err(|e| format!("cannot record an instruction's result: {e}"))?;
        if failed {
            return Err(message);
        }
    }
    for upload in &plan.uploads {
        let Some(hub) = hub else { break };
        let (path, size, sha256) = transfer::upload(hub, upload).await?;
        // Recorded as a step of its own, so the status says what the hub has.
        let result = InstructionResult {
            name: format!("upload {}", upload.name),
            exit_code: 0,
            stdout: format!("file={}\nsize={size}\nsha256={sha256}\n", path.display()),
            finished_at: crate::now(),
            ..InstructionResult::default()
        };
        record
            .record(|s| s.results.push(result))
            .map_err(|e| format!("cannot record an upload: {e}"))?;
    }
    Ok(())
}

/// The last (up to) three non-empty lines of `text`, joined with " / ": a tool's own error
/// (curl's, say) is often followed by a line of the script's saying what it was doing.
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    if lines.is_empty() {
        return "no output on stderr".to_owned();
    }
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

/// Keeps the applied plan's periodic instructions and probes going; never returns.
async fn monitor(record: &Record, plan: &Plan, root: &Root) {
    let periodic = plan.periodic.iter().filter_map(|p| {
        let instruction = p.instruction.clone()?;
        let period = Duration::from_secs(if p.period_seconds == 0 {
            60
        } else {
            p.period_seconds.into()
        });
        Some(async move {
            let mut ticks = tokio::time::interval(period);
            loop {
                ticks.tick().await;
                let result = exec::run(&instruction, root, None, drop).await;
                keep_periodic(record, result);
            }
        })
    });
    let probes = plan.probes.iter().map(|p| async move {
        let timing = probe::Timing::of(p);
        tokio::time::sleep(timing.initial_delay).await;
        let mut status = ProbeStatus {
            name: p.name.clone(),
            ..ProbeStatus::default()
        };
        let mut ticks = tokio::time::interval(timing.period);
        loop {
            ticks.tick().await;
            let result = probe::once(p).await;
            if probe::fold(&mut status, timing, result) {
                let status = status.clone();
                let kept =
                    record.record(
                        |s| match s.probes.iter_mut().find(|x| x.name == status.name) {
                            Some(x) => *x = status,
                            None => s.probes.push(status),
                        },
                    );
                if let Err(e) = kept {
                    tracing::warn!(error = %e, "cannot record a probe's health");
                }
            }
        }
    });
    let periodic: Vec<_> = periodic.collect();
    let probes: Vec<_> = probes.collect();
    tokio::join!(join_all(periodic), join_all(probes));
    std::future::pending::<()>().await;
}

/// Records a periodic instruction's run when its outcome differs from the last one kept.
fn keep_periodic(record: &Record, result: InstructionResult) {
    let same = |x: &InstructionResult| {
        x.exit_code == result.exit_code && x.stdout == result.stdout && x.stderr == result.stderr
    };
    if record
        .status()
        .periodic
        .iter()
        .any(|x| x.name == result.name && same(x))
    {
        return;
    }
    let kept = record.record(
        |s| match s.periodic.iter_mut().find(|x| x.name == result.name) {
            Some(x) => *x = result,
            None => s.periodic.push(result),
        },
    );
    if let Err(e) = kept {
        tracing::warn!(error = %e, "cannot record a periodic instruction's result");
    }
}

#[cfg(test)]
mod tests;
