//! Dates and timestamps as [`Range::Time`]: instants in microseconds since 1970-01-01 00:00:00, without a time zone
//! (a timestamp with one is not ordered here). The conversions between the temporal types and their truncations
//! (`date_trunc`) as DataFusion computes them are monotone (never decreasing) in the instant, so a range maps to the
//! range between the images of its ends; a calendar part (`EXTRACT`, `date_part`) is bounded by the years of the
//! ends (by their months or days when they share a year or a month), else by its fixed range.
//!
//! Calendar arithmetic (chrono's, the library Arrow and DataFusion compute with) is defined between the years 1 and
//! 9999 here: an expression that needs it on a wider range is refused, since its value could not be computed (or
//! could fail) on some instant.

use super::Range;
use crate::policy::MICROS_PER_DAY;
use chrono::{Datelike, NaiveDate, NaiveDateTime};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{Column, ScalarValue};
use datafusion::logical_expr::Expr;

/// 0001-01-01 00:00:00 and 9999-12-31 23:59:59.999999, in microseconds: where calendar arithmetic is defined.
const CALENDAR: (i128, i128) = (-62_135_596_800_000_000, 253_402_300_799_999_999);

/// The granularities of `date_trunc` (DataFusion's names), and which of them keep only an instant's date.
pub(super) const TRUNCATIONS: &[(&str, bool)] = &[
    ("microsecond", false),
    ("millisecond", false),
    ("second", false),
    ("minute", false),
    ("hour", false),
    ("day", true),
    ("week", true),
    ("month", true),
    ("quarter", true),
    ("year", true),
];

/// A part `date_part` (EXTRACT) reads.
pub(super) struct Part {
    /// Its name, as DataFusion spells it (lower case).
    pub name: &'static str,
    /// Whether it depends only on an instant's date.
    pub date_only: bool,
    /// Its range, when that does not depend on the instant.
    pub fixed: Option<(i128, i128)>,
}

/// The parts `date_part` (EXTRACT) reads; any other is refused.
pub(super) const PARTS: &[Part] = &[
    Part { name: "year", date_only: true, fixed: None },
    Part { name: "isoyear", date_only: true, fixed: None },
    Part { name: "quarter", date_only: true, fixed: Some((1, 4)) },
    Part { name: "month", date_only: true, fixed: Some((1, 12)) },
    Part { name: "week", date_only: true, fixed: Some((1, 53)) },
    Part { name: "day", date_only: true, fixed: Some((1, 31)) },
    Part { name: "doy", date_only: true, fixed: Some((1, 366)) },
    Part { name: "dow", date_only: true, fixed: Some((0, 6)) },
    Part { name: "isodow", date_only: true, fixed: Some((1, 7)) },
    Part { name: "hour", date_only: false, fixed: Some((0, 23)) },
    Part { name: "minute", date_only: false, fixed: Some((0, 59)) },
    Part { name: "second", date_only: false, fixed: None },
    Part { name: "millisecond", date_only: false, fixed: None },
    Part { name: "microsecond", date_only: false, fixed: None },
    Part { name: "nanosecond", date_only: false, fixed: None },
    Part { name: "epoch", date_only: false, fixed: None },
];

/// Microseconds per unit of a temporal type without a time zone, as a fraction (numerator, denominator).
fn scale(t: &DataType) -> Option<(i128, i128)> {
    Some(match t {
        DataType::Date32 => (MICROS_PER_DAY.into(), 1),
        DataType::Timestamp(unit, None) => match unit {
            TimeUnit::Second => (1_000_000, 1),
            TimeUnit::Millisecond => (1_000, 1),
            TimeUnit::Microsecond => (1, 1),
            TimeUnit::Nanosecond => (1, 1_000),
        },
        _ => return None,
    })
}

/// The smallest and largest native values (days, seconds, ...) of a temporal type.
fn native_range(t: &DataType) -> (i128, i128) {
    match t {
        DataType::Date32 => (i32::MIN.into(), i32::MAX.into()),
        _ => (i64::MIN.into(), i64::MAX.into()),
    }
}

/// The instants a temporal type holds, or `None` for other types.
pub(super) fn type_range(t: &DataType) -> Option<Range> {
    let (num, den) = scale(t)?;
    let (lo, hi) = native_range(t);
    Some(Range::Time((lo * num).div_euclid(den), ceil_div(hi * num, den)))
}

fn ceil_div(x: i128, d: i128) -> i128 {
    -(-x).div_euclid(d)
}

/// A temporal literal as a one-point range (`None` unless it is exactly one microsecond instant).
pub(super) fn point(v: &ScalarValue) -> Option<Range> {
    let (native, t) = match v {
        ScalarValue::Date32(Some(d)) => (i128::from(*d), DataType::Date32),
        ScalarValue::TimestampSecond(Some(x), None)
        | ScalarValue::TimestampMillisecond(Some(x), None)
        | ScalarValue::TimestampMicrosecond(Some(x), None)
        | ScalarValue::TimestampNanosecond(Some(x), None) => (i128::from(*x), v.data_type()),
        _ => return None,
    };
    let (num, den) = scale(&t)?;
    let us = native * num;
    (us % den == 0).then(|| Range::Time(us / den, us / den))
}

