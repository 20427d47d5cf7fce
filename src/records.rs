//! Reading the preemption records: the lines of record files folded into one
//! [`Preemption`] per task and preemption and one [`Resume`] per restart.
//!
//! Every process that handles a notice writes one JSON line per stage
//! (`notice`, `agreement`, `save_start`, `save_end`, `exit`, `error`, after
//! the restart `resumed`, under SLURM `requeue`); docs/records.md describes
//! them. Python writes them and reads the files (a local folder, or objects
//! through `tf.io.gfile`); this module takes the bytes and decides everything
//! else, without I/O:
//!
//! * **Which lines count** ([`lines`]). A file is split at its newlines; the
//!   part after the last newline is a line a kill cut off, never used. Each
//!   whole line must be JSON and of the schema's shape ([`schema`]); any other
//!   is skipped and its number (from 1) counted. A file that could not be read
//!   is counted as line 0. Reading never fails: a record that is not whole or
//!   makes no sense is not used, so a record file never stops a handler.
//! * **The fold** ([`read`]). The lines of one `(job, str(task), preemption)`
//!   make one [`Preemption`], created by its first line (which gives `host`
//!   and `pid`). The first `notice` gives the notice's time, source, platform,
//!   deadline and grace period; every later line of a stage overwrites that
//!   stage's fields (`agreement`: step, proposer, time; `save_start`: its time,
//!   and the step when it has one; `save_end`: time, path; `exit`: time, code;
//!   `error`: the error). Fields the schema does not name go to `extra`, a
//!   later line's value winning. A `resumed` line is a [`Resume`] of its own.
//!   Preemptions are ordered by notice time (0 without one) then `"job task"`,
//!   resumes by time; both sorts are stable, so ties keep the files' order.
//! * **The last exit** ([`last_exit`]). A restarted task writes `resumed` only
//!   for its own latest preemption that reached its exit with no `resumed` line
//!   of the task at or after that exit; a coordinator's file also holds the
//!   lines it wrote for its PS and worker tasks, which are not its own.
//! * **One `resumed` line a preemption** ([`Claims`]): a second handler of the
//!   same run (tf_keras makes several) claims the same preemption in vain.
//! * **What goes back to Python** ([`Records::to_json`], [`Preemption::to_json`]):
//!   JSON text whose numbers are the lines' own (an integer stays an integer, a
//!   float a float, as Python's `json` reads them).
//! * **A line's stamps** ([`downtime`]): the writer stamps each line with the wall
//!   clock when the binding builds it; a `resumed` line's downtime is its time less
//!   the exit it resumes from.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};

use serde_json::{json, Map, Number, Value};

pub mod schema;

/// Seconds `Recorder.close` (Python's `records.py`) waits for an object store to take
/// the lines still queued (the `exit` line among them) before the process exits
/// without them.
pub const FLUSH_BOUND: f64 = 10.0;

/// Seconds a stage of the training thread (an agreement, a save) waits for the line
/// of the notice that led to it, which the notice's thread is writing (the core took
/// the notice first): then it writes its own. The notice's line comes first in the
/// records unless writing it takes longer than this.
pub const NOTICE_LINE_BOUND: f64 = 10.0;
/// `report`: a task's preemption belongs to the same cluster-wide preemption as
/// the previous ones when its notice comes before they all exited, or within
/// this many seconds of the first notice when none exited.
pub const REPORT_GROUP_WINDOW: f64 = 600.0;

/// `report`: the preemptions of `records` (their indices, in order) grouped into
/// cluster-wide ones: each joins the group before it when [`same_preemption`] says
/// so, its time being its notice's (else its save's start, else its exit, else 0),
/// the group's beginning its tasks' earliest such time and its end their last exit.
#[must_use]
pub fn groups(records: &Records) -> Vec<Vec<usize>> {
    let when = |p: &Preemption| {
        [&p.notice_time, &p.save_start, &p.exit_time]
            .into_iter()
            .flatten()
            .map(seconds)
            .find(|&t| t != 0.0)
            .unwrap_or(0.0)
    };
    let mut groups: Vec<(Vec<usize>, f64, Option<f64>)> = Vec::new();
    for (i, p) in records.preemptions.iter().enumerate() {
        let t = when(p);
        let exit = p.exit_time.as_ref().map(seconds);
        match groups.last_mut() {
            Some((tasks, first, end)) if same_preemption(t, *first, *end) => {
                tasks.push(i);
                *first = first.min(t);
                *end = match (*end, exit) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
            }
            _ => groups.push((vec![i], t, exit)),
        }
    }
    groups.into_iter().map(|(tasks, _, _)| tasks).collect()
}

