//! SLURM: the job as one protocol object ([`Job`], in `slurm/job.rs`: its read, a
//! notice's deadlines, the requeue after the save), and what it decides by: SLURM's
//! text as `scontrol` prints it (`Key=Value` fields, local timestamps and durations),
//! whether an error is worth another try, the requeue's decision and its retries
//! ([`RequeueRun`]). The deadlines they lead to are told in
//! docs/getting-started/slurm.md; `_platforms/slurm.py` runs `scontrol` as [`Job`]
//! says, within the bounds below.

mod job;
#[allow(unused_imports)] // by the binding (src/python/slurm.rs)
pub(crate) use job::{slurm_action, slurm_event};
pub use job::{Job, SlurmAction, SlurmEvent, Step};

/// Bound, in seconds, on `scontrol requeue`, its retries included (while the
/// controller reads as too busy to answer).
pub const REQUEUE_TIMEOUT: f64 = 30.0;
/// Bound, in seconds, on each `scontrol show` call of the reader started with the
/// handler.
pub const READ_TIMEOUT: f64 = 10.0;
/// Bound, in seconds, on the one `scontrol show job` made when an `srun` task gets
/// SIGTERM (is it a preemption?): the notice waits for it, so it is short.
pub const NOTICE_READ_TIMEOUT: f64 = 2.0;

/// SLURM's shortest wait between the SIGTERM that ends a job's steps and its SIGKILL,
/// in seconds: slurmd waits `max(KillWait, 5 s)` (`delay = MAX(conf->kill_wait, 5)`
/// in its job termination, the path of the time limit, a preemption, `scancel` and
/// `scontrol requeue` alike).
pub const MIN_KILL_WAIT: f64 = 5.0;

/// When SLURM's SIGKILL follows the SIGTERM it sends at `term_at`: `KillWait` later
/// (at least [`MIN_KILL_WAIT`]); None when `KillWait` is not known (nothing is
/// assumed in its place: SLURM's own default of 30 s may not be the cluster's).
#[must_use]
pub fn kill_after(term_at: f64, kill_wait: Option<f64>) -> Option<f64> {
    kill_wait
        .filter(|k| k.is_finite() && *k >= 0.0)
        .map(|k| term_at + k.max(MIN_KILL_WAIT))
}

/// What a signal's notice is told under SLURM (docs/getting-started/slurm.md has the
/// table): `(deadline, kill)`, Unix seconds, for a signal at `unix_now`.
///
/// * `end`: the job's end (`SLURM_JOB_END_TIME`, else `EndTime`); ignored unless
///   after `unix_now`. The time limit's SIGTERM comes then.
/// * `sigterm`: the signal is a new SIGTERM and the job has been read (else it is
///   SIGUSR1, the time limit's warning, or a SIGTERM before anything was read).
/// * `grace_end`: for an `srun` task's SIGTERM of a preemption, `PreemptTime` plus the
///   partition's `GraceTime` (SLURM's second SIGTERM comes then).
/// * `kill_wait`: the cluster's `KillWait`, None when not read.
///
/// The deadline is what the saves are planned against: the job's end for SIGUSR1;
/// for a SIGTERM the grace time's end, else now + `KillWait`, capped by the job's end.
/// The kill is when SIGKILL comes: [`kill_after`] the SIGTERM that ends the job (at
/// the job's end, at the grace time's end, or now), capped by the time limit's; None
/// without `KillWait`.
#[must_use]
pub fn signal_deadlines(
    unix_now: f64,
    end: Option<f64>,
    sigterm: bool,
    grace_end: Option<f64>,
    kill_wait: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    let end = end.filter(|e| *e > unix_now);
    let end_kill = end.and_then(|e| kill_after(e, kill_wait));
    if !sigterm {
        return (end, end_kill);
    }
    let earliest = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let bound = grace_end.or_else(|| kill_wait.map(|k| unix_now + k));
    let kill = kill_after(grace_end.unwrap_or(unix_now), kill_wait);
    (earliest(bound, end), earliest(kill, end_kill))
}

/// Seconds from now until SLURM's SIGKILL of a job this process requeued: the
/// requeue ends the job's steps (SIGTERM, then SIGKILL [`kill_after`]); `since` is how
/// long ago the `scontrol requeue` that did it started (the controller acts during
/// the call, so its start is the earliest the SIGTERM can be). None without
/// `KillWait`.
#[must_use]
pub fn kill_after_requeue(since: f64, kill_wait: Option<f64>) -> Option<f64> {
    kill_after(-since.max(0.0), kill_wait)
}

/// Whether `b` can be part of a field name (`Partition`, `TRES/node`, `OS:Flags`).
fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b':' || b == b'/'
}

/// The field names' starts: a run of name bytes followed by `=`, at the start of the
/// text or after whitespace. Returns (start of the name, index of its `=`).
fn key_starts(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut starts = Vec::new();
    for i in 0..bytes.len() {
        if i > 0 && !bytes[i - 1].is_ascii_whitespace() {
            continue;
        }
        let mut j = i;
        while j < bytes.len() && is_key_byte(bytes[j]) {
            j += 1;
        }
        if j > i && bytes.get(j) == Some(&b'=') {
            starts.push((i, j));
        }
    }
    starts
}

/// The `Key=Value` fields of one record of `scontrol show ... -o`, in order; a value runs
/// up to the whitespace before the next `Key=` (so it may hold spaces). A key seen twice
/// keeps its first value.
#[must_use]
pub fn fields(text: &str) -> Vec<(String, String)> {
    let text = text.trim();
    let bytes = text.as_bytes();
    let starts = key_starts(bytes);
    let mut out: Vec<(String, String)> = Vec::with_capacity(starts.len());
    for (n, &(key, eq)) in starts.iter().enumerate() {
        let end = starts.get(n + 1).map_or(bytes.len(), |&(next, _)| next - 1);
        let name = &text[key..eq];
        if !out.iter().any(|(k, _)| k == name) {
            out.push((name.to_owned(), text[eq + 1..end.max(eq + 1)].to_owned()));
        }
    }
    out
}

/// A SLURM timestamp (`2026-11-25T16:43:17`, the controller's local time) as its parts;
/// None for `Unknown`, `N/A`, `None` or anything else.
#[must_use]
pub fn timestamp(text: &str) -> Option<[u32; 6]> {
    let b = text.trim().as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let number = |at: usize, len: usize| -> Option<u32> {
        let part = &b[at..at + len];
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0, |acc, d| acc * 10 + u32::from(d - b'0')))
    };
    let parts = [
        number(0, 4)?,
        number(5, 2)?,
        number(8, 2)?,
        number(11, 2)?,
        number(14, 2)?,
        number(17, 2)?,
    ];
    let [_, month, day, hour, minute, second] = parts;
    ((1..=12).contains(&month) && (1..=31).contains(&day) && hour < 24 && minute < 60 && second < 61).then_some(parts)
}