/// Whether `[lo, hi]` lies where calendar arithmetic is defined.
pub(super) fn in_calendar(lo: i128, hi: i128) -> bool {
    CALENDAR.0 <= lo && hi <= CALENDAR.1
}

fn datetime(us: i128) -> Option<NaiveDateTime> {
    datafusion::arrow::temporal_conversions::timestamp_us_to_datetime(i64::try_from(us).ok()?)
}

fn micros(t: NaiveDateTime) -> i128 {
    t.and_utc().timestamp_micros().into()
}

/// The instants of a CAST of instants in `[lo, hi]` to `to` (Arrow's conversion: a timestamp to a date keeps its
/// date, found through the calendar; to a coarser unit it truncates towards 0; to a finer one it multiplies), or
/// `None` when some of them do not fit `to` or the calendar (the cast would fail) or `to` is not a temporal type
/// without a time zone.
pub(super) fn cast(lo: i128, hi: i128, to: &DataType) -> Option<Range> {
    let (num, den) = scale(to)?;
    // Arrow finds a timestamp's date through the calendar, and fails outside it.
    if *to == DataType::Date32 && !in_calendar(lo, hi) {
        return None;
    }
    let native = |us: i128| -> i128 {
        match to {
            DataType::Date32 => us.div_euclid(MICROS_PER_DAY.into()),
            // µs → unit: multiply (ns) or truncate towards 0 (s, ms), as Arrow does.
            _ if den > 1 => us * den,
            _ => us / num,
        }
    };
    let (l, h) = (native(lo), native(hi));
    let (tl, th) = native_range(to);
    if l < tl || h > th {
        return None;
    }
    Some(Range::Time((l * num).div_euclid(den), ceil_div(h * num, den)))
}

/// `date_part(part, x)` for `x` in `[lo, hi]`: the years between the ends' (one either side for the ISO year); within
/// one year, the months, quarters and days of the year between the ends'; within one month, the days. `None` when
/// the range says nothing more than the part's fixed range.
pub(super) fn part(part: &str, lo: i128, hi: i128) -> Option<(i128, i128)> {
    if !in_calendar(lo, hi) {
        return None;
    }
    let (a, b) = (datetime(lo)?, datetime(hi)?);
    let same_year = a.year() == b.year();
    let of = |f: fn(&NaiveDateTime) -> u32| Some((i128::from(f(&a)), i128::from(f(&b))));
    match part {
        "year" => Some((a.year().into(), b.year().into())),
        "isoyear" => Some((i128::from(a.year()) - 1, i128::from(b.year()) + 1)),
        "month" if same_year => of(|t| t.month()),
        "quarter" if same_year => of(|t| t.month0() / 3 + 1),
        "doy" if same_year => of(|t| t.ordinal()),
        "day" if same_year && a.month() == b.month() => of(|t| t.day()),
        _ => None,
    }
}

/// `date_trunc(granularity, x)` for `x` in `[lo, hi]`, a result of type `out`; `None` when it could fail. DataFusion
/// truncates to a day or finer by arithmetic on the value (`v − v mod n`, which must not leave the type), and to a
/// week or coarser through nanoseconds (the instant and its truncation must be nanosecond timestamps: 1677–2262).
pub(super) fn truncate(granularity: &str, lo: i128, hi: i128, out: &DataType) -> Option<Range> {
    let nanoseconds = DataType::Timestamp(TimeUnit::Nanosecond, None);
    let f = |us: i128| -> Option<i128> {
        let step = |n: i128| Some(us.div_euclid(n) * n);
        let t = datetime(us)?;
        let day = |d: NaiveDate| Some(micros(d.and_hms_opt(0, 0, 0)?));
        match granularity {
            "microsecond" => Some(us),
            "millisecond" => step(1_000),
            "second" => step(1_000_000),
            "minute" => step(60_000_000),
            "hour" => step(3_600_000_000),
            "day" => step(MICROS_PER_DAY.into()),
            "week" => day(t.date() - chrono::Days::new(t.weekday().num_days_from_monday().into())),
            "month" => day(t.date().with_day(1)?),
            "quarter" => day(NaiveDate::from_ymd_opt(t.year(), t.month0() / 3 * 3 + 1, 1)?),
            "year" => day(NaiveDate::from_ymd_opt(t.year(), 1, 1)?),
            _ => None,
        }
    };
    if !in_calendar(lo, hi) {
        return None;
    }
    let (l, h) = (f(lo)?, f(hi)?);
    let coarse = TRUNCATIONS.iter().position(|(g, _)| *g == granularity)? > 5;
    if coarse && (cast(lo, hi, &nanoseconds).is_none() || cast(l, h, &nanoseconds).is_none()) {
        return None;
    }
    cast(l, h, out).filter(|r| *r == Range::Time(l, h))
}

