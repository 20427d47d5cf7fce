//! AWS EC2: the IMDSv2 session token, the spot `instance-action` and the
//! rebalance recommendation, all watched by one [`AwsPoller`], and the
//! detection requests (token, or the IMDSv1 meta-data root).

use serde_json::Value;

use super::dates::parse_rfc3339;
use super::shared::{paced, trouble, Action, Event, Notice, Poller, Request, Response, Timing};

/// IMDSv2 session token lifetime asked for, in seconds (the maximum, 6 h).
pub const AWS_TOKEN_TTL: u32 = 21_600;
/// Seconds between attempts to get an IMDSv2 token once one failed.
pub const AWS_TOKEN_RETRY: f64 = 30.0;
/// Longest pause between rebalance-recommendation polls, in seconds.
pub const AWS_REBALANCE_MAX_INTERVAL: f64 = 1.0;
/// Default grace period on AWS, in seconds: Spot gives two minutes' notice (the
/// notice's own deadline caps it).
pub const AWS_GRACE_PERIOD: u32 = 120;

const AWS_TOKEN_PATH: &str = "/latest/api/token";
const AWS_TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const AWS_TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
const AWS_ACTION_PATH: &str = "/latest/meta-data/spot/instance-action";
const AWS_REBALANCE_PATH: &str = "/latest/meta-data/events/recommendations/rebalance";
const AWS_PROBE_V1_PATH: &str = "/latest/meta-data/";

/// The note [`AwsPoller`] emits when IMDSv2 is not there (logged once).
pub const NOTE_IMDSV1: &str = "the IMDSv2 token request was refused (403/404/405); polling with IMDSv1, without a token";

#[derive(Clone, Debug, PartialEq)]
enum Token {
    /// Fetch one before the next poll.
    Need,
    /// Use this one; fetch a new one from `refresh_at` on.
    Have { value: String, refresh_at: f64, expires_at: f64 },
    /// Poll without a token; try to get one again from `retry_at` on (never,
    /// after the server said IMDSv2 is not there).
    Without { retry_at: Option<f64> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AwsCall {
    Token,
    Action,
    Rebalance,
}

/// Watches an EC2 instance: IMDSv2 token, spot `instance-action`, rebalance
/// recommendation.
#[derive(Clone, Debug)]
pub struct AwsPoller {
    timing: Timing,
    token: Token,
    action_at: f64,
    rebalance_at: f64,
    rebalance_seen: bool,
    noticed: bool,
    sent: Option<(AwsCall, f64)>,
}

/// An IMDSv2 token fit for a header: 1–4096 visible ASCII bytes (after
/// trimming white space).
pub(super) fn valid_token(body: &[u8]) -> Option<String> {
    let token = std::str::from_utf8(body).ok()?.trim();
    (!token.is_empty() && token.len() <= 4096 && token.bytes().all(|b| b.is_ascii_graphic())).then(|| token.to_owned())
}

/// Parses a spot `instance-action` document into a notice.
///
/// # Errors
///
/// Why it is not an announcement: not JSON, not an object, no `action`
/// string, or an action other than `terminate`, `stop`, `hibernate`.
pub fn parse_spot_action(body: &[u8]) -> Result<Notice, &'static str> {
    let value: Value = serde_json::from_slice(body).map_err(|_| "not JSON")?;
    let object = value.as_object().ok_or("not a JSON object")?;
    let action = object.get("action").and_then(Value::as_str).ok_or("no action")?;
    let action = ["terminate", "stop", "hibernate"]
        .into_iter()
        .find(|a| *a == action)
        .ok_or("unknown action")?;
    let time = object
        .get("time")
        .and_then(Value::as_str)
        .and_then(|t| parse_rfc3339(t).map(|s| (t, s)));
    Ok(match time {
        Some((text, seconds)) => Notice {
            description: format!("AWS spot instance-action {action} at {text}"),
            deadline: Some(seconds),
        },
        None => Notice {
            description: format!("AWS spot instance-action {action} (no valid time)"),
            deadline: None,
        },
    })
}

/// Parses a rebalance recommendation (`{"noticeTime": "…"}`) to Unix
/// seconds.
///
/// # Errors
///
/// Why it is not one: not JSON, not an object, no RFC 3339 `noticeTime`.
pub fn parse_rebalance(body: &[u8]) -> Result<f64, &'static str> {
    let value: Value = serde_json::from_slice(body).map_err(|_| "not JSON")?;
    let time = value
        .as_object()
        .ok_or("not a JSON object")?
        .get("noticeTime")
        .and_then(Value::as_str);
    time.and_then(parse_rfc3339).ok_or("no valid noticeTime")
}

impl AwsPoller {
    /// A poller whose first request (the token) is due at once.
    #[must_use]
    pub fn new(timing: Timing) -> Self {
        AwsPoller {
            timing,
            token: Token::Need,
            action_at: f64::NEG_INFINITY,
            rebalance_at: f64::NEG_INFINITY,
            rebalance_seen: false,
            noticed: false,
            sent: None,
        }
    }

    fn rebalance_interval(&self) -> f64 {
        self.timing.interval.min(AWS_REBALANCE_MAX_INTERVAL)
    }

    /// No token to be had: keep a still-valid one for a while, else poll
    /// without; try again after [`AWS_TOKEN_RETRY`].
    fn token_failed(&mut self, now: f64) {
        let retry_at = now + AWS_TOKEN_RETRY;
        self.token = match std::mem::replace(&mut self.token, Token::Need) {
            Token::Have { value, expires_at, .. } if now < expires_at => Token::Have {
                value,
                refresh_at: retry_at.min(expires_at),
                expires_at,
            },
            _ => Token::Without { retry_at: Some(retry_at) },
        };
    }

