//! A TCP proxy in front of an etcd member (plain HTTP/2, as the tests' etcd speaks) that can
//! lose one answer: armed with a marker, it lets the first request whose body carries the
//! marker reach etcd, and when etcd answers that request (its first frame on that stream,
//! which etcd sends only once the request is applied) it closes the connection instead of
//! passing the answer on. The client is left with a write committed whose outcome it never
//! heard, which is what a cut network does to an etcd client.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};

/// What every connection of one proxy shares.
#[derive(Debug, Default)]
struct Shared {
    /// The marker of the request whose answer is to be lost, until a request carries it.
    armed: Option<Vec<u8>>,
}

/// The proxy; it stops when dropped.
#[derive(Debug)]
pub struct LossyProxy {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    /// How many answers were lost.
    lost: watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LossyProxy {
    /// A proxy on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (lost_tx, lost) = watch::channel(0);
        let lost_tx = Arc::new(lost_tx);
        let state = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, state.clone(), lost_tx.clone()));
            }
        });
        Self {
            addr,
            shared,
            lost,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Loses the answer to the next request whose body carries `marker`.
    pub fn lose_answer_to(&self, marker: &[u8]) {
        self.shared.lock().unwrap().armed = Some(marker.to_vec());
    }

    /// How many answers were lost so far.
    pub fn lost(&self) -> usize {
        *self.lost.borrow()
    }
}

/// HTTP/2 frames, as far as the proxy needs them: (type, stream id, payload) once whole.
struct Frames {
    buffer: Vec<u8>,
    /// The client's connection preface, before its first frame.
    preface: usize,
}

const DATA: u8 = 0;
const HEADER: usize = 9;

impl Frames {
    fn new(preface: usize) -> Self {
        Self {
            buffer: Vec::new(),
            preface,
        }
    }

    /// Takes `bytes` in; every frame they complete, with its whole bytes.
    fn push(&mut self, bytes: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
        self.buffer.extend_from_slice(bytes);
        let skip = self.preface.min(self.buffer.len());
        self.buffer.drain(..skip);
        self.preface -= skip;
        let mut frames = Vec::new();
        while self.buffer.len() >= HEADER {
            let length = u32::from_be_bytes([0, self.buffer[0], self.buffer[1], self.buffer[2]]);
            let whole = HEADER + length as usize;
            if self.buffer.len() < whole {
                break;
            }
            let kind = self.buffer[3];
            let stream = u32::from_be_bytes([
                self.buffer[5],
                self.buffer[6],
                self.buffer[7],
                self.buffer[8],
            ]) & 0x7fff_ffff;
            frames.push((kind, stream, self.buffer.drain(..whole).collect()));
        }
        frames
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    shared: Arc<Mutex<Shared>>,
    lost: Arc<watch::Sender<usize>>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // The stream whose answer is to be lost, once a request carried the marker.
    let (doomed_tx, doomed) = watch::channel(None::<u32>);
    let upstream = async move {
        // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        let mut frames = Frames::new(24);
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Looked at before it is passed on, so the answer cannot come before the doom.
            for (kind, stream, frame) in frames.push(&chunk[..n]) {
                let mut shared = shared.lock().unwrap();
                let carries = |marker: &Vec<u8>| {
                    frame[HEADER..]
                        .windows(marker.len())
                        .any(|w| w == marker.as_slice())
                };
                if kind == DATA && shared.armed.as_ref().is_some_and(carries) {
                    shared.armed = None;
                    doomed_tx.send_replace(Some(stream));
                }
            }
            if server_write.write_all(&chunk[..n]).await.is_err() {
                return;
            }
        }
    };
    let downstream = async move {
        let mut frames = Frames::new(0);
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for (_, stream, frame) in frames.push(&chunk[..n]) {
                if *doomed.borrow() == Some(stream) {
                    // etcd answered: the request was applied. The answer goes nowhere.
                    lost.send_modify(|n| *n += 1);
                    return;
                }
                if client_write.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    };
    // Either way ending closes both connections (their halves are dropped here).
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}
