//! SLURM's text as `scontrol` prints it: `Key=Value` fields, local timestamps and
//! durations, and whether an error is worth another try. The deadlines they lead to are told in docs/getting-started/slurm.md;
//! `_platforms/slurm.py` runs `scontrol` and asks these, within the bounds below.

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

/// Whether this process decides about the job's requeue: under SLURM, with requeue
/// on, and as the job's task 0 (`SLURM_PROCID` 0, empty or unset: one task per job
/// requeues it).
#[must_use]
pub fn decides_requeue(under_slurm: bool, enabled: bool, procid: Option<&str>) -> bool {
    under_slurm && enabled && matches!(procid.map(str::trim), None | Some("" | "0"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
