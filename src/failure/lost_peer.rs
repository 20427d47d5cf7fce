//! A lost peer: whether the error out of a MultiWorkerMirroredStrategy step means that
//! another worker is gone (issue 62), and which one.
//!
//! Under MWMS every worker holds the whole model, so a worker that dies without notice
//! (killed, crashed, its host gone, its process frozen) leaves the others with all the
//! state; they can save it if they can tell this apart from everything else a step
//! can raise. [`lost_peer`] makes that call from what TensorFlow gives the survivor:
//! the error's canonical code (`OpError.error_code`) and its message.
//!
//! # What TensorFlow says
//!
//! Read from real runs (`dev/lost_peer_probe.py`; the records are in
//! `tests/fixtures/lost_peer/`, one file per TensorFlow version, and the tests below
//! classify every one of them):
//!
//! | the fault | the survivor's error |
//! | --- | --- |
//! | a peer SIGKILLed (non-chief or chief) | `UnavailableError`: "Collective ops is aborted by: recvmsg:Connection reset by peer", the lost task as "remote target" |
//! | a peer SIGSTOPped (heartbeats stop) | `UnavailableError`: "Error reported from …: The following tasks are unhealthy (stopped sending heartbeats):" and the tasks, one a line (TF 2.19–2.21); "Error reported from …: Task /job:worker/replica:0/task:1 heartbeat timeout." (2.16–2.18) |
//! | the chief SIGSTOPped (the coordination service frozen with it) | `DeadlineExceededError`: "Collective ops is aborted by: Deadline Exceeded", then "RPC: /tensorflow.CoordinationService/Heartbeat": this worker's own heartbeat to the service went unanswered (TF 2.21, about 10 s after the stop) |
//! | a peer's own step error, reported to the cluster as TF's handler does | the peer's error type (`InvalidArgumentError`, `ResourceExhaustedError`, …): "Collective ops is aborted by: Error reported from /job:worker/task:1: " and the peer's message |
//! | the same bug on every worker | its own `InvalidArgumentError` |
//!
//! # The rule
//!
//! A peer is lost when the error is `UNAVAILABLE` and the text that explains it
//! carries a sign of a lost process: its transport broke, or the coordination service
//! says it stopped sending heartbeats. The coordination service's host (the chief) is
//! lost when this worker's own heartbeat to it went unanswered (`UNAVAILABLE` or
//! `DEADLINE_EXCEEDED`, the heartbeat's RPC named); no task is named then, and the
//! probe finds which. The explaining text is the whole message, or,
//! when the message relays an error another task reported ("Error reported from
//! /job:…: "), what that task reported: an `UnavailableError` the user's own step
//! raised on a peer (a remote service it reads, say) and that peer reported is no lost
//! peer, but a peer relaying that *it* lost a peer is.
//!
//! Everything else is not a lost peer and raises as before: a bug in the step, a bad
//! input, an out-of-memory error on this worker or a peer, an application error a
//! peer propagated.
//!
//! A lost peer found here is a suspicion the caller confirms with a health probe of
//! the tasks named (TensorFlow's `check_collective_ops_peer_health`, which
//! `_cluster/membership.py` already calls to name the peers that do not answer): the
//! sign in the text can come from a service the step talks to that is not a peer.

/// TF's canonical code `UNAVAILABLE` (`tf.errors.UNAVAILABLE`).
pub const UNAVAILABLE: i64 = 14;

/// TF's canonical code `DEADLINE_EXCEEDED`.
pub const DEADLINE_EXCEEDED: i64 = 4;

/// The RPC of this worker's heartbeat to the coordination service, as an error that
/// came of it names it.
const HEARTBEAT_RPC: &str = "/tensorflow.CoordinationService/Heartbeat";

