//! A minimal blocking HTTP/1.1 client for metadata servers, with hard bounds.
//!
//! The metadata services of GCE, AWS and Azure answer plain HTTP on a
//! link-local address (`metadata.google.internal`, `169.254.169.254`). Off the
//! cloud that address may drop packets, and on it a misbehaving proxy may
//! answer with anything. The termination sources ([`crate::sources`]) poll
//! such a server every half second for the whole life of a training job, so
//! this client's one job is to never hang, never grow without bound, and
//! never take long to abandon:
//!
//! * **one overall deadline per request.** Resolution, connect, write and
//!   every read all count against it; a server that dribbles a byte every
//!   100 ms cannot extend it, because each read is given only what is left;
//! * **short slices.** Every blocking step (resolution, connect, write, read)
//!   waits at most [`SLICE`] before it looks at the caller's stop flag, so a
//!   request blocked on a silent server is abandoned within about
//!   [`SLICE`] of the flag being set ([`HttpError::Stopped`]). Connecting is
//!   retried in slices too: a link-local server answers a SYN in
//!   microseconds, so a slice is plenty;
//! * **caps.** The header block is at most [`MAX_HEAD`] bytes and the body at
//!   most [`MAX_BODY`]; a larger `Content-Length` is refused before reading,
//!   and a chunked or read-to-EOF body is cut off the moment it passes the
//!   cap ([`HttpError::TooLarge`]). Reading then stops: the connection is
//!   dropped, never drained;
//! * **one request per connection** (`Connection: close`): no pooling, no
//!   keep-alive state to get wrong. Bodies are framed by `Transfer-Encoding:
//!   chunked`, `Content-Length` or end of stream, in that order (RFC 9112
//!   §6.3).
//!
//! Only `http://host[:port]` bases ([`BaseUrl`]) are accepted: no TLS, no
//! proxies, no redirects (a metadata server has no reason to send one).
//! Names are resolved with [`ToSocketAddrs`] for the given host only, on a
//! helper thread so that a slow resolver is bounded by the same deadline and
//! stop flag; IP literals skip resolution.
//!
//! The response parser reads through the [`Transport`] trait, so the same
//! code runs over a socket and over a byte slice in the property tests.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use thiserror::Error;

/// Largest body accepted. Every metadata answer watched here is a few
/// hundred bytes; 64 KiB leaves room for a verbose Azure event list.
pub const MAX_BODY: usize = 64 * 1024;

/// Largest header block (status line, headers, blank line) accepted.
pub const MAX_HEAD: usize = 16 * 1024;

/// Longest single blocking step: how late a stop flag or a deadline can be
/// noticed.
pub const SLICE: Duration = Duration::from_millis(250);

/// Longest chunk-size line (size, extensions, CRLF) accepted.
const MAX_CHUNK_LINE: usize = 1024;

/// Most header fields accepted in one response.
const MAX_FIELDS: usize = 100;

/// Most name resolutions running at once (each on its own thread).
const MAX_RESOLVERS: usize = 4;

/// Name resolutions running now.
static RESOLVERS: AtomicUsize = AtomicUsize::new(0);

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 8 * 1024;