    fn on_token(&mut self, now: f64, response: &Response<'_>) -> Option<Event> {
        const WHAT: &str = "AWS IMDSv2 token";
        match response.status {
            200 => {
                let Some(value) = valid_token(response.body) else {
                    self.token_failed(now);
                    return trouble(WHAT, true, "not a token");
                };
                let ttl = response
                    .header(AWS_TOKEN_TTL_HEADER)
                    .and_then(|t| t.parse::<u32>().ok())
                    .filter(|&t| t > 0)
                    .map_or(AWS_TOKEN_TTL, |t| t.min(AWS_TOKEN_TTL));
                let ttl = f64::from(ttl);
                self.token = Token::Have {
                    value,
                    refresh_at: now + 0.9 * ttl,
                    expires_at: now + ttl,
                };
                None
            }
            // 403, 404, 405: IMDSv2 is switched off or not there.
            403..=405 => {
                self.token = Token::Without { retry_at: None };
                Some(Event::Note(NOTE_IMDSV1))
            }
            status => {
                self.token_failed(now);
                trouble(WHAT, false, format!("status {status}"))
            }
        }
    }
}

impl Poller for AwsPoller {
    fn next(&mut self, now: f64) -> Action {
        let need_token = match &self.token {
            Token::Need => true,
            Token::Have { refresh_at, .. } => now >= *refresh_at,
            Token::Without { retry_at } => retry_at.is_some_and(|t| now >= t),
        };
        if need_token {
            self.sent = Some((AwsCall::Token, now));
            return Action::Request(Request {
                method: "PUT",
                path: AWS_TOKEN_PATH.to_owned(),
                headers: vec![(AWS_TOKEN_TTL_HEADER, AWS_TOKEN_TTL.to_string())],
                timeout: self.timing.request_timeout,
            });
        }
        let (call, due) = if !self.rebalance_seen && self.rebalance_at < self.action_at {
            (AwsCall::Rebalance, self.rebalance_at)
        } else {
            (AwsCall::Action, self.action_at)
        };
        if now < due {
            return Action::SleepUntil(due);
        }
        self.sent = Some((call, now));
        let headers = match &self.token {
            Token::Have { value, .. } => vec![(AWS_TOKEN_HEADER, value.clone())],
            _ => Vec::new(),
        };
        let path = if call == AwsCall::Action {
            AWS_ACTION_PATH
        } else {
            AWS_REBALANCE_PATH
        };
        Action::Request(Request {
            method: "GET",
            path: path.to_owned(),
            headers,
            timeout: self.timing.request_timeout,
        })
    }

    fn on_response(&mut self, now: f64, _unix_now: f64, response: &Response<'_>) -> Option<Event> {
        let (call, issued) = self.sent.take()?;
        let (what, every) = match call {
            AwsCall::Token => return self.on_token(now, response),
            AwsCall::Action => ("AWS spot instance-action", self.timing.interval),
            AwsCall::Rebalance => ("AWS rebalance recommendation", self.rebalance_interval()),
        };
        let later = paced(issued, every, now);
        if call == AwsCall::Action {
            self.action_at = later;
        } else {
            self.rebalance_at = later;
        }
        match (response.status, call) {
            (401, _) => {
                // The token expired or was never there: get a new one.
                self.token = Token::Need;
                trouble(what, false, "status 401 (session token rejected; fetching a new one)")
            }
            (404, _) => None,
            (200, AwsCall::Action) => match parse_spot_action(response.body) {
                Ok(notice) if !self.noticed => {
                    self.noticed = true;
                    Some(Event::Notice(notice))
                }
                Ok(_) => None,
                Err(why) => trouble(what, true, why),
            },
            (200, _) => match parse_rebalance(response.body) {
                Ok(time) => {
                    self.rebalance_seen = true;
                    Some(Event::Rebalance(time))
                }
                Err(why) => trouble(what, true, why),
            },
            (status, _) => trouble(what, false, format!("status {status}")),
        }
    }

    fn on_failure(&mut self, now: f64, detail: &str) -> Option<Event> {
        let (call, issued) = self.sent.take()?;
        let what = match call {
            AwsCall::Token => {
                self.token_failed(now);
                "AWS IMDSv2 token"
            }
            AwsCall::Action => {
                self.action_at = paced(issued, self.timing.interval, now);
                "AWS spot instance-action"
            }
            AwsCall::Rebalance => {
                self.rebalance_at = paced(issued, self.rebalance_interval(), now);
                "AWS rebalance recommendation"
            }
        };
        trouble(what, false, detail)
    }
}

/// AWS's detection requests: `PUT /latest/api/token` answers 200, or answers
/// 403/404/405 and then `GET /latest/meta-data/` answers 200 (IMDSv1).
/// The poller watching AWS, with its thread's name.
pub(super) fn pollers(timing: Timing) -> Vec<super::shared::NamedPoller> {
    vec![("tfh-aws-imds", Box::new(AwsPoller::new(timing)))]
}

pub(super) fn probe(status: &mut super::shared::ProbeStatus<'_>) -> bool {
    match status("PUT", AWS_TOKEN_PATH, &[(AWS_TOKEN_TTL_HEADER, "21600")]) {
        Some(200) => true,
        Some(403..=405) => status("GET", AWS_PROBE_V1_PATH, &[]) == Some(200),
        _ => false,
    }
}