/// How a lost peer showed itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Detection {
    /// The transport to the peer broke: a reset or closed connection, a refused or
    /// failed connection (the process is gone, or its host).
    ConnectionLost,
    /// The coordination service says the peer stopped sending heartbeats (the process
    /// is frozen, or cut off without its connections being reset).
    StoppedHeartbeats,
    /// This worker's heartbeat to the coordination service went unanswered: the task
    /// that hosts it (the chief) is frozen or cut off.
    ServiceUnanswered,
    /// A call of the preemption protocol to the coordination service (publishing
    /// the agreed step, an acknowledgement, reading a step key) went unanswered
    /// until its retry rule gave up: the task that hosts the service is frozen, cut
    /// off or gone. The call's error names no peer; the probe finds it.
    ProtocolUnanswered,
    /// The agreed step's acknowledgements of some workers did not come within the
    /// peer timeout: those workers are frozen, cut off or gone.
    Unacknowledged,
    /// A non-chief saved a preemption's round, and the chief's checkpoint of it did
    /// not appear in the folder before the chief stopped answering: the chief died
    /// (or froze) inside its save.
    UnfinishedSave,
    /// This worker's step stayed blocked past the handler's bound (its peer timeout)
    /// and a peer did not answer a health probe: the handler aborted the step's
    /// collectives itself (TensorFlow had not).
    StepBlocked,
}

crate::words!(Detection {
    Detection::ConnectionLost => "connection lost",
    Detection::StoppedHeartbeats => "stopped sending heartbeats",
    Detection::ServiceUnanswered => "no answer to this worker's heartbeats",
    Detection::ProtocolUnanswered => "no answer to the preemption protocol's calls",
    Detection::Unacknowledged => "the agreed step not acknowledged",
    Detection::UnfinishedSave => "the chief's save of the round not written",
    Detection::StepBlocked => "a step blocked past the peer timeout",
});

/// A lost peer: how it showed itself, and the tasks the error names
/// (`/job:worker/replica:0/task:1`), in the order named, without repeats. The list can
/// be empty: TF does not always name the peer, and the probe then finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostPeer {
    pub detection: Detection,
    pub tasks: Vec<String>,
}

/// What precedes an error another task reported through the coordination service.
const REPORTED_FROM: &str = "Error reported from /job:";

/// The coordination service's words for tasks whose heartbeats stopped (TF 2.19 on); the
/// tasks follow, one a line.
const STOPPED_HEARTBEATS: &str = "stopped sending heartbeats";

/// The same, one task at a time (TF 2.16–2.18): "Task /job:… heartbeat timeout."
const HEARTBEAT_TIMEOUT: &str = " heartbeat timeout";

/// Words of a broken transport (gRPC's and the socket's), matched case-insensitively.
const CONNECTION_LOST: [&str; 7] = [
    "connection reset by peer",
    "socket closed",
    "broken pipe",
    "transport closed",
    "connection refused",
    "failed to connect to all addresses",
    "stream removed",
];

/// Whether a step's error (`code`, `message`) means a peer is lost, and which.
///
/// `code` is the error's canonical code (`OpError.error_code`), `message` its text.
/// Pure: the same answer for the same error.
#[must_use]
pub fn lost_peer(code: i64, message: &str) -> Option<LostPeer> {
    if matches!(code, UNAVAILABLE | DEADLINE_EXCEEDED) && !message.contains(REPORTED_FROM) && message.contains(HEARTBEAT_RPC) {
        return Some(LostPeer {
            detection: Detection::ServiceUnanswered,
            tasks: Vec::new(),
        });
    }
    if code != UNAVAILABLE {
        return None;
    }
    let text = explaining_text(message);
    let lower = text.to_lowercase();
    let detection = if lower.contains(STOPPED_HEARTBEATS) || lower.contains(HEARTBEAT_TIMEOUT) {
        Detection::StoppedHeartbeats
    } else if CONNECTION_LOST.iter().any(|sign| lower.contains(sign)) {
        Detection::ConnectionLost
    } else {
        return None;
    };
    let tasks = match detection {
        Detection::StoppedHeartbeats => heartbeat_tasks(text),
        _ => remote_targets(text),
    };
    Some(LostPeer { detection, tasks })
}

