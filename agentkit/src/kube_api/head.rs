//! Where each HTTP/1 request in what the hub sends on a stream begins and ends, and its head as
//! the API server is sent it. The agent reads only this much of a request: the body and the
//! whole response pass through as bytes.

/// A request head larger than this is refused, as Go's HTTP server (kube-apiserver's) refuses
/// one past its default `MaxHeaderBytes`.
const MAX_HEAD: usize = 1 << 20;

/// Header lines looked for at first; a head with more (a user in hundreds of groups) is parsed
/// again with room for as many as its bytes can hold.
const FEW_HEADERS: usize = 64;

/// One request's head, rewritten to go on.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Head {
    /// The head to send: as received, but with the agent's own `Authorization` and `Host`.
    pub(super) bytes: Vec<u8>,
    /// How many bytes of the input the head took.
    pub(super) len: usize,
    pub(super) body: Body,
    /// The request asks to switch protocols (`exec`, `attach`, `port-forward`): once its body
    /// is through, the stream is the upgraded connection's, both ways.
    pub(super) upgrade: bool,
}

/// What is left of a request's body, framed as its head says (RFC 9112 §6).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Body {
    /// Bytes still to come (none for a request without a body).
    Length(u64),
    Chunked(Chunks),
}

impl Body {
    /// How many bytes at the start of `input` belong to the body, and whether the body ends
    /// with them.
    pub(super) fn advance(&mut self, input: &[u8]) -> Result<(usize, bool), String> {
        match self {
            Body::Length(left) => {
                let take = usize::try_from(*left).map_or(input.len(), |l| l.min(input.len()));
                *left -= take as u64;
                Ok((take, *left == 0))
            }
            Body::Chunked(chunks) => chunks.advance(input),
        }
    }
}

/// The head at the start of `input`, if all of it has arrived, with `authorization` and `host`
/// put in place of the caller's. Errors say what is wrong with the request.
pub(super) fn parse(
    input: &[u8],
    authorization: &[u8],
    host: &[u8],
) -> Result<Option<Head>, String> {
    let mut few = [httparse::EMPTY_HEADER; FEW_HEADERS];
    let mut request = httparse::Request::new(&mut few);
    match request.parse(input) {
        Ok(status) => return finish(&request, status, input, authorization, host),
        Err(httparse::Error::TooManyHeaders) => {}
        Err(e) => return Err(format!("the request's head cannot be read: {e}")),
    }
    // Each header line takes at least four bytes ("a:\r\n").
    let mut many = vec![httparse::EMPTY_HEADER; input.len().min(MAX_HEAD) / 4 + 1];
    let mut request = httparse::Request::new(&mut many);
    match request.parse(input) {
        Ok(status) => finish(&request, status, input, authorization, host),
        Err(e) => Err(format!("the request's head cannot be read: {e}")),
    }
}

