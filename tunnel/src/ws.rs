//! A WebSocket (RFC 6455) seen as a byte stream, so yamux can run over it, with the session's
//! keepalive.
//!
//! Only what the tunnel needs, written for its hot path: binary frames carry the byte stream
//! (their boundaries mean nothing), writes are gathered into one frame per flush with the mask
//! applied as bytes are buffered (a server's large writes, which carry no mask, go to the stream
//! without passing through the buffer), and reads unmask straight into yamux's buffer. Text frames
//! carry the session's messages (see `messages`) where both ends agreed to them. Other text
//! frames, reserved bits, unmasked client frames, oversized messages and malformed headers end
//! the session with the reason. Both sides ping a peer silent for an interval and a half and
//! count any inbound byte as a sign of life; a peer silent for three intervals is declared dead.

use std::{
    io::{self, IoSlice},
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use base64::Engine as _;
use bytes::{Buf, BytesMut};
use futures::{AsyncRead, AsyncWrite};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::{
    io::{AsyncRead as TokioRead, AsyncWrite as TokioWrite},
    time::{Instant, Sleep},
};

use crate::messages::{self, Messages};

mod pings;

/// Limits and timing of the WebSocket under a session.
#[derive(Debug, Clone, Copy)]
pub struct WsSettings {
    /// Interval between keepalive pings, which go only to a peer silent for one and a half of
    /// these; a peer silent for three is declared dead.
    pub ping_interval: Duration,
    /// Largest WebSocket message accepted from the peer; a larger one ends the session.
    pub max_message_size: usize,
    /// Largest frame this side sends; must not exceed the peer's `max_message_size`.
    pub batch_size: usize,
}

impl Default for WsSettings {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(10),
            max_message_size: 1024 * 1024,
            batch_size: 256 * 1024,
        }
    }
}

impl WsSettings {
    /// How long a peer may stay silent before the session is declared dead.
    pub fn dead_after(&self) -> Duration {
        self.ping_interval * 3
    }
}

