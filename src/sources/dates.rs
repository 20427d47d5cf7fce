//! The two date formats metadata services use: RFC 3339 (AWS) and RFC 1123
//! (Azure's `NotBefore`), parsed to Unix seconds without a date crate.

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix seconds of a UTC date and time, or None when a field is out of
/// range (second 60, a leap second, is accepted).
fn unix_seconds(year: i64, month: u32, day: u32, hour: u32, minute: u32, second: u32) -> Option<i64> {
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + i64::from(hour * 3600 + minute * 60 + second))
}

/// The ASCII digits `bytes[range]` as a number; None if any is not a digit
/// or the range is out of bounds.
fn digits(bytes: &[u8], range: std::ops::Range<usize>) -> Option<u32> {
    let part = bytes.get(range)?;
    if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(part.iter().fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0')))
}

#[allow(clippy::cast_precision_loss)] // Unix seconds of years 0–9999 fit an f64 exactly
fn as_f64(seconds: i64) -> f64 {
    seconds as f64
}

/// Parses an RFC 3339 date-time (`2017-09-18T08:22:00Z`,
/// `2017-09-18T08:22:00.123+00:00`, any `±hh:mm` offset) to Unix seconds.
/// None for anything else; never panics.
#[must_use]
pub fn parse_rfc3339(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    let sep = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(sep(4, b'-') && sep(7, b'-') && (sep(10, b'T') || sep(10, b't')) && sep(13, b':') && sep(16, b':')) {
        return None;
    }
    let year = digits(b, 0..4)?;
    let mut seconds = unix_seconds(
        i64::from(year),
        digits(b, 5..7)?,
        digits(b, 8..10)?,
        digits(b, 11..13)?,
        digits(b, 14..16)?,
        digits(b, 17..19)?,
    )?;
    let mut i = 19;
    let mut fraction = 0.0;
    if sep(i, b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        // Nanoseconds are plenty; further digits are validated, not used.
        let used = &b[start..(start + 9).min(i)];
        let value = used.iter().fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0'));
        let scale = used.iter().fold(1u32, |acc, _| acc * 10);
        fraction = f64::from(value) / f64::from(scale);
    }
    match &b[i..] {
        b"Z" | b"z" => {}
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let hours = digits(b, i + 1..i + 3)?;
            let minutes = digits(b, i + 4..i + 6)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = i64::from(hours * 3600 + minutes * 60);
            // Local time = UTC + offset.
            seconds -= if *sign == b'+' { offset } else { -offset };
        }
        _ => return None,
    }
    Some(as_f64(seconds) + fraction)
}

pub(super) const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
pub(super) const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// Parses an RFC 1123 date (`Mon, 19 Sep 2016 18:29:47 GMT`; zone `GMT`,
/// `UTC` or `+0000`) to Unix seconds. The weekday must be a weekday name but
/// is not checked against the date. None for anything else; never panics.
#[must_use]
pub fn parse_rfc1123(text: &str) -> Option<f64> {
    let (weekday, rest) = text.split_once(", ")?;
    if !WEEKDAYS.contains(&weekday) {
        return None;
    }
    let mut parts = rest.split(' ');
    let (day, month, year, time, zone) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !matches!(zone, "GMT" | "UTC" | "+0000") || !(1..=2).contains(&day.len()) || year.len() != 4 {
        return None;
    }
    let month = MONTHS.iter().position(|m| *m == month)?;
    let t = time.as_bytes();
    if t.len() != 8 || t[2] != b':' || t[5] != b':' {
        return None;
    }
    let seconds = unix_seconds(
        i64::from(digits(year.as_bytes(), 0..4)?),
        u32::try_from(month).ok()? + 1,
        digits(day.as_bytes(), 0..day.len())?,
        digits(t, 0..2)?,
        digits(t, 3..5)?,
        digits(t, 6..8)?,
    )?;
    Some(as_f64(seconds))
}
