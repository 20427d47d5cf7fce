//! The SLURM job as one protocol object ([`Job`]): events in, actions out,
//! the caller (`_platforms/slurm.py`) only performs them.
//!
//! Three threads talk to it, each with one loop (report an event, perform the
//! action it gets back, until the action is an outcome):
//!
//! | thread | starts with | performs | ends with |
//! | --- | --- | --- | --- |
//! | the reader (a daemon, when the handler starts) | [`SlurmEvent::Read`] | `scontrol show job`, `show partition`, `show config` ([`JobRead`]) | [`SlurmAction::Read`]: the job's limits, for the log |
//! | a notice's (the signal's driver thread) | [`SlurmEvent::Notice`] | for a new SIGTERM of an `srun` task under a `GraceTime` ([`notice_reads_job`]), or the time limit's warning once the job was read, one `scontrol show job` | [`SlurmAction::Deadlines`] |
//! | the one that saved (after the save) | [`SlurmEvent::Requeue`] | `scontrol show job` and `scontrol requeue`, retried while the controller is busy ([`RequeueRun`]) | [`SlurmAction::Requeued`], or [`SlurmAction::Done`] when it is not this task's to do ([`decides_requeue`]) |
//!
//! Each call is an [`SlurmAction::Scontrol`] with its own timeout and a number
//! that its outcome ([`SlurmEvent::Exited`] or [`SlurmEvent::NotRun`]) names,
//! so the threads' calls never mix. The requeue's pauses between attempts are
//! [`Step::Wait`]s: the caller waits until then and asks [`Job::poll`]. The
//! object reads no clock: each call is given `now`.

use super::{
    decides_requeue, field_of, fields, grace_end_of, notice_reads_job, signal_deadlines, time_of, Attempt, JobQuery, JobRead, JobShown,
    RequeueRun, RequeueStep, NOTICE_READ_TIMEOUT,
};

crate::wire! {
    /// What a thread tells the SLURM job ([`Job::handle`]).
    pub enum SlurmEvent via slurm_event {
        /// Read the job's limits (once, when the handler starts).
        Read {},
        /// A signal arrived at `at` (Unix seconds). `end`: `SLURM_JOB_END_TIME`
        /// when set; `sigterms`: the SIGTERMs this process caught so far (None:
        /// the core's count, `signals::delivered`; a test states one);
        /// `srun_step`: this process is a task `srun` started.
        Notice { at: f64, end: Option<f64>, sigterms: Option<u64>, srun_step: bool },
        /// The save is done: put the job back in the queue if this process
        /// decides so (`enabled`: the requeue option; `procid`: `SLURM_PROCID`;
        /// `time_limit_signal`: SIGUSR1, the time limit's warning, was caught;
        /// None: whether the core counted one, `signals::delivered`).
        Requeue { enabled: bool, procid: Option<String>, time_limit_signal: Option<bool> },
        /// The call numbered `call` exited with `code`, printing these.
        Exited { call: u64, code: i32, stdout: String, stderr: String },
        /// The call numbered `call` could not be started, or did not end within
        /// its timeout (`timed_out`): `why`.
        NotRun { call: u64, why: String, timed_out: bool },
    }
}