/// The text that explains `message`: what the last task it relays reported, or the
/// whole message.
fn explaining_text(message: &str) -> &str {
    match message.rfind(REPORTED_FROM) {
        Some(at) => {
            let relayed = &message[at + REPORTED_FROM.len()..];
            // "/job:worker/task:1: <what it reported>"
            relayed.find(": ").map_or(relayed, |colon| &relayed[colon + 2..])
        }
        None => message,
    }
}

/// The tasks whose heartbeats stopped: those listed after "stopped sending heartbeats"
/// (one `/job:…` a line), and each "Task /job:… heartbeat timeout".
fn heartbeat_tasks(text: &str) -> Vec<String> {
    let mut tasks: Vec<String> = Vec::new();
    let mut add = |task: &str| {
        if task.starts_with("/job:") && !tasks.iter().any(|t| t == task) {
            tasks.push(task.to_owned());
        }
    };
    if let Some(at) = text.find(STOPPED_HEARTBEATS) {
        for line in text[at..].lines().skip(1) {
            let line = line.trim();
            if !line.starts_with("/job:") {
                break;
            }
            add(line.split_whitespace().next().unwrap_or(line));
        }
    }
    let mut rest = text;
    while let Some(at) = rest.find(HEARTBEAT_TIMEOUT) {
        // "… Task /job:worker/replica:0/task:1 heartbeat timeout": the word before it.
        add(rest[..at].rsplit(char::is_whitespace).next().unwrap_or(""));
        rest = &rest[at + HEARTBEAT_TIMEOUT.len()..];
    }
    tasks
}

