//! Reading a WebSocket byte stream as it passes, one direction at a time (RFC 6455 §5): the
//! hub splices an exec's bytes through unchanged and hands a copy here, which finds the
//! messages in it. Nothing here writes to the connection.

/// A message's opcode (RFC 6455 §5.2): text, binary, or a control frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    Text,
    Binary,
    Close,
    Other(u8),
}

/// One direction's bytes, read frame by frame into whole messages.
#[derive(Debug, Default)]
pub struct Reader {
    buffer: Vec<u8>,
    /// The data message being reassembled from its fragments, and its opcode.
    partial: Option<(Opcode, Vec<u8>)>,
    /// Set once the stream is not WebSocket as this reader knows it: nothing more is read.
    lost: bool,
}

/// The largest frame followed: an exec's frames are a terminal's writes, far smaller; a bigger
/// one means the stream is not what it seemed, and is not buffered.
const MAX_FRAME: u64 = 16 * 1024 * 1024;

impl Reader {
    /// Adds `bytes` and returns the messages they complete, unmasked.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<(Opcode, Vec<u8>)> {
        if self.lost {
            return Vec::new();
        }
        self.buffer.extend_from_slice(bytes);
        let mut messages = Vec::new();
        let mut at = 0;
        loop {
            let (frame, used) = match frame(&self.buffer[at..]) {
                Step::Frame(frame, used) => (frame, used),
                Step::NeedMore => break,
                Step::NotWebSocket => {
                    self.lost = true;
                    break;
                }
            };
            at += used;
            let Frame {
                fin,
                opcode,
                payload,
            } = frame;
            match (opcode, self.partial.take()) {
                // A continuation of the message begun.
                (0, Some((kind, mut data))) => {
                    data.extend_from_slice(&payload);
                    if fin {
                        messages.push((kind, data));
                    } else {
                        self.partial = Some((kind, data));
                    }
                }
                (0, None) => {}
                // Control frames come between fragments and leave the message begun alone.
                (8..=15, partial) => {
                    self.partial = partial;
                    if opcode == 8 {
                        messages.push((Opcode::Close, payload));
                    }
                }
                (_, _) => {
                    let kind = match opcode {
                        1 => Opcode::Text,
                        2 => Opcode::Binary,
                        other => Opcode::Other(other),
                    };
                    if fin {
                        messages.push((kind, payload));
                    } else {
                        self.partial = Some((kind, payload));
                    }
                }
            }
        }
        self.buffer.drain(..at.min(self.buffer.len()));
        messages
    }
}

/// What the start of a stream holds.
enum Step {
    /// A whole frame, and the bytes it takes.
    Frame(Frame, usize),
    NeedMore,
    NotWebSocket,
}

/// The frame at the start of `bytes`, if it is all there.
fn frame(bytes: &[u8]) -> Step {
    match frame_or_more(bytes) {
        Some(Ok(step)) => step,
        Some(Err(())) => Step::NotWebSocket,
        None => Step::NeedMore,
    }
}

/// `None`: the frame is not all there yet; `Err`: a length no exec sends.
fn frame_or_more(bytes: &[u8]) -> Option<Result<Step, ()>> {
    let [first, second, ..] = *bytes else {
        return None;
    };
    let masked = second & 0x80 != 0;
    let (length, mut at) = match second & 0x7f {
        126 => (
            u64::from(u16::from_be_bytes([*bytes.get(2)?, *bytes.get(3)?])),
            4,
        ),
        127 => {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(bytes.get(2..10)?);
            (u64::from_be_bytes(eight), 10)
        }
        short => (u64::from(short), 2),
    };
    if length > MAX_FRAME {
        return Some(Err(()));
    }
    let mask = if masked {
        let key: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        at += 4;
        Some(key)
    } else {
        None
    };
    let length = usize::try_from(length).ok()?;
    let mut payload = bytes.get(at..at + length)?.to_vec();
    if let Some(key) = mask {
        for (i, byte) in payload.iter_mut().enumerate() {
            *byte ^= key[i % 4];
        }
    }
    Some(Ok(Step::Frame(
        Frame {
            fin: first & 0x80 != 0,
            opcode: first & 0x0f,
            payload,
        },
        at + length,
    )))
}

struct Frame {
    fin: bool,
    opcode: u8,
    payload: Vec<u8>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A frame as a client (masked) or a server sends it.
    pub(crate) fn frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        let masked = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(masked | n as u8),
            n if n <= 0xffff => {
                out.push(masked | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(masked | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        match mask {
            Some(key) => {
                out.extend_from_slice(&key);
                out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
            }
            None => out.extend_from_slice(payload),
        }
        out
    }

    #[test]
    fn messages_are_found_however_the_bytes_arrive() {
        let big = vec![b'x'; 70_000];
        let mut stream = frame(true, 2, b"\x01hello", None);
        stream.extend(frame(true, 2, b"\x00ls\r", Some([1, 2, 3, 4])));
        // Fragmented, with a ping between the fragments.
        stream.extend(frame(false, 2, b"\x01par", None));
        stream.extend(frame(true, 9, b"", None));
        stream.extend(frame(true, 0, b"ts", None));
        stream.extend(frame(true, 2, &big, None));
        stream.extend(frame(true, 8, b"\x03\xe8", None));
        let expected = vec![
            (Opcode::Binary, b"\x01hello".to_vec()),
            (Opcode::Binary, b"\x00ls\r".to_vec()),
            (Opcode::Binary, b"\x01parts".to_vec()),
            (Opcode::Binary, big.clone()),
            (Opcode::Close, b"\x03\xe8".to_vec()),
        ];
        for chunk in [1, 3, 7, 1000, stream.len()] {
            let mut reader = Reader::default();
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                got.extend(reader.feed(piece));
            }
            assert_eq!(got, expected, "in chunks of {chunk}");
        }
    }

    #[test]
    fn a_stream_that_is_not_websocket_is_dropped_not_buffered() {
        let mut reader = Reader::default();
        // A length of 2^63: not a frame anyone sends.
        let mut bytes = vec![0x82, 0x7f];
        bytes.extend_from_slice(&(1u64 << 63).to_be_bytes());
        assert!(reader.feed(&bytes).is_empty());
        assert!(reader.feed(&frame(true, 2, b"\x01after", None)).is_empty());
        assert!(reader.buffer.len() <= 10);
    }
}