/// Why a request failed. Every variant means "no usable answer"; callers of
/// a poller treat them alike and only log the message.
#[derive(Debug, Error)]
pub enum HttpError {
    /// The overall deadline passed (resolution, connect, or a server that
    /// does not answer, or answers too slowly).
    #[error("timed out")]
    Timeout,
    /// The name did not resolve, or no address accepted the connection.
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    /// The header block or the body exceeded its cap; reading stopped there.
    #[error("{0} exceeds its size limit")]
    TooLarge(&'static str),
    /// The bytes received are not an HTTP/1.x response (or the stream ended
    /// inside one).
    #[error("malformed response: {0}")]
    Malformed(&'static str),
    /// The caller's stop flag was set.
    #[error("stopped")]
    Stopped,
    /// Any other socket error, or an invalid request (`InvalidInput`).
    #[error("i/o error: {0}")]
    Io(io::Error),
}

/// A base URL that is not `http://host[:port]`.
#[derive(Debug, Error)]
#[error("invalid base URL {url:?}: {reason} (expected http://host[:port])")]
pub struct UrlError {
    url: String,
    reason: &'static str,
}

/// `http://host[:port]`: where a metadata server listens. No path, query,
/// fragment or user info; one trailing slash is tolerated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl {
    /// Host name or IP literal, without brackets.
    host: String,
    port: u16,
}

impl BaseUrl {
    /// Parses `http://host[:port]` (`[v6]` for IPv6 literals).
    ///
    /// # Errors
    ///
    /// [`UrlError`] for another scheme, a path, an empty or invalid host, or
    /// a port that is not 1–65535.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let err = |reason| UrlError {
            url: url.chars().take(200).collect(),
            reason,
        };
        let rest = match url.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &url[7..],
            _ => return Err(err("the scheme must be http://")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(err("no path, query, fragment or user info is allowed"));
        }
        let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
            let (host, after) = bracketed.split_once(']').ok_or_else(|| err("unclosed ["))?;
            host.parse::<Ipv6Addr>().map_err(|_| err("invalid IPv6 literal"))?;
            (host, after)
        } else {
            match rest.find(':') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, ""),
            }
        };
        let port = if port.is_empty() {
            80
        } else {
            let digits = port.strip_prefix(':').ok_or_else(|| err("unexpected text after the host"))?;
            if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err("invalid port"));
            }
            match digits.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(err("invalid port")),
            }
        };
        let valid_host = !host.is_empty()
            && host.len() <= 253
            && (host.parse::<IpAddr>().is_ok()
                || host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_'));
        if !valid_host {
            return Err(err("invalid host"));
        }
        Ok(BaseUrl {
            host: host.to_owned(),
            port,
        })
    }

    /// The host, without brackets.
    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port (80 when the URL gave none).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `Host` header value.
    #[must_use]
    pub fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}", self.host_header())
    }
}

/// A complete response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code (100–599).
    pub status: u16,
    /// Header fields in order, names as sent, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked, at most [`MAX_BODY`] bytes.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// The first value of header `name` (case-insensitive) in `headers`.
#[must_use]
pub fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// One client per polling thread: it keeps the resolved addresses of its
/// base (resolved again after a connect failure).
#[derive(Debug)]
pub struct Client {
    base: BaseUrl,
    addrs: Option<Vec<SocketAddr>>,
}

impl Client {
    /// A client for `base`; nothing is resolved yet.
    #[must_use]
    pub fn new(base: BaseUrl) -> Self {
        Client { base, addrs: None }
    }

    /// The base URL.
    #[must_use]
    pub fn base(&self) -> &BaseUrl {
        &self.base
    }

    /// Sends `method path` with `headers` (plus `Host`, `Connection: close`,
    /// and `Content-Length: 0` for `PUT`/`POST`) and reads the whole
    /// response, all within `timeout`. `stop`, checked at least every
    /// [`SLICE`], abandons the request.
    ///
    /// # Errors
    ///
    /// [`HttpError`]: see its variants. An invalid method, path or header
    /// (control characters, no leading `/`) is `Io` with `InvalidInput`, and
    /// nothing is sent.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        timeout: Duration,
        stop: Option<&AtomicBool>,
    ) -> Result<Response, HttpError> {
        let start = Instant::now();
        // A deadline too far to represent is a day away: still bounded.
        let deadline = start.checked_add(timeout).unwrap_or(start + Duration::from_secs(86_400));
        let request = encode_request(&self.base, method, path, headers)?;
        let addrs = match &self.addrs {
            Some(a) => a.clone(),
            None => {
                let a = resolve(&self.base, deadline, stop)?;
                self.addrs = Some(a.clone());
                a
            }
        };
        let mut stream = match connect(&addrs, deadline, stop) {
            Ok(s) => s,
            Err(e) => {
                if matches!(e, HttpError::Connect(_)) {
                    self.addrs = None;
                }
                return Err(e);
            }
        };
        let _ = stream.set_nodelay(true);
        write_all(&mut stream, &request, deadline, stop)?;
        let mut conn = Conn::new(stream, deadline, stop);
        read_response(&mut conn)
    }
}

