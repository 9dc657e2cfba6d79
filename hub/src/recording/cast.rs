//! An exec session's messages as an asciicast v2 recording (asciinema's format: a JSON header
//! line, then one `[seconds, code, data]` line per event): output (`o`, the container's stdout
//! and stderr), input (`i`, only when the settings say so), and the terminal's size (`r`).

use base64::Engine as _;
use serde_json::json;

use super::ws::Opcode;

/// Kubernetes' exec channels (the first byte of each message).
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const RESIZE: u8 = 4;

/// The size a terminal is taken to have until the client says.
const DEFAULT_SIZE: (u64, u64) = (80, 24);

/// A recording being made: what it has written, and what it keeps between messages.
#[derive(Debug)]
pub struct Cast {
    /// Whether what is typed is recorded.
    input: bool,
    /// The most bytes the recording may take.
    limit: u64,
    written: u64,
    pub(super) truncated: bool,
    /// `base64.channel.k8s.io` and its versions: text messages, a channel digit then base64.
    base64: bool,
    header: Option<serde_json::Value>,
    /// The start of a UTF-8 character cut by a message's end, per channel.
    carry: [Vec<u8>; 3],
}

impl Cast {
    /// A recording of a session that speaks `protocol` (the `Sec-WebSocket-Protocol` agreed),
    /// started at `timestamp` (Unix seconds), titled `title`.
    pub fn new(protocol: &str, input: bool, limit: u64, timestamp: i64, title: &str) -> Self {
        Self {
            input,
            limit,
            written: 0,
            truncated: false,
            base64: protocol.contains("base64"),
            header: Some(json!({
                "version": 2,
                "timestamp": timestamp,
                "title": title,
                "env": {"TERM": "xterm-256color"},
            })),
            carry: Default::default(),
        }
    }

    /// The recording's bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The lines (each ending in a newline) a message adds to the recording; `from_client`
    /// says which way it went, `at` is seconds since the session began.
    pub fn message(&mut self, from_client: bool, opcode: Opcode, data: &[u8], at: f64) -> String {
        if self.truncated {
            return String::new();
        }
        let decoded;
        let (channel, bytes) = match (opcode, self.base64) {
            (Opcode::Binary, false) => match data.split_first() {
                Some((channel, rest)) => (*channel, rest),
                None => return String::new(),
            },
            (Opcode::Text, true) => {
                let Some((digit, rest)) = data.split_first() else {
                    return String::new();
                };
                let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(rest) else {
                    return String::new();
                };
                decoded = bytes;
                (digit.wrapping_sub(b'0'), decoded.as_slice())
            }
            _ => return String::new(),
        };
        let event = match (from_client, channel) {
            (false, STDOUT | STDERR) => self.text(channel, bytes).map(|t| ("o", t)),
            (true, STDIN) if self.input => self.text(channel, bytes).map(|t| ("i", t)),
            (true, RESIZE) => size(bytes).map(|(w, h)| {
                // The first size the client gives is the recording's own.
                if let Some(header) = &mut self.header {
                    header["width"] = json!(w);
                    header["height"] = json!(h);
                }
                ("r", format!("{w}x{h}"))
            }),
            _ => None,
        };
        let Some((code, text)) = event else {
            return String::new();
        };
        let mut out = self.header_line();
        let line = format!("{}\n", json!([round(at), code, text]));
        if self.written + (out.len() + line.len()) as u64 > self.limit {
            self.truncated = true;
            out.push_str(&format!(
                "{}\n",
                json!([round(at), "m", format!("recording stopped: it reached its limit of {} bytes (setting session-recording-max-size)", self.limit)])
            ));
        } else {
            out.push_str(&line);
        }
        self.written += out.len() as u64;
        out
    }

    /// The header line, the first time anything is written (with the size given by then).
    fn header_line(&mut self) -> String {
        match self.header.take() {
            Some(mut header) => {
                if header.get("width").is_none() {
                    header["width"] = json!(DEFAULT_SIZE.0);
                    header["height"] = json!(DEFAULT_SIZE.1);
                }
                format!("{header}\n")
            }
            None => String::new(),
        }
    }

