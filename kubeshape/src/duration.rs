//! How Kubernetes prints an age ("3m10s", "2d1h", "8y"): the rules of apimachinery's
//! `duration.HumanDuration`, which kubectl and the API server's Table printers use, so a cached
//! or simulated Table reads exactly as the API server's would.

/// `seconds` (whole, truncated toward zero as Go's `int(d.Seconds())` does) as Kubernetes
/// prints a duration.
pub fn human(seconds: i64) -> String {
    // Up to a second in the future is taken as now (clocks differ a little).
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

#[cfg(test)]
mod tests {
    use super::human;

    const MINUTE: i64 = 60;
    const HOUR: i64 = 60 * MINUTE;
    const DAY: i64 = 24 * HOUR;
    const YEAR: i64 = 365 * DAY;

    #[test]
    fn durations_print_as_kubectl_prints_them() {
        // The cases of apimachinery's own tests (TestHumanDuration and its boundaries).
        for (seconds, printed) in [
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (1, "1s"),
            (70, "70s"),
            (119, "119s"),
            (2 * MINUTE, "2m"),
            (2 * MINUTE + 1, "2m1s"),
            (190, "3m10s"),
            (10 * MINUTE - 1, "9m59s"),
            (10 * MINUTE, "10m"),
            (10 * MINUTE + 1, "10m"),
            (70 * MINUTE, "70m"),
            (3 * HOUR - 1, "179m"),
            (3 * HOUR, "3h"),
            (3 * HOUR + MINUTE, "3h1m"),
            (8 * HOUR - 1, "7h59m"),
            (8 * HOUR, "8h"),
            (8 * HOUR + 59 * MINUTE, "8h"),
            (47 * HOUR, "47h"),
            (2 * DAY, "2d"),
            (49 * HOUR, "2d1h"),
            (8 * DAY - 1, "7d23h"),
            (8 * DAY, "8d"),
            (8 * DAY + 23 * HOUR, "8d"),
            (367 * DAY, "367d"),
            (2 * YEAR - 1, "729d"),
            (2 * YEAR, "2y"),
            (2 * YEAR + DAY - 1, "2y"),
            (2 * YEAR + DAY, "2y1d"),
            (2 * YEAR + 25 * HOUR, "2y1d"),
            (3 * YEAR, "3y"),
            (8 * YEAR + 2 * HOUR, "8y"),
        ] {
            assert_eq!(human(seconds), printed, "{seconds} s");
        }
    }
}
