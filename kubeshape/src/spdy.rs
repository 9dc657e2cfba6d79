//! The part of SPDY/3.1 framing Kubernetes' streams need (kubectl's port-forward, and exec and
//! attach before WebSocket): reading SYN_STREAM (with its zlib-compressed header block, one
//! compression context per direction, primed with the protocol's dictionary), data frames,
//! PING and GOAWAY; writing SYN_STREAM, SYN_REPLY, data and PING. The simulator serves
//! sessions with it and the hub reads the exec sessions it records. Flow control is not
//! enforced by kubectl's SPDY library, and not here either.

use std::sync::LazyLock;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;

/// What the server acts on; everything else (SETTINGS, RST_STREAM, WINDOW_UPDATE, HEADERS)
/// is `Other`.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream: u32,
        /// Header names (lower case, as SPDY sends them) and values.
        headers: Vec<(String, String)>,
        fin: bool,
    },
    Data {
        stream: u32,
        data: Vec<u8>,
        fin: bool,
    },
    Ping {
        id: u32,
    },
    GoAway,
    Other,
}

/// One connection's two header-compression contexts.
pub struct Session {
    inflate: Decompress,
    deflate: Compress,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("spdy::Session")
    }
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    pub fn new() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        // SPDY/3 compresses every header block against the protocol's dictionary.
        let _ = deflate.set_dictionary(&DICTIONARY);
        Session {
            inflate: Decompress::new(true),
            deflate,
        }
    }

    /// Takes the next whole frame off the front of `input`, if there is one.
    pub fn next_frame(&mut self, input: &mut Vec<u8>) -> Result<Option<Frame>, String> {
        if input.len() < 8 {
            return Ok(None);
        }
        let length =
            usize::from(input[5]) << 16 | usize::from(input[6]) << 8 | usize::from(input[7]);
        if input.len() < 8 + length {
            return Ok(None);
        }
        let frame: Vec<u8> = input.drain(..8 + length).collect();
        let flags = frame[4];
        let body = &frame[8..];
        let word =
            |at: usize| u32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        if frame[0] & 0x80 == 0 {
            return Ok(Some(Frame::Data {
                stream: u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) & 0x7fff_ffff,
                data: body.to_vec(),
                fin: flags & FLAG_FIN != 0,
            }));
        }
        let version = u16::from_be_bytes([frame[0], frame[1]]) & 0x7fff;
        if version != VERSION {
            return Err(format!("SPDY version {version}, not 3"));
        }
        Ok(Some(match u16::from_be_bytes([frame[2], frame[3]]) {
            SYN_STREAM if body.len() >= 10 => {
                let block = self.inflate(&body[10..])?;
                Frame::SynStream {
                    stream: word(0) & 0x7fff_ffff,
                    headers: header_pairs(&block)?,
                    fin: flags & FLAG_FIN != 0,
                }
            }
            PING if body.len() >= 4 => Frame::Ping { id: word(0) },
            GOAWAY => Frame::GoAway,
            _ => Frame::Other,
        }))
    }

    /// A SYN_STREAM opening `stream` with `headers` (the client's side of a session).
    pub fn syn_stream(&mut self, stream: u32, headers: &[(&str, &str)]) -> Result<Vec<u8>, String> {
        let mut block = (headers.len() as u32).to_be_bytes().to_vec();
        for (name, value) in headers {
            for part in [name, value] {
                block.extend_from_slice(&(part.len() as u32).to_be_bytes());
                block.extend_from_slice(part.as_bytes());
            }
        }
        let block = self.deflate(&block)?;
        let mut body = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
        // No associated stream; priority and slot 0.
        body.extend_from_slice(&[0; 6]);
        body.extend(block);
        Ok(control(SYN_STREAM, 0, &body))
    }

    /// A SYN_REPLY accepting `stream`, with no headers.
    pub fn syn_reply(&mut self, stream: u32) -> Result<Vec<u8>, String> {
        let block = self.deflate(&0u32.to_be_bytes())?;
        let mut body = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
        body.extend(block);
        Ok(control(SYN_REPLY, 0, &body))
    }

    fn inflate(&mut self, block: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(block.len() * 4 + 64);
        let mut at = 0;
        loop {
            let (read, wrote) = (self.inflate.total_in(), self.inflate.total_out());
            if out.capacity() - out.len() < 256 {
                out.reserve(4096);
            }
            if let Err(e) =
                self.inflate
                    .decompress_vec(&block[at..], &mut out, FlushDecompress::Sync)
            {
                if e.needs_dictionary().is_none() {
                    return Err(format!("a SPDY header block does not inflate: {e}"));
                }
                self.inflate
                    .set_dictionary(&DICTIONARY)
                    .map_err(|e| format!("the SPDY dictionary: {e}"))?;
            }
            at += (self.inflate.total_in() - read) as usize;
            let progressed = self.inflate.total_in() > read || self.inflate.total_out() > wrote;
            if at >= block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if !progressed && at >= block.len() {
                return Ok(out);
            }
        }
    }

    fn deflate(&mut self, block: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(block.len() + 64);
        let mut at = 0;
        loop {
            let read = self.deflate.total_in();
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            self.deflate
                .compress_vec(&block[at..], &mut out, FlushCompress::Sync)
                .map_err(|e| format!("a SPDY header block does not deflate: {e}"))?;
            at += (self.deflate.total_in() - read) as usize;
            if at >= block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// A data frame on `stream`.
pub fn data(stream: u32, bytes: &[u8], fin: bool) -> Vec<u8> {
    let mut frame = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
    frame.push(if fin { FLAG_FIN } else { 0 });
    frame.extend_from_slice(&length(bytes.len()));
    frame.extend_from_slice(bytes);
    frame
}

/// The answer to a PING: the same id back.
pub fn ping(id: u32) -> Vec<u8> {
    control(PING, 0, &id.to_be_bytes())
}

fn control(kind: u16, flags: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = (0x8000 | VERSION).to_be_bytes().to_vec();
    frame.extend_from_slice(&kind.to_be_bytes());
    frame.push(flags);
    frame.extend_from_slice(&length(body.len()));
    frame.extend_from_slice(body);
    frame
}

fn length(n: usize) -> [u8; 3] {
    let n = n as u32;
    [(n >> 16) as u8, (n >> 8) as u8, n as u8]
}

/// An uncompressed header block: a count, then each name and value with its length.
fn header_pairs(block: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut at = 0;
    let mut next = |len: usize| -> Result<&[u8], String> {
        let part = block
            .get(at..at + len)
            .ok_or("a SPDY header block ends early")?;
        at += len;
        Ok(part)
    };
    let count =
        |bytes: &[u8]| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let pairs = count(next(4)?);
    let mut headers = Vec::with_capacity(pairs.min(64));
    for _ in 0..pairs {
        let len = count(next(4)?);
        let name = String::from_utf8_lossy(next(len)?).into_owned();
        let len = count(next(4)?);
        // Several values of one name are joined by NUL; port-forward sends one each.
        let value = String::from_utf8_lossy(next(len)?).into_owned();
        headers.push((name, value));
    }
    Ok(headers)
}

/// SPDY/3's header-compression dictionary (section 2.6.10.1 of the protocol): these words,
/// each after its 32-bit length, then the text below as it is.
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];
const DICTIONARY_TEXT: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut bytes = Vec::with_capacity(1423);
    for word in DICTIONARY_WORDS {
        bytes.extend_from_slice(&(word.len() as u32).to_be_bytes());
        bytes.extend_from_slice(word.as_bytes());
    }
    bytes.extend_from_slice(DICTIONARY_TEXT.as_bytes());
    bytes
});

