//! Five-field cron expressions (minute, hour, day of month, month, day of week; UTC), as
//! crontab(5) reads them: `*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, and lists of
//! those. As in cron, when both day fields are restricted a day matching either one fires.

use time::{Duration, OffsetDateTime};

/// A parsed expression: the allowed values of each field, as bit sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Day of month and day of week are both restricted (not `*`).
    either_day: bool,
}

/// (name, lowest, highest) of each field.
const FIELDS: [(&str, u32, u32); 5] = [
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
];

impl Cron {
    pub fn parse(text: &str) -> Result<Cron, String> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(format!(
                "{text:?} has {} fields; a schedule has 5: minute hour day-of-month month day-of-week (e.g. \"0 */6 * * *\")",
                parts.len()
            ));
        }
        let mut sets = [0u64; 5];
        for (i, part) in parts.iter().enumerate() {
            sets[i] = field(part, FIELDS[i])?;
        }
        // Sunday is 0 or 7.
        if sets[4] & (1 << 7) != 0 {
            sets[4] |= 1;
        }
        Ok(Cron {
            minutes: sets[0],
            hours: sets[1],
            days: sets[2],
            months: sets[3],
            weekdays: sets[4],
            either_day: !parts[2].starts_with('*') && !parts[4].starts_with('*'),
        })
    }

    fn matches(&self, t: OffsetDateTime) -> bool {
        let has = |set: u64, v: u8| set & (1u64 << v) != 0;
        let day = has(self.days, t.day());
        let weekday = has(self.weekdays, t.weekday().number_days_from_sunday());
        let day_ok = if self.either_day {
            day || weekday
        } else {
            day && weekday
        };
        has(self.minutes, t.minute())
            && has(self.hours, t.hour())
            && has(self.months, u8::from(t.month()))
            && day_ok
    }

    /// The first minute after `after` the expression fires at, within five years (an
    /// expression such as `0 0 31 2 *` never fires: `None`).
    pub fn next_after(&self, after: OffsetDateTime) -> Option<OffsetDateTime> {
        let start =
            after.replace_second(0).ok()?.replace_nanosecond(0).ok()? + Duration::minutes(1);
        let mut t = start;
        let end = start + Duration::days(5 * 366);
        while t < end {
            if self.months & (1u64 << u8::from(t.month())) == 0 {
                // Skip to the first minute of the next day; whole days are cheap to skip.
                t = (t + Duration::days(1)).replace_time(time::Time::MIDNIGHT);
                continue;
            }
            if self.matches(t) {
                return Some(t);
            }
            t += if self.hours & (1u64 << t.hour()) == 0 {
                Duration::minutes(60 - i64::from(t.minute()))
            } else {
                Duration::minutes(1)
            };
        }
        None
    }
}

fn field(text: &str, (name, low, high): (&str, u32, u32)) -> Result<u64, String> {
    let bad = |why: &str| format!("{name} {text:?}: {why}");
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| bad("a step is a number above 0"))?,
            ),
            None => (item, 1),
        };
        let number = |s: &str| {
            s.parse::<u32>()
                .ok()
                .filter(|v| (low..=high).contains(v))
                .ok_or_else(|| bad(&format!("values go from {low} to {high}")))
        };
        let (from, to) = match range {
            "*" => (low, high),
            r => match r.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                // `5/15` means from 5 to the end, every 15.
                None if item.contains('/') => (number(r)?, high),
                None => {
                    let v = number(r)?;
                    (v, v)
                }
            },
        };
        if from > to {
            return Err(bad("a range goes from low to high"));
        }
        let mut v = from;
        while v <= to {
            set |= 1u64 << v;
            v += step;
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn next(expr: &str, after: OffsetDateTime) -> OffsetDateTime {
        Cron::parse(expr).unwrap().next_after(after).unwrap()
    }

    #[test]
    fn common_schedules_fire_when_cron_would() {
        let t = datetime!(2026-11-23 16:12:30 UTC);
        assert_eq!(next("* * * * *", t), datetime!(2026-11-23 16:13 UTC));
        assert_eq!(next("*/5 * * * *", t), datetime!(2026-11-23 16:15 UTC));
        assert_eq!(next("0 */6 * * *", t), datetime!(2026-11-23 18:00 UTC));
        assert_eq!(next("30 2 * * *", t), datetime!(2026-11-24 02:30 UTC));
        // 2026-11-23 is a Monday: the next Sunday (0 or 7) is the 29th.
        assert_eq!(next("0 0 * * 0", t), datetime!(2026-11-29 00:00 UTC));
        assert_eq!(next("0 0 * * 7", t), datetime!(2026-11-29 00:00 UTC));
        assert_eq!(next("0 0 1 1 *", t), datetime!(2027-01-01 00:00 UTC));
        assert_eq!(
            next("15,45 9-10 * * 1-5", t),
            datetime!(2026-11-24 09:15 UTC)
        );
        // Both day fields restricted: either one will do (the 1st, or a Friday).
        assert_eq!(next("0 0 1 * 5", t), datetime!(2026-11-27 00:00 UTC));
        assert_eq!(next("0 0 29 2 *", t), datetime!(2028-02-29 00:00 UTC));
        assert!(Cron::parse("0 0 31 2 *").unwrap().next_after(t).is_none());
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        for (expr, says) in [
            ("* * * *", "has 4 fields"),
            ("60 * * * *", "minute \"60\": values go from 0 to 59"),
            ("* 24 * * *", "hour"),
            ("*/0 * * * *", "a step is a number above 0"),
            ("5-1 * * * *", "low to high"),
            ("a * * * *", "minute"),
            ("* * 0 * *", "day of month"),
        ] {
            let e = Cron::parse(expr).unwrap_err();
            assert!(e.contains(says), "{expr}: {e}");
        }
    }
}