/// The tasks gRPC names as the "remote target" of a failed call.
fn remote_targets(text: &str) -> Vec<String> {
    const TARGET: &str = "remote target ";
    let mut tasks: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(TARGET) {
        rest = &rest[at + TARGET.len()..];
        // Up to a space, or the end of the status's braces or list.
        let task: String = rest.chars().take_while(|c| !c.is_whitespace() && !"},;)".contains(*c)).collect();
        if task.starts_with("/job:") && !tasks.contains(&task) {
            tasks.push(task);
        }
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    const INVALID_ARGUMENT: i64 = 3;
    const RESOURCE_EXHAUSTED: i64 = 8;

    #[test]
    fn a_reset_connection_names_its_remote_target() {
        let message = "Graph execution error:\n\nCollective ops is aborted by: recvmsg:Connection \
                       reset by peer\nAdditional GRPC error information from remote target \
                       /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf:\n\
                       :UNKNOWN:Error received from peer  {grpc_status:14}";
        let lost = lost_peer(UNAVAILABLE, message).expect("a lost peer");
        assert_eq!(lost.detection, Detection::ConnectionLost);
        assert_eq!(lost.tasks, ["/job:worker/replica:0/task:1"]);
    }

    #[test]
    fn stopped_heartbeats_name_every_listed_task() {
        let message = "Collective ops is aborted by: Error reported from /job:worker/task:1: The \
                       following tasks are unhealthy (stopped sending heartbeats):\n\
                       /job:worker/replica:0/task:1\n/job:worker/replica:0/task:2\nThe tasks have \
                       crashed.";
        let lost = lost_peer(UNAVAILABLE, message).expect("a lost peer");
        assert_eq!(lost.detection, Detection::StoppedHeartbeats);
        assert_eq!(lost.tasks, ["/job:worker/replica:0/task:1", "/job:worker/replica:0/task:2"]);
    }

    #[test]
    fn a_heartbeat_timeout_of_tf_2_16_names_its_task() {
        let message = "Collective ops is aborted by: Error reported from /job:worker/task:1: Task \
                       /job:worker/replica:0/task:1 heartbeat timeout. This indicates that the \
                       remote task has failed, got preempted, or crashed unexpectedly.";
        let lost = lost_peer(UNAVAILABLE, message).expect("a lost peer");
        assert_eq!(lost.detection, Detection::StoppedHeartbeats);
        assert_eq!(lost.tasks, ["/job:worker/replica:0/task:1"]);
    }

    #[test]
    fn a_peer_s_own_unavailable_error_relayed_is_no_lost_peer() {
        // The user's step on worker 1 could not reach a service of its own; worker 1
        // reported it; worker 0's collective was aborted with that text.
        let message = "Collective ops is aborted by: Error reported from /job:worker/task:1: \
                       my feature store is unavailable";
        assert_eq!(lost_peer(UNAVAILABLE, message), None);
    }

    #[test]
    fn a_peer_relaying_its_own_lost_peer_is_a_lost_peer() {
        let message = "Collective ops is aborted by: Error reported from /job:worker/task:2: \
                       Collective ops is aborted by: recvmsg:Connection reset by peer from \
                       remote target /job:worker/replica:0/task:1 while calling X";
        let lost = lost_peer(UNAVAILABLE, message).expect("a lost peer");
        assert_eq!(lost.tasks, ["/job:worker/replica:0/task:1"]);
    }

    #[test]
    fn other_codes_are_never_a_lost_peer() {
        let reset = "recvmsg:Connection reset by peer";
        for code in [INVALID_ARGUMENT, RESOURCE_EXHAUSTED, 1, 2, 4, 10, 13] {
            assert_eq!(lost_peer(code, reset), None, "code {code}");
        }
        assert_eq!(lost_peer(UNAVAILABLE, "the tf.data service is unavailable"), None);
    }

    #[test]
    fn an_unanswered_heartbeat_to_the_service_is_a_lost_chief_unless_relayed() {
        let own = "Collective ops is aborted by: Deadline Exceeded\n\nRPC: /tensorflow.CoordinationService/Heartbeat\n";
        for code in [DEADLINE_EXCEEDED, UNAVAILABLE] {
            assert_eq!(
                lost_peer(code, own),
                Some(LostPeer {
                    detection: Detection::ServiceUnanswered,
                    tasks: vec![]
                })
            );
        }
        assert_eq!(lost_peer(3, own), None, "another code: not the heartbeat's failure");
        let relayed = format!("Collective ops is aborted by: Error reported from /job:worker/task:1: {own}");
        assert_eq!(lost_peer(DEADLINE_EXCEEDED, &relayed), None);
    }

    /// Every record of `dev/lost_peer_probe.py` in `tests/fixtures/lost_peer/`: a
    /// survivor of a killed or stopped peer sees a lost peer (naming the target when
    /// the error names a task); every other error is not one.
    #[test]
    fn the_errors_tensorflow_gives_are_classified() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lost_peer");
        let mut files: Vec<_> = std::fs::read_dir(&folder)
            .expect("tests/fixtures/lost_peer")
            .map(|entry| entry.expect("an entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no records in {}", folder.display());
        let mut checked = 0;
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable");
            let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            let version = json["tensorflow"].as_str().unwrap_or("?").to_owned();
            for record in json["results"].as_array().expect("results") {
                let Some(code) = record["code"].as_i64() else {
                    continue; // no error came (a stopped chief): nothing to classify
                };
                let scenario = record["scenario"].as_str().expect("scenario");
                let message = record["message"].as_str().expect("message");
                let (fault, target) = scenario.split_once(':').expect("fault:target");
                let got = lost_peer(code, message);
                let what = format!("TF {version}, {scenario}, worker {}", record["index"]);
                if record["role"] == "survivor" && matches!(fault, "kill" | "stop") {
                    let lost = got.unwrap_or_else(|| panic!("{what}: not a lost peer: {message}"));
                    let task = format!("/job:worker/replica:0/task:{target}");
                    assert!(lost.tasks.is_empty() || lost.tasks == [task.clone()], "{what}: {lost:?}");
                    if fault == "stop" && lost.detection == Detection::ServiceUnanswered {
                        // The chief, which hosts the service: the probe names it.
                        assert_eq!(target, "0", "{what}");
                        assert!(lost.tasks.is_empty(), "{what}");
                    } else if fault == "stop" {
                        assert_eq!(lost.detection, Detection::StoppedHeartbeats, "{what}");
                        assert_eq!(lost.tasks, [task], "{what}");
                    }
                } else {
                    assert_eq!(got, None, "{what}: {message}");
                }
                checked += 1;
            }
        }
        assert!(checked >= 6, "only {checked} records");
    }
}