/// A SLURM duration as seconds: `30 sec`, `20`, `00:00:20`, `05:00` (minutes and
/// seconds), `1-00:00:10` (days-hours:minutes:seconds); None for `UNLIMITED` and
/// anything else.
#[must_use]
pub fn seconds(text: &str) -> Option<f64> {
    let first = text.split_whitespace().next()?;
    let (days, rest) = match first.rsplit_once('-') {
        Some((d, r)) => (Some(d.parse::<u64>().ok()?), r),
        None => (None, first),
    };
    let mut total: u64 = 0;
    for part in rest.split(':') {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        total = total.checked_mul(60)?.checked_add(part.parse::<u64>().ok()?)?;
    }
    let total = total.checked_add(days.unwrap_or(0).checked_mul(86_400)?)?;
    #[allow(clippy::cast_precision_loss)] // durations far below 2^53 s
    Some(total as f64)
}

/// The value of `key` in `scontrol show config` (`KillWait                = 30 sec`).
#[must_use]
pub fn config_value<'a>(config: &'a str, key: &str) -> Option<&'a str> {
    config.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?;
        let value = rest.trim_start().strip_prefix('=')?;
        Some(value.trim()).filter(|v| !v.is_empty())
    })
}

/// What `scontrol` says when the controller did not answer in time or could not be
/// reached (its `MessageTimeout`, a controller restarting): worth another try. Any
/// other message (`Invalid job id`, a refusal) is final.
const BUSY: &[&str] = &[
    "timed out",
    "time out",
    "timeout",
    "unable to contact",
    "connection refused",
    "temporarily unavailable",
    "try again",
];

/// Whether `scontrol`'s error `message` says the controller was busy or unreachable.
#[must_use]
pub fn controller_busy(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    BUSY.iter().any(|phrase| message.contains(phrase))
}

/// Why a job that saved goes back to the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequeueReason {
    /// SLURM's time limit: `--signal` sent SIGUSR1 to this process.
    TimeLimit,
    /// A preemption: the job's `PreemptTime` is set.
    Preemption,
}

impl RequeueReason {
    /// The reason as the log and the `requeue` record name it.
    #[must_use]
    pub fn text(self) -> &'static str {
        match self {
            RequeueReason::TimeLimit => "time limit (SIGUSR1)",
            RequeueReason::Preemption => "preemption",
        }
    }
}

/// What is known of the job when task 0 decides about its requeue, after the save:
/// this process's signals and the job's record (`scontrol show job`, read then; a
/// record that could not be read is all defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobEnd {
    /// SIGUSR1 reached this process (`--signal` before the time limit).
    pub time_limit_signal: bool,
    /// The record's `PreemptTime` is a time.
    pub preempted: bool,
    /// The record's `Restarts`.
    pub restarts: u64,
    /// This run's `SLURM_RESTART_COUNT`.
    pub restart_count: u64,
    /// The record's `Requeue` (`1` or `0`), None when it has none.
    pub requeueable: Option<bool>,
}

/// What task 0 does about the job's requeue after the save.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// SLURM requeued the job itself (a preempted batch step is signalled only when
    /// `GraceTime` ends, and `Restarts` already counts this run's end): nothing to do.
    Already(RequeueReason),
    /// Neither the time limit nor a preemption ended the job (a user's `scancel`):
    /// not requeued.
    NoReason,
    /// The job was submitted without `--requeue` (`Requeue=0`): not requeued, and
    /// the log says how to submit it.
    NotRequeueable(RequeueReason),
    /// `scontrol requeue` the job (retried within [`REQUEUE_TIMEOUT`] while the
    /// controller reads as busy, [`controller_busy`]).
    Requeue(RequeueReason),
}

/// The requeue decision for `job`, in this order: already requeued, no reason, not
/// requeueable, requeue. A time limit's SIGUSR1 is the reason before a preemption.
#[must_use]
pub fn requeue(job: &JobEnd) -> Requeue {
    let reason = if job.time_limit_signal {
        Some(RequeueReason::TimeLimit)
    } else if job.preempted {
        Some(RequeueReason::Preemption)
    } else {
        None
    };
    if job.restarts > job.restart_count {
        return Requeue::Already(reason.unwrap_or(RequeueReason::Preemption));
    }
    match reason {
        None => Requeue::NoReason,
        Some(reason) if job.requeueable == Some(false) => Requeue::NotRequeueable(reason),
        Some(reason) => Requeue::Requeue(reason),
    }
}

impl Requeue {
    /// The decision and its reason as the records name them: `already`, `no_reason`,
    /// `not_requeueable` or `requeue`.
    #[must_use]
    pub fn names(self) -> (&'static str, Option<&'static str>) {
        match self {
            Requeue::Already(r) => ("already", Some(r.text())),
            Requeue::NoReason => ("no_reason", None),
            Requeue::NotRequeueable(r) => ("not_requeueable", Some(r.text())),
            Requeue::Requeue(r) => ("requeue", Some(r.text())),
        }
    }
}

/// Whether this process decides about the job's requeue: under SLURM, with requeue
/// on, and as the job's task 0 (`SLURM_PROCID` 0, empty or unset: one task per job
/// requeues it).
#[must_use]
pub fn decides_requeue(under_slurm: bool, enabled: bool, procid: Option<&str>) -> bool {
    under_slurm && enabled && matches!(procid.map(str::trim), None | Some("" | "0"))
}

/// What the reader of the job asks `scontrol`, in order ([`JobRead`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobQuery {
    /// `scontrol show job -o JOB`: its `EndTime`, `Partition`, `Requeue`.
    Job,
    /// `scontrol show partition -o PARTITION`: its `GraceTime`.
    Partition(String),
    /// `scontrol show config`: the cluster's `KillWait`.
    Config,
}

impl JobQuery {
    /// `scontrol`'s arguments for the job `job_id`.
    #[must_use]
    pub fn args(&self, job_id: &str) -> Vec<String> {
        let words: &[&str] = match self {
            JobQuery::Job => &["show", "job", "-o", job_id],
            JobQuery::Partition(partition) => &["show", "partition", "-o", partition],
            JobQuery::Config => &["show", "config"],
        };
        words.iter().map(|w| (*w).to_owned()).collect()
    }
}

/// The read of a job's limits, once, when the handler starts: the job, its
/// partition (when it names one), the cluster's configuration, each bounded by
/// [`READ_TIMEOUT`]. A job that cannot be read, or any call that fails to run, ends
/// the read with an error (the job then has no deadline); a partition or
/// configuration that `scontrol` refuses leaves its value unknown.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRead {
    next: Option<JobQuery>,
    /// The job's fields (`scontrol show job -o`), empty until read.
    pub job: Vec<(String, String)>,
    /// The partition's `GraceTime`, seconds.
    pub grace_time: Option<f64>,
    /// The cluster's `KillWait`, seconds.
    pub kill_wait: Option<f64>,
    /// Why the read ended early.
    pub error: Option<String>,
}