    /// `bytes` of `channel` as text: what completes a character cut by the last message, and
    /// up to the last whole character (the rest is kept for the next).
    fn text(&mut self, channel: u8, bytes: &[u8]) -> Option<String> {
        let carry = &mut self.carry[usize::from(channel.min(2))];
        carry.extend_from_slice(bytes);
        let whole = match std::str::from_utf8(carry) {
            Ok(_) => carry.len(),
            // A character cut at the end: keep it; anything else is shown as U+FFFD.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => carry.len(),
        };
        let text = String::from_utf8_lossy(&carry[..whole]).into_owned();
        carry.drain(..whole);
        (!text.is_empty()).then_some(text)
    }
}

/// A resize message's `{"Width": W, "Height": H}`.
fn size(bytes: &[u8]) -> Option<(u64, u64)> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Some((value["Width"].as_u64()?, value["Height"].as_u64()?))
}

/// Seconds to the microsecond, as asciinema writes them.
fn round(at: f64) -> f64 {
    (at * 1_000_000.0).round() / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<serde_json::Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_session_becomes_asciicast_v2_output_resizes_and_input_only_when_asked() {
        for input in [false, true] {
            let mut cast = Cast::new("v5.channel.k8s.io", input, 1 << 20, 1_764_000_000, "t");
            let mut out = String::new();
            out += &cast.message(
                true,
                Opcode::Binary,
                b"\x04{\"Width\":120,\"Height\":40}",
                0.01,
            );
            out += &cast.message(true, Opcode::Binary, b"\x00ls\r", 0.5);
            out += &cast.message(false, Opcode::Binary, b"\x01ls\r\nfile\r\n", 0.5100004);
            out += &cast.message(false, Opcode::Binary, b"\x02oops", 0.6);
            // The closing status (channel 3) is not terminal output.
            out += &cast.message(false, Opcode::Binary, b"\x03{\"status\":\"Success\"}", 0.7);
            let got = lines(&out);
            let header = &got[0];
            assert_eq!(
                (&header["version"], &header["width"], &header["height"]),
                (&json!(2), &json!(120), &json!(40))
            );
            let mut expected = vec![json!([0.01, "r", "120x40"])];
            if input {
                expected.push(json!([0.5, "i", "ls\r"]));
            }
            expected.push(json!([0.51, "o", "ls\r\nfile\r\n"]));
            expected.push(json!([0.6, "o", "oops"]));
            assert_eq!(got[1..], expected[..], "input {input}");
        }
    }

    #[test]
    fn a_character_cut_between_messages_is_kept_whole() {
        let mut cast = Cast::new("v4.channel.k8s.io", false, 1 << 20, 0, "t");
        let euro = "€".as_bytes();
        let first = cast.message(false, Opcode::Binary, &[&[1], &euro[..1]].concat(), 0.1);
        let second = cast.message(false, Opcode::Binary, &[&[1], &euro[1..]].concat(), 0.2);
        let got = lines(&format!("{first}{second}"));
        // The header, then one event with the whole character.
        assert_eq!(got[1..], [json!([0.2, "o", "€"])]);
    }

    #[test]
    fn base64_protocols_are_read_too() {
        let mut cast = Cast::new("base64.channel.k8s.io", true, 1 << 20, 0, "t");
        let out = cast.message(false, Opcode::Text, b"1aGk=", 0.1);
        assert_eq!(lines(&out)[1], json!([0.1, "o", "hi"]));
    }

    #[test]
    fn past_its_limit_a_recording_says_so_and_stops() {
        let mut cast = Cast::new("v5.channel.k8s.io", false, 300, 0, "t");
        let mut out = String::new();
        for i in 0..20 {
            out += &cast.message(
                false,
                Opcode::Binary,
                b"\x01twenty bytes of text",
                f64::from(i),
            );
        }
        assert!(cast.truncated);
        let got = lines(&out);
        let last = got.last().unwrap();
        assert_eq!(last[1], "m");
        assert!(last[2].as_str().unwrap().contains("limit of 300 bytes"));
        assert!(out.len() < 500, "{}", out.len());
        assert_eq!(cast.written(), out.len() as u64);
    }
}
