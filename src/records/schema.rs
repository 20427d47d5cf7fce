//! The schema of a record line (`tf_failure_handling.records.FIELDS`): each
//! known field and what its value must be, and the parsing of one line into a
//! typed [`Line`].
//!
//! The rules read a value through its [`Shape`], which both sides build: from
//! a parsed JSON value here ([`Shape::of`]), from a Python object in the
//! binding (`records.valid` takes a dict someone parsed), so the rules are
//! written once.

use serde_json::{Map, Number, Value};

/// The latest time a line may carry: the end of year 9999, the last one a
/// date can show.
pub const LATEST: f64 = 253_402_300_799.0;

/// What a known field's value must be. `null` is the same as absent and
/// passes every kind; [`REQUIRED`] says which fields must not be absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An integer (not a boolean, not `1.0`).
    Int,
    /// A string.
    Str,
    /// An integer or a string (`task`, `code`).
    IntOrStr,
    /// A finite number.
    Number,
    /// A finite number, not negative (`grace_period`).
    NonNegative,
    /// Unix seconds: a finite number from 0 to [`LATEST`].
    Time,
}

/// The known fields in the order of `records.FIELDS`. A line's other fields
/// are kept (in `extra`), whatever their value.
pub const FIELDS: [(&str, Kind); 19] = [
    ("schema", Kind::Int),
    ("stage", Kind::Str),
    ("time", Kind::Time),
    ("job", Kind::Str),
    ("task", Kind::IntOrStr),
    ("host", Kind::Str),
    ("pid", Kind::Int),
    ("preemption", Kind::Str),
    ("platform", Kind::Str),
    ("source", Kind::Str),
    ("deadline", Kind::Time),
    ("grace_period", Kind::NonNegative),
    ("step", Kind::Int),
    ("proposer", Kind::Str),
    ("path", Kind::Str),
    ("code", Kind::IntOrStr),
    ("error", Kind::Str),
    ("lost", Kind::Int),
    ("downtime", Kind::Number),
];

/// The fields every line has (not absent, not `null`).
pub const REQUIRED: [&str; 4] = ["stage", "time", "job", "task"];

/// The kind of the known field `name`, or None when the schema does not name it.
#[must_use]
pub fn kind(name: &str) -> Option<Kind> {
    FIELDS.iter().find(|(n, _)| *n == name).map(|(_, k)| *k)
}

/// What the rules see of a value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    /// Absent or `null` (Python's `None`).
    Null,
    /// `true` or `false`: never a number, although Python's `bool` is an `int`.
    Bool,
    /// An integer, with its value as the nearest `f64` (infinite when too large
    /// for one: not a finite number).
    Int(f64),
    /// A floating-point number (`1.0` and `1e3` are, as in Python's `json`).
    Float(f64),
    /// A string.
    Str,
    /// A list, an object, or (from Python) anything else.
    Other,
}

impl Shape {
    /// The shape of a parsed JSON value (`None`: the field is absent).
    #[must_use]
    pub fn of(value: Option<&Value>) -> Shape {
        match value {
            None | Some(Value::Null) => Shape::Null,
            Some(Value::Bool(_)) => Shape::Bool,
            Some(Value::Number(n)) => {
                let v = n.as_f64().unwrap_or(f64::INFINITY);
                if n.is_f64() {
                    Shape::Float(v)
                } else {
                    Shape::Int(v)
                }
            }
            Some(Value::String(_)) => Shape::Str,
            Some(Value::Array(_) | Value::Object(_)) => Shape::Other,
        }
    }

    fn finite(self) -> Option<f64> {
        match self {
            Shape::Int(v) | Shape::Float(v) if v.is_finite() => Some(v),
            _ => None,
        }
    }
}

impl Kind {
    /// Whether a value of `shape` is allowed (`null` always is).
    #[must_use]
    pub fn accepts(self, shape: Shape) -> bool {
        if shape == Shape::Null {
            return true;
        }
        match self {
            Kind::Int => matches!(shape, Shape::Int(_)),
            Kind::Str => shape == Shape::Str,
            Kind::IntOrStr => matches!(shape, Shape::Int(_) | Shape::Str),
            Kind::Number => shape.finite().is_some(),
            Kind::NonNegative => shape.finite().is_some_and(|v| v >= 0.0),
            Kind::Time => shape.finite().is_some_and(|v| (0.0..=LATEST).contains(&v)),
        }
    }
}

