//! The gRPC keepalive this package adds to TensorFlow's channels in a
//! ParameterServerStrategy process: a connection to a stopped task fails its
//! calls after a ping timeout instead of stalling them.
//! [`with_keepalive`] adds these, in milliseconds, to `TF_GRPC_DEFAULT_OPTIONS`
//! (the options of every channel TensorFlow creates in the process) unless the
//! user set them there; `_coordinator/grpc_keepalive.py` reads and writes the
//! variable. When they apply and their limits:
//! docs/getting-started/parameter-server.md.

/// Seconds between two keepalive pings on a connection with a call outstanding
/// (`grpc.keepalive_time_ms`). gRPC's default of at most 2 pings without data
/// keeps the servers, whose ping policy TensorFlow lets no one change, from
/// answering "too_many_pings".
pub const GRPC_PING_EVERY: f64 = 5.0;
/// Seconds a ping may go unanswered before gRPC closes the connection, failing
/// its calls. `grpc.http2.ping_timeout_ms` is the one this gRPC applies to
/// keepalive pings (its default is a minute); `grpc.keepalive_timeout_ms` is
/// the documented one: both are set.
pub const GRPC_PING_TIMEOUT: f64 = 5.0;
/// Seconds a reconnection may wait for the peer's HTTP/2 SETTINGS
/// (`grpc.min_reconnect_backoff_ms`; gRPC's default 20 s): a stopped task
/// accepts the TCP connection and never answers, and new calls to it wait for
/// the attempt.
pub const GRPC_CONNECT_TIMEOUT: f64 = 5.0;

/// The channel options of the keepalive, each with its value in milliseconds, as
/// `TF_GRPC_DEFAULT_OPTIONS` takes them.
#[must_use]
pub fn grpc_keepalive_options() -> Vec<(&'static str, u64)> {
    let ms = |s: f64| {
        // Seconds of a few minutes at most: far below u64::MAX milliseconds.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ms = (s * 1000.0) as u64;
        ms
    };
    vec![
        ("grpc.keepalive_time_ms", ms(GRPC_PING_EVERY)),
        ("grpc.keepalive_timeout_ms", ms(GRPC_PING_TIMEOUT)),
        ("grpc.http2.ping_timeout_ms", ms(GRPC_PING_TIMEOUT)),
        ("grpc.min_reconnect_backoff_ms", ms(GRPC_CONNECT_TIMEOUT)),
    ]
}

/// `TF_GRPC_DEFAULT_OPTIONS` (`current`: TF's format, `name=value` pairs separated by
/// commas) with the options of [`grpc_keepalive_options`] that it does not name
/// added after the user's; None when it names them all.
#[must_use]
pub fn with_keepalive(current: &str) -> Option<String> {
    let named: Vec<&str> = current
        .split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| item.split('=').next().unwrap_or("").trim())
        .collect();
    let added: Vec<String> = grpc_keepalive_options()
        .into_iter()
        .filter(|(name, _)| !named.contains(name))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    if added.is_empty() {
        return None;
    }
    let kept = current.trim().trim_matches(',');
    let kept = (!current.trim().is_empty()).then_some(kept);
    Some(kept.into_iter().map(str::to_owned).chain(added).collect::<Vec<_>>().join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keepalive_is_added_after_the_users_options_and_never_twice() {
        let all = "grpc.keepalive_time_ms=5000,grpc.keepalive_timeout_ms=5000,\
                   grpc.http2.ping_timeout_ms=5000,grpc.min_reconnect_backoff_ms=5000";
        assert_eq!(with_keepalive("").as_deref(), Some(all));
        assert_eq!(with_keepalive(all), None);
        let mine = with_keepalive("grpc.keepalive_time_ms=60000,grpc.foo=1,").expect("added");
        assert!(
            mine.starts_with("grpc.keepalive_time_ms=60000,grpc.foo=1,grpc.keepalive_timeout_ms=5000"),
            "{mine}"
        );
        assert_eq!(mine.matches("grpc.keepalive_time_ms").count(), 1);
    }
}
