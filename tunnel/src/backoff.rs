//! Reconnect delays: capped exponential backoff with full jitter, so agents cut off together
//! (a hub restart) come back spread over the whole window instead of in waves.

use std::time::Duration;

use ring::rand::{SecureRandom, SystemRandom};

/// Delays between reconnect attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The window of the first retry.
    pub base: Duration,
    /// The largest window.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The window for retry number `attempt` (0 for the first): `min(cap, base * 2^attempt)`.
    pub fn window(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay before retry `attempt`: uniform over `[0, window(attempt)]` ("full jitter").
    pub fn delay(&self, attempt: u32) -> Duration {
        let mut bytes = [0u8; 8];
        // The system RNG failing is as good as no jitter; use the full window then.
        let unit = match SystemRandom::new().fill(&mut bytes) {
            Ok(()) => (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64,
            Err(_) => 1.0,
        };
        self.window(attempt).mul_f64(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_doubles_from_base_up_to_the_cap() {
        let b = Backoff::default();
        let secs: Vec<u64> = (0..9).map(|a| b.window(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.window(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn delays_stay_inside_the_window_and_spread_over_it() {
        let b = Backoff::default();
        let delays: Vec<Duration> = (0..2000).map(|_| b.delay(4)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(16)));
        // Full jitter: a good share lands in each half of the window.
        let low = delays
            .iter()
            .filter(|d| **d < Duration::from_secs(8))
            .count();
        assert!(
            (600..=1400).contains(&low),
            "{low} of 2000 delays in the lower half"
        );
    }
}
