//! The date parsers: known values, junk, and every date of four centuries.

use super::*;
use crate::sources::dates::{MONTHS, WEEKDAYS};

use proptest::prelude::*;

#[test]
fn rfc3339_known_values_and_junk() {
    for (text, expected) in [
        ("1970-01-01T00:00:00Z", 0.0),
        ("2017-09-18T08:22:00Z", 1_505_722_920.0),
        ("2017-09-18T08:22:00+00:00", 1_505_722_920.0),
        ("2017-09-18t08:22:00z", 1_505_722_920.0),
        ("2017-09-18T10:22:00+02:00", 1_505_722_920.0),
        ("2017-09-18T06:52:00-01:30", 1_505_722_920.0),
        ("2017-09-18T08:22:00.25Z", 1_505_722_920.25),
        ("2000-02-29T00:00:00Z", 951_782_400.0),
        ("2026-11-22T19:00:00Z", 1_795_374_000.0),
        ("1969-12-31T23:59:59Z", -1.0),
        ("2016-12-31T23:59:60Z", 1_483_228_800.0),
        ("9999-12-31T23:59:59Z", 253_402_300_799.0),
    ] {
        assert_eq!(parse_rfc3339(text), Some(expected), "{text}");
    }
    // Digits past nanoseconds are validated, not used.
    let t = parse_rfc3339("2017-09-18T08:22:00.123456789123Z").unwrap();
    assert!((t - 1_505_722_920.123_456_8).abs() < 1e-6, "{t}");
    for junk in [
        "",
        "2017-09-18",
        "2017-09-18T08:22:00",
        "2017-09-18 08:22:00Z",
        "2017-09-18T08:22Z",
        "2017-09-18T08:22:00.Z",
        "2017-09-18T08:22:00ZZ",
        "2017-09-18T08:22:00+0000",
        "2017-09-18T08:22:00+24:00",
        "2017-09-18T08:22:00 Z",
        " 2017-09-18T08:22:00Z",
        "2017-13-18T08:22:00Z",
        "2017-00-18T08:22:00Z",
        "2017-02-29T08:22:00Z",
        "1900-02-29T08:22:00Z",
        "2017-09-31T08:22:00Z",
        "2017-09-18T24:00:00Z",
        "2017-09-18T08:60:00Z",
        "2017-09-18T08:22:61Z",
        "+017-09-18T08:22:00Z",
        "２０17-09-18T08:22:00Z",
        "2017-09-18T08:22:00.１Z",
        "Mon, 19 Sep 2016 18:29:47 GMT",
    ] {
        assert_eq!(parse_rfc3339(junk), None, "{junk}");
    }
}

#[test]
fn rfc1123_known_values_and_junk() {
    for (text, expected) in [
        ("Mon, 19 Sep 2016 18:29:47 GMT", 1_474_309_787.0),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
        ("Thu, 1 Jan 1970 00:00:00 UTC", 0.0),
        ("Sun, 06 Nov 1994 08:49:37 +0000", 784_111_777.0),
        ("Tue, 29 Feb 2000 12:00:00 GMT", 951_825_600.0),
    ] {
        assert_eq!(parse_rfc1123(text), Some(expected), "{text}");
    }
    for junk in [
        "",
        "19 Sep 2016 18:29:47 GMT",
        "Mon 19 Sep 2016 18:29:47 GMT",
        "Monday, 19 Sep 2016 18:29:47 GMT",
        "Mon, 19 Sep 2016 18:29:47",
        "Mon, 19 Sep 2016 18:29:47 PST",
        "Mon, 19 Sep 2016 18:29:47 GMT ",
        "Mon,  19 Sep 2016 18:29:47 GMT",
        "Mon, 19 sep 2016 18:29:47 GMT",
        "Mon, 19 Sept 2016 18:29:47 GMT",
        "Mon, 31 Sep 2016 18:29:47 GMT",
        "Mon, 00 Sep 2016 18:29:47 GMT",
        "Mon, 190 Sep 2016 18:29:47 GMT",
        "Mon, 19 Sep 16 18:29:47 GMT",
        "Mon, 19 Sep 2016 18:29 GMT",
        "Mon, 19 Sep 2016 18-29-47 GMT",
        "Mon, 19 Sep 2016 25:29:47 GMT",
        "Mon, 19 Sep 2016 1a:29:47 GMT",
        "Mon, 19 Sep 2016 18:29:4７ GMT",
        "2016-09-19T18:29:47Z",
    ] {
        assert_eq!(parse_rfc1123(junk), None, "{junk}");
    }
}

/// The inverse of `days_from_civil` (Howard Hinnant's `civil_from_days`),
/// to generate dates for the round trip.
fn civil(seconds: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let n = |x: i64| u32::try_from(x).unwrap();
    (y, n(m), n(d), n(rest / 3600), n(rest % 3600 / 60), n(rest % 60))
}

proptest! {
    #[test]
    fn date_parsers_never_panic(text in ".{0,40}") {
        let _ = parse_rfc3339(&text);
        let _ = parse_rfc1123(&text);
    }

    #[test]
    fn date_parsers_never_panic_on_near_misses(text in "[0-9A-Za-z:.+, -]{0,34}") {
        let _ = parse_rfc3339(&text);
        let _ = parse_rfc1123(&text);
    }

    #[test]
    fn dates_round_trip(seconds in 0i64..253_402_300_800, weekday in 0usize..7) {
        let (y, mo, d, h, mi, s) = civil(seconds);
        let expected = Some(seconds as f64);
        let rfc3339 = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z");
        prop_assert_eq!(parse_rfc3339(&rfc3339), expected, "{}", rfc3339);
        let rfc1123 = format!("{}, {d:02} {} {y:04} {h:02}:{mi:02}:{s:02} GMT", WEEKDAYS[weekday], MONTHS[mo as usize - 1]);
        prop_assert_eq!(parse_rfc1123(&rfc1123), expected, "{}", rfc1123);
    }
}