/// `report`: whether a task's preemption noticed at `t` belongs to the cluster-wide
/// preemption before it, which began at `first` and ended (its last exit) at `end`,
/// None when none of its tasks exited: noticed before that end, or within
/// [`REPORT_GROUP_WINDOW`] of `first` when there is no end.
#[must_use]
pub fn same_preemption(t: f64, first: f64, end: Option<f64>) -> bool {
    match end {
        Some(end) => t <= end,
        None => t - first <= REPORT_GROUP_WINDOW,
    }
}
/// A `resumed` line's downtime: the seconds from the exit it resumes from,
/// `exited`, to its own `time` (both wall-clock stamps).
#[must_use]
pub fn downtime(time: f64, exited: f64) -> f64 {
    time - exited
}

#[cfg(test)]
mod tests;

pub use schema::{parse_line, IntOrStr, Line};

/// One task's view of one preemption (Python's `records.Preemption`).
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // the fields are Python's `records.Preemption`'s
pub struct Preemption {
    pub job: String,
    pub task: IntOrStr,
    pub host: Option<String>,
    pub pid: Option<Number>,
    /// The `preemption` id shared by the lines.
    pub id: Option<String>,
    pub platform: Option<String>,
    pub source: Option<String>,
    pub notice_time: Option<Number>,
    pub deadline: Option<Number>,
    pub grace_period: Option<Number>,
    pub agreed_step: Option<Number>,
    pub proposer: Option<String>,
    pub agreement_time: Option<Number>,
    pub save_start: Option<Number>,
    pub save_end: Option<Number>,
    pub checkpoint_path: Option<String>,
    pub exit_code: Option<IntOrStr>,
    pub exit_time: Option<Number>,
    pub error: Option<String>,
    pub extra: Map<String, Value>,
}

/// A `resumed` line: a task restarted from a checkpoint.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // the fields are Python's `records.Resume`'s
pub struct Resume {
    pub job: String,
    pub task: IntOrStr,
    pub time: Number,
    pub step: Option<Number>,
    pub lost: Option<Number>,
    pub downtime: Option<Number>,
    pub host: Option<String>,
    pub extra: Map<String, Value>,
}

/// What a set of record files holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Records {
    /// In order of notice time, then `"job task"`.
    pub preemptions: Vec<Preemption>,
    /// In order of time.
    pub resumes: Vec<Resume>,
    /// The lines skipped, per file in the order read: cut off, not JSON, or not
    /// of the schema's shape; line 0: the file itself could not be read.
    pub skipped: Vec<(String, Vec<usize>)>,
}

/// A JSON number as the `f64` it compares as (every number of a valid line is
/// finite; an integer time is below 2^53, so exact).
fn seconds(n: &Number) -> f64 {
    n.as_f64().unwrap_or(0.0)
}

/// Python's order of two finite floats: `-0.0` equals `0.0`.
fn by_value(a: f64, b: f64) -> Ordering {
    a.partial_cmp(&b).unwrap_or(Ordering::Equal)
}

/// The lines of one file: each whole line parsed, or `Err` with its number
/// (from 1) when it is not JSON or not of the schema's shape; the bytes after
/// the last newline, when there are any, are one cut-off line, always `Err`.
pub fn lines(data: &[u8]) -> impl Iterator<Item = Result<Line, usize>> + '_ {
    let (whole, tail) = match memchr::memrchr(b'\n', data) {
        Some(end) => (Some(&data[..end]), &data[end + 1..]),
        None => (None, data),
    };
    let count = whole.map_or(0, |w| memchr::memchr_iter(b'\n', w).count() + 1);
    let parsed = whole
        .into_iter()
        .flat_map(|w| w.split(|&b| b == b'\n'))
        .enumerate()
        .map(|(i, raw)| parse_line(raw).ok_or(i + 1));
    parsed.chain((!tail.is_empty()).then_some(Err(count + 1)))
}

