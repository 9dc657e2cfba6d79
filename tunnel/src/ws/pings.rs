//! yamux's round-trip pings, kept off the wire.
//!
//! yamux 0.14 sends a ping whenever its connection is polled 10 s or more after the last pong,
//! to measure the round trip by which it grows stream windows, and has no setting to stop it.
//! A session's windows grow only with `SessionSettings::window_growth`, 0 by default, so the
//! measurement sizes nothing; yet with agents beating every 10 s nearly every beat brought a
//! ping each way, and each ping and its pong a write and a read of their own on both ends: an
//! idle hub made two writes and two reads per beat against the one of each a bare WebSocket
//! server makes per ping (`bench fleet`; docs/benchmarks.md).
//!
//! So `WsIo` follows the frames yamux writes and drops each ping yamux starts: yamux then
//! waits for a pong that never comes and starts no other (it sets no deadline on one). Pings
//! from a peer that still sends them are answered as before: only a ping's start is dropped,
//! never a pong.

/// A yamux frame header's bytes: version, type, flags (2), stream (4), length (4).
const HEADER: usize = 12;
/// The type of a frame with a body of `length` bytes; no other type has a body.
const DATA: u8 = 0;
const PING: u8 = 2;
/// A ping's flags: `SYN` asks, `ACK` answers.
const SYN: u16 = 1;
const ACK: u16 = 2;

/// Where the bytes yamux writes stand between its frames.
#[derive(Debug, Default)]
pub(super) struct Pings {
    /// Bytes still to come of a data frame's body.
    body_left: usize,
    /// A header taken in parts: its bytes so far, and how many.
    header: [u8; HEADER],
    have: usize,
}

impl Pings {
    /// Whether `data`, about to be written, is a ping yamux starts. yamux writes a frame's
    /// header in a write of its own and its body after, so a ping is one write of a whole
    /// header at a frame boundary; anything else (a body that happens to hold the same bytes)
    /// is not at a boundary.
    pub(super) fn is_ping(&self, data: &[u8]) -> bool {
        let [0, PING, f0, f1, ..] = *data else {
            return false;
        };
        self.body_left == 0
            && self.have == 0
            && data.len() == HEADER
            && u16::from_be_bytes([f0, f1]) & (SYN | ACK) == SYN
    }

    /// Follows `taken`, bytes of yamux's written to the peer.
    pub(super) fn wrote(&mut self, mut taken: &[u8]) {
        while !taken.is_empty() {
            if self.body_left > 0 {
                let n = taken.len().min(self.body_left);
                self.body_left -= n;
                taken = &taken[n..];
                continue;
            }
            let n = (HEADER - self.have).min(taken.len());
            self.header[self.have..self.have + n].copy_from_slice(&taken[..n]);
            self.have += n;
            taken = &taken[n..];
            if self.have == HEADER {
                self.have = 0;
                let [_, kind, _, _, _, _, _, _, l0, l1, l2, l3] = self.header;
                if kind == DATA {
                    let length = u32::from_be_bytes([l0, l1, l2, l3]);
                    self.body_left = usize::try_from(length).unwrap_or(usize::MAX);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Headers as yamux 0.14 encodes them (version, type, flags, stream id, length; big-endian).
    const OUR_PING: [u8; 12] = [0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7];
    const A_PONG: [u8; 12] = [0, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7];
    const OPEN_STREAM_3: [u8; 12] = [0, 1, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0];
    const DATA_12_ON_3: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 12];

    #[test]
    fn a_ping_at_a_frame_boundary_is_found_and_nothing_else() {
        let mut pings = Pings::default();
        assert!(pings.is_ping(&OUR_PING));
        assert!(!pings.is_ping(&A_PONG), "a pong answers the peer's ping");
        assert!(!pings.is_ping(&OPEN_STREAM_3));
        // Not a whole write of its own: not yamux's ping.
        assert!(!pings.is_ping(&[OUR_PING.as_slice(), &[0]].concat()));
        assert!(!pings.is_ping(&OUR_PING[..11]));

        // A data frame whose 12-byte body reads like a ping is the body, not a ping.
        pings.wrote(&OPEN_STREAM_3);
        pings.wrote(&DATA_12_ON_3);
        assert!(!pings.is_ping(&OUR_PING));
        pings.wrote(&OUR_PING[..5]);
        assert!(!pings.is_ping(&OUR_PING));
        pings.wrote(&OUR_PING[5..]);
        assert!(pings.is_ping(&OUR_PING), "the body has ended");
    }

    #[test]
    fn headers_and_bodies_taken_in_any_pieces_are_followed() {
        let body = [7u8; 300];
        let mut stream = Vec::new();
        stream.extend_from_slice(&OPEN_STREAM_3);
        stream.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 1, 44]); // 300 bytes
        stream.extend_from_slice(&body);
        stream.extend_from_slice(&A_PONG);
        for piece in 1..=stream.len() {
            let mut pings = Pings::default();
            for chunk in stream.chunks(piece) {
                pings.wrote(chunk);
            }
            assert!(pings.is_ping(&OUR_PING), "pieces of {piece}");
        }
        // One byte short of the body's end: still inside it.
        let mut pings = Pings::default();
        pings.wrote(&stream[..stream.len() - A_PONG.len() - 1]);
        assert!(!pings.is_ping(&OUR_PING));
    }
}