/// Which end of the WebSocket this is: clients mask what they send, servers must not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Server,
}

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key`.
pub(crate) fn accept_key(key: &str) -> String {
    let mut input = key.trim().as_bytes().to_vec();
    input.extend_from_slice(GUID.as_bytes());
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// A fresh `Sec-WebSocket-Key`.
pub(crate) fn new_key() -> String {
    base64::engine::general_purpose::STANDARD.encode(random_bytes::<16>())
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // Masking keys need not be secret from the peer, only unpredictable to scripts sharing a
    // proxy; the tunnel has no such scripts. A failed RNG still yields a valid (zero) key.
    let _ = SystemRandom::new().fill(&mut bytes);
    bytes
}

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// Room kept in front of a data frame being filled, for its header once its length is known.
const HEADER_SLOT: usize = 14;
/// Where the first frame of an empty write buffer starts. rustls copies each record's plaintext
/// to 5 bytes into a fresh allocation, which with mimalloc (all Drover binaries) is page-aligned,
/// as our own large buffer is. glibc's memcpy (`rep movsb`) on AMD EPYC runs about 15 times
/// slower when the destination lies 1 to 15 bytes past the source modulo 4 KiB: from the start
/// of our buffer every record hit that (3.4 against 52 GB/s in a C loop on the 2-core VM; the
/// copy was a quarter of the tunnel's CPU). 64 bytes in, the destination is behind the source.
const LEAD: usize = 64;
/// A server's writes at least this large skip the write buffer (see `WsIo::write_through`).
const WRITE_THROUGH: usize = 16 * 1024;
/// With flushes deferred, a flush finding at least this much unsent writes it at once: bulk
/// data gains nothing from waiting, and frames of other streams would wait behind it.
const DEFER_LIMIT: usize = 64 * 1024;
/// Deferred writes made without yielding after a yield that gained no frame.
const UNYIELDING: u8 = 16;
/// Reads handed out while more keep coming before what is owed is written anyway.
const READS_PER_WRITE: u8 = 4;
/// Most bytes read at once into the header buffer.
const HEADER_READ: usize = 4096;
/// A write buffer larger than this is given back once it has been flushed with little in it.
const IDLE_WRITE_CAPACITY: usize = 16 * 1024;
/// Most bytes read ahead of the user while the socket will not take our writes (see
/// `WsIo::absorb`). A peer's unsent bytes are its socket buffers plus a batch, a few MiB.
const ABSORB_LIMIT: usize = 8 * 1024 * 1024;

fn protocol_error(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("WebSocket: {message}"))
}

/// The masking key as seen `offset` bytes into a payload, repeated to eight bytes.
fn wide_key(key: [u8; 4], offset: usize) -> ([u8; 4], u64) {
    let key = u32::from_be_bytes(key)
        .rotate_left(8 * (offset % 4) as u32)
        .to_be_bytes();
    let wide = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    (key, wide)
}

/// XORs `data` with the masking key, `offset` bytes into the masked payload.
fn apply_mask(data: &mut [u8], key: [u8; 4], offset: usize) {
    let (key, wide) = wide_key(key, offset);
    let mut chunks = data.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(word) ^ wide).to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
}

/// Appends `src` to `dst` masked, in one pass (the copy and the mask cost one read and one
/// write of each byte, not two).
fn extend_masked(dst: &mut Vec<u8>, src: &[u8], key: [u8; 4], offset: usize) {
    let (key, wide) = wide_key(key, offset);
    let from = dst.len();
    dst.resize(from + src.len(), 0);
    let out = &mut dst[from..];
    let mut outs = out.chunks_exact_mut(8);
    let mut ins = src.chunks_exact(8);
    for (o, i) in (&mut outs).zip(&mut ins) {
        let mut word = [0u8; 8];
        word.copy_from_slice(i);
        o.copy_from_slice(&(u64::from_ne_bytes(word) ^ wide).to_ne_bytes());
    }
    for (n, (o, i)) in outs
        .into_remainder()
        .iter_mut()
        .zip(ins.remainder())
        .enumerate()
    {
        *o = i ^ key[n % 4];
    }
}

/// A frame header as read off the wire.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    fin: bool,
    opcode: u8,
    mask: Option<[u8; 4]>,
    len: u64,
}

/// Parses a header from the start of `buf`: `Ok(None)` if more bytes are needed.
fn parse_header(buf: &[u8]) -> io::Result<Option<(Header, usize)>> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let (b0, b1) = (buf[0], buf[1]);
    if b0 & 0x70 != 0 {
        return Err(protocol_error(
            "reserved bits set, but no extension was negotiated".into(),
        ));
    }
    let mut at = 2;
    let len = match b1 & 0x7f {
        126 => {
            let Some(bytes) = buf.get(2..4) else {
                return Ok(None);
            };
            at = 4;
            u64::from(u16::from_be_bytes([bytes[0], bytes[1]]))
        }
        127 => {
            let Some(bytes) = buf.get(2..10) else {
                return Ok(None);
            };
            at = 10;
            let mut b = [0u8; 8];
            b.copy_from_slice(bytes);
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    let mask = if b1 & 0x80 != 0 {
        let Some(bytes) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        at += 4;
        Some([bytes[0], bytes[1], bytes[2], bytes[3]])
    } else {
        None
    };
    Ok(Some((
        Header {
            fin: b0 & 0x80 != 0,
            opcode: b0 & 0x0f,
            mask,
            len,
        },
        at,
    )))
}

/// Encodes a header for a frame whose payload follows; returns its length in `out`.
fn encode_header(
    out: &mut [u8; HEADER_SLOT],
    opcode: u8,
    len: usize,
    mask: Option<[u8; 4]>,
) -> usize {
    out[0] = 0x80 | opcode;
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    let mut at = if len < 126 {
        out[1] = mask_bit | len as u8;
        2
    } else if let Ok(short) = u16::try_from(len) {
        out[1] = mask_bit | 126;
        out[2..4].copy_from_slice(&short.to_be_bytes());
        4
    } else {
        out[1] = mask_bit | 127;
        out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    };
    if let Some(key) = mask {
        out[at..at + 4].copy_from_slice(&key);
        at += 4;
    }
    at
}

/// The byte-stream view of a WebSocket, for yamux (futures-io traits), over any tokio stream
/// that has completed the HTTP upgrade.
pub(crate) struct WsIo<T> {
    io: T,
    role: Role,
    settings: WsSettings,
    reader: Reader,
    writer: Writer,
    keepalive: Keepalive,
    /// Masking keys not yet used (client side).
    masks: Vec<u8>,
    /// Flushes wait for the next read (see `WsIo::deferring_flushes`); `None` if they do not.
    deferral: Option<Deferral>,
    /// Messages beside the byte stream, in text frames (see `messages`); `None`: a text frame
    /// ends the session.
    messages: Option<Messages>,
    /// Reads handed to yamux since what is owed was last written (see `poll_read`).
    reads_unpaid: u8,
    /// Follows yamux's frames to drop its round-trip pings (see `pings`); `None`: sent.
    pings: Option<pings::Pings>,
}

/// Whether a `WsIo` owes a flush, and whether waiting for more frames has been paying off.
#[derive(Debug, Default)]
struct Deferral {
    /// Buffered bytes wait for a flush that was asked for.
    owed: bool,
    /// The length of the write buffer when the task yielded to let other frames join.
    len_at_yield: Option<usize>,
    /// Writes still to be made without yielding first, after a yield that gained nothing.
    unyielding: u8,
}

#[derive(Default)]
struct Reader {
    buf: BytesMut,
    /// Payload bytes of the current data frame still to be handed out.
    payload_left: u64,
    mask: Option<[u8; 4]>,
    mask_offset: usize,
    /// A fragmented message has started and its final frame has not arrived.
    in_message: bool,
    message_len: u64,
    /// The peer's Close arrived, or the connection ended.
    done: bool,
}

#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already handed to the stream.
    written: usize,
    /// The data frame being filled: where its header slot starts, and its masking key.
    open: Option<(usize, Option<[u8; 4]>)>,
    /// A Close frame has been queued; nothing may follow it.
    closed: bool,
}

impl<T> std::fmt::Debug for WsIo<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsIo")
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl<T: TokioRead + TokioWrite + Unpin> WsIo<T> {
    pub(crate) fn new(io: T, role: Role, settings: WsSettings) -> Self {
        Self {
            io,
            role,
            reader: Reader::default(),
            writer: Writer::default(),
            keepalive: Keepalive::new(settings.ping_interval, settings.dead_after()),
            settings,
            masks: Vec::new(),
            deferral: None,
            messages: None,
            reads_unpaid: 0,
            pings: None,
        }
    }

    /// Takes the peer's messages and sends ours (see `messages`).
    pub(crate) fn with_messages(mut self, messages: Messages) -> Self {
        self.messages = Some(messages);
        self
    }

    /// Makes a flush of a few small frames only mark them as owed; the next read writes
    /// them. For yamux, which flushes after every frame it sends, then sends whatever
    /// frame another stream has ready, and reads the socket only once none is left: writing
    /// at each flush put each small frame in a TLS record and a system call of its own (two
    /// per proxied request under load, and on loopback a write also runs the receiver's TCP
    /// stack). Deferred, the frames leave in one write at yamux's next read. Under load that
    /// read first yields once, so that other tasks can hand yamux their frames too (replies of
    /// many streams then share a write); when a yield gains no frame (one request at a time),
    /// the next `UNYIELDING` writes are made without one, as a yield costs the waiting
    /// request a trip through the scheduler. Only for a caller that, like yamux, always reads
    /// before it waits.
    pub(crate) fn deferring_flushes(mut self) -> Self {
        self.deferral = Some(Deferral::default());
        self
    }

    /// Drops the round-trip pings yamux starts (see `pings`): for a session whose windows do
    /// not grow, which is all they size.
    pub(crate) fn without_yamux_pings(mut self) -> Self {
        self.pings = Some(pings::Pings::default());
        self
    }

    /// Carries out a deferred flush (or first yields, see `deferring_flushes`). What the
    /// stream does not take now stays buffered: the stream's readiness wakes the task, and
    /// yamux, which asks for a flush every time it is polled, owes it again.
    fn pay_flush(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let buffered = self.writer.buf.len();
        let unsent = buffered - self.writer.written;
        let Some(deferral) = &mut self.deferral else {
            return Ok(());
        };
        if !deferral.owed || unsent == 0 {
            // A control frame may have taken the bytes along.
            deferral.owed = false;
            deferral.len_at_yield = None;
            return Ok(());
        }
        match deferral.len_at_yield.take() {
            None if deferral.unyielding == 0 => {
                deferral.len_at_yield = Some(buffered);
                cx.waker().wake_by_ref();
                return Ok(());
            }
            None => deferral.unyielding -= 1,
            Some(len) if buffered <= len => deferral.unyielding = UNYIELDING,
            Some(_) => {}
        }
        deferral.owed = false;
        self.seal();
        if self.poll_drain(cx)?.is_ready() {
            let _ = Pin::new(&mut self.io).poll_flush(cx)?;
        }
        Ok(())
    }

    fn new_mask(&mut self) -> Option<[u8; 4]> {
        if self.role != Role::Client {
            return None;
        }
        // Keys come from the system's RNG 256 at a time: one system call per frame was a
        // measurable share of a small proxied request's cost.
        if self.masks.len() < 4 {
            self.masks = random_bytes::<1024>().to_vec();
        }
        let mut key = [0u8; 4];
        key.copy_from_slice(&self.masks[self.masks.len() - 4..]);
        self.masks.truncate(self.masks.len() - 4);
        Some(key)
    }

    /// Closes the data frame being filled, writing its header in front of its payload.
    fn seal(&mut self) {
        let Some((start, key)) = self.writer.open.take() else {
            return;
        };
        let w = &mut self.writer;
        let payload = w.buf.len() - start - HEADER_SLOT;
        if payload == 0 {
            w.buf.truncate(start);
            return;
        }
        let mut header = [0u8; HEADER_SLOT];
        let len = encode_header(&mut header, OP_BINARY, payload, key);
        let at = start + HEADER_SLOT - len;
        w.buf[at..start + HEADER_SLOT].copy_from_slice(&header[..len]);
        if w.written == start {
            // Nothing unwritten in front: skip the unused part of the slot.
            w.written = at;
        } else {
            // Earlier bytes still wait for the socket: close the gap instead.
            w.buf.copy_within(at.., start);
            w.buf.truncate(w.buf.len() - (at - start));
        }
    }

    /// Queues a complete control frame after whatever is buffered.
    fn queue_control(&mut self, opcode: u8, payload: &[u8]) {
        if self.writer.closed {
            return;
        }
        self.seal();
        let key = self.new_mask();
        let mut header = [0u8; HEADER_SLOT];
        let len = encode_header(&mut header, opcode, payload.len(), key);
        let w = &mut self.writer;
        if w.buf.is_empty() {
            w.written = 0;
        }
        w.buf.extend_from_slice(&header[..len]);
        let from = w.buf.len();
        w.buf.extend_from_slice(payload);
        if let Some(key) = key {
            apply_mask(&mut w.buf[from..], key, 0);
        }
        if opcode == OP_CLOSE {
            w.closed = true;
        }
    }

    /// Takes what it can of `data` into the write buffer (or, for a server's large writes,
    /// straight to the stream).
    fn take(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let batch = self.settings.batch_size;
        let filled = self
            .writer
            .open
            .map_or(0, |(start, _)| self.writer.buf.len() - start - HEADER_SLOT);
        if filled > 0 && filled + data.len() > batch {
            self.seal();
        }
        // Hold no more than one batch unwritten: past that, wait for the socket.
        if self.writer.buf.len() - self.writer.written >= batch && self.poll_drain(cx)?.is_pending()
        {
            self.absorb(cx)?;
            return Poll::Pending;
        }
        if self.role == Role::Server && data.len() >= WRITE_THROUGH && self.io.is_write_vectored() {
            return Poll::Ready(self.write_through(cx, data));
        }
        if self.writer.open.is_none() {
            let key = self.new_mask();
            let w = &mut self.writer;
            if w.buf.is_empty() {
                // Unused room in front (see `LEAD`), counted as written.
                w.buf.resize(LEAD, 0);
                w.written = LEAD;
            }
            w.open = Some((w.buf.len(), key));
            w.buf.resize(w.buf.len() + HEADER_SLOT, 0);
        }
        let Some((start, key)) = self.writer.open else {
            unreachable!("a frame was opened above")
        };
        let w = &mut self.writer;
        let offset = w.buf.len() - start - HEADER_SLOT;
        let n = data.len().min(batch - offset);
        match key {
            Some(key) => extend_masked(&mut w.buf, &data[..n], key, offset),
            None => w.buf.extend_from_slice(&data[..n]),
        }
        Poll::Ready(Ok(n))
    }

    /// A server's large write as a frame of its own, without copying it into the buffer: its
    /// header joins what is buffered, and both go to the stream in vectored writes (rustls
    /// copies them into its records, as it would the buffer). What the stream does not take
    /// now is buffered after all, so the whole write is accepted and the byte stream stays in
    /// order.
    fn write_through(&mut self, cx: &mut Context<'_>, data: &[u8]) -> io::Result<usize> {
        self.seal();
        let n = data.len().min(self.settings.batch_size);
        let mut header = [0u8; HEADER_SLOT];
        let len = encode_header(&mut header, OP_BINARY, n, None);
        let w = &mut self.writer;
        if w.buf.is_empty() {
            w.written = 0;
        }
        w.buf.extend_from_slice(&header[..len]);
        let mut taken = 0;
        while taken < n {
            let queued = &w.buf[w.written..];
            let parts = [IoSlice::new(queued), IoSlice::new(&data[taken..n])];
            let sent = match Pin::new(&mut self.io).poll_write_vectored(cx, &parts) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(sent)) => sent,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => break,
            };
            crate::metrics::BYTES_SENT.fetch_add(sent as u64, std::sync::atomic::Ordering::Relaxed);
            let from_buf = sent.min(queued.len());
            w.written += from_buf;
            taken += sent - from_buf;
        }
        w.buf.extend_from_slice(&data[taken..n]);
        if w.written == w.buf.len() {
            w.buf.clear();
            w.written = 0;
        }
        Ok(n)
    }

    /// Writes buffered, sealed bytes to the stream.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let end = self
            .writer
            .open
            .map_or(self.writer.buf.len(), |(start, _)| start);
        while self.writer.written < end {
            let n = ready!(
                Pin::new(&mut self.io).poll_write(cx, &self.writer.buf[self.writer.written..end])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            crate::metrics::BYTES_SENT.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            self.writer.written += n;
        }
        if self.writer.open.is_none() {
            let w = &mut self.writer;
            let used = w.buf.len();
            w.buf.clear();
            w.written = 0;
            if used < IDLE_WRITE_CAPACITY && w.buf.capacity() > IDLE_WRITE_CAPACITY {
                w.buf.shrink_to(IDLE_WRITE_CAPACITY);
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Checks liveness, queues a ping when one is due, and pushes queued control frames out.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        self.queue_due(cx)?;
        self.push_queued(cx)
    }

    /// Checks liveness; queues a ping when one is due and the messages waiting to be sent.
    fn queue_due(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.keepalive.poll(cx)? {
            self.queue_control(OP_PING, b"");
        }
        if let Some(messages) = &self.messages {
            for message in messages.take_outgoing(cx).map_err(protocol_error)? {
                self.queue_control(OP_TEXT, &messages::encode(&message));
            }
        }
        Ok(())
    }

    /// Best effort: writes sealed bytes (pings, pongs, a close) now; if the socket is full they
    /// leave with the next flush, and the socket's readiness wakes this task for it.
    fn push_queued(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.writer.written < self.writer.buf.len() && self.writer.open.is_none() {
            if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
                return Err(e);
            }
            let _ = Pin::new(&mut self.io).poll_flush(cx)?;
        }
        Ok(())
    }

    /// Called when the socket will not take our bytes: reads what the peer has sent into the
    /// read buffer, so that the peer's own writes keep moving even while our user is not
    /// reading. yamux stops reading while a reply it owes (a pong) cannot be written; two peers
    /// that both do so with full sockets would otherwise wait on each other for ever. What is
    /// read here is handed out by `poll_read` first; the task is woken so it gets there.
    fn absorb(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let mut got = false;
        while !self.reader.done && self.reader.buf.len() < ABSORB_LIMIT {
            match self.poll_fill(cx) {
                Poll::Ready(Ok(true)) => got = true,
                // End of stream: `poll_read` reads it again and reports it.
                Poll::Ready(Ok(false)) | Poll::Pending => break,
                Poll::Ready(Err(e)) => return Err(e),
            }
        }
        if got {
            cx.waker().wake_by_ref();
        }
        Ok(())
    }

    /// Reads more bytes into the read buffer, for frame headers and control frames; payloads
    /// are read past it. `Ok(false)` at end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        let buf = &mut self.reader.buf;
        let had = buf.len();
        // Small reads: what follows a header is mostly payload, which should not pass through
        // this buffer. Zeroing this much is cheaper than one copy of a payload.
        buf.resize(had + HEADER_READ, 0);
        let mut read = tokio::io::ReadBuf::new(&mut buf[had..]);
        let polled = Pin::new(&mut self.io).poll_read(cx, &mut read);
        let n = read.filled().len();
        buf.truncate(had + n);
        match polled {
            Poll::Pending => {
                if buf.is_empty() {
                    // Idle: give the buffer back.
                    *buf = BytesMut::new();
                }
                Poll::Pending
            }
            Poll::Ready(Ok(())) if n == 0 => Poll::Ready(Ok(false)),
            Poll::Ready(Ok(())) => {
                crate::metrics::BYTES_RECEIVED
                    .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                self.keepalive.heard_from_peer();
                Poll::Ready(Ok(true))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }

    /// Handles the next frame header in the buffer; `Ok(false)` if more bytes are needed.
    fn next_frame(&mut self) -> io::Result<bool> {
        let Some((header, header_len)) = parse_header(&self.reader.buf)? else {
            return Ok(false);
        };
        match (self.role, header.mask) {
            (Role::Server, None) => {
                return Err(protocol_error("client frame is not masked".into()));
            }
            (Role::Client, Some(_)) => return Err(protocol_error("server frame is masked".into())),
            _ => {}
        }
        let max = self.settings.max_message_size as u64;
        match header.opcode {
            OP_BINARY | OP_CONTINUATION => {
                let starts = header.opcode == OP_BINARY;
                if starts == self.reader.in_message {
                    return Err(protocol_error(if starts {
                        "a new message started inside a fragmented one".into()
                    } else {
                        "continuation frame outside a message".into()
                    }));
                }
                let message_len = if starts { 0 } else { self.reader.message_len } + header.len;
                if message_len > max {
                    return Err(protocol_error(format!(
                        "peer sent a {message_len}-byte message; the limit is {max}"
                    )));
                }
                let r = &mut self.reader;
                r.message_len = message_len;
                r.in_message = !header.fin;
                r.payload_left = header.len;
                r.mask = header.mask;
                r.mask_offset = 0;
                r.buf.advance(header_len);
                Ok(true)
            }
            OP_CLOSE | OP_PING | OP_PONG => {
                if !header.fin || header.len > 125 {
                    return Err(protocol_error(
                        "control frame fragmented or over 125 bytes".into(),
                    ));
                }
                let total = header_len + header.len as usize;
                if self.reader.buf.len() < total {
                    return Ok(false);
                }
                let mut payload = self.reader.buf[header_len..total].to_vec();
                if let Some(key) = header.mask {
                    apply_mask(&mut payload, key, 0);
                }
                self.reader.buf.advance(total);
                match header.opcode {
                    OP_PING => self.queue_control(OP_PONG, &payload),
                    OP_CLOSE => {
                        // Echo the status code, as RFC 6455 asks, then report end of stream.
                        let code = payload.get(..2).map(<[u8]>::to_vec).unwrap_or_default();
                        self.queue_control(OP_CLOSE, &code);
                        self.reader.done = true;
                    }
                    _ => {}
                }
                Ok(true)
            }
            OP_TEXT => {
                let Some(inbox) = &self.messages else {
                    return Err(protocol_error(
                        "text frame; this session carries binary frames only".into(),
                    ));
                };
                if !header.fin || self.reader.in_message {
                    return Err(protocol_error(
                        "a message fragmented or inside a fragmented one".into(),
                    ));
                }
                if header.len > max {
                    return Err(protocol_error(format!(
                        "peer sent a {}-byte message; the limit is {max}",
                        header.len
                    )));
                }
                let total = header_len + header.len as usize;
                if self.reader.buf.len() < total {
                    return Ok(false);
                }
                let payload = &mut self.reader.buf[header_len..total];
                if let Some(key) = header.mask {
                    apply_mask(payload, key, 0);
                }
                let reply = inbox.received(payload).map_err(protocol_error)?;
                self.reader.buf.advance(total);
                if let Some(reply) = reply {
                    self.queue_control(OP_TEXT, &messages::encode(&reply));
                }
                Ok(true)
            }
            other => Err(protocol_error(format!("unknown opcode {other:#x}"))),
        }
    }
}

impl<T: TokioRead + TokioWrite + Unpin> AsyncRead for WsIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.queue_due(cx)?;
        let read = this.read_frames(cx, out);
        if matches!(read, Poll::Ready(Err(_))) {
            return read;
        }
        // What this side owes the peer leaves in one write once yamux has read all there is
        // (it reads until it would wait): a flush it asked for (its frames, a pong to the
        // frames just read, its own ping), pongs and answers to what was just read, a ping,
        // messages. Each in a write of its own had been a TLS record and a system call each
        // (two to three per heartbeat on the hub). While reads keep coming (bulk data), every
        // few reads, so that window updates keep the sender going. After the peer's Close,
        // its socket may already be gone: the reply is a courtesy.
        if matches!(read, Poll::Ready(Ok(n)) if n > 0) && this.reads_unpaid < READS_PER_WRITE {
            this.reads_unpaid += 1;
            return read;
        }
        this.reads_unpaid = 0;
        // Before waiting, the keepalive's timer moves past what was just heard (and what a
        // handler sent meanwhile goes along).
        if read.is_pending() {
            this.queue_due(cx)?;
        }
        this.pay_flush(cx)?;
        if let Err(e) = this.push_queued(cx)
            && !this.reader.done
        {
            return Poll::Ready(Err(e));
        }
        read
    }
}

impl<T: TokioRead + TokioWrite + Unpin> WsIo<T> {
    /// Reads frames until yamux's bytes or the end of the stream; control frames and messages
    /// are handled on the way, their answers queued.
    fn read_frames(&mut self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        let this = self;
        loop {
            if this.reader.done {
                return Poll::Ready(Ok(0));
            }
            if this.reader.payload_left > 0 {
                let want = out
                    .len()
                    .min(usize::try_from(this.reader.payload_left).unwrap_or(usize::MAX));
                let n = if this.reader.buf.is_empty() {
                    // Payload goes straight from TLS into yamux's buffer: no copy of ours.
                    let mut read = tokio::io::ReadBuf::new(&mut out[..want]);
                    ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
                    let n = read.filled().len();
                    if n == 0 {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the connection ended inside a WebSocket frame",
                        )));
                    }
                    crate::metrics::BYTES_RECEIVED
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    this.keepalive.heard_from_peer();
                    n
                } else {
                    let n = want.min(this.reader.buf.len());
                    out[..n].copy_from_slice(&this.reader.buf[..n]);
                    this.reader.buf.advance(n);
                    n
                };
                let r = &mut this.reader;
                if let Some(key) = r.mask {
                    apply_mask(&mut out[..n], key, r.mask_offset);
                    r.mask_offset += n;
                }
                r.payload_left -= n as u64;
                return Poll::Ready(Ok(n));
            }
            if this.next_frame()? {
                continue;
            }
            if !ready!(this.poll_fill(cx))? {
                this.reader.done = true;
                if !this.reader.buf.is_empty() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection ended inside a WebSocket frame header",
                    )));
                }
            }
        }
    }
}

impl<T: TokioRead + TokioWrite + Unpin> AsyncWrite for WsIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.poll_keepalive(cx)?;
        if this.writer.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if let Some(pings) = &this.pings
            && pings.is_ping(data)
        {
            return Poll::Ready(Ok(data.len()));
        }
        let n = ready!(this.take(cx, data))?;
        if let Some(pings) = &mut this.pings {
            pings.wrote(data.get(..n).unwrap_or_default());
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.poll_keepalive(cx)?;
        let unsent = this.writer.buf.len() - this.writer.written;
        if let Some(deferral) = &mut this.deferral {
            if unsent > 0 && unsent < DEFER_LIMIT {
                // Not sealed: frames flushed together share one WebSocket frame too.
                deferral.owed = true;
                return Poll::Ready(Ok(()));
            }
            // Written now: bulk data, or nothing of ours (the stream below may hold some).
            deferral.owed = false;
            deferral.len_at_yield = None;
        }
        this.seal();
        if this.poll_drain(cx)?.is_pending() {
            this.absorb(cx)?;
            return Poll::Pending;
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.writer.closed {
            this.queue_control(OP_CLOSE, &1000u16.to_be_bytes());
        }
        this.seal();
        ready!(this.poll_drain(cx))?;
        ready!(Pin::new(&mut this.io).poll_flush(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// When to ping and when to give up on a silent peer.
struct Keepalive {
    interval: Duration,
    dead_after: Duration,
    last_heard: Instant,
    next_ping: Instant,
    timer: Pin<Box<Sleep>>,
}

impl Keepalive {
    fn new(interval: Duration, dead_after: Duration) -> Self {
        let now = Instant::now();
        Self {
            interval,
            dead_after,
            last_heard: now,
            next_ping: now + interval,
            timer: Box::pin(tokio::time::sleep_until(now + interval)),
        }
    }

    fn heard_from_peer(&mut self) {
        // Only a timestamp: the timer is re-armed lazily in `poll`, not on every read.
        self.last_heard = Instant::now();
    }

    /// Fails once the peer has been silent for `dead_after`; returns true when a ping is due;
    /// leaves the timer armed for the next of the two moments.
    fn poll(&mut self, cx: &mut Context<'_>) -> io::Result<bool> {
        let mut ping = false;
        loop {
            let now = Instant::now();
            let deadline = self.last_heard + self.dead_after;
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "keepalive: nothing heard from the peer for {:?} (pings every {:?})",
                        now - self.last_heard,
                        self.interval
                    ),
                ));
            }
            // Only a quiet peer is pinged: anything heard from it (beats, their answers)
            // proves the path as well, and a fleet's pings are otherwise most of an idle hub's
            // work. Quiet means silent for half an interval more than one: agents beat once an
            // interval, and a beat a little late is no reason to ping. Silence is still found
            // at `dead_after`.
            let quiet_since = self.last_heard + self.interval + self.interval / 2;
            let due = self.next_ping.max(quiet_since);
            if now >= due {
                ping = true;
                self.next_ping = now + self.interval;
                continue;
            }
            // The timer follows what is heard only once it is within an interval of firing:
            // re-arming it on every read costs a bulk stream, and a timer that fires while
            // the peer is not quiet wakes the session for nothing.
            let wake_at = due.min(deadline);
            let armed = self.timer.deadline();
            if armed > wake_at || (armed != wake_at && armed <= now + self.interval) {
                self.timer.as_mut().reset(wake_at);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Ok(ping);
            }
        }
    }
}

#[cfg(test)]
mod tests;