/// Reads record files, each `(name, bytes)` (None: it could not be read), and
/// folds their lines (the module's rules).
pub fn read<'a>(sources: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> Records {
    let mut fold = Fold::default();
    let mut skipped: Vec<(String, Vec<usize>)> = Vec::new();
    for (name, data) in sources {
        let mut bad = Vec::new();
        match data {
            None => bad.push(0),
            Some(data) => {
                for line in lines(data) {
                    match line {
                        Ok(line) => fold.add(line),
                        Err(number) => bad.push(number),
                    }
                }
            }
        }
        if bad.is_empty() {
            continue;
        }
        match skipped.iter_mut().find(|(n, _)| n == name) {
            Some((_, numbers)) => numbers.append(&mut bad),
            None => skipped.push((name.to_owned(), bad)),
        }
    }
    fold.finish(skipped)
}

#[derive(Default)]
struct Fold {
    preemptions: Vec<Preemption>,
    /// `(job, str(task), preemption)` -> index in `preemptions`.
    index: HashMap<(String, String, Option<String>), usize>,
    resumes: Vec<Resume>,
}

impl Fold {
    fn add(&mut self, line: Line) {
        if line.stage == "resumed" {
            self.resumes.push(Resume {
                job: line.job,
                task: line.task,
                time: line.time,
                step: line.step,
                lost: line.lost,
                downtime: line.downtime,
                host: line.host,
                extra: line.extra,
            });
            return;
        }
        let key = (line.job.clone(), line.task.to_string(), line.preemption.clone());
        let i = *self.index.entry(key).or_insert_with(|| {
            self.preemptions.push(Preemption {
                job: line.job.clone(),
                task: line.task.clone(),
                host: line.host.clone(),
                pid: line.pid.clone(),
                id: line.preemption.clone(),
                platform: None,
                source: None,
                notice_time: None,
                deadline: None,
                grace_period: None,
                agreed_step: None,
                proposer: None,
                agreement_time: None,
                save_start: None,
                save_end: None,
                checkpoint_path: None,
                exit_code: None,
                exit_time: None,
                error: None,
                extra: Map::new(),
            });
            self.preemptions.len() - 1
        });
        let p = &mut self.preemptions[i];
        p.extra.extend(line.extra);
        let t = Some(line.time);
        match line.stage.as_str() {
            "notice" if p.notice_time.is_none() => {
                p.notice_time = t;
                p.source = line.source;
                p.platform = line.platform;
                p.deadline = line.deadline;
                p.grace_period = line.grace_period;
            }
            "agreement" => {
                p.agreed_step = line.step;
                p.proposer = line.proposer;
                p.agreement_time = t;
            }
            "save_start" => {
                p.save_start = t;
                if line.step.is_some() {
                    p.agreed_step = line.step;
                }
            }
            "save_end" => {
                p.save_end = t;
                p.checkpoint_path = line.path;
            }
            "exit" => {
                p.exit_time = t;
                p.exit_code = line.code;
            }
            "error" => p.error = line.error,
            _ => {}
        }
    }

    fn finish(self, skipped: Vec<(String, Vec<usize>)>) -> Records {
        let mut keyed: Vec<(f64, String, Preemption)> = self
            .preemptions
            .into_iter()
            .map(|p| (p.notice_time.as_ref().map_or(0.0, seconds), format!("{} {}", p.job, p.task), p))
            .collect();
        keyed.sort_by(|a, b| by_value(a.0, b.0).then_with(|| a.1.cmp(&b.1)));
        let mut resumes = self.resumes;
        resumes.sort_by(|a, b| by_value(seconds(&a.time), seconds(&b.time)));
        Records {
            preemptions: keyed.into_iter().map(|(_, _, p)| p).collect(),
            resumes,
            skipped,
        }
    }
}