crate::wire! {
    /// What the thread that reported does next ([`Job::handle`]).
    pub enum SlurmAction via slurm_action {
        /// Run `scontrol` with `args` within `timeout` seconds; report how it
        /// ended (`SlurmEvent.Exited` or `SlurmEvent.NotRun`, naming `call`).
        Scontrol { call: u64, args: Vec<String>, timeout: f64 },
        /// The read is over: the job's `EndTime` (Unix seconds), `Partition`, its
        /// `GraceTime` and the cluster's `KillWait` (seconds), whether it is
        /// requeueable, and why the read ended early.
        Read {
            end_time: Option<f64>,
            partition: Option<String>,
            grace_time: Option<f64>,
            kill_wait: Option<f64>,
            requeue: Option<bool>,
            error: Option<String>,
        },
        /// The notice's `deadline` (the saves are planned against it) and `kill`
        /// (when SLURM's SIGKILL comes), Unix seconds or None; `unread`: why
        /// the job could not be read for it.
        Deadlines { deadline: Option<f64>, kill: Option<f64>, unread: Option<String> },
        /// The requeue is over: whether the job is back in the queue and what
        /// scontrol said; the decision (`already`, `no_reason`,
        /// `not_requeueable`, `requeue`) and its reason; the seconds it took;
        /// the seconds from now until SLURM's SIGKILL when this requeued it
        /// (`KillWait` after the requeue) and that `KillWait`; the job's
        /// `JobState` as first read.
        Requeued {
            requeued: bool,
            message: String,
            what: String,
            reason: Option<String>,
            took: f64,
            kill_in: Option<f64>,
            kill_wait: Option<f64>,
            job_state: Option<String>,
        },
        /// Nothing to do (not this process's requeue, an answer to no call).
        Done {},
    }
}

/// What the reporting thread does next: an action, or a wait until `at` (a
/// pause of the requeue's retry rule), after which it asks [`Job::poll`].
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Perform this.
    Do(SlurmAction),
    /// Nothing until `at` (seconds on the caller's clock).
    Wait { at: f64 },
}

/// What a notice knows before its read of the job.
#[derive(Clone, Copy, Debug, PartialEq)]
struct NoticeFacts {
    at: f64,
    end: Option<f64>,
    sigterm: bool,
    /// Not a new SIGTERM, once the job has been read: the time limit's warning
    /// (SIGUSR1). Its read of the job gives the job's end as it is now: a time limit
    /// changed since the start (`scontrol update TimeLimit=`) moves `EndTime`, and
    /// neither the start's read nor `SLURM_JOB_END_TIME` follows it.
    warning: bool,
    grace_time: Option<f64>,
    kill_wait: Option<f64>,
}

impl NoticeFacts {
    fn deadlines(self, job: Option<&[(String, String)]>, unread: Option<String>) -> SlurmAction {
        let grace_end = job.and_then(|job| grace_end_of(job, self.grace_time));
        let now_end = job.filter(|_| self.warning).and_then(|job| time_of(job, "EndTime"));
        let end = now_end.or(self.end);
        let (deadline, kill) = signal_deadlines(self.at, end, self.sigterm, grace_end, self.kill_wait);
        SlurmAction::Deadlines { deadline, kill, unread }
    }
}

/// Whom an outstanding call answers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Purpose {
    Read,
    Notice(NoticeFacts),
    RequeueShow,
    RequeueRun,
}

/// A requeue under way.
#[derive(Debug)]
struct Requeuing {
    run: RequeueRun,
    started: f64,
    /// The job's fields as first read (empty when unreadable).
    first: Option<Vec<(String, String)>>,
}

/// How a call ended, in the words the read, the notice and the requeue use.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    why: String,
    timed_out: bool,
}

impl Outcome {
    /// What scontrol said: its error output, else its output, trimmed.
    fn said(&self) -> &str {
        if self.stderr.is_empty() { &self.stdout } else { &self.stderr }.trim()
    }

    /// The failure's text: what scontrol said or its exit code; why it did not run.
    fn failure(&self) -> String {
        match self.code {
            Some(code) if self.said().is_empty() => format!("exit {code}"),
            Some(_) => self.said().to_owned(),
            None => self.why.clone(),
        }
    }

    /// The first line of a successful `scontrol show job -o`, as fields.
    fn job(&self) -> Result<Vec<(String, String)>, String> {
        match self.code {
            Some(0) => Ok(fields(self.stdout.lines().next().unwrap_or(""))),
            _ => Err(self.failure()),
        }
    }
}