/// The channels of a remote command (exec, attach), numbered as WebSocket sessions number
/// them in each message's first byte.
pub mod channel {
    pub const STDIN: u8 = 0;
    pub const STDOUT: u8 = 1;
    pub const STDERR: u8 = 2;
    pub const ERROR: u8 = 3;
    pub const RESIZE: u8 = 4;
}

/// The channel an exec or attach stream carries, by its `streamType` header.
pub fn exec_channel(headers: &[(String, String)]) -> Option<u8> {
    let kind = headers
        .iter()
        .find(|(name, _)| name == "streamtype")
        .map(|(_, v)| v.as_str())?;
    Some(match kind {
        "stdin" => channel::STDIN,
        "stdout" => channel::STDOUT,
        "stderr" => channel::STDERR,
        "error" => channel::ERROR,
        "resize" => channel::RESIZE,
        _ => return None,
    })
}

/// A stream's `data` as the messages a WebSocket session would carry (the channel byte
/// first): a resize stream's one per JSON line (client-go writes each terminal size as a
/// line), any other's as one.
pub fn channel_messages(channel: u8, data: &[u8]) -> Vec<Vec<u8>> {
    if channel == channel::RESIZE {
        data.split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| [&[channel], line].concat())
            .collect()
    } else if data.is_empty() {
        Vec::new()
    } else {
        vec![[&[channel], data].concat()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_streams_map_to_the_websocket_channels() {
        let headers = |kind: &str| vec![("streamtype".to_owned(), kind.to_owned())];
        for (kind, number) in [
            ("stdin", 0),
            ("stdout", 1),
            ("stderr", 2),
            ("error", 3),
            ("resize", 4),
        ] {
            assert_eq!(exec_channel(&headers(kind)), Some(number), "{kind}");
        }
        assert_eq!(exec_channel(&headers("data")), None);
        assert_eq!(exec_channel(&[]), None);
        assert_eq!(
            channel_messages(
                4,
                b"{\"Width\":80,\"Height\":24}\n{\"Width\":100,\"Height\":30}\n"
            ),
            [
                b"\x04{\"Width\":80,\"Height\":24}".to_vec(),
                b"\x04{\"Width\":100,\"Height\":30}".to_vec()
            ]
        );
        assert_eq!(channel_messages(1, b"a\nb\n"), [b"\x01a\nb\n".to_vec()]);
        assert!(channel_messages(0, b"").is_empty());
    }

    #[test]
    fn the_dictionary_is_the_protocols() {
        // 1,423 bytes, and the Adler-32 zlib names it by in a stream's header.
        assert_eq!(DICTIONARY.len(), 1423);
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in DICTIONARY.iter() {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!(format!("{:08x}", (b << 16) | a), "e3c6a7c2");
    }

    #[test]
    fn a_reply_s_headers_inflate_on_the_other_side() {
        let mut server = Session::new();
        let reply = server.syn_reply(3).unwrap();
        assert_eq!(&reply[..4], &[0x80, 0x03, 0x00, 0x02]);
        // What a client (one inflate context for the connection) reads back: no headers.
        let mut client = Session::new();
        let block = client.inflate(&reply[12..]).unwrap();
        assert_eq!(header_pairs(&block).unwrap(), vec![]);
        // A second block continues the same stream.
        let again = server.syn_reply(5).unwrap();
        assert_eq!(
            header_pairs(&client.inflate(&again[12..]).unwrap()).unwrap(),
            vec![]
        );
    }

    #[test]
    fn a_stream_s_headers_are_read_back() {
        let (mut client, mut server) = (Session::new(), Session::new());
        let mut input = client
            .syn_stream(1, &[("streamtype", "error"), ("port", "80")])
            .unwrap();
        input.extend(client.syn_stream(3, &[("streamtype", "stdout")]).unwrap());
        assert_eq!(
            server.next_frame(&mut input).unwrap(),
            Some(Frame::SynStream {
                stream: 1,
                headers: vec![
                    ("streamtype".into(), "error".into()),
                    ("port".into(), "80".into())
                ],
                fin: false
            })
        );
        assert!(matches!(
            server.next_frame(&mut input).unwrap(),
            Some(Frame::SynStream { stream: 3, headers, .. }) if headers == [("streamtype".to_owned(), "stdout".to_owned())]
        ));
    }

    #[test]
    fn frames_are_taken_whole() {
        let mut session = Session::new();
        let mut input = data(5, b"hello", true);
        input.extend(ping(7));
        let partial = input.split_off(input.len() - 3);
        assert_eq!(
            session.next_frame(&mut input).unwrap(),
            Some(Frame::Data {
                stream: 5,
                data: b"hello".to_vec(),
                fin: true
            })
        );
        assert_eq!(
            session.next_frame(&mut input).unwrap(),
            None,
            "the ping is not whole yet"
        );
        input.extend(partial);
        assert_eq!(
            session.next_frame(&mut input).unwrap(),
            Some(Frame::Ping { id: 7 })
        );
        assert!(input.is_empty());
    }
}
