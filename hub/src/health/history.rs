//! A machine's usage over the last 24 hours at one-minute resolution, for charts. Samples
//! arriving within a minute are folded into one point (CPU averaged, memory and disk as last
//! seen, network as the minute's rate). Only the minute being filled and the last hour's CPU
//! are in the hub's memory (about 200 bytes a machine); closed minutes go to the charts' file
//! ([`super::charts`]), so a day of charts does not cost the hub memory per agent, and a
//! restarted hub keeps them.

use proto::health::v1::Usage;
use serde::Serialize;

/// 24 hours.
pub const MINUTES: usize = 24 * 60;

/// One minute of usage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    /// Minutes since the Unix epoch; shown as `time` (RFC 3339) by the API.
    #[serde(skip)]
    pub minute: u32,
    pub cpu_percent: f32,
    pub memory_used_bytes: u64,
    pub disk_used_bytes: u64,
    pub load1: f32,
    /// Bytes per second over the minute, every interface but loopback.
    pub net_rx_rate: f32,
    pub net_tx_rate: f32,
}

/// A closed minute as kept: CPU and load in hundredths, memory in KiB, disk in MiB, network in
/// whole bytes a second, which is finer than a chart shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kept {
    pub minute: u32,
    pub cpu_centi: u16,
    pub load_centi: u16,
    pub memory_kib: u32,
    pub disk_mib: u32,
    pub net_rx_rate: u64,
    pub net_tx_rate: u64,
}

impl Kept {
    pub fn of(p: &Point) -> Kept {
        let centi = |v: f32, max: f32| (v.clamp(0.0, max) * 100.0).round() as u16;
        let rate = |v: f32| v.max(0.0).round() as u64;
        Kept {
            minute: p.minute,
            cpu_centi: centi(p.cpu_percent, 100.0),
            load_centi: centi(p.load1, 655.0),
            memory_kib: u32::try_from(p.memory_used_bytes >> 10).unwrap_or(u32::MAX),
            disk_mib: u32::try_from(p.disk_used_bytes >> 20).unwrap_or(u32::MAX),
            net_rx_rate: rate(p.net_rx_rate),
            net_tx_rate: rate(p.net_tx_rate),
        }
    }

    pub fn point(&self) -> Point {
        Point {
            minute: self.minute,
            cpu_percent: f32::from(self.cpu_centi) / 100.0,
            memory_used_bytes: u64::from(self.memory_kib) << 10,
            disk_used_bytes: u64::from(self.disk_mib) << 20,
            load1: f32::from(self.load_centi) / 100.0,
            net_rx_rate: self.net_rx_rate as f32,
            net_tx_rate: self.net_tx_rate as f32,
        }
    }
}

/// The first minute of the 24 hours before `now` (seconds since the Unix epoch).
pub fn oldest_minute(now: u64) -> u32 {
    u32::try_from((now / 60).saturating_sub(MINUTES as u64 - 1)).unwrap_or(0)
}

/// The minute being filled.
#[derive(Debug, Clone, Copy)]
struct Open {
    point: Point,
    cpu_sum: f64,
    samples: u32,
    net_rx: u64,
    net_tx: u64,
    net_seconds: u64,
}

/// One machine's minute being filled, and its last hour's CPU (for the sparkline of a list of
/// machines, drawn without reading the charts' file for every row).
#[derive(Debug)]
pub struct History {
    open: Option<Open>,
    /// CPU in hundredths of the closed minute `m` at `m % 60`, [`NO_CPU`] for none.
    hour: [u16; 60],
    /// The newest closed minute in `hour`.
    newest: u32,
    /// The previous sample's time and network counters, for rates.
    last_net: Option<(u64, u64, u64)>,
}

/// A minute of `History::hour` without a figure.
const NO_CPU: u16 = u16::MAX;

impl Default for History {
    fn default() -> Self {
        Self {
            open: None,
            hour: [NO_CPU; 60],
            newest: 0,
            last_net: None,
        }
    }
}