/// The SLURM job this process runs in (see the module).
#[derive(Debug)]
pub struct Job {
    id: String,
    restart_count: u64,
    read: JobRead,
    reading: bool,
    seen_term: u64,
    calls: Vec<(u64, Purpose)>,
    next_call: u64,
    requeue: Option<Requeuing>,
}

impl Job {
    /// The job `id`, in its run whose `SLURM_RESTART_COUNT` is `restart_count`.
    #[must_use]
    pub fn new(id: String, restart_count: u64) -> Self {
        Job {
            id,
            restart_count,
            read: JobRead::default(),
            reading: false,
            seen_term: 0,
            calls: Vec::new(),
            next_call: 0,
            requeue: None,
        }
    }

    /// Whether the read of the job's limits is over.
    fn read_done(&self) -> bool {
        self.reading && self.read.next().is_none()
    }

    fn call(&mut self, purpose: Purpose, args: Vec<String>, timeout: f64) -> Step {
        self.next_call += 1;
        self.calls.push((self.next_call, purpose));
        Step::Do(SlurmAction::Scontrol {
            call: self.next_call,
            args,
            timeout,
        })
    }

    fn show_job(&self) -> Vec<String> {
        JobQuery::Job.args(&self.id)
    }

    /// `event`, reported at `now` (seconds on the caller's monotonic clock):
    /// what the reporting thread does next.
    pub fn handle(&mut self, event: SlurmEvent, now: f64) -> Step {
        match event {
            SlurmEvent::Read {} => {
                self.reading = true;
                self.next_read()
            }
            SlurmEvent::Notice {
                at,
                end,
                sigterms,
                srun_step,
            } => {
                let sigterms = sigterms.unwrap_or_else(|| crate::sources::signals::delivered(libc::SIGTERM));
                self.notice(at, end, sigterms, srun_step)
            }
            SlurmEvent::Requeue {
                enabled,
                procid,
                time_limit_signal,
            } => {
                if !decides_requeue(true, enabled, procid.as_deref()) || self.requeue.is_some() {
                    return Step::Do(SlurmAction::Done {});
                }
                self.requeue = Some(Requeuing {
                    run: RequeueRun::new(
                        time_limit_signal.unwrap_or_else(|| crate::sources::signals::delivered(libc::SIGUSR1) > 0),
                        self.restart_count,
                    ),
                    started: now,
                    first: None,
                });
                self.poll(now)
            }
            SlurmEvent::Exited {
                call,
                code,
                stdout,
                stderr,
            } => self.answered(
                call,
                Outcome {
                    code: Some(code),
                    stdout,
                    stderr,
                    why: String::new(),
                    timed_out: false,
                },
                now,
            ),
            SlurmEvent::NotRun { call, why, timed_out } => self.answered(
                call,
                Outcome {
                    code: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    why,
                    timed_out,
                },
                now,
            ),
        }
    }

    /// The requeue's next step at `now`, after a [`Step::Wait`]; [`SlurmAction::Done`]
    /// when no requeue is under way.
    pub fn poll(&mut self, now: f64) -> Step {
        let Some(requeuing) = self.requeue.as_mut() else {
            return Step::Do(SlurmAction::Done {});
        };
        match requeuing.run.poll(now) {
            RequeueStep::Wait { at } => Step::Wait { at },
            RequeueStep::Show { timeout } => self.call(Purpose::RequeueShow, self.show_job(), timeout),
            RequeueStep::Run { timeout, again } => {
                if let Some(again) = again {
                    log::info!(
                        target: "tf_failure_handling",
                        "SLURM job {}: scontrol requeue failed ({again}); trying again.",
                        self.id
                    );
                }
                let args = vec!["requeue".to_owned(), self.id.clone()];
                self.call(Purpose::RequeueRun, args, timeout)
            }
            RequeueStep::Done { requeued, message } => {
                let (what, reason) = requeuing.run.decision().map_or(("no_reason", None), super::Requeue::names);
                let kill_wait = self.read.kill_wait;
                let job_state = requeuing
                    .first
                    .as_deref()
                    .and_then(|job| field_of(job, "JobState"))
                    .map(str::to_owned);
                Step::Do(SlurmAction::Requeued {
                    requeued,
                    message,
                    what: what.to_owned(),
                    reason: reason.map(str::to_owned),
                    took: now - requeuing.started,
                    kill_in: requeuing.run.kill_after(now, kill_wait),
                    kill_wait,
                    job_state,
                })
            }
        }
    }

