//! The load the scenarios put on a byte stream, the same over a tunnel stream as over a plain
//! TLS connection, so the two are measured by the same code.
//!
//! A connection starts with one byte choosing the server's behaviour:
//! `e` echo until EOF; `s` sink: read until EOF, then answer the byte count (u64, big-endian);
//! `o` source: read a u64 count, send that many bytes, close.

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const CHUNK: usize = 256 * 1024;

/// Where in its buffer a writer's bytes start: 64 bytes in, as the tunnel's WebSocket writer
/// places its frames (`LEAD` in tunnel/src/ws.rs says why: rustls's record copy is ~15 times
/// slower from the start of a page-aligned buffer on this VM). It gives the direct baseline its
/// best case, so the tunnel is compared with the fastest raw rustls, not a slowed one.
const LEAD: usize = 64;

/// Serves one connection of the bench protocol.
pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut io: S) -> std::io::Result<()> {
    match io.read_u8().await? {
        b'e' => {
            let (mut r, mut w) = tokio::io::split(io);
            tokio::io::copy(&mut r, &mut w).await?;
        }
        b's' => {
            let mut buf = vec![0u8; CHUNK];
            let mut total: u64 = 0;
            loop {
                match io.read(&mut buf).await? {
                    0 => break,
                    n => total += n as u64,
                }
            }
            io.write_u64(total).await?;
            io.shutdown().await?;
        }
        b'o' => {
            let mut left = io.read_u64().await?;
            let buf = vec![0x5au8; LEAD + CHUNK];
            while left > 0 {
                let n = left.min(CHUNK as u64) as usize;
                io.write_all(&buf[LEAD..LEAD + n]).await?;
                left -= n as u64;
            }
            io.shutdown().await?;
        }
        other => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("unknown bench mode {other:#x}"),
            ));
        }
    }
    Ok(())
}

/// Sends `bytes` to a sink; returns the time until the sink confirmed it had them all.
pub(crate) async fn upload<S: AsyncRead + AsyncWrite + Unpin>(
    mut io: S,
    bytes: u64,
) -> anyhow::Result<Duration> {
    let buf = vec![0xa5u8; LEAD + CHUNK];
    let start = Instant::now();
    io.write_u8(b's').await?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        io.write_all(&buf[LEAD..LEAD + n]).await?;
        left -= n as u64;
    }
    io.shutdown().await?;
    let confirmed = io.read_u64().await?;
    anyhow::ensure!(confirmed == bytes, "sink got {confirmed} bytes of {bytes}");
    Ok(start.elapsed())
}

/// Asks a source for `bytes`; returns the time until the last one arrived.
pub(crate) async fn download<S: AsyncRead + AsyncWrite + Unpin>(
    mut io: S,
    bytes: u64,
) -> anyhow::Result<Duration> {
    let mut buf = vec![0u8; CHUNK];
    let start = Instant::now();
    io.write_u8(b'o').await?;
    io.write_u64(bytes).await?;
    io.flush().await?;
    let mut got: u64 = 0;
    loop {
        match io.read(&mut buf).await? {
            0 => break,
            n => got += n as u64,
        }
    }
    anyhow::ensure!(got == bytes, "source sent {got} bytes of {bytes}");
    Ok(start.elapsed())
}

/// `count` round trips of `size` bytes through an echo; returns each one's duration.
pub(crate) async fn round_trips<S: AsyncRead + AsyncWrite + Unpin>(
    mut io: S,
    count: usize,
    size: usize,
) -> anyhow::Result<Vec<Duration>> {
    io.write_u8(b'e').await?;
    let out = vec![7u8; size];
    let mut back = vec![0u8; size];
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        io.write_all(&out).await?;
        io.flush().await?;
        io.read_exact(&mut back).await?;
        times.push(start.elapsed());
    }
    anyhow::ensure!(back == out, "echo returned other bytes");
    Ok(times)
}

/// The `p`-th percentile (0–100) in microseconds.
pub(crate) fn percentile_us(times: &mut [Duration], p: f64) -> f64 {
    times.sort_unstable();
    if times.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (times.len() - 1) as f64).round() as usize;
    times[rank.min(times.len() - 1)].as_secs_f64() * 1e6
}

pub(crate) fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64()
}

/// CPU time this process has used (user + system), from `/proc/self/stat`; `None` elsewhere.
pub(crate) fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // Linux reports these in USER_HZ, which is 100 on every architecture Drover builds for.
    Some(Duration::from_millis(ticks * 10))
}
