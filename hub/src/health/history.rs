//! A machine's usage over the last 24 hours at one-minute resolution, for charts. Samples
//! arriving within a minute are folded into one point (CPU averaged, memory and disk as last
//! seen, network as the minute's rate). Closed minutes are kept in 24 bytes each and the buffer
//! grows, exactly, to at most [`MINUTES`] of them (34 KiB a machine after a day), then stays:
//! its memory does not grow with time. Kept in the hub's memory only: a restarted hub starts
//! each chart afresh.

use std::collections::VecDeque;

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

/// A closed minute as kept: CPU and load in hundredths, memory in KiB, disk in MiB, which is
/// finer than a chart shows.
#[derive(Debug, Clone, Copy)]
struct Kept {
    minute: u32,
    cpu_centi: u16,
    load_centi: u16,
    memory_kib: u32,
    disk_mib: u32,
    net_rx_rate: f32,
    net_tx_rate: f32,
}

impl Kept {
    fn of(p: &Point) -> Kept {
        let centi = |v: f32, max: f32| (v.clamp(0.0, max) * 100.0).round() as u16;
        Kept {
            minute: p.minute,
            cpu_centi: centi(p.cpu_percent, 100.0),
            load_centi: centi(p.load1, 655.0),
            memory_kib: u32::try_from(p.memory_used_bytes >> 10).unwrap_or(u32::MAX),
            disk_mib: u32::try_from(p.disk_used_bytes >> 20).unwrap_or(u32::MAX),
            net_rx_rate: p.net_rx_rate,
            net_tx_rate: p.net_tx_rate,
        }
    }

    fn point(&self) -> Point {
        Point {
            minute: self.minute,
            cpu_percent: f32::from(self.cpu_centi) / 100.0,
            memory_used_bytes: u64::from(self.memory_kib) << 10,
            disk_used_bytes: u64::from(self.disk_mib) << 20,
            load1: f32::from(self.load_centi) / 100.0,
            net_rx_rate: self.net_rx_rate,
            net_tx_rate: self.net_tx_rate,
        }
    }
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

#[derive(Debug, Default)]
pub struct History {
    points: VecDeque<Kept>,
    open: Option<Open>,
    /// The previous sample's time and network counters, for rates.
    last_net: Option<(u64, u64, u64)>,
}

impl History {
    /// Adds a sample taken at `now` (seconds since the Unix epoch). Samples older than the
    /// minute being filled are ignored.
    pub fn record(&mut self, now: u64, usage: &Usage) {
        let minute = u32::try_from(now / 60).unwrap_or(u32::MAX);
        if let Some(open) = self.open
            && open.point.minute != minute
        {
            if minute < open.point.minute {
                return;
            }
            self.close(open);
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
    }

    fn close(&mut self, open: Open) {
        if self.points.len() == MINUTES {
            self.points.pop_front();
        } else if self.points.len() == self.points.capacity() {
            // Grown exactly, never past a day's worth (doubling would overshoot to 2,048).
            let more = self
                .points
                .capacity()
                .max(16)
                .min(MINUTES - self.points.len());
            self.points.reserve_exact(more);
        }
        self.points.push_back(Kept::of(&open.point));
    }

    /// The points of the last 24 hours before `now`, oldest first, the minute being filled last.
    pub fn points(&self, now: u64) -> impl Iterator<Item = Point> {
        let oldest = u32::try_from((now / 60).saturating_sub(MINUTES as u64 - 1)).unwrap_or(0);
        self.points
            .iter()
            .map(Kept::point)
            .chain(self.open.as_ref().map(|o| o.point))
            .filter(move |p| p.minute >= oldest)
    }

    /// The memory the buffer holds, for the test that it stays bounded.
    pub fn capacity(&self) -> usize {
        self.points.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(cpu: f32, memory: u64, rx: u64) -> Usage {
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
        h.record(t, &usage(10.0, 100, 1_000));
        h.record(t + 20, &usage(30.0, 200, 3_000));
        h.record(t + 40, &usage(50.0, 300, 5_000));
        let points: Vec<_> = h.points(t + 40).collect();
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].cpu_percent, 30.0);
        assert_eq!(points[0].memory_used_bytes, 300);
        // 4,000 bytes over 40 s.
        assert_eq!(points[0].net_rx_rate, 100.0);
        h.record(t + 60, &usage(70.0, 400, 5_600));
        let points: Vec<_> = h.points(t + 60).collect();
        assert_eq!(points.len(), 2);
        assert_eq!(points[1].cpu_percent, 70.0);
        assert_eq!(points[1].net_rx_rate, 30.0);
    }

    #[test]
    fn a_reset_counter_is_not_a_burst() {
        let mut h = History::default();
        h.record(600, &usage(0.0, 0, 1_000_000));
        h.record(610, &usage(0.0, 0, 10));
        assert_eq!(h.points(610).next().unwrap().net_rx_rate, 0.0);
    }

    #[test]
    fn three_days_of_samples_keep_one_day_in_bounded_memory() {
        let mut h = History::default();
        let start = 1_800_000_000;
        let day = 24 * 3600;
        let mut capacity_after_a_day = 0;
        for t in (start..start + 3 * day).step_by(10) {
            if t == start + day + 60 {
                capacity_after_a_day = h.capacity();
            }
            h.record(t, &usage(((t / 10) % 100) as f32, t, t * 100));
        }
        let end = start + 3 * day;
        assert_eq!(capacity_after_a_day, MINUTES, "grown past a day's worth");
        assert_eq!(h.capacity(), MINUTES, "the buffer grew after a day");
        assert_eq!(std::mem::size_of::<Kept>(), 24, "a kept minute got bigger");
        let points: Vec<_> = h.points(end - 10).collect();
        assert_eq!(points.len(), MINUTES);
        let minutes: Vec<u32> = points.iter().map(|p| p.minute).collect();
        assert!(
            minutes.windows(2).all(|w| w[1] == w[0] + 1),
            "a gap or a repeat"
        );
        assert_eq!(
            *minutes.last().unwrap(),
            u32::try_from((end - 10) / 60).unwrap()
        );
        // 100 bytes a second throughout; memory within the KiB it is kept in.
        assert!(points.iter().all(|p| p.net_rx_rate == 100.0));
        let last = points[MINUTES - 2];
        let sampled = u64::from(last.minute) * 60 + 50;
        assert!(sampled - last.memory_used_bytes < 1024, "{last:?}");
    }

    #[test]
    fn old_points_leave_the_window_even_without_new_samples() {
        let mut h = History::default();
        h.record(600, &usage(1.0, 1, 0));
        assert_eq!(h.points(600).count(), 1);
        assert_eq!(h.points(600 + 25 * 3600).count(), 0);
    }
}