fn invalid(what: &'static str) -> HttpError {
    HttpError::Io(io::Error::new(io::ErrorKind::InvalidInput, what))
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn encode_request(base: &BaseUrl, method: &str, path: &str, headers: &[(&str, &str)]) -> Result<Vec<u8>, HttpError> {
    if !is_token(method) {
        return Err(invalid("invalid method"));
    }
    if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid("invalid path"));
    }
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: */*\r\nUser-Agent: tf-failure-handling/{}\r\n",
        base.host_header(),
        env!("CARGO_PKG_VERSION")
    );
    for (name, value) in headers {
        if !is_token(name) {
            return Err(invalid("invalid header name"));
        }
        if !value.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()) {
            return Err(invalid("invalid header value"));
        }
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    if method == "PUT" || method == "POST" {
        out.push_str("Content-Length: 0\r\n");
    }
    out.push_str("\r\n");
    Ok(out.into_bytes())
}

/// Fails with `Stopped` or `Timeout`, else returns the time left (> 0).
fn check(deadline: Instant, stop: Option<&AtomicBool>) -> Result<Duration, HttpError> {
    if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
        return Err(HttpError::Stopped);
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HttpError::Timeout);
    }
    Ok(left)
}

fn resolve(base: &BaseUrl, deadline: Instant, stop: Option<&AtomicBool>) -> Result<Vec<SocketAddr>, HttpError> {
    if let Ok(ip) = base.host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, base.port)]);
    }
    // getaddrinfo cannot be interrupted: run it on a helper thread and stop
    // waiting for it at the deadline (it then ends on its own). A resolver
    // that hangs must not pile up threads: at most MAX_RESOLVERS at a time.
    if RESOLVERS.fetch_add(1, Ordering::SeqCst) >= MAX_RESOLVERS {
        RESOLVERS.fetch_sub(1, Ordering::SeqCst);
        return Err(HttpError::Connect(io::Error::other(
            "name resolution is still busy with earlier requests",
        )));
    }
    let (tx, rx) = mpsc::channel();
    let host = base.host.clone();
    let port = base.port;
    let spawned = std::thread::Builder::new().name("tfh-resolve".into()).spawn(move || {
        let _ = tx.send((host.as_str(), port).to_socket_addrs().map(Iterator::collect::<Vec<_>>));
        RESOLVERS.fetch_sub(1, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        RESOLVERS.fetch_sub(1, Ordering::SeqCst);
        return Err(HttpError::Io(e));
    }
    loop {
        let left = check(deadline, stop)?;
        match rx.recv_timeout(left.min(SLICE)) {
            Ok(Ok(addrs)) if addrs.is_empty() => {
                return Err(HttpError::Connect(io::Error::new(
                    io::ErrorKind::NotFound,
                    "the name has no address",
                )))
            }
            Ok(Ok(addrs)) => return Ok(addrs),
            Ok(Err(e)) => return Err(HttpError::Connect(e)),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(HttpError::Connect(io::Error::other("the resolver thread failed")));
            }
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Tries each address in turn, each attempt at most one slice, until one
/// connects, all refuse, or the deadline passes.
fn connect(addrs: &[SocketAddr], deadline: Instant, stop: Option<&AtomicBool>) -> Result<TcpStream, HttpError> {
    let mut pending: Vec<SocketAddr> = addrs.to_vec();
    let mut last_error = None;
    while !pending.is_empty() {
        let mut i = 0;
        while i < pending.len() {
            let left = check(deadline, stop)?;
            match TcpStream::connect_timeout(&pending[i], left.min(SLICE)) {
                Ok(stream) => return Ok(stream),
                Err(e) if is_timeout(&e) => i += 1,
                Err(e) => {
                    last_error = Some(e);
                    pending.remove(i);
                }
            }
        }
    }
    Err(HttpError::Connect(last_error.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, "no address to connect to")
    })))
}

fn write_all(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant, stop: Option<&AtomicBool>) -> Result<(), HttpError> {
    while !bytes.is_empty() {
        let left = check(deadline, stop)?;
        stream.set_write_timeout(Some(left.min(SLICE))).map_err(HttpError::Io)?;
        match stream.write(bytes) {
            Ok(0) => return Err(HttpError::Io(io::ErrorKind::WriteZero.into())),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(HttpError::Io(e)),
        }
    }
    Ok(())
}

/// A byte source whose blocking reads can be bounded.
pub trait Transport: Read {
    /// Bounds the next read to `slice` (a no-op for sources that never
    /// block).
    ///
    /// # Errors
    ///
    /// The OS refused the timeout.
    fn set_read_slice(&mut self, slice: Duration) -> io::Result<()>;
}

impl Transport for TcpStream {
    fn set_read_slice(&mut self, slice: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(slice))
    }
}

impl Transport for &[u8] {
    fn set_read_slice(&mut self, _: Duration) -> io::Result<()> {
        Ok(())
    }
}

/// The reading side of one exchange: buffered bytes not yet consumed, the
/// deadline, the stop flag.
pub struct Conn<'s, T> {
    io: T,
    buf: Vec<u8>,
    eof: bool,
    deadline: Instant,
    stop: Option<&'s AtomicBool>,
}

impl<'s, T: Transport> Conn<'s, T> {
    /// Wraps `io`; every read is bounded by `deadline` and `stop`.
    pub fn new(io: T, deadline: Instant, stop: Option<&'s AtomicBool>) -> Self {
        Conn {
            io,
            buf: Vec::new(),
            eof: false,
            deadline,
            stop,
        }
    }

    /// Reads more bytes into the buffer; `Ok(false)` at end of stream.
    fn fill(&mut self) -> Result<bool, HttpError> {
        if self.eof {
            return Ok(false);
        }
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            let left = check(self.deadline, self.stop)?;
            self.io.set_read_slice(left.min(SLICE)).map_err(HttpError::Io)?;
            match self.io.read(&mut chunk) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(HttpError::Io(e)),
            }
        }
    }

    /// Takes one CRLF-terminated line (without the CRLF) of at most `max`
    /// bytes from the buffer.
    fn take_line(&mut self, max: usize) -> Result<Vec<u8>, HttpError> {
        loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                if i > max {
                    return Err(HttpError::Malformed("line too long"));
                }
                let line = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            if self.buf.len() > max + 1 {
                return Err(HttpError::Malformed("line too long"));
            }
            if !self.fill()? {
                return Err(HttpError::Malformed("the stream ended inside a line"));
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads one response from `conn`: the header block, then the body framed
/// by chunked encoding, `Content-Length`, or end of stream.
///
/// # Errors
///
/// [`HttpError`]: `Malformed` for anything that is not an HTTP/1.x
/// response, `TooLarge` past a cap, `Timeout`/`Stopped`/`Io` from the
/// transport.
pub fn read_response<T: Transport>(conn: &mut Conn<'_, T>) -> Result<Response, HttpError> {
    // The header block, checked for "HTTP/" as soon as five bytes are in, so
    // binary garbage fails at once instead of at the deadline.
    let mut searched = 0;
    let head_len = loop {
        if conn.buf.len() >= 5 && !conn.buf.starts_with(b"HTTP/") {
            return Err(HttpError::Malformed("not an HTTP/1.x status line"));
        }
        if let Some(i) = find(&conn.buf[searched..], b"\r\n\r\n") {
            break searched + i + 4;
        }
        searched = conn.buf.len().saturating_sub(3);
        if conn.buf.len() > MAX_HEAD {
            return Err(HttpError::TooLarge("the header block"));
        }
        if !conn.fill()? {
            return Err(HttpError::Malformed("the stream ended inside the header block"));
        }
    };
    if head_len > MAX_HEAD {
        return Err(HttpError::TooLarge("the header block"));
    }
    let (status, headers) = parse_head(&conn.buf[..head_len - 4])?;
    conn.buf.drain(..head_len);
    let body = if status == 204 || status == 304 {
        Vec::new()
    } else if let Some(te) = header(&headers, "transfer-encoding") {
        let last = te.rsplit(',').next().unwrap_or("").trim();
        if last.eq_ignore_ascii_case("chunked") {
            read_chunked(conn)?
        } else {
            read_to_end(conn)?
        }
    } else if let Some(length) = content_length(&headers)? {
        read_exact(conn, length)?
    } else {
        read_to_end(conn)?
    };
    Ok(Response { status, headers, body })
}

/// Status code and header fields of a header block (without the final
/// blank line).
///
/// # Errors
///
/// `Malformed` for a bad status line, a field without a colon or with an
/// invalid name, obsolete line folding, non-UTF-8 values, or too many
/// fields.
pub fn parse_head(block: &[u8]) -> Result<(u16, Vec<(String, String)>), HttpError> {
    let mut lines = block.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status_line = lines.next().unwrap_or_default();
    let status = parse_status_line(status_line).ok_or(HttpError::Malformed("bad status line"))?;
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() >= MAX_FIELDS {
            return Err(HttpError::Malformed("too many header fields"));
        }
        if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
            return Err(HttpError::Malformed("obsolete line folding"));
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(HttpError::Malformed("header field without a colon"))?;
        let name = std::str::from_utf8(&line[..colon]).ok().filter(|n| is_token(n));
        let name = name.ok_or(HttpError::Malformed("bad header name"))?;
        let value = std::str::from_utf8(&line[colon + 1..]).map_err(|_| HttpError::Malformed("header value is not UTF-8"))?;
        if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(HttpError::Malformed("control character in a header value"));
        }
        headers.push((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()));
    }
    Ok((status, headers))
}

fn parse_status_line(line: &[u8]) -> Option<u16> {
    let rest = line.strip_prefix(b"HTTP/1.")?;
    let (&minor, rest) = rest.split_first()?;
    if !minor.is_ascii_digit() {
        return None;
    }
    let rest = rest.strip_prefix(b" ")?;
    let code = rest.get(..3)?;
    if !code.iter().all(u8::is_ascii_digit) || !(rest.len() == 3 || rest[3] == b' ') {
        return None;
    }
    let status = code.iter().fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
    if !(100..=599).contains(&status) {
        return None;
    }
    if status < 200 {
        // An interim response: never asked for (no Expect header is sent).
        return None;
    }
    Some(status)
}

fn content_length(headers: &[(String, String)]) -> Result<Option<usize>, HttpError> {
    let mut found: Option<u64> = None;
    for (name, value) in headers {
        if !name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        for part in value.split(',') {
            let part = part.trim();
            if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HttpError::Malformed("bad Content-Length"));
            }
            let n: u64 = part.parse().map_err(|_| HttpError::Malformed("bad Content-Length"))?;
            if found.is_some_and(|f| f != n) {
                return Err(HttpError::Malformed("conflicting Content-Length values"));
            }
            found = Some(n);
        }
    }
    match found {
        None => Ok(None),
        Some(n) if n > MAX_BODY as u64 => Err(HttpError::TooLarge("the body")),
        Some(n) => Ok(Some(usize::try_from(n).map_err(|_| HttpError::TooLarge("the body"))?)),
    }
}

fn read_exact<T: Transport>(conn: &mut Conn<'_, T>, length: usize) -> Result<Vec<u8>, HttpError> {
    while conn.buf.len() < length {
        if !conn.fill()? {
            return Err(HttpError::Malformed("the stream ended before Content-Length bytes"));
        }
    }
    conn.buf.truncate(length);
    Ok(std::mem::take(&mut conn.buf))
}

fn read_to_end<T: Transport>(conn: &mut Conn<'_, T>) -> Result<Vec<u8>, HttpError> {
    loop {
        if conn.buf.len() > MAX_BODY {
            return Err(HttpError::TooLarge("the body"));
        }
        if !conn.fill()? {
            return Ok(std::mem::take(&mut conn.buf));
        }
    }
}

fn read_chunked<T: Transport>(conn: &mut Conn<'_, T>) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    loop {
        let line = conn.take_line(MAX_CHUNK_LINE)?;
        let size_text = line.split(|&b| b == b';').next().unwrap_or_default();
        let size_text = std::str::from_utf8(size_text)
            .map_err(|_| HttpError::Malformed("bad chunk size"))?
            .trim_matches([' ', '\t']);
        if size_text.is_empty() || size_text.len() > 16 || !size_text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(HttpError::Malformed("bad chunk size"));
        }
        let size = u64::from_str_radix(size_text, 16).map_err(|_| HttpError::Malformed("bad chunk size"))?;
        if size == 0 {
            break;
        }
        let room = (MAX_BODY - body.len()) as u64;
        if size > room {
            return Err(HttpError::TooLarge("the body"));
        }
        #[allow(clippy::cast_possible_truncation)] // size ≤ MAX_BODY
        let size = size as usize;
        while conn.buf.len() < size + 2 {
            if !conn.fill()? {
                return Err(HttpError::Malformed("the stream ended inside a chunk"));
            }
        }
        if &conn.buf[size..size + 2] != b"\r\n" {
            return Err(HttpError::Malformed("chunk not followed by CRLF"));
        }
        body.extend_from_slice(&conn.buf[..size]);
        conn.buf.drain(..size + 2);
    }
    // Trailer fields, ignored, up to the blank line; bounded like a header
    // block.
    let mut trailer = 0;
    loop {
        let line = conn.take_line(MAX_HEAD)?;
        if line.is_empty() {
            return Ok(body);
        }
        trailer += line.len() + 2;
        if trailer > MAX_HEAD {
            return Err(HttpError::TooLarge("the trailer"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::thread;

    use proptest::prelude::*;

    use super::*;

    /// Serves one connection on 127.0.0.1 with `serve`, which gets the
    /// accepted stream after the request head has been read.
    fn server(serve: impl FnOnce(TcpStream) + Send + 'static) -> BaseUrl {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => return,
                }
            }
            serve(stream);
        });
        BaseUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap()
    }

    fn reply(bytes: &'static [u8]) -> BaseUrl {
        server(move |mut s| {
            let _ = s.write_all(bytes);
        })
    }

    fn get(base: BaseUrl, timeout: Duration) -> Result<Response, HttpError> {
        Client::new(base).request("GET", "/x", &[("Metadata", "true")], timeout, None)
    }

    /// Far above anything these tests wait for: it only turns a request that
    /// never returns into a failure that says what it was waiting for. How
    /// fast a request gives up is not checked here (that is a bench figure).
    const HANG_BOUND: Duration = Duration::from_secs(30);

    /// Runs `f` on a thread; its result, or a failure naming `what` if it
    /// has not returned within [`HANG_BOUND`].
    fn returns<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(HANG_BOUND) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} had not returned after {HANG_BOUND:?}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
        }
    }

    /// A server that reads the request head, says so on the returned
    /// receiver, writes `first` and then nothing, holding the connection open
    /// until the returned sender is dropped: whatever the client sees, it is
    /// not the end of the stream.
    fn holding_server(first: &'static [u8]) -> (BaseUrl, mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (read_tx, read_rx) = mpsc::channel();
        let (release, held) = mpsc::channel::<()>();
        let base = server(move |mut s| {
            let _ = s.write_all(first);
            let _ = read_tx.send(());
            let _ = held.recv();
            drop(s);
        });
        (base, read_rx, release)
    }

    #[test]
    fn base_urls() {
        let b = BaseUrl::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!(
            (b.host(), b.port(), b.host_header()),
            ("127.0.0.1", 8080, "127.0.0.1:8080".to_owned())
        );
        let b = BaseUrl::parse("http://metadata.google.internal").unwrap();
        assert_eq!((b.port(), b.host_header()), (80, "metadata.google.internal".to_owned()));
        let b = BaseUrl::parse("HTTP://[::1]:9").unwrap();
        assert_eq!((b.host(), b.host_header()), ("::1", "[::1]:9".to_owned()));
        assert_eq!(b.to_string(), "http://[::1]:9");
        for bad in [
            "",
            "https://x",
            "http://",
            "http://x/path",
            "http://x:0",
            "http://x:65536",
            "http://x:",
            "http://u@x",
            "http://x?q",
            "http://[::1",
            "http://[zz]:1",
            "http://a b",
            "http://x:1:2",
            "ftp://x",
            "http://x//",
        ] {
            assert!(BaseUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn content_length_body_and_request_shape() {
        let (tx, rx) = mpsc::channel();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).unwrap();
                head.push(byte[0]);
            }
            tx.send(String::from_utf8(head).unwrap()).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: abc\r\n\r\nhello, and more")
                .unwrap();
        });
        let base = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let r = Client::new(base)
            .request(
                "PUT",
                "/latest/api/token",
                &[("X-aws-ec2-metadata-token-ttl-seconds", "21600")],
                Duration::from_secs(5),
                None,
            )
            .unwrap();
        assert_eq!((r.status, r.body.as_slice(), r.header("etag")), (200, &b"hello"[..], Some("abc")));
        let head = rx.recv().unwrap();
        assert!(head.starts_with("PUT /latest/api/token HTTP/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("\r\nHost: 127.0.0.1:{port}\r\n")), "{head}");
        assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
        assert!(head.contains("\r\nContent-Length: 0\r\n"), "{head}");
        assert!(head.contains("\r\nX-aws-ec2-metadata-token-ttl-seconds: 21600\r\n"), "{head}");
    }

    #[test]
    fn chunked_body() {
        let base = reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\nX-T: 1\r\n\r\n");
        assert_eq!(get(base, Duration::from_secs(5)).unwrap().body, b"Wikipedia");
    }

    #[test]
    fn read_to_eof_body() {
        let base = reply(b"HTTP/1.0 404 Not Found\r\nServer: x\r\n\r\nnot here");
        let r = get(base, Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"not here"[..]));
    }

    #[test]
    fn never_answering_server_times_out_at_the_deadline() {
        // The server holds the connection open without a byte until the end of
        // the test: only the deadline can end the request, and not before it.
        let (base, _, release) = holding_server(b"");
        let start = Instant::now();
        let e = returns("a request to a silent server (deadline 400 ms)", move || {
            get(base, Duration::from_millis(400))
        })
        .unwrap_err();
        let took = start.elapsed();
        drop(release);
        assert!(matches!(e, HttpError::Timeout), "{e:?}");
        assert!(took >= Duration::from_millis(400), "returned before its deadline: {took:?}");
    }

    #[test]
    fn dribbling_server_cannot_extend_the_deadline() {
        // A byte every 20 ms of a 60,000-byte body: the response would take 20
        // minutes, so a client whose deadline each byte extends never returns
        // (the hang bound fails it); one bounded by its deadline times out.
        let (release, held) = mpsc::channel::<()>();
        let base = server(move |mut s| {
            if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 60000\r\n\r\n").is_err() {
                return;
            }
            while let Err(mpsc::RecvTimeoutError::Timeout) = held.recv_timeout(Duration::from_millis(20)) {
                if s.write_all(b"x").is_err() {
                    return;
                }
            }
        });
        let start = Instant::now();
        let e = returns("a request to a dribbling server (deadline 600 ms)", move || {
            get(base, Duration::from_millis(600))
        })
        .unwrap_err();
        let took = start.elapsed();
        drop(release);
        assert!(matches!(e, HttpError::Timeout), "{e:?}");
        assert!(took >= Duration::from_millis(600), "returned before its deadline: {took:?}");
    }

    #[test]
    fn ten_mebibyte_bodies_are_refused() {
        // Announced: refused before reading.
        let base = server(|mut s| {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10485760\r\n\r\n");
            let _ = s.write_all(&vec![b'x'; 10 << 20]);
        });
        assert!(matches!(get(base, Duration::from_secs(5)), Err(HttpError::TooLarge(_))));
        // Read to end of stream: cut off at the cap.
        let base = server(|mut s| {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
            let _ = s.write_all(&vec![b'x'; 10 << 20]);
        });
        assert!(matches!(get(base, Duration::from_secs(5)), Err(HttpError::TooLarge(_))));
        // Chunked: one huge chunk.
        let base = server(|mut s| {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA00000\r\n");
            let _ = s.write_all(&vec![b'x'; 10 << 20]);
        });
        assert!(matches!(get(base, Duration::from_secs(5)), Err(HttpError::TooLarge(_))));
        // Endless headers.
        let base = server(|mut s| {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n");
            for _ in 0..10_000 {
                if s.write_all(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n").is_err() {
                    return;
                }
            }
        });
        assert!(matches!(get(base, Duration::from_secs(5)), Err(HttpError::TooLarge(_))));
    }

    #[test]
    fn garbage_and_truncation_are_malformed() {
        let base = reply(b"\x00\xff\x13garbage\r\n\r\n");
        assert!(matches!(get(base, Duration::from_secs(5)), Err(HttpError::Malformed(_))));
        // Binary garbage that never ends a line fails at once too: the server
        // holds the connection open after it, so a client that waited for the
        // line's end would see neither an end of stream nor anything but its
        // own deadline (HANG_BOUND away), and fail with Timeout.
        let (base, _, release) = holding_server(b"\x89PNG\x00\x00");
        let r = get(base, HANG_BOUND);
        drop(release);
        assert!(matches!(r, Err(HttpError::Malformed(_))), "{r:?}");
        let base = reply(b"HTTP/1.1 200 OK\r\nContent-Le");
        assert!(matches!(get(base, Duration::from_secs(5)), Err(HttpError::Malformed(_))));
        let base = reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort");
        assert!(matches!(get(base, Duration::from_secs(5)), Err(HttpError::Malformed(_))));
    }

    #[test]
    fn connection_refused_is_connect() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let base = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        assert!(matches!(get(base, Duration::from_secs(2)), Err(HttpError::Connect(_))));
    }

    #[test]
    fn stop_flag_abandons_a_blocked_request() {
        // The server has read the request and answers nothing; the request's
        // own deadline is beyond the hang bound, so only the flag can end it.
        let (base, head_read, release) = holding_server(b"");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(Client::new(base).request("GET", "/", &[], 2 * HANG_BOUND, Some(&flag)));
        });
        head_read.recv_timeout(HANG_BOUND).expect("the request never reached the server");
        stop.store(true, Ordering::SeqCst);
        let r = rx
            .recv_timeout(HANG_BOUND)
            .unwrap_or_else(|e| panic!("the request did not stop after the flag was set: {e:?}"));
        drop(release);
        assert!(matches!(r, Err(HttpError::Stopped)), "{r:?}");
    }

    #[test]
    fn invalid_requests_are_not_sent() {
        let base = BaseUrl::parse("http://127.0.0.1:9").unwrap();
        let mut c = Client::new(base);
        let t = Duration::from_secs(1);
        for (m, p, h) in [
            ("GET", "nopath", ("A", "b")),
            ("GET", "/a b", ("A", "b")),
            ("G T", "/", ("A", "b")),
            ("GET", "/", ("A", "b\r\nX: y")),
            ("GET", "/", ("A:", "b")),
        ] {
            let e = c.request(m, p, &[h], t, None).unwrap_err();
            assert!(matches!(&e, HttpError::Io(io) if io.kind() == io::ErrorKind::InvalidInput), "{e:?}");
        }
    }

    fn parse_bytes(bytes: &[u8]) -> Result<Response, HttpError> {
        let mut conn = Conn::new(bytes, Instant::now() + Duration::from_secs(60), None);
        read_response(&mut conn)
    }

    #[test]
    fn framing_table() {
        let ok = |b: &[u8]| parse_bytes(b).map(|r| (r.status, r.body));
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab").unwrap(),
            (200, b"ab".to_vec())
        );
        assert_eq!(
            ok(b"HTTP/1.1 200\r\nContent-Length: 2, 2\r\n\r\nab").unwrap(),
            (200, b"ab".to_vec())
        );
        assert_eq!(ok(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap(), (204, vec![]));
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\na\r\n0\r\n\r\n").unwrap(),
            (200, b"a".to_vec())
        );
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 600 Nope\r\n\r\n",
            b"HTTP/2 200\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab",
            b"HTTP/1.1 200 OK\r\nX: \xff\r\n\r\n",
        ] {
            assert!(
                matches!(parse_bytes(bad), Err(HttpError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(
            parse_bytes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n"),
            Err(HttpError::TooLarge(_))
        ));
    }

    proptest! {
        #[test]
        fn parser_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_bytes(&bytes);
        }

        #[test]
        fn parser_never_panics_after_a_valid_status_line(
            tail in proptest::collection::vec(any::<u8>(), 0..600),
            chunked in any::<bool>(),
        ) {
            let mut bytes = if chunked {
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n".to_vec()
            } else {
                b"HTTP/1.1 200 OK\r\n".to_vec()
            };
            bytes.extend_from_slice(&tail);
            if let Ok(r) = parse_bytes(&bytes) {
                prop_assert!(r.body.len() <= MAX_BODY);
            }
        }
    }
}