/// The latest preemption of `job`/`task` (`task` as Python's `str(task)`)
/// that reached its exit and has no `resumed` line of the same task at or
/// after that exit; None when there is none. Of two exits at the same time,
/// the first in the records' order.
#[must_use]
pub fn last_exit<'r>(records: &'r Records, job: &str, task: &str) -> Option<&'r Preemption> {
    let own = |j: &str, t: &IntOrStr| j == job && t.to_string() == task;
    let mut last: Option<(&Preemption, f64)> = None;
    for p in &records.preemptions {
        let Some(exit) = p.exit_time.as_ref().map(seconds) else { continue };
        if own(&p.job, &p.task) && last.map_or(true, |(_, latest)| exit > latest) {
            last = Some((p, exit));
        }
    }
    let (last, exit) = last?;
    let resumed = records.resumes.iter().any(|r| own(&r.job, &r.task) && seconds(&r.time) >= exit);
    (!resumed).then_some(last)
}

fn opt(n: Option<&Number>) -> Value {
    n.map_or(Value::Null, |n| Value::Number(n.clone()))
}

impl IntOrStr {
    fn to_json(&self) -> Value {
        match self {
            IntOrStr::Int(n) => Value::Number(n.clone()),
            IntOrStr::Str(s) => Value::String(s.clone()),
        }
    }
}

impl Preemption {
    /// Its fields, named as Python's `records.Preemption`'s.
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({
            "job": self.job,
            "task": self.task.to_json(),
            "host": self.host,
            "pid": opt(self.pid.as_ref()),
            "id": self.id,
            "platform": self.platform,
            "source": self.source,
            "notice_time": opt(self.notice_time.as_ref()),
            "deadline": opt(self.deadline.as_ref()),
            "grace_period": opt(self.grace_period.as_ref()),
            "agreed_step": opt(self.agreed_step.as_ref()),
            "proposer": self.proposer,
            "agreement_time": opt(self.agreement_time.as_ref()),
            "save_start": opt(self.save_start.as_ref()),
            "save_end": opt(self.save_end.as_ref()),
            "checkpoint_path": self.checkpoint_path,
            "exit_code": self.exit_code.as_ref().map_or(Value::Null, IntOrStr::to_json),
            "exit_time": opt(self.exit_time.as_ref()),
            "error": self.error,
            "extra": self.extra,
        })
    }
}

impl Resume {
    /// Its fields, named as Python's `records.Resume`'s.
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({
            "job": self.job,
            "task": self.task.to_json(),
            "time": self.time,
            "step": opt(self.step.as_ref()),
            "lost": opt(self.lost.as_ref()),
            "downtime": opt(self.downtime.as_ref()),
            "host": self.host,
            "extra": self.extra,
        })
    }
}

impl Records {
    /// The text Python's `records.load` reads: `{"preemptions": [...], "resumes":
    /// [...], "skipped": [[file, [line numbers]], ...], "groups": [[index, ...], ...]}`
    /// (the files in the order read; [`groups`]).
    #[must_use]
    pub fn to_json(&self) -> String {
        json!({
            "preemptions": self.preemptions.iter().map(Preemption::to_json).collect::<Vec<_>>(),
            "resumes": self.resumes.iter().map(Resume::to_json).collect::<Vec<_>>(),
            "skipped": self.skipped,
            "groups": groups(self),
        })
        .to_string()
    }
}

/// The preemptions a `resumed` line was claimed for, in this process: the
/// first claim of a `(folder, job, task, preemption)` wins, even before its
/// line reached the store.
#[derive(Debug, Default)]
pub struct Claims {
    taken: BTreeSet<(String, String, String, Option<String>)>,
}

impl Claims {
    /// No claim yet.
    #[must_use]
    pub const fn new() -> Self {
        Claims { taken: BTreeSet::new() }
    }

    /// True the first time `(folder, job, task, preemption)` is claimed.
    pub fn claim(&mut self, folder: &str, job: &str, task: &str, preemption: Option<&str>) -> bool {
        self.taken
            .insert((folder.to_owned(), job.to_owned(), task.to_owned(), preemption.map(str::to_owned)))
    }
}
