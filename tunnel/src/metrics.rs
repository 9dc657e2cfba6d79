//! Counters for the process's tunnel traffic, read by whoever exports metrics (the hub's
//! `/metrics`). Process-wide and lock-free: an atomic add per read or write.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

pub(crate) static STREAMS_OPENED: AtomicU64 = AtomicU64::new(0);
pub(crate) static STREAMS_OPEN: AtomicI64 = AtomicI64::new(0);
pub(crate) static BYTES_SENT: AtomicU64 = AtomicU64::new(0);
pub(crate) static BYTES_RECEIVED: AtomicU64 = AtomicU64::new(0);

/// The counters now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelCounters {
    /// Streams opened by either side since the process started.
    pub streams_opened: u64,
    /// Streams open now.
    pub streams_open: u64,
    /// Bytes written to and read from tunnel connections (WebSocket payload and framing).
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

pub fn counters() -> TunnelCounters {
    TunnelCounters {
        streams_opened: STREAMS_OPENED.load(Ordering::Relaxed),
        streams_open: STREAMS_OPEN.load(Ordering::Relaxed).max(0) as u64,
        bytes_sent: BYTES_SENT.load(Ordering::Relaxed),
        bytes_received: BYTES_RECEIVED.load(Ordering::Relaxed),
    }
}