impl History {
    /// Adds a sample taken at `now` (seconds since the Unix epoch); returns the minute it
    /// closed, to keep. Samples older than the minute being filled are ignored.
    pub fn record(&mut self, now: u64, usage: &Usage) -> Option<Kept> {
        let minute = u32::try_from(now / 60).unwrap_or(u32::MAX);
        let mut closed = None;
        if let Some(open) = self.open
            && open.point.minute != minute
        {
            if minute < open.point.minute {
                return None;
            }
            let kept = Kept::of(&open.point);
            self.close_hour(&kept);
            closed = Some(kept);
            self.open = None;
        }
        let (mut rx, mut tx, mut seconds) = (0, 0, 0);
        if let Some((then, last_rx, last_tx)) = self.last_net
            && now > then
        {
            // A counter that went down was reset (a reboot); that interval counts as nothing.
            rx = usage.net_rx_bytes.saturating_sub(last_rx);
            tx = usage.net_tx_bytes.saturating_sub(last_tx);
            seconds = now - then;
        }
        self.last_net = Some((now, usage.net_rx_bytes, usage.net_tx_bytes));
        let open = self.open.get_or_insert(Open {
            point: Point {
                minute,
                cpu_percent: 0.0,
                memory_used_bytes: 0,
                disk_used_bytes: 0,
                load1: 0.0,
                net_rx_rate: 0.0,
                net_tx_rate: 0.0,
            },
            cpu_sum: 0.0,
            samples: 0,
            net_rx: 0,
            net_tx: 0,
            net_seconds: 0,
        });
        open.cpu_sum += f64::from(usage.cpu_percent);
        open.samples += 1;
        open.net_rx += rx;
        open.net_tx += tx;
        open.net_seconds += seconds;
        let p = &mut open.point;
        p.cpu_percent = (open.cpu_sum / f64::from(open.samples)) as f32;
        p.memory_used_bytes = usage.memory_used_bytes;
        p.disk_used_bytes = usage.disk_used_bytes;
        p.load1 = usage.load1 as f32;
        if open.net_seconds > 0 {
            p.net_rx_rate = (open.net_rx as f64 / open.net_seconds as f64) as f32;
            p.net_tx_rate = (open.net_tx as f64 / open.net_seconds as f64) as f32;
        }
        closed
    }

    fn close_hour(&mut self, kept: &Kept) {
        let m = kept.minute;
        // The minutes skipped since the newest (no samples) have no figure.
        let skipped = m.saturating_sub(self.newest).min(61);
        for gap in 1..skipped {
            self.hour[((self.newest + gap) % 60) as usize] = NO_CPU;
        }
        self.hour[(m % 60) as usize] = kept.cpu_centi;
        self.newest = self.newest.max(m);
    }

    /// The last hour's CPU before `now`, oldest first, the minute being filled last: points
    /// with their minute and `cpu_percent` only.
    pub fn last_hour_cpu(&self, now: u64) -> Vec<Point> {
        let now_minute = u32::try_from(now / 60).unwrap_or(u32::MAX);
        let first = now_minute
            .saturating_sub(59)
            .max(self.newest.saturating_sub(59));
        let cpu = |minute: u32, cpu_percent: f32| Point {
            minute,
            cpu_percent,
            memory_used_bytes: 0,
            disk_used_bytes: 0,
            load1: 0.0,
            net_rx_rate: 0.0,
            net_tx_rate: 0.0,
        };
        (first..=self.newest.min(now_minute))
            .filter_map(|m| {
                let centi = self.hour[(m % 60) as usize];
                (centi != NO_CPU).then(|| cpu(m, f32::from(centi) / 100.0))
            })
            .chain(
                self.open
                    .as_ref()
                    .filter(|o| o.point.minute + 59 >= now_minute)
                    .map(|o| cpu(o.point.minute, o.point.cpu_percent)),
            )
            .collect()
    }

