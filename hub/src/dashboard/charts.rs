//! Usage charts as inline SVG, drawn here from the hub's one-minute history: a sparkline of CPU
//! for list rows, and a chart with its scale for a machine's page. Each is an image with a text
//! alternative that says what it shows.

use std::fmt::Write as _;

use super::escape;
use crate::health::history::Point;

/// Minutes since the Unix epoch, now.
pub(super) fn now_minute() -> u32 {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    u32::try_from(seconds / 60).unwrap_or(u32::MAX)
}

/// A line through each point within the last `minutes` before `now` in a `width` × `height`
/// box, `value` scaled so `max` is the top, and a dot on the latest.
fn polyline(
    points: &[Point],
    value: impl Fn(&Point) -> f64,
    max: f64,
    now: u32,
    minutes: u32,
    width: f64,
    height: f64,
) -> String {
    let start = now.saturating_sub(minutes);
    let mut out = String::new();
    let mut last = None;
    for p in points
        .iter()
        .filter(|p| p.minute > start && p.minute <= now)
    {
        let x = f64::from(p.minute - start) / f64::from(minutes) * width;
        let v = if max > 0.0 {
            (value(p) / max).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let y = height - v * height;
        let _ = write!(out, "{x:.1},{y:.1} ");
        last = Some((x, y));
    }
    let mut svg = format!(r#"<polyline points="{}"/>"#, out.trim_end());
    // A line of one point would not show.
    if let Some((x, y)) = last {
        let _ = write!(svg, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5"/>"#);
    }
    svg
}

/// A 120 × 28 sparkline of CPU % over the last hour.
pub(super) fn sparkline(points: &[Point], now: u32) -> String {
    let line = polyline(
        points,
        |p| f64::from(p.cpu_percent),
        100.0,
        now,
        60,
        120.0,
        28.0,
    );
    let latest = points.last().map_or_else(
        || "no data yet".to_owned(),
        |p| format!("{:.0}% now", p.cpu_percent),
    );
    format!(
        r#"<svg class="spark" viewBox="0 0 120 28" width="120" height="28" role="img" aria-label="CPU over the last hour, {latest}">{line}</svg>"#
    )
}

/// What a chart draws.
#[derive(Debug, Clone, Copy)]
pub(super) enum Series {
    Cpu,
    /// Memory used as a share of `total` bytes.
    Memory {
        total: u64,
    },
}

/// A 600 × 160 chart of `series` over the last `minutes`, with a 0–100 % scale.
pub(super) fn chart(
    points: &[Point],
    series: Series,
    now: u32,
    minutes: u32,
    title: &str,
) -> String {
    let value = |p: &Point| match series {
        Series::Cpu => f64::from(p.cpu_percent),
        Series::Memory { total } if total > 0 => p.memory_used_bytes as f64 / total as f64 * 100.0,
        Series::Memory { .. } => 0.0,
    };
    let (width, height) = (600.0, 160.0);
    let line = polyline(points, value, 100.0, now, minutes, width, height);
    let start = now.saturating_sub(minutes);
    let shown: Vec<f64> = points
        .iter()
        .filter(|p| p.minute > start)
        .map(value)
        .collect();
    let summary = if shown.is_empty() {
        "no data yet".to_owned()
    } else {
        let max = shown.iter().copied().fold(0.0, f64::max);
        let last = shown.last().copied().unwrap_or_default();
        format!("{last:.0}% now, at most {max:.0}%")
    };
    let span = if minutes >= 24 * 60 {
        "24 h ago"
    } else {
        "1 h ago"
    };
    format!(
        r#"<figure class="chart">
<figcaption>{title}: {summary}</figcaption>
<svg viewBox="0 0 {w} {h}" preserveAspectRatio="none" role="img" aria-label="{title}: {summary}">
<line class="grid" x1="0" y1="0" x2="{w}" y2="0"/><line class="grid" x1="0" y1="{mid}" x2="{w}" y2="{mid}"/><line class="grid" x1="0" y1="{h}" x2="{w}" y2="{h}"/>
{line}
</svg>
<div class="scale"><span>{span}</span><span>100% top · 50% middle</span><span>now</span></div>
</figure>"#,
        w = width,
        h = height,
        mid = height / 2.0,
        title = escape(title),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(minute: u32, cpu: f32) -> Point {
        Point {
            minute,
            cpu_percent: cpu,
            memory_used_bytes: 50,
            disk_used_bytes: 0,
            load1: 0.0,
            net_rx_rate: 0.0,
            net_tx_rate: 0.0,
        }
    }

    #[test]
    fn a_sparkline_scales_the_last_hour_and_says_what_it_shows() {
        let now = 1_000_000;
        let points = [
            point(now - 120, 90.0),
            point(now - 30, 0.0),
            point(now, 50.0),
        ];
        let svg = sparkline(&points, now);
        // The point two hours ago is left out; half-way is x 60, full CPU is y 0.
        assert!(svg.contains(r#"points="60.0,28.0 120.0,14.0""#), "{svg}");
        assert!(svg.contains(r#"<circle cx="120.0" cy="14.0""#), "{svg}");
        assert!(svg.contains("50% now"), "{svg}");
    }

    #[test]
    fn a_memory_chart_is_a_share_of_the_total() {
        let now = 1_000_000;
        let svg = chart(
            &[point(now, 0.0)],
            Series::Memory { total: 200 },
            now,
            60,
            "Memory",
        );
        assert!(svg.contains("25% now, at most 25%"), "{svg}");
        assert!(svg.contains(r#"points="600.0,120.0""#), "{svg}");
    }
}