/// Whether an object whose fields have the shapes `shape_of(name)` is of the
/// schema's shape: every [`REQUIRED`] field present, every known field of its
/// [`Kind`].
pub fn conforms(mut shape_of: impl FnMut(&str) -> Shape) -> bool {
    REQUIRED.iter().all(|name| shape_of(name) != Shape::Null) && FIELDS.iter().all(|(name, kind)| kind.accepts(shape_of(name)))
}

/// An integer or a string, as a line wrote it (`task`, `code`).
#[derive(Clone, Debug, PartialEq)]
pub enum IntOrStr {
    /// An integer (an `i64` or `u64` [`Number`]).
    Int(Number),
    /// A string.
    Str(String),
}

impl std::fmt::Display for IntOrStr {
    /// Python's `str()` of the value: `0` and `"0"` name the same task.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IntOrStr::Int(n) => n.fmt(f),
            IntOrStr::Str(s) => f.write_str(s),
        }
    }
}

/// One line of the schema's shape. Numbers stay [`Number`]s, so an integer
/// written as `5` is read back as an integer and `5.0` as a float, as Python's
/// `json` reads them.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // the fields are the schema's (docs/records.md)
pub struct Line {
    pub stage: String,
    pub time: Number,
    pub job: String,
    pub task: IntOrStr,
    pub host: Option<String>,
    pub pid: Option<Number>,
    pub preemption: Option<String>,
    pub platform: Option<String>,
    pub source: Option<String>,
    pub deadline: Option<Number>,
    pub grace_period: Option<Number>,
    pub step: Option<Number>,
    pub proposer: Option<String>,
    pub path: Option<String>,
    pub code: Option<IntOrStr>,
    pub error: Option<String>,
    pub lost: Option<Number>,
    pub downtime: Option<Number>,
    /// The fields the schema does not name (a newer schema's, `requeue`'s).
    pub extra: Map<String, Value>,
}

/// A UTF-8 byte order mark, which Python's `json.loads` of bytes skips.
const BOM: &[u8] = b"\xef\xbb\xbf";

/// One line (without its newline) parsed and checked against the schema;
/// None when it is not JSON (RFC 8259: `NaN`, numbers beyond `f64`, lone
/// surrogates and nesting deeper than 128 are not), not an object, or not of
/// the schema's shape. Python's `json` took the first three, and deeper
/// nesting, in the fields the schema does not name; `json.dumps` writes none
/// of them but `NaN` and infinities, which no known field may hold. An
/// integer field written `-0` is read as the float -0.0 (Python: 0).
#[must_use]
pub fn parse_line(raw: &[u8]) -> Option<Line> {
    let raw = raw.strip_prefix(BOM).unwrap_or(raw);
    let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(raw) else {
        return None;
    };
    if !conforms(|name| Shape::of(map.get(name))) {
        return None;
    }
    let mut take = |name: &str| map.remove(name).unwrap_or(Value::Null);
    let _schema = take("schema");
    let line = Line {
        stage: string(take("stage"))?,
        time: number(take("time"))?,
        job: string(take("job"))?,
        task: int_or_str(take("task"))?,
        host: string(take("host")),
        pid: number(take("pid")),
        preemption: string(take("preemption")),
        platform: string(take("platform")),
        source: string(take("source")),
        deadline: number(take("deadline")),
        grace_period: number(take("grace_period")),
        step: number(take("step")),
        proposer: string(take("proposer")),
        path: string(take("path")),
        code: int_or_str(take("code")),
        error: string(take("error")),
        lost: number(take("lost")),
        downtime: number(take("downtime")),
        extra: Map::new(),
    };
    Some(Line { extra: map, ..line })
}

fn string(value: Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s),
        _ => None,
    }
}

fn number(value: Value) -> Option<Number> {
    match value {
        Value::Number(n) => Some(n),
        _ => None,
    }
}

fn int_or_str(value: Value) -> Option<IntOrStr> {
    match value {
        Value::Number(n) if !n.is_f64() => Some(IntOrStr::Int(n)),
        Value::String(s) => Some(IntOrStr::Str(s)),
        _ => None,
    }
}