fn finish(
    request: &httparse::Request<'_, '_>,
    status: httparse::Status<usize>,
    input: &[u8],
    authorization: &[u8],
    host: &[u8],
) -> Result<Option<Head>, String> {
    let len = match status {
        httparse::Status::Complete(len) if len <= MAX_HEAD => len,
        httparse::Status::Partial if input.len() <= MAX_HEAD => return Ok(None),
        _ => {
            return Err(format!(
                "the request's head is larger than {} KiB",
                MAX_HEAD >> 10
            ));
        }
    };
    let (Some(method), Some(path), Some(version)) = (request.method, request.path, request.version)
    else {
        return Err("the request's head is incomplete".into());
    };
    let mut bytes = Vec::with_capacity(len + authorization.len() + host.len() + 32);
    bytes.extend_from_slice(method.as_bytes());
    bytes.push(b' ');
    bytes.extend_from_slice(path.as_bytes());
    bytes.extend_from_slice(if version == 0 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    let (mut length, mut chunked, mut upgrade) = (None::<u64>, None::<bool>, false);
    for header in request.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("authorization") || name.eq_ignore_ascii_case("host") {
            continue;
        }
        if name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(header.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or("the request's Content-Length is not a number")?;
            if length.is_some_and(|l| l != value) {
                return Err("the request has two different Content-Lengths".into());
            }
            length = Some(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding decides how the body ends (RFC 9112 §6.3).
            let last = header
                .value
                .rsplit(|&b| b == b',')
                .next()
                .unwrap_or_default();
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case("upgrade") {
            upgrade = true;
        }
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(header.value);
        bytes.extend_from_slice(b"\r\n");
    }
    for (name, value) in [(&b"authorization: "[..], authorization), (b"host: ", host)] {
        if !value.is_empty() {
            bytes.extend_from_slice(name);
            bytes.extend_from_slice(value);
            bytes.extend_from_slice(b"\r\n");
        }
    }
    bytes.extend_from_slice(b"\r\n");
    let body = match (chunked, length) {
        (Some(_), Some(_)) => {
            return Err("the request has both a Transfer-Encoding and a Content-Length".into());
        }
        (Some(false), None) => {
            return Err("the request's Transfer-Encoding does not end in chunked".into());
        }
        (Some(true), None) => Body::Chunked(Chunks::default()),
        (None, length) => Body::Length(length.unwrap_or(0)),
    };
    Ok(Some(Head {
        bytes,
        len,
        body,
        upgrade,
    }))
}

/// Finds the end of a chunked body in the bytes given to it, a piece at a time.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Chunks {
    state: State,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum State {
    /// In a chunk's size line: the size so far, whether a digit was seen, whether the
    /// extensions have begun.
    #[default]
    Start,
    Size {
        size: u64,
        extension: bool,
    },
    /// The line ended; a size of 0 was the last chunk.
    SizeEnd {
        size: u64,
    },
    Data(u64),
    /// The CR LF after a chunk's data: how many of its two bytes are still to come.
    DataEnd(u8),
    /// In the trailer section: bytes seen on its current line.
    Trailer(usize),
    Done,
}

impl Chunks {
    fn advance(&mut self, input: &[u8]) -> Result<(usize, bool), String> {
        let bad = |what: &str| Err(format!("the request's chunked body is malformed: {what}"));
        let mut at = 0;
        while at < input.len() {
            let byte = input[at];
            self.state = match self.state {
                State::Done => break,
                State::Data(left) => {
                    let take = (input.len() - at).min(usize::try_from(left).unwrap_or(usize::MAX));
                    at += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::DataEnd(2)
                    } else {
                        State::Data(left)
                    };
                    continue;
                }
                State::Start => match hex(byte) {
                    Some(digit) => State::Size {
                        size: digit,
                        extension: false,
                    },
                    None => return bad("a chunk's size is not hexadecimal"),
                },
                State::Size { size, extension } => match (byte, hex(byte)) {
                    (b'\r', _) => State::SizeEnd { size },
                    (b'\n', _) => self.after_size(size),
                    (_, Some(digit)) if !extension => {
                        if size >> 60 != 0 {
                            return bad("a chunk's size is too large");
                        }
                        State::Size {
                            size: size << 4 | digit,
                            extension,
                        }
                    }
                    _ => State::Size {
                        size,
                        extension: true,
                    },
                },
                State::SizeEnd { size } if byte == b'\n' => self.after_size(size),
                State::SizeEnd { .. } => return bad("a chunk's size line has a lone CR"),
                State::DataEnd(2) if byte == b'\r' => State::DataEnd(1),
                State::DataEnd(_) if byte == b'\n' => State::Start,
                State::DataEnd(_) => return bad("a chunk's data is longer than its size"),
                State::Trailer(0) if byte == b'\n' => State::Done,
                State::Trailer(_) if byte == b'\n' => State::Trailer(0),
                State::Trailer(seen) if byte == b'\r' => State::Trailer(seen),
                State::Trailer(seen) => State::Trailer(seen + 1),
            };
            at += 1;
        }
        Ok((at, matches!(self.state, State::Done)))
    }

    fn after_size(&self, size: u64) -> State {
        if size == 0 {
            State::Trailer(0)
        } else {
            State::Data(size)
        }
    }
}

fn hex(byte: u8) -> Option<u64> {
    (byte as char).to_digit(16).map(u64::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUTH: &[u8] = b"Bearer agent-token";
    const HOST: &[u8] = b"10.43.0.1:443";

    fn head(input: &str) -> Head {
        parse(input.as_bytes(), AUTH, HOST).unwrap().unwrap()
    }

    #[test]
    fn a_head_goes_on_with_the_agents_credential_and_host_in_place_of_the_callers() {
        let input = "GET /api/v1/namespaces/default/pods/web-0 HTTP/1.1\r\nHost: hub.example\r\nAuthorization: Bearer callers\r\nimpersonate-user: mia\r\nimpersonate-group: Entwickler M\u{fc}nchen\r\naccept: application/json\r\n\r\nNEXT";
        let parsed = head(input);
        assert_eq!(
            String::from_utf8(parsed.bytes).unwrap(),
            "GET /api/v1/namespaces/default/pods/web-0 HTTP/1.1\r\nimpersonate-user: mia\r\nimpersonate-group: Entwickler M\u{fc}nchen\r\naccept: application/json\r\nauthorization: Bearer agent-token\r\nhost: 10.43.0.1:443\r\n\r\n"
        );
        assert_eq!(parsed.len, input.len() - "NEXT".len());
        assert_eq!(parsed.body, Body::Length(0));
        assert!(!parsed.upgrade);
    }

    #[test]
    fn a_head_not_all_here_waits_for_more_and_a_bad_one_says_what_is_wrong() {
        let whole = "POST /api/v1/namespaces HTTP/1.1\r\ncontent-length: 12\r\n\r\n";
        for cut in 0..whole.len() {
            assert_eq!(
                parse(&whole.as_bytes()[..cut], AUTH, HOST),
                Ok(None),
                "{cut}"
            );
        }
        assert_eq!(head(whole).body, Body::Length(12));
        for (input, says) in [
            ("GET / HTTP/1.1\r\nbad header\r\n\r\n", "cannot be read"),
            (
                "GET / HTTP/1.1\r\ncontent-length: ten\r\n\r\n",
                "not a number",
            ),
            (
                "GET / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                "two different",
            ),
            (
                "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n",
                "both",
            ),
            (
                "POST / HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
                "does not end in chunked",
            ),
        ] {
            let error = parse(input.as_bytes(), AUTH, HOST).unwrap_err();
            assert!(error.contains(says), "{input:?}: {error}");
        }
        let endless = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD));
        assert!(
            parse(endless.as_bytes(), AUTH, HOST)
                .unwrap_err()
                .contains("larger than 1024 KiB")
        );
    }

    #[test]
    fn a_user_in_hundreds_of_groups_gets_every_group_through() {
        let groups: String = (0..500)
            .map(|i| format!("impersonate-group: team-{i}\r\n"))
            .collect();
        let parsed = head(&format!("GET /api HTTP/1.1\r\n{groups}\r\n"));
        let sent = String::from_utf8(parsed.bytes).unwrap();
        assert_eq!(sent.matches("impersonate-group: ").count(), 500);
        assert!(sent.contains("team-499\r\n"));
    }

    #[test]
    fn bodies_are_framed_as_their_headers_say() {
        assert_eq!(
            head("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n").body,
            Body::Chunked(Chunks::default())
        );
        assert_eq!(
            head("PUT / HTTP/1.1\r\ncontent-length: 0\r\n\r\n").body,
            Body::Length(0)
        );
        assert_eq!(
            head("PUT / HTTP/1.1\r\nContent-Length: 7\r\ncontent-length: 7\r\n\r\n").body,
            Body::Length(7)
        );
        let exec = head(
            "GET /api/v1/namespaces/default/pods/web-0/exec?command=sh HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        );
        assert!(exec.upgrade);
        assert!(
            String::from_utf8(exec.bytes)
                .unwrap()
                .contains("Connection: Upgrade\r\nUpgrade: websocket\r\n")
        );
    }

    /// Feeds `body` to a new `Chunks` in pieces of `step` bytes; where it says the body ends.
    fn end_of(body: &[u8], step: usize) -> Result<Option<usize>, String> {
        let mut chunks = Chunks::default();
        let mut at = 0;
        for piece in body.chunks(step) {
            let (used, done) = chunks.advance(piece)?;
            at += used;
            if done {
                return Ok(Some(at));
            }
            assert_eq!(used, piece.len());
        }
        Ok(None)
    }

    #[test]
    fn a_chunked_body_ends_after_its_last_chunk_and_trailers_however_it_arrives() {
        let body = b"5\r\nhello\r\n1A;name=value\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-checksum: 1\r\n\r\nGET /next";
        let end = body.len() - b"GET /next".len();
        for step in 1..=body.len() {
            assert_eq!(end_of(body, step), Ok(Some(end)), "pieces of {step}");
        }
        // Without trailers; bare LFs, as lenient servers take them.
        assert_eq!(end_of(b"3\r\nabc\r\n0\r\n\r\nX", 4), Ok(Some(13)));
        assert_eq!(end_of(b"3\nabc\r\n0\n\nX", 2), Ok(Some(10)));
        // Not ended yet.
        assert_eq!(end_of(b"3\r\nabc\r\n0\r\n", 100), Ok(None));
        for bad in [
            &b"x\r\n"[..],
            b"3\r\nabcd\r\n",
            b"3\rx",
            b"fffffffffffffffff\r\n",
        ] {
            assert!(
                end_of(bad, 100).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