    fn next_read(&mut self) -> Step {
        if let Some((query, timeout)) = self.read.next() {
            if !self.calls.iter().any(|(_, p)| *p == Purpose::Read) {
                let args = query.args(&self.id);
                return self.call(Purpose::Read, args, timeout);
            }
        }
        let read = &self.read;
        Step::Do(SlurmAction::Read {
            end_time: read.end_time(),
            partition: read.field("Partition").map(str::to_owned),
            grace_time: read.grace_time,
            kill_wait: read.kill_wait,
            requeue: read.requeueable(),
            error: read.error.clone(),
        })
    }

    fn notice(&mut self, at: f64, end: Option<f64>, sigterms: u64, srun_step: bool) -> Step {
        let new_term = sigterms > self.seen_term;
        self.seen_term = self.seen_term.max(sigterms);
        let read = self.read_done().then_some(&self.read);
        let facts = NoticeFacts {
            at,
            end: end.or_else(|| read.and_then(JobRead::end_time)),
            sigterm: new_term && read.is_some(),
            warning: !new_term && read.is_some(),
            grace_time: read.and_then(|r| r.grace_time),
            kill_wait: read.and_then(|r| r.kill_wait),
        };
        if facts.warning || notice_reads_job(facts.sigterm, srun_step, facts.grace_time) {
            let args = self.show_job();
            return self.call(Purpose::Notice(facts), args, NOTICE_READ_TIMEOUT);
        }
        Step::Do(facts.deadlines(None, None))
    }