    /// The minute being filled, if it is within the 24 hours before `now`.
    pub fn open_point(&self, now: u64) -> Option<Point> {
        self.open
            .as_ref()
            .map(|o| o.point)
            .filter(|p| p.minute >= oldest_minute(now))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A beat's usage: CPU %, memory used and bytes received so far.
    pub(crate) fn usage(cpu: f32, memory: u64, rx: u64) -> Usage {
        Usage {
            cpu_percent: cpu,
            memory_used_bytes: memory,
            net_rx_bytes: rx,
            ..Usage::default()
        }
    }

    #[test]
    fn samples_within_a_minute_fold_into_one_point() {
        let mut h = History::default();
        let t = 1_800_000_000 / 60 * 60;
        assert_eq!(h.record(t, &usage(10.0, 100, 1_000)), None);
        assert_eq!(h.record(t + 20, &usage(30.0, 200, 3_000)), None);
        assert_eq!(h.record(t + 40, &usage(50.0, 300, 5_000)), None);
        let open = h.open_point(t + 40).unwrap();
        assert_eq!(open.cpu_percent, 30.0);
        assert_eq!(open.memory_used_bytes, 300);
        // 4,000 bytes over 40 s.
        assert_eq!(open.net_rx_rate, 100.0);
        let closed = h.record(t + 60, &usage(70.0, 400, 5_600)).unwrap();
        assert_eq!(closed.point().minute, u32::try_from(t / 60).unwrap());
        assert_eq!(closed.point().cpu_percent, 30.0);
        let open = h.open_point(t + 60).unwrap();
        assert_eq!(open.cpu_percent, 70.0);
        assert_eq!(open.net_rx_rate, 30.0);
    }

    #[test]
    fn a_reset_counter_is_not_a_burst() {
        let mut h = History::default();
        h.record(600, &usage(0.0, 0, 1_000_000));
        h.record(610, &usage(0.0, 0, 10));
        assert_eq!(h.open_point(610).unwrap().net_rx_rate, 0.0);
    }

    #[test]
    fn a_kept_minute_reads_back_as_a_chart_shows_it() {
        let point = Point {
            minute: 30_000_000,
            cpu_percent: 12.345,
            memory_used_bytes: 3 << 30,
            disk_used_bytes: 40 << 30,
            load1: 1.5,
            net_rx_rate: 1_250_000.4,
            net_tx_rate: 20_000_000_000.0,
        };
        let back = Kept::of(&point).point();
        assert_eq!(back.cpu_percent, 12.35);
        assert_eq!(back.memory_used_bytes, 3 << 30);
        assert_eq!(back.disk_used_bytes, 40 << 30);
        assert_eq!(back.load1, 1.5);
        assert_eq!(back.net_rx_rate, 1_250_000.0);
        // Faster than 4 GB/s (a 100 GbE link) is not clipped.
        assert_eq!(back.net_tx_rate, 20_000_000_000.0);
    }

    #[test]
    fn the_last_hours_cpu_is_kept_with_its_gaps() {
        let mut h = History::default();
        let t = 1_800_000_000 / 60 * 60;
        // Two hours of a sample a minute, but none in minutes 100 to 104.
        for m in (0..120u64).filter(|m| !(100..105).contains(m)) {
            h.record(t + m * 60, &usage(m as f32 / 2.0, 0, 0));
        }
        let now = t + 119 * 60 + 30;
        let points = h.last_hour_cpu(now);
        let minutes: Vec<u64> = points
            .iter()
            .map(|p| u64::from(p.minute) - t / 60)
            .collect();
        let expected: Vec<u64> = (60..120).filter(|m| !(100..105).contains(m)).collect();
        assert_eq!(minutes, expected);
        assert!(
            points
                .iter()
                .all(|p| p.cpu_percent == (u64::from(p.minute) - t / 60) as f32 / 2.0)
        );
        // An hour and more later without a sample: nothing left to draw.
        assert!(h.last_hour_cpu(now + 3600 + 60).is_empty());
    }

    #[test]
    fn an_open_minute_leaves_the_window_even_without_new_samples() {
        let mut h = History::default();
        h.record(600, &usage(1.0, 1, 0));
        assert!(h.open_point(600).is_some());
        assert!(h.open_point(600 + 25 * 3600).is_none());
    }
}