/// Whether `e` reads the timestamp column `c` only through its date: each read, through its clamp and casts, is the
/// argument of `date_trunc` to a day or coarser, of `date_part` (EXTRACT) of a part of the date, or of a CAST to a
/// date. Such an expression takes the same value on every instant of a day, so its values over a period are its
/// values on the period's days.
pub(crate) fn reads_only_dates(e: &Expr, c: &Column) -> bool {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    if !e.column_refs().contains(c) {
        return true;
    }
    let of_date = match e {
        Expr::ScalarFunction(f) => match (f.name(), f.args.as_slice()) {
            ("date_trunc", [Expr::Literal(g, _), x]) => is_read_of(x, c) && of_date(TRUNCATIONS.iter().copied(), g),
            ("date_part", [Expr::Literal(p, _), x]) => {
                is_read_of(x, c) && of_date(PARTS.iter().map(|p| (p.name, p.date_only)), p)
            }
            _ => false,
        },
        Expr::Cast(k) => *k.field.data_type() == DataType::Date32 && is_read_of(&k.expr, c),
        _ => false,
    };
    if of_date {
        return true;
    }
    if matches!(e, Expr::Column(_)) {
        return false;
    }
    let mut all = true;
    let _ = e.apply_children(|x| {
        all &= reads_only_dates(x, c);
        Ok(if all { TreeNodeRecursion::Continue } else { TreeNodeRecursion::Stop })
    });
    all
}

/// Whether `x` is the column `c`, clamped or cast.
fn is_read_of(mut x: &Expr, c: &Column) -> bool {
    loop {
        match x {
            Expr::Column(y) => return y == c,
            Expr::Cast(k) => x = &k.expr,
            Expr::ScalarFunction(f) if f.func.inner().is::<crate::plan::computed::Clamp>() => match f.args.first() {
                Some(a) => x = a,
                None => return false,
            },
            _ => return false,
        }
    }
}

/// Whether the literal `name` is one of `list`'s entries that read only an instant's date.
fn of_date<'a>(mut list: impl Iterator<Item = (&'a str, bool)>, name: &ScalarValue) -> bool {
    let name = name.to_string().to_lowercase();
    list.any(|(n, date_only)| date_only && n == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(s: &str) -> i128 {
        match ScalarValue::Utf8(Some(s.into())).cast_to(&DataType::Timestamp(TimeUnit::Microsecond, None)) {
            Ok(ScalarValue::TimestampMicrosecond(Some(v), None)) => v.into(),
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn the_calendar_limits_are_the_years_1_and_9999() {
        assert_eq!(CALENDAR, (us("0001-01-01T00:00:00"), us("9999-12-31T23:59:59.999999")));
    }

    #[test]
    fn parts_and_truncations_follow_the_calendar() {
        let (lo, hi) = (us("2019-03-04T10:00:00"), us("2023-12-31T23:00:00"));
        assert_eq!(part("year", lo, hi), Some((2019, 2023)));
        assert_eq!(part("month", lo, hi), None);
        assert_eq!(part("month", lo, us("2019-11-02")), Some((3, 11)));
        assert_eq!(part("day", lo, us("2019-03-30")), Some((4, 30)));
        let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
        assert_eq!(truncate("month", lo, hi, &ns), Some(Range::Time(us("2019-03-01"), us("2023-12-01"))));
        assert_eq!(truncate("week", lo, hi, &ns), Some(Range::Time(us("2019-03-04"), us("2023-12-25"))));
        assert_eq!(truncate("quarter", lo, hi, &ns), Some(Range::Time(us("2019-01-01"), us("2023-10-01"))));
        assert_eq!(truncate("hour", lo, hi, &ns), Some(Range::Time(lo, hi)));
        // A week or coarser goes through nanoseconds, even for a microsecond timestamp: 1677–2262 only.
        let micros = DataType::Timestamp(TimeUnit::Microsecond, None);
        assert_eq!(truncate("year", us("2300-01-01"), us("2300-01-02"), &micros), None);
        assert!(truncate("day", us("2300-01-01"), us("2300-01-02"), &micros).is_some());
        assert_eq!(truncate("month", us("1677-09-22"), hi, &ns), None, "1677-09-01 is before the first nanosecond");
    }

    #[test]
    fn casts_keep_the_date_or_fail_when_the_instant_does_not_fit() {
        let (lo, hi) = (us("1969-12-31T12:00:00"), us("2024-02-29T23:59:59"));
        assert_eq!(cast(lo, hi, &DataType::Date32), Some(Range::Time(us("1969-12-31"), us("2024-02-29"))));
        let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
        assert_eq!(cast(lo, hi, &ns), Some(Range::Time(lo, hi)));
        assert_eq!(cast(us("1500-01-01"), hi, &ns), None, "before 1677 a nanosecond timestamp overflows");
        let s = DataType::Timestamp(TimeUnit::Second, None);
        assert_eq!(cast(-1_500_000, 2_500_000, &s), Some(Range::Time(-1_000_000, 2_000_000)), "towards 0");
        assert_eq!(point(&ScalarValue::Date32(Some(1))), Some(Range::Time(86_400_000_000, 86_400_000_000)));
        assert_eq!(point(&ScalarValue::TimestampNanosecond(Some(1), None)), None);
    }
}