impl Default for JobRead {
    fn default() -> Self {
        JobRead {
            next: Some(JobQuery::Job),
            job: Vec::new(),
            grace_time: None,
            kill_wait: None,
            error: None,
        }
    }
}

impl JobRead {
    /// The next call and its bound in seconds; None once the read is over.
    #[must_use]
    pub fn next(&self) -> Option<(&JobQuery, f64)> {
        self.next.as_ref().map(|q| (q, READ_TIMEOUT))
    }

    /// The job's field `key`, if read.
    #[must_use]
    pub fn field(&self, key: &str) -> Option<&str> {
        field_of(&self.job, key)
    }

    /// The job's `EndTime`, Unix seconds; None when unlimited or unknown.
    #[must_use]
    pub fn end_time(&self) -> Option<f64> {
        self.field("EndTime").and_then(unix_time)
    }

    /// Whether the job is requeueable (`Requeue=1`), None when not said.
    #[must_use]
    pub fn requeueable(&self) -> Option<bool> {
        self.field("Requeue").map(|r| r == "1")
    }

    /// The call handed out by [`JobRead::next`] exited with `code`, printing
    /// `stdout` and `stderr`.
    pub fn answered(&mut self, code: i32, stdout: &str, stderr: &str) {
        self.next = match self.next.take() {
            Some(JobQuery::Job) if code != 0 => {
                let said = if stderr.trim().is_empty() { stdout.trim() } else { stderr.trim() };
                self.error = Some(if said.is_empty() {
                    format!("RuntimeError: exit {code}")
                } else {
                    format!("RuntimeError: {said}")
                });
                None
            }
            Some(JobQuery::Job) => {
                self.job = fields(stdout.lines().next().unwrap_or(""));
                match self.field("Partition").filter(|p| !p.is_empty()) {
                    Some(partition) => Some(JobQuery::Partition(partition.to_owned())),
                    None => Some(JobQuery::Config),
                }
            }
            Some(JobQuery::Partition(_)) => {
                if code == 0 {
                    self.grace_time = fields(stdout)
                        .into_iter()
                        .find(|(k, _)| k == "GraceTime")
                        .and_then(|(_, v)| seconds(&v));
                }
                Some(JobQuery::Config)
            }
            Some(JobQuery::Config) => {
                if code == 0 {
                    self.kill_wait = config_value(stdout, "KillWait").and_then(seconds);
                }
                None
            }
            None => None,
        };
    }

    /// The call could not be made or did not end in time: `why`. The read ends.
    pub fn failed(&mut self, why: String) {
        if self.next.take().is_some() {
            self.error = Some(why);
        }
    }
}

/// Whether a signal's notice reads the job again first: a new SIGTERM of an `srun`
/// task whose partition has a `GraceTime` may be a preemption, whose grace time
/// started with it ([`grace_end`]).
#[must_use]
pub fn notice_reads_job(sigterm: bool, srun_step: bool, grace_time: Option<f64>) -> bool {
    sigterm && srun_step && grace_time.is_some_and(|g| g != 0.0)
}

/// The end of a preemption's grace time: `preempted` (the job's `PreemptTime`) plus
/// `grace_time`, when the job is being preempted in this run (a `PreemptTime` not
/// before its `StartTime`); None otherwise.
#[must_use]
pub fn grace_end(preempted: Option<f64>, started: Option<f64>, grace_time: Option<f64>) -> Option<f64> {
    let preempted = preempted.filter(|p| started.map_or(true, |s| *p >= s))?;
    Some(preempted + grace_time?)
}

/// A SLURM timestamp (the controller's local time, [`timestamp`]) as Unix seconds,
/// by the zone's rule (as Python's naive `datetime.timestamp()`); None for
/// `Unknown`, `N/A` or anything else.
#[must_use]
pub fn unix_time(text: &str) -> Option<f64> {
    let [year, month, day, hour, minute, second] = timestamp(text)?;
    // SAFETY: an all-zero `tm` is valid; mktime reads and normalizes it, nothing else.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = i32::try_from(year).ok()? - 1900;
    tm.tm_mon = i32::try_from(month).ok()? - 1;
    tm.tm_mday = i32::try_from(day).ok()?;
    tm.tm_hour = i32::try_from(hour).ok()?;
    tm.tm_min = i32::try_from(minute).ok()?;
    tm.tm_sec = i32::try_from(second).ok()?;
    tm.tm_isdst = -1;
    // SAFETY: `tm` is a valid, initialized struct owned by this frame.
    let seconds = unsafe { libc::mktime(&mut tm) };
    #[allow(clippy::cast_precision_loss)] // Unix seconds fit an f64 exactly
    (seconds != -1).then_some(seconds as f64)
}

/// The field `key` of a job's fields (`scontrol show job -o`, [`fields`]).
#[must_use]
pub fn field_of<'a>(job: &'a [(String, String)], key: &str) -> Option<&'a str> {
    job.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The field `key` of a job's fields as Unix seconds ([`unix_time`]).
#[must_use]
pub fn time_of(job: &[(String, String)], key: &str) -> Option<f64> {
    field_of(job, key).and_then(unix_time)
}

/// [`grace_end`] from the job's fields as a notice read them (`PreemptTime`,
/// `StartTime`).
#[must_use]
pub fn grace_end_of(job: &[(String, String)], grace_time: Option<f64>) -> Option<f64> {
    grace_end(time_of(job, "PreemptTime"), time_of(job, "StartTime"), grace_time)
}

/// The job's `Restarts` field as a count (0 when absent, negative or not a number).
#[must_use]
pub fn restarts(value: Option<&str>) -> u64 {
    value
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map_or(0, |n| u64::try_from(n).unwrap_or(0))
}

/// Each `scontrol requeue` is given at least this many seconds, even once
/// [`REQUEUE_TIMEOUT`] is spent (a retry the rule still allows, see [`crate::retry`]).
pub const MIN_ATTEMPT_TIMEOUT: f64 = 1.0;

/// What the process does next while it puts the job back in the queue
/// ([`RequeueRun::poll`]).
#[derive(Clone, Debug, PartialEq)]
pub enum RequeueStep {
    /// Run `scontrol requeue JOB` within `timeout` seconds. `again`: the failure
    /// before this attempt (None for the first), for the log.
    Run { timeout: f64, again: Option<String> },
    /// Read the job (`scontrol show job`, within `timeout` seconds) and report its
    /// `Restarts`: a controller that did not answer may have acted all the same.
    Show { timeout: f64 },
    /// Nothing until `at` (the retry rule's pause between two attempts).
    Wait { at: f64 },
    /// Finished: whether the job went back to the queue, and what scontrol said.
    Done { requeued: bool, message: String },
}