    fn answered(&mut self, call: u64, outcome: Outcome, now: f64) -> Step {
        let Some(at) = self.calls.iter().position(|(c, _)| *c == call) else {
            return Step::Do(SlurmAction::Done {});
        };
        let (_, purpose) = self.calls.remove(at);
        match purpose {
            Purpose::Read => {
                match outcome.code {
                    Some(code) => self.read.answered(code, &outcome.stdout, &outcome.stderr),
                    None => self.read.failed(outcome.why),
                }
                self.next_read()
            }
            Purpose::Notice(facts) => Step::Do(match outcome.job() {
                Ok(job) => facts.deadlines(Some(&job), None),
                Err(why) => facts.deadlines(None, Some(why)),
            }),
            Purpose::RequeueShow => {
                let job = outcome.job();
                let Some(requeuing) = self.requeue.as_mut() else {
                    return Step::Do(SlurmAction::Done {});
                };
                let shown = match &job {
                    Ok(job) => Ok(JobShown::from_fields(job)),
                    Err(why) => Err(format!("scontrol show job failed: {why}")),
                };
                requeuing.first.get_or_insert_with(|| job.unwrap_or_default());
                requeuing.run.shown(now, shown);
                self.poll(now)
            }
            Purpose::RequeueRun => {
                let attempt = match outcome.code {
                    Some(code) => Attempt::Exited {
                        code,
                        said: outcome.said().to_owned(),
                    },
                    None if outcome.timed_out => Attempt::TimedOut,
                    None => Attempt::CouldNotRun(outcome.why),
                };
                if let Some(requeuing) = self.requeue.as_mut() {
                    requeuing.run.ran(attempt);
                }
                self.poll(now)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::slurm::{READ_TIMEOUT, REQUEUE_TIMEOUT};

    fn scontrol(step: Step) -> (u64, Vec<String>, f64) {
        match step {
            Step::Do(SlurmAction::Scontrol { call, args, timeout }) => (call, args, timeout),
            step => panic!("not a call: {step:?}"),
        }
    }

    fn exited(call: u64, code: i32, stdout: &str, stderr: &str) -> SlurmEvent {
        SlurmEvent::Exited {
            call,
            code,
            stdout: stdout.to_owned(),
            stderr: stderr.to_owned(),
        }
    }

    /// A job read: EndTime 2026-11-25T17:42:37, GraceTime 20 s, KillWait 10 s.
    fn read_job() -> Job {
        let mut job = Job::new("7".into(), 0);
        let (call, args, timeout) = scontrol(job.handle(SlurmEvent::Read {}, 0.0));
        assert_eq!((args.join(" "), timeout), ("show job -o 7".into(), READ_TIMEOUT));
        let job_line = "JobId=7 Partition=low EndTime=2026-11-25T17:42:37 Requeue=1";
        let (call, args, _) = scontrol(job.handle(exited(call, 0, job_line, ""), 0.0));
        assert_eq!(args.join(" "), "show partition -o low");
        let (call, args, _) = scontrol(job.handle(exited(call, 0, "PartitionName=low GraceTime=20", ""), 0.0));
        assert_eq!(args.join(" "), "show config");
        let read = job.handle(exited(call, 0, "KillWait = 10 sec\n", ""), 0.0);
        let Step::Do(SlurmAction::Read {
            end_time,
            partition,
            grace_time,
            kill_wait,
            requeue,
            error,
        }) = read
        else {
            panic!("{read:?}");
        };
        assert!(end_time.is_some());
        assert_eq!(
            (partition.as_deref(), grace_time, kill_wait, requeue, error),
            (Some("low"), Some(20.0), Some(10.0), Some(true), None)
        );
        job
    }

    fn deadlines(step: Step) -> (Option<f64>, Option<f64>, Option<String>) {
        match step {
            Step::Do(SlurmAction::Deadlines { deadline, kill, unread }) => (deadline, kill, unread),
            step => panic!("not deadlines: {step:?}"),
        }
    }

    fn notice(at: f64, sigterms: u64, srun_step: bool) -> SlurmEvent {
        SlurmEvent::Notice {
            at,
            end: None,
            sigterms: Some(sigterms),
            srun_step,
        }
    }

    #[test]
    fn a_read_that_fails_ends_with_why() {
        let mut job = Job::new("7".into(), 0);
        let (call, ..) = scontrol(job.handle(SlurmEvent::Read {}, 0.0));
        let why = SlurmEvent::NotRun {
            call,
            why: "TimeoutExpired: scontrol".into(),
            timed_out: true,
        };
        match job.handle(why, 1.0) {
            Step::Do(SlurmAction::Read { error, end_time, .. }) => {
                assert_eq!((error.as_deref(), end_time), (Some("TimeoutExpired: scontrol"), None));
            }
            step => panic!("{step:?}"),
        }
    }

    #[test]
    fn a_notice_before_the_read_knows_only_the_job_s_end() {
        let mut job = Job::new("7".into(), 0);
        let end = SlurmEvent::Notice {
            at: 1000.0,
            end: Some(1600.0),
            sigterms: Some(1),
            srun_step: true,
        };
        assert_eq!(deadlines(job.handle(end, 0.0)), (Some(1600.0), None, None));
        // A read under way is not over: still nothing of it.
        let _ = job.handle(SlurmEvent::Read {}, 0.0);
        assert_eq!(deadlines(job.handle(notice(1000.0, 2, false), 0.0)), (None, None, None));
    }

    #[test]
    fn an_srun_task_s_new_sigterm_reads_the_job_within_the_notice_s_bound() {
        let mut job = read_job();
        let at = super::super::unix_time("2026-11-25T16:42:37").unwrap();
        let end = at + 3600.0;
        let (call, args, timeout) = scontrol(job.handle(notice(at, 1, true), 0.0));
        assert_eq!((args.join(" "), timeout), ("show job -o 7".into(), NOTICE_READ_TIMEOUT));
        let shown = "JobId=7 PreemptTime=2026-11-25T16:42:37 StartTime=2026-11-25T16:00:00";
        let told = deadlines(job.handle(exited(call, 0, shown, ""), 0.0));
        assert_eq!(told, (Some(at + 20.0), Some(at + 30.0), None), "GraceTime, then KillWait");
        // The same count again: no new SIGTERM, a warning: the job's end as it is now,
        // read within the same bound; the start's read when the job shows none.
        let (call, args, timeout) = scontrol(job.handle(notice(at, 1, true), 0.0));
        assert_eq!((args.join(" "), timeout), ("show job -o 7".into(), NOTICE_READ_TIMEOUT));
        let told = deadlines(job.handle(exited(call, 0, "JobId=7 JobState=RUNNING", ""), 0.0));
        assert_eq!(told, (Some(end), Some(end + 10.0), None));
        // A new one the job cannot be read for: now + KillWait, and why.
        let (call, ..) = scontrol(job.handle(notice(at, 2, true), 0.0));
        let (deadline, _, unread) = deadlines(job.handle(exited(call, 1, "", "Invalid job id"), 0.0));
        assert_eq!((deadline, unread.as_deref()), (Some(at + 10.0), Some("Invalid job id")));
        // The batch step's SIGTERM is not read for.
        assert_eq!(deadlines(job.handle(notice(at, 3, false), 0.0)).0, Some(at + 10.0));
    }

    #[test]
    fn a_warning_takes_the_job_s_end_as_it_is_now() {
        // The time limit was shortened after the start's read (`scontrol update
        // TimeLimit=`): the warning's read gives the new end.
        let mut job = read_job();
        let started_end = super::super::unix_time("2026-11-25T17:42:37").unwrap();
        let at = started_end - 3000.0;
        let (call, args, timeout) = scontrol(job.handle(notice(at, 0, true), 0.0));
        assert_eq!((args.join(" "), timeout), ("show job -o 7".into(), NOTICE_READ_TIMEOUT));
        let shown = "JobId=7 JobState=RUNNING EndTime=2026-11-25T16:53:07";
        let now_end = super::super::unix_time("2026-11-25T16:53:07").unwrap();
        let told = deadlines(job.handle(exited(call, 0, shown, ""), 0.0));
        assert_eq!(told, (Some(now_end), Some(now_end + 10.0), None));
        // Unreadable: the start's end, and why.
        let (call, ..) = scontrol(job.handle(notice(at, 0, false), 0.0));
        let why = SlurmEvent::NotRun {
            call,
            why: "TimeoutExpired: scontrol".into(),
            timed_out: true,
        };
        let (deadline, kill, unread) = deadlines(job.handle(why, 0.0));
        assert_eq!((deadline, kill), (Some(started_end), Some(started_end + 10.0)));
        assert_eq!(unread.as_deref(), Some("TimeoutExpired: scontrol"));
        // A SIGTERM's read does not move the job's end (its deadline is the grace time's).
        let (call, ..) = scontrol(job.handle(notice(at, 1, true), 0.0));
        let told = deadlines(job.handle(exited(call, 0, shown, ""), 0.0));
        assert_eq!(told.0, Some(at + 10.0), "KillWait: no PreemptTime shown");
    }

    #[test]
    fn only_task_zero_with_the_requeue_on_requeues() {
        let mut job = read_job();
        let off = SlurmEvent::Requeue {
            enabled: false,
            procid: None,
            time_limit_signal: Some(true),
        };
        assert_eq!(job.handle(off, 0.0), Step::Do(SlurmAction::Done {}));
        let task_one = SlurmEvent::Requeue {
            enabled: true,
            procid: Some("1".into()),
            time_limit_signal: Some(true),
        };
        assert_eq!(job.handle(task_one, 0.0), Step::Do(SlurmAction::Done {}));
        assert_eq!(job.poll(0.0), Step::Do(SlurmAction::Done {}), "no requeue under way");
        assert_eq!(
            job.handle(exited(99, 0, "", ""), 0.0),
            Step::Do(SlurmAction::Done {}),
            "no such call"
        );
    }

    #[test]
    fn a_busy_controller_is_paused_for_then_requeued_and_the_kill_follows() {
        let mut job = read_job();
        let requeue = SlurmEvent::Requeue {
            enabled: true,
            procid: Some("0".into()),
            time_limit_signal: Some(true),
        };
        let (call, args, _) = scontrol(job.handle(requeue, 100.0));
        assert_eq!(args.join(" "), "show job -o 7");
        let (call, args, timeout) = scontrol(job.handle(exited(call, 0, "JobId=7 JobState=RUNNING Restarts=0", ""), 100.0));
        assert_eq!((args.join(" "), timeout), ("requeue 7".into(), REQUEUE_TIMEOUT));
        let busy = "Socket timed out on send/recv operation";
        let (call, args, _) = scontrol(job.handle(exited(call, 1, "", busy), 101.0));
        assert_eq!(args.join(" "), "show job -o 7", "read again after a failure");
        let Step::Wait { at } = job.handle(exited(call, 0, "JobId=7 Restarts=0", ""), 101.0) else {
            panic!("a pause");
        };
        assert!(at > 101.0 && at < 100.0 + REQUEUE_TIMEOUT);
        assert_eq!(job.poll(at - 0.01), Step::Wait { at });
        let (call, args, timeout) = scontrol(job.poll(at));
        assert_eq!(args.join(" "), "requeue 7");
        assert!((timeout - (100.0 + REQUEUE_TIMEOUT - at)).abs() < 1e-9);
        match job.handle(exited(call, 0, "", ""), at + 1.0) {
            Step::Do(SlurmAction::Requeued {
                requeued,
                what,
                reason,
                took,
                kill_in,
                kill_wait,
                job_state,
                ..
            }) => {
                assert!(requeued);
                assert_eq!((what.as_str(), reason.as_deref()), ("requeue", Some("time limit (SIGUSR1)")));
                assert!((took - (at + 1.0 - 100.0)).abs() < 1e-9);
                assert_eq!((kill_in, kill_wait), (Some(9.0), Some(10.0)), "KillWait after its start");
                assert_eq!(job_state.as_deref(), Some("RUNNING"), "as first read");
            }
            step => panic!("{step:?}"),
        }
    }

    #[test]
    fn a_requeue_that_cannot_start_or_times_out_says_so() {
        for (timed_out, said) in [(false, "could not run: OSError: gone"), (true, "did not finish within")] {
            let mut job = Job::new("7".into(), 0);
            let requeue = SlurmEvent::Requeue {
                enabled: true,
                procid: None,
                time_limit_signal: Some(true),
            };
            let (call, ..) = scontrol(job.handle(requeue, 0.0));
            let unread = SlurmEvent::NotRun {
                call,
                why: "gone".into(),
                timed_out: true,
            };
            let (call, ..) = scontrol(job.handle(unread, 0.0));
            let failed = SlurmEvent::NotRun {
                call,
                why: "OSError: gone".into(),
                timed_out,
            };
            let step = job.handle(failed, 1.0);
            let message = match step {
                Step::Do(SlurmAction::Requeued { message, .. }) => message,
                // A time-out is a failure to retry: the job is read again.
                Step::Do(SlurmAction::Scontrol { .. }) if timed_out => continue,
                step => panic!("{step:?}"),
            };
            assert!(message.contains(said), "{message}");
        }
    }
}