/// The outcome of one `scontrol requeue`, as the process that ran it reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// It exited with `code` (0: the job went back to the queue), saying `said`.
    Exited { code: i32, said: String },
    /// It did not finish within the step's timeout.
    TimedOut,
    /// It could not be started at all (not on `PATH`, not executable): why.
    CouldNotRun(String),
}

/// Seconds as Python's `{:g}` prints them (six significant digits, no trailing
/// zeros): `30`, `1`, `29.9877`.
fn seconds_text(seconds: f64) -> String {
    #[allow(clippy::cast_possible_truncation)] // a small digit count
    let before = if seconds.abs() >= 1.0 {
        seconds.abs().log10().floor() as i32 + 1
    } else {
        1
    };
    let decimals = usize::try_from((6 - before).max(0)).unwrap_or(0);
    let text = format!("{seconds:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// What the job's record shows when read for the requeue (`scontrol show job`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobShown {
    /// Its `PreemptTime` is a time.
    pub preempted: bool,
    /// Its `Restarts` ([`restarts`]).
    pub restarts: u64,
    /// Its `Requeue` (`1` or `0`), None when it has none.
    pub requeueable: Option<bool>,
}

impl JobShown {
    /// What the job's fields (`scontrol show job -o`) show.
    #[must_use]
    pub fn from_fields(job: &[(String, String)]) -> Self {
        let field = |key: &str| field_of(job, key);
        JobShown {
            preempted: field("PreemptTime").and_then(timestamp).is_some(),
            restarts: restarts(field("Restarts")),
            requeueable: field("Requeue").map(|r| r != "0"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum RunState {
    Deciding,
    Reading,
    Ready { again: Option<String> },
    Running { timeout: f64 },
    Failed { message: String },
    Showing { message: String },
    Waiting { at: f64, message: String },
    Done { requeued: bool, message: String },
}

/// The job back in the queue after the save, by the task that decides it
/// ([`decides_requeue`]): the job is read and the decision made ([`requeue`]);
/// when it is to requeue, `scontrol requeue`, retried by the protocol's retry rule
/// ([`crate::retry::Retry`], bounded by [`REQUEUE_TIMEOUT`] from the decision)
/// while the controller reads as too busy to answer ([`controller_busy`]); after
/// each failure the job is read again, and one that shows this run's requeue counts
/// as requeued. Events go in with `now`, [`RequeueStep`]s come out: the caller only
/// performs them. It never reads a clock.
#[derive(Clone, Debug)]
pub struct RequeueRun {
    time_limit_signal: bool,
    restart_count: u64,
    decision: Option<Requeue>,
    retry: crate::retry::Retry,
    end: f64,
    state: RunState,
    attempt_start: Option<f64>,
}

impl RequeueRun {
    /// The requeue of a job whose process got SLURM's time-limit signal (SIGUSR1) or
    /// not, by the run whose `SLURM_RESTART_COUNT` is `restart_count`.
    #[must_use]
    pub fn new(time_limit_signal: bool, restart_count: u64) -> Self {
        RequeueRun {
            time_limit_signal,
            restart_count,
            decision: None,
            retry: crate::retry::Retry::new(REQUEUE_TIMEOUT),
            end: f64::INFINITY,
            state: RunState::Deciding,
            attempt_start: None,
        }
    }

    /// The decision, once the job was read.
    #[must_use]
    pub fn decision(&self) -> Option<Requeue> {
        self.decision
    }

    /// What to do at `now`. A `Run` or `Show` is handed out once; its outcome comes
    /// back through [`RequeueRun::ran`] or [`RequeueRun::shown`] (until then `poll`
    /// answers `Wait` for ever: nothing is due).
    pub fn poll(&mut self, now: f64) -> RequeueStep {
        match std::mem::replace(&mut self.state, RunState::Reading) {
            RunState::Deciding => {
                self.state = RunState::Reading;
                RequeueStep::Show { timeout: READ_TIMEOUT }
            }
            RunState::Ready { again } => {
                self.attempt_start = Some(now);
                let timeout = (self.end - now).max(MIN_ATTEMPT_TIMEOUT);
                self.state = RunState::Running { timeout };
                RequeueStep::Run { timeout, again }
            }
            RunState::Failed { message } => {
                self.state = RunState::Showing { message };
                RequeueStep::Show { timeout: READ_TIMEOUT }
            }
            RunState::Waiting { at, message } if now < at => {
                self.state = RunState::Waiting { at, message };
                RequeueStep::Wait { at }
            }
            RunState::Waiting { message, .. } => {
                self.state = RunState::Ready { again: Some(message) };
                self.poll(now)
            }
            RunState::Done { requeued, message } => {
                self.state = RunState::Done {
                    requeued,
                    message: message.clone(),
                };
                RequeueStep::Done { requeued, message }
            }
            state @ (RunState::Running { .. } | RunState::Reading | RunState::Showing { .. }) => {
                self.state = state;
                RequeueStep::Wait { at: f64::INFINITY }
            }
        }
    }

    /// The `scontrol requeue` handed out by [`RequeueRun::poll`] ended so.
    pub fn ran(&mut self, attempt: Attempt) {
        let RunState::Running { timeout } = self.state else {
            return;
        };
        self.state = match attempt {
            Attempt::Exited { code: 0, said } => RunState::Done {
                requeued: true,
                message: said,
            },
            Attempt::Exited { code, said } if said.trim().is_empty() => RunState::Failed {
                message: format!("scontrol requeue exited with {code}"),
            },
            Attempt::Exited { said, .. } => RunState::Failed { message: said },
            Attempt::TimedOut => RunState::Failed {
                message: format!("scontrol requeue did not finish within {} s", seconds_text(timeout)),
            },
            Attempt::CouldNotRun(why) => RunState::Done {
                requeued: false,
                message: format!("scontrol requeue could not run: {why}"),
            },
        };
    }

    /// The job read at `now` (a `Show`), or why it could not be. The first read
    /// makes the decision ([`requeue`]; an unread record is all defaults), and a
    /// requeue's bound starts then. A read after a failed attempt: `Restarts` past
    /// this run's count is requeued all the same; else the retry rule decides, and
    /// only a busy controller is tried again.
    pub fn shown(&mut self, now: f64, job: Result<JobShown, String>) {
        match std::mem::replace(&mut self.state, RunState::Reading) {
            RunState::Reading => self.decide(now, job),
            RunState::Showing { message } => self.after_failure(now, message, job.ok().map(|j| j.restarts)),
            state => self.state = state,
        }
    }

    fn decide(&mut self, now: f64, job: Result<JobShown, String>) {
        let (shown, why) = match job {
            Ok(shown) => (shown, None),
            Err(why) => (JobShown::default(), Some(why)),
        };
        let decision = requeue(&JobEnd {
            time_limit_signal: self.time_limit_signal,
            preempted: shown.preempted,
            restarts: shown.restarts,
            restart_count: self.restart_count,
            requeueable: shown.requeueable,
        });
        self.decision = Some(decision);
        self.state = match decision {
            Requeue::Already(_) => RunState::Done {
                requeued: true,
                message: "SLURM already requeued the job".to_owned(),
            },
            Requeue::NoReason => RunState::Done {
                requeued: false,
                message: why.unwrap_or_else(|| "the notice was neither SLURM's time limit nor a preemption".to_owned()),
            },
            Requeue::NotRequeueable(_) => RunState::Done {
                requeued: false,
                message: "the job is not requeueable (Requeue=0): submit it with sbatch --requeue".to_owned(),
            },
            Requeue::Requeue(_) => {
                self.retry = crate::retry::Retry::new(REQUEUE_TIMEOUT).started(now);
                self.end = now + REQUEUE_TIMEOUT;
                RunState::Ready { again: None }
            }
        };
    }

    fn after_failure(&mut self, now: f64, message: String, restarts: Option<u64>) {
        if restarts.is_some_and(|r| r > self.restart_count) {
            self.state = RunState::Done {
                requeued: true,
                message: format!("{message}; the job shows requeued all the same"),
            };
            return;
        }
        self.state = match self.retry.failed(now, false) {
            crate::retry::Verdict::Again { at, .. } if controller_busy(&message) => RunState::Waiting { at, message },
            _ => RunState::Done { requeued: false, message },
        };
    }

    /// Seconds from `now` until SLURM's SIGKILL, once this run requeued the job: the
    /// requeue ends the job's steps at the soonest when its last `scontrol requeue`
    /// started ([`kill_after_requeue`]). None before, when not requeued by a call of
    /// this run, or without `KillWait`.
    #[must_use]
    pub fn kill_after(&self, now: f64, kill_wait: Option<f64>) -> Option<f64> {
        match (&self.state, self.attempt_start) {
            (RunState::Done { requeued: true, .. }, Some(start)) => kill_after_requeue(now - start, kill_wait),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A requeue decided (a preemption of this run), at `now`.
    fn decided(now: f64, restart_count: u64) -> RequeueRun {
        let mut run = RequeueRun::new(false, restart_count);
        assert_eq!(run.poll(now), RequeueStep::Show { timeout: READ_TIMEOUT });
        let shown = JobShown {
            preempted: true,
            restarts: restart_count,
            requeueable: Some(true),
        };
        run.shown(now, Ok(shown));
        assert_eq!(run.decision(), Some(Requeue::Requeue(RequeueReason::Preemption)));
        run
    }

    fn run_to_end(
        run: &mut RequeueRun,
        now: &mut f64,
        answer: &mut dyn FnMut(f64) -> Attempt,
        restarts: Option<u64>,
    ) -> (bool, String, u32) {
        let mut calls = 0;
        loop {
            match run.poll(*now) {
                RequeueStep::Run { timeout, .. } => {
                    calls += 1;
                    let attempt = answer(timeout);
                    *now += 0.01;
                    run.ran(attempt);
                }
                RequeueStep::Show { timeout } => {
                    assert_eq!(timeout, READ_TIMEOUT);
                    let shown = restarts.map(|restarts| JobShown {
                        restarts,
                        ..JobShown::default()
                    });
                    run.shown(*now, shown.ok_or_else(|| "unreadable".to_owned()));
                }
                RequeueStep::Wait { at } => {
                    assert!(at.is_finite() && at > *now, "a pause ends: {at} at {now}");
                    *now = at;
                }
                RequeueStep::Done { requeued, message } => return (requeued, message, calls),
            }
        }
    }

    const BUSY_SAID: &str = "slurm_requeue error: Socket timed out on send/recv operation";

    #[test]
    fn a_requeue_that_succeeds_at_once_is_done() {
        let mut run = decided(100.0, 0);
        let mut now = 100.0;
        let got = run_to_end(
            &mut run,
            &mut now,
            &mut |timeout| {
                assert_eq!(timeout, REQUEUE_TIMEOUT);
                Attempt::Exited {
                    code: 0,
                    said: "ok".into(),
                }
            },
            Some(0),
        );
        assert_eq!(got, (true, "ok".into(), 1));
        assert_eq!(
            run.poll(now),
            RequeueStep::Done {
                requeued: true,
                message: "ok".into()
            },
            "done stays done"
        );
        // SIGKILL KillWait after the last attempt's start.
        assert_eq!(run.kill_after(102.0, Some(30.0)), Some(28.0));
        assert_eq!(run.kill_after(102.0, None), None);
    }

    #[test]
    fn a_busy_controller_is_tried_again_then_requeues() {
        let mut run = decided(0.0, 0);
        let mut now = 0.0;
        let mut answers = vec![
            Attempt::Exited {
                code: 0,
                said: String::new(),
            },
            Attempt::Exited {
                code: 1,
                said: BUSY_SAID.into(),
            },
        ];
        let got = run_to_end(&mut run, &mut now, &mut |_| answers.pop().unwrap(), Some(0));
        assert_eq!(got, (true, String::new(), 2));
    }

    #[test]
    fn a_job_that_shows_requeued_counts_as_requeued() {
        let mut run = decided(0.0, 2);
        let mut now = 0.0;
        let got = run_to_end(
            &mut run,
            &mut now,
            &mut |_| Attempt::Exited {
                code: 1,
                said: BUSY_SAID.into(),
            },
            Some(3),
        );
        assert!(got.0);
        assert!(got.1.ends_with("; the job shows requeued all the same"), "{}", got.1);
        assert_eq!(got.2, 1);
        // Restarts equal to this run's count, or unreadable: not requeued by that.
        for restarts in [Some(2), None] {
            let mut run = decided(0.0, 2);
            let mut now = 0.0;
            let mut answers = vec![
                Attempt::Exited {
                    code: 0,
                    said: String::new(),
                },
                Attempt::Exited {
                    code: 1,
                    said: BUSY_SAID.into(),
                },
            ];
            assert_eq!(run_to_end(&mut run, &mut now, &mut |_| answers.pop().unwrap(), restarts).2, 2);
        }
    }

    #[test]
    fn a_refusal_or_a_start_failure_is_final() {
        let mut run = decided(0.0, 0);
        let mut now = 0.0;
        let refused = "slurm_requeue error: Invalid job id specified";
        let got = run_to_end(
            &mut run,
            &mut now,
            &mut |_| Attempt::Exited {
                code: 1,
                said: refused.into(),
            },
            Some(0),
        );
        assert_eq!(got, (false, refused.into(), 1));
        assert_eq!(run.kill_after(now, Some(30.0)), None, "not requeued: no kill stated");
        let mut run = decided(0.0, 0);
        let got = run_to_end(&mut run, &mut now, &mut |_| Attempt::CouldNotRun("no scontrol".into()), Some(0));
        assert_eq!(got, (false, "scontrol requeue could not run: no scontrol".into(), 1));
    }

    #[test]
    fn a_busy_controller_is_given_up_on_within_the_bound() {
        let mut run = decided(0.0, 0);
        let mut now = 0.0;
        let mut timeouts = Vec::new();
        let got = run_to_end(
            &mut run,
            &mut now,
            &mut |timeout| {
                timeouts.push(timeout);
                Attempt::Exited {
                    code: 1,
                    said: BUSY_SAID.into(),
                }
            },
            Some(0),
        );
        assert_eq!((got.0, got.1.as_str()), (false, BUSY_SAID));
        assert!(got.2 >= 4, "at least the rule's minimum of attempts: {}", got.2);
        assert!(
            (REQUEUE_TIMEOUT..REQUEUE_TIMEOUT + 2.0).contains(&now),
            "given up once the bound passed: {now}"
        );
        // Each attempt gets what is left of the bound, at least a second.
        assert_eq!(timeouts[0], REQUEUE_TIMEOUT);
        assert!(timeouts.iter().all(|t| *t >= MIN_ATTEMPT_TIMEOUT));
        assert_eq!(*timeouts.last().unwrap(), MIN_ATTEMPT_TIMEOUT);
    }

    #[test]
    fn attempts_that_time_out_get_the_minimum_once_the_bound_is_spent() {
        // A controller that answers "busy" only at each attempt's timeout: the first
        // attempt takes the whole bound, the rule's minimum of attempts follows, each
        // with MIN_ATTEMPT_TIMEOUT.
        let mut run = decided(0.0, 0);
        let mut now = 0.0;
        let mut timeouts = Vec::new();
        loop {
            match run.poll(now) {
                RequeueStep::Run { timeout, again } => {
                    assert_eq!(again.is_some(), !timeouts.is_empty());
                    timeouts.push(timeout);
                    now += timeout;
                    run.ran(Attempt::Exited {
                        code: 1,
                        said: BUSY_SAID.into(),
                    });
                }
                RequeueStep::Show { .. } => run.shown(now, Err("unreadable".into())),
                RequeueStep::Wait { at } => now = at,
                RequeueStep::Done { requeued, .. } => {
                    assert!(!requeued);
                    break;
                }
            }
        }
        assert_eq!(timeouts, vec![REQUEUE_TIMEOUT, 1.0, 1.0, 1.0]);
        // scontrol's own timeout (the process killed) reads as no answer: final.
        let mut run = decided(0.0, 0);
        let mut now = 0.0;
        let got = run_to_end(&mut run, &mut now, &mut |_| Attempt::TimedOut, None);
        assert_eq!(got, (false, "scontrol requeue did not finish within 30 s".into(), 1));
        // An exit without a word is named by its code.
        let mut run = decided(0.0, 0);
        let got = run_to_end(&mut run, &mut now, &mut |_| Attempt::Exited { code: 3, said: " ".into() }, None);
        assert_eq!(got, (false, "scontrol requeue exited with 3".into(), 1));
        for (seconds, text) in [
            (30.0, "30"),
            (1.0, "1"),
            (29.987_654, "29.9877"),
            (0.5, "0.5"),
            (5.123_456_7, "5.12346"),
        ] {
            assert_eq!(seconds_text(seconds), text);
        }
    }

    #[test]
    fn out_of_turn_events_change_nothing() {
        let nine = || {
            Ok(JobShown {
                restarts: 9,
                ..JobShown::default()
            })
        };
        let mut run = RequeueRun::new(true, 0);
        run.ran(Attempt::Exited {
            code: 0,
            said: String::new(),
        });
        assert_eq!(run.decision(), None);
        assert!(matches!(run.poll(0.0), RequeueStep::Show { .. }));
        assert_eq!(run.poll(0.0), RequeueStep::Wait { at: f64::INFINITY }, "the read is awaited");
        let mut run = decided(0.0, 0);
        run.shown(0.0, nine());
        run.ran(Attempt::Exited {
            code: 0,
            said: String::new(),
        });
        assert!(matches!(run.poll(0.0), RequeueStep::Run { .. }));
        assert_eq!(
            run.poll(0.0),
            RequeueStep::Wait { at: f64::INFINITY },
            "the attempt's outcome is awaited"
        );
        run.shown(0.0, nine());
        assert_eq!(run.poll(0.0), RequeueStep::Wait { at: f64::INFINITY });
    }

    #[test]
    fn the_first_read_decides_and_only_a_requeue_runs_scontrol() {
        use RequeueReason::{Preemption, TimeLimit};
        let shown = |preempted, restarts, requeueable| {
            Ok(JobShown {
                preempted,
                restarts,
                requeueable,
            })
        };
        let unread = || Err("scontrol show job failed: gone".to_owned());
        // (SIGUSR1, restart count, the read, decision, done)
        type Row = (bool, u64, Result<JobShown, String>, Requeue, Option<(bool, &'static str)>);
        let rows: Vec<Row> = vec![
            (
                false,
                1,
                shown(false, 2, Some(true)),
                Requeue::Already(Preemption),
                Some((true, "SLURM already requeued the job")),
            ),
            (
                false,
                0,
                shown(false, 0, Some(true)),
                Requeue::NoReason,
                Some((false, "the notice was neither SLURM's time limit nor a preemption")),
            ),
            (
                false,
                0,
                unread(),
                Requeue::NoReason,
                Some((false, "scontrol show job failed: gone")),
            ),
            (true, 0, unread(), Requeue::Requeue(TimeLimit), None),
            (
                false,
                0,
                shown(true, 0, Some(false)),
                Requeue::NotRequeueable(Preemption),
                Some((false, "the job is not requeueable (Requeue=0): submit it with sbatch --requeue")),
            ),
            (false, 0, shown(true, 0, None), Requeue::Requeue(Preemption), None),
        ];
        for (usr1, restart_count, read, decision, done) in rows {
            let mut run = RequeueRun::new(usr1, restart_count);
            assert!(matches!(run.poll(50.0), RequeueStep::Show { .. }));
            run.shown(100.0, read);
            assert_eq!(run.decision(), Some(decision));
            match (run.poll(100.0), done) {
                (RequeueStep::Done { requeued, message }, Some((want, said))) => {
                    assert_eq!((requeued, message.as_str()), (want, said));
                }
                (RequeueStep::Run { timeout, again: None }, None) => {
                    assert_eq!(timeout, REQUEUE_TIMEOUT, "the bound starts at the decision");
                }
                (step, _) => panic!("{decision:?}: {step:?}"),
            }
        }
    }

    #[test]
    fn a_job_is_read_then_its_partition_then_the_configuration() {
        let mut read = JobRead::default();
        let (query, timeout) = read.next().unwrap();
        assert_eq!((query.clone(), timeout), (JobQuery::Job, READ_TIMEOUT));
        assert_eq!(query.args("7"), ["show", "job", "-o", "7"]);
        read.answered(0, "JobId=7 Partition=low EndTime=Unknown Requeue=1\nsecond line", "");
        assert_eq!(read.field("Partition"), Some("low"));
        let (query, _) = read.next().unwrap();
        assert_eq!(query.args("7"), ["show", "partition", "-o", "low"]);
        read.answered(0, "PartitionName=low GraceTime=00:00:20 State=UP", "");
        assert_eq!(read.grace_time, Some(20.0));
        assert_eq!(read.next().unwrap().0.args("7"), ["show", "config"]);
        read.answered(0, "KillWait                = 30 sec\n", "");
        assert_eq!((read.kill_wait, read.next(), read.error.clone()), (Some(30.0), None, None));
        read.answered(0, "", "");
        assert_eq!(read.next(), None, "done stays done");
    }

    #[test]
    fn a_job_read_skips_what_scontrol_refuses_and_ends_at_a_failure() {
        // No partition: straight to the configuration; a refused one: no KillWait.
        let mut read = JobRead::default();
        read.answered(0, "JobId=7 Partition=", "");
        assert_eq!(read.next().unwrap().0, &JobQuery::Config);
        read.answered(1, "", "denied");
        assert_eq!((read.kill_wait, read.error.clone(), read.next()), (None, None, None));
        // A refused partition: its GraceTime unknown, the configuration still read.
        let mut read = JobRead::default();
        read.answered(0, "JobId=7 Partition=low", "");
        read.answered(1, "", "no such partition");
        assert_eq!((read.grace_time, read.next().unwrap().0), (None, &JobQuery::Config));
        // The job refused: the read ends, naming scontrol's message.
        let mut read = JobRead::default();
        read.answered(1, "", " Invalid job id specified\n");
        assert_eq!(read.error.as_deref(), Some("RuntimeError: Invalid job id specified"));
        assert_eq!(read.next(), None);
        let mut read = JobRead::default();
        read.answered(2, "", "");
        assert_eq!(read.error.as_deref(), Some("RuntimeError: exit 2"));
        // A call that cannot run or times out: the read ends with it.
        let mut read = JobRead::default();
        read.answered(0, "JobId=7 Partition=low", "");
        read.failed("TimeoutExpired: scontrol".into());
        assert_eq!((read.next(), read.error.as_deref()), (None, Some("TimeoutExpired: scontrol")));
        read.failed("later".into());
        assert_eq!(read.error.as_deref(), Some("TimeoutExpired: scontrol"), "the first failure stays");
    }

    #[test]
    fn a_notice_reads_the_job_for_an_srun_task_s_sigterm_with_a_grace_time() {
        assert!(notice_reads_job(true, true, Some(20.0)));
        assert!(!notice_reads_job(true, true, Some(0.0)));
        assert!(!notice_reads_job(true, true, None));
        assert!(!notice_reads_job(true, false, Some(20.0)));
        assert!(!notice_reads_job(false, true, Some(20.0)));
        // Preempted in this run: PreemptTime plus GraceTime.
        assert_eq!(grace_end(Some(1000.0), Some(900.0), Some(20.0)), Some(1020.0));
        assert_eq!(grace_end(Some(1000.0), None, Some(20.0)), Some(1020.0));
        assert_eq!(grace_end(Some(900.0), Some(900.0), Some(20.0)), Some(920.0));
        // A PreemptTime of an earlier run, none, or no GraceTime: none.
        assert_eq!(grace_end(Some(500.0), Some(900.0), Some(20.0)), None);
        assert_eq!(grace_end(None, Some(900.0), Some(20.0)), None);
        assert_eq!(grace_end(Some(1000.0), None, None), None);
    }

    #[test]
    fn a_job_s_fields_as_the_requeue_and_a_notice_read_them() {
        let job = fields("JobId=7 PreemptTime=2026-11-25T16:42:37 StartTime=2026-11-25T16:00:00 Restarts=2 Requeue=0");
        assert_eq!(
            JobShown::from_fields(&job),
            JobShown {
                preempted: true,
                restarts: 2,
                requeueable: Some(false)
            }
        );
        assert_eq!(JobShown::from_fields(&fields("PreemptTime=None")), JobShown::default());
        let preempted = unix_time("2026-11-25T16:42:37").unwrap();
        assert_eq!(unix_time("2026-11-25T16:42:38"), Some(preempted + 1.0));
        assert_eq!(grace_end_of(&job, Some(20.0)), Some(preempted + 20.0));
        assert_eq!(grace_end_of(&fields("StartTime=2026-11-25T16:00:00"), Some(20.0)), None);
        assert_eq!(unix_time("Unknown"), None);
        let mut read = JobRead::default();
        read.answered(0, "JobId=7 EndTime=2026-11-25T16:42:37 Requeue=1", "");
        assert_eq!((read.end_time(), read.requeueable()), (Some(preempted), Some(true)));
    }

    #[test]
    fn restarts_are_a_count() {
        for (value, want) in [
            (Some("2"), 2),
            (Some(" 3 "), 3),
            (Some("-1"), 0),
            (Some("x"), 0),
            (Some(""), 0),
            (None, 0),
        ] {
            assert_eq!(restarts(value), want, "{value:?}");
        }
    }

    #[test]
    fn signal_deadlines_table() {
        // For a signal at 1000: (end, sigterm, grace_end, KillWait) -> (deadline, kill).
        type Row = (Option<f64>, bool, Option<f64>, Option<f64>, Option<f64>, Option<f64>);
        let rows: [Row; 10] = [
            // SIGUSR1 (time limit): the saves by the job's end, SIGKILL KillWait after it.
            (Some(1600.0), false, None, Some(30.0), Some(1600.0), Some(1630.0)),
            // ... KillWait unknown: no kill is assumed.
            (Some(1600.0), false, None, None, Some(1600.0), None),
            // ... KillWait under SLURM's floor of 5 s.
            (Some(1600.0), false, None, Some(2.0), Some(1600.0), Some(1605.0)),
            // ... the job's end is past or unknown.
            (Some(1000.0), false, None, Some(30.0), None, None),
            (None, false, None, Some(30.0), None, None),
            // scancel, or a batch step's preemption SIGTERM: now + KillWait for both.
            (None, true, None, Some(10.0), Some(1010.0), Some(1010.0)),
            // ... capped by the job's end.
            (Some(1004.0), true, None, Some(10.0), Some(1004.0), Some(1010.0)),
            // An srun task's preemption: the grace time's end, SIGKILL KillWait after it.
            (None, true, Some(1020.0), Some(10.0), Some(1020.0), Some(1030.0)),
            // A SIGTERM with nothing read: the job's end, no kill.
            (Some(1600.0), true, None, None, Some(1600.0), None),
            (None, true, Some(1020.0), None, Some(1020.0), None),
        ];
        for (end, sigterm, grace_end, kill_wait, deadline, kill) in rows {
            assert_eq!(
                signal_deadlines(1000.0, end, sigterm, grace_end, kill_wait),
                (deadline, kill),
                "{end:?} {sigterm} {grace_end:?} {kill_wait:?}"
            );
        }
    }

    #[test]
    fn a_requeue_moves_the_kill_to_killwait_after_it() {
        assert_eq!(kill_after_requeue(2.0, Some(30.0)), Some(28.0));
        assert_eq!(kill_after_requeue(0.5, Some(1.0)), Some(4.5), "SLURM's floor of 5 s");
        assert_eq!(kill_after_requeue(2.0, None), None, "KillWait unknown: none assumed");
        assert_eq!(kill_after_requeue(-1.0, Some(30.0)), Some(30.0));
        assert_eq!(kill_after(10.0, Some(f64::NAN)), None);
    }

    #[test]
    fn requeue_decision_table() {
        use RequeueReason::{Preemption, TimeLimit};
        let job = |time_limit_signal, preempted, restarts, restart_count, requeueable| JobEnd {
            time_limit_signal,
            preempted,
            restarts,
            restart_count,
            requeueable,
        };
        // (name, facts, decision)
        let rows = [
            (
                "time limit: requeue",
                job(true, false, 0, 0, Some(true)),
                Requeue::Requeue(TimeLimit),
            ),
            (
                "preemption: requeue",
                job(false, true, 0, 0, Some(true)),
                Requeue::Requeue(Preemption),
            ),
            (
                "both: the time limit is named",
                job(true, true, 0, 0, None),
                Requeue::Requeue(TimeLimit),
            ),
            (
                "no Requeue field: requeue",
                job(false, true, 2, 2, None),
                Requeue::Requeue(Preemption),
            ),
            (
                "a user's scancel: not requeued",
                job(false, false, 0, 0, Some(true)),
                Requeue::NoReason,
            ),
            ("an unread record and no signal: no reason", JobEnd::default(), Requeue::NoReason),
            (
                "Requeue=0: not requeueable",
                job(true, false, 0, 0, Some(false)),
                Requeue::NotRequeueable(TimeLimit),
            ),
            (
                "Requeue=0, preempted: not requeueable",
                job(false, true, 1, 1, Some(false)),
                Requeue::NotRequeueable(Preemption),
            ),
            (
                "Restarts past this run's count: already",
                job(false, true, 1, 0, Some(true)),
                Requeue::Already(Preemption),
            ),
            (
                "already, with no reason read: a preemption",
                job(false, false, 3, 2, Some(true)),
                Requeue::Already(Preemption),
            ),
            (
                "already comes before Requeue=0",
                job(true, false, 1, 0, Some(false)),
                Requeue::Already(TimeLimit),
            ),
            (
                "Restarts equal to this run's count: not already",
                job(false, true, 2, 2, Some(true)),
                Requeue::Requeue(Preemption),
            ),
        ];
        for (name, facts, want) in rows {
            assert_eq!(requeue(&facts), want, "{name}");
        }
        assert_eq!(TimeLimit.text(), "time limit (SIGUSR1)");
        assert_eq!(Preemption.text(), "preemption");
    }

    #[test]
    fn task_zero_decides() {
        let rows = [
            (true, true, None, true),
            (true, true, Some("0"), true),
            (true, true, Some(" 0\n"), true),
            (true, true, Some(""), true),
            (true, true, Some("1"), false),
            (true, false, Some("0"), false),
            (false, true, None, false),
        ];
        for (under_slurm, enabled, procid, want) in rows {
            assert_eq!(
                decides_requeue(under_slurm, enabled, procid),
                want,
                "{under_slurm} {enabled} {procid:?}"
            );
        }
    }

    fn as_map(text: &str) -> Vec<(&'static str, String)> {
        fields(text)
            .into_iter()
            .map(|(k, v)| (&*Box::leak(k.into_boxed_str()), v))
            .collect()
    }

    #[test]
    fn fields_of_one_record() {
        let got = as_map("JobId=12 JobName=train run UserId=root(0) TRES/node=cpu=1 EndTime=Unknown Requeue=1");
        assert_eq!(
            got,
            vec![
                ("JobId", "12".into()),
                ("JobName", "train run".into()),
                ("UserId", "root(0)".into()),
                ("TRES/node", "cpu=1".into()),
                ("EndTime", "Unknown".into()),
                ("Requeue", "1".into()),
            ]
        );
        assert_eq!(as_map("A=1 A=2"), vec![("A", "1".into())]);
        assert_eq!(as_map("  Empty= Next=x\n"), vec![("Empty", String::new()), ("Next", "x".into())]);
        assert!(fields("no fields here").is_empty());
        assert!(fields("").is_empty());
    }

    #[test]
    fn timestamps() {
        assert_eq!(timestamp("2026-11-25T16:43:17"), Some([2026, 11, 25, 16, 43, 17]));
        assert_eq!(timestamp(" 2026-11-25T16:43:17\n"), Some([2026, 11, 25, 16, 43, 17]));
        for bad in [
            "Unknown",
            "N/A",
            "None",
            "",
            "2026-13-25T16:43:17",
            "2026-11-25 16:43:17",
            "2026-11-25T16:43:1x",
        ] {
            assert_eq!(timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations() {
        let rows: &[(&str, Option<f64>)] = &[
            ("30 sec", Some(30.0)),
            ("20", Some(20.0)),
            ("00:00:20", Some(20.0)),
            ("05:00", Some(300.0)),
            ("1-00:00:10", Some(86_410.0)),
            ("2-01:00:00", Some(176_400.0)),
            ("UNLIMITED", None),
            ("", None),
            ("1-", None),
            ("-5", None),
            ("1:x", None),
        ];
        for &(text, want) in rows {
            assert_eq!(seconds(text), want, "{text:?}");
        }
    }

    #[test]
    fn a_busy_controller_is_worth_another_try_and_a_refusal_is_not() {
        for busy in [
            "slurm_requeue error: Socket timed out on send/recv operation",
            "Unable to contact slurm controller (connect failure)",
            "Connection refused",
            "Resource temporarily unavailable",
            "Slurm backup controller in standby mode, try again",
            "TIMEOUT",
        ] {
            assert!(controller_busy(busy), "{busy}");
        }
        for refusal in ["Invalid job id specified", "Job is not requeueable", "Access/permission denied", ""] {
            assert!(!controller_busy(refusal), "{refusal}");
        }
    }

    #[test]
    fn config_values() {
        let config =
            "Configuration data as of 2026-11-25T16:43:17\nKillOnBadExit           = 0\nKillWait                = 30 sec\nEmpty =\n";
        assert_eq!(config_value(config, "KillWait"), Some("30 sec"));
        assert_eq!(config_value(config, "KillOnBadExit"), Some("0"));
        assert_eq!(config_value(config, "Empty"), None);
        assert_eq!(config_value(config, "Missing"), None);
    }
}
