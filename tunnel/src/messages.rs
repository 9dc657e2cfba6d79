//! Messages on the session's WebSocket itself, beside yamux: for what needs no stream — what
//! every agent sends all the time (heartbeats), and what a system-agent would otherwise hold a
//! stream open for all session long (its plans).
//!
//! A heartbeat as a gRPC call opens a yamux stream, routes a request through tonic on a task of
//! its own and closes the stream: at 1,000 beats a second that was most of an idle hub's work
//! (docs/benchmarks-history.md, "health"). A message is one WebSocket text frame each way, read and
//! answered by the task that already owns the session, with no stream, call or task per beat.
//!
//! The agent offers them in its upgrade request ([`MESSAGES_HEADER`]) and uses them only if the
//! hub's answer carries the same header back: a hub that does not takes beats as calls, and an
//! agent that does not offer them never sends one (either side may be the older).
//!
//! On the wire a message is a text frame whose payload is the message's bytes in base64 (text
//! frames must be UTF-8; binary frames are yamux's byte stream, whose boundaries mean nothing).

use std::{
    collections::VecDeque,
    fmt,
    sync::{Arc, Mutex},
    task::Context,
};

use base64::Engine as _;
use futures::task::AtomicWaker;
use tokio::sync::mpsc;

use crate::session::SessionInfo;

/// Header by which an agent offers messages and the hub accepts them; its value names what
/// the messages are.
pub const MESSAGES_HEADER: &str = "x-drover-session-messages";
/// The one kind of messages there is: `drover.session.v1` in the proto crate (an agent's
/// heartbeats and plan watches one way, the hub's replies and plans the other). Its
/// predecessor, `health.v1` (bare heartbeats), is no longer offered or accepted: a peer that
/// knows only it makes calls instead.
pub const SESSION_MESSAGES: &str = "session.v1";

/// Most messages queued to send; past that, [`Messenger::send`] fails and the session ends
/// (it is not being written: its peer stopped reading), so that nothing sent on it is silently
/// lost: its agent connects again and is told afresh.
const MAX_QUEUED: usize = 64;

/// Takes the peer's messages, on the task that drives the session (so it must not block).
pub trait OnMessage: Send + Sync + 'static {
    /// What it returns is sent back at once; an answer that has to wait goes through
    /// `messenger` later.
    fn on_message(
        &self,
        session: &SessionInfo,
        message: &[u8],
        messenger: &Messenger,
    ) -> Option<Vec<u8>>;
}

impl<F> OnMessage for F
where
    F: Fn(&SessionInfo, &[u8], &Messenger) -> Option<Vec<u8>> + Send + Sync + 'static,
{
    fn on_message(
        &self,
        session: &SessionInfo,
        message: &[u8],
        messenger: &Messenger,
    ) -> Option<Vec<u8>> {
        self(session, message, messenger)
    }
}

/// Sends messages on one session. Cheap to clone.
#[derive(Clone)]
pub struct Messenger {
    outbox: Arc<Outbox>,
}

#[derive(Default)]
struct Outbox {
    queue: Mutex<Queue>,
    /// The session's driver, which writes what is queued whenever it runs.
    driver: AtomicWaker,
}

#[derive(Default)]
struct Queue {
    messages: VecDeque<Vec<u8>>,
    /// A message was refused for want of room: the driver ends the session.
    overflowed: bool,
    /// The session's driver is gone: nothing queued will be written.
    closed: bool,
}

impl fmt::Debug for Messenger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Messenger").finish_non_exhaustive()
    }
}

/// The session is ended, or ends because its peer stopped reading.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the session is not sending messages (ended, or its peer stopped reading)")]
pub struct NotSent;

impl Messenger {
    pub(crate) fn new() -> Self {
        Self {
            outbox: Arc::new(Outbox::default()),
        }
    }

    /// Queues `message` and wakes the session's driver, which writes it. A session whose
    /// queue is full is ended (see [`MAX_QUEUED`]).
    pub fn send(&self, message: Vec<u8>) -> Result<(), NotSent> {
        let sent = {
            let mut queue = self.lock();
            if queue.closed {
                return Err(NotSent);
            }
            let room = queue.messages.len() < MAX_QUEUED;
            if room {
                queue.messages.push_back(message);
            } else {
                queue.overflowed = true;
            }
            room
        };
        self.outbox.driver.wake();
        if sent { Ok(()) } else { Err(NotSent) }
    }

    /// Whether the session has ended (or is ending, having failed to send).
    pub fn is_closed(&self) -> bool {
        let queue = self.lock();
        queue.closed || queue.overflowed
    }

    /// A messenger on no session, for tests of an [`OnMessage`]: what is sent stays queued
    /// for [`Messenger::take_sent`].
    #[cfg(any(test, feature = "testing"))]
    pub fn detached() -> Self {
        Self::new()
    }

    /// What was sent and not yet written, taken (tests only, see [`Messenger::detached`]).
    #[cfg(any(test, feature = "testing"))]
    pub fn take_sent(&self) -> Vec<Vec<u8>> {
        self.lock().messages.drain(..).collect()
    }

    /// The next message sent, once one is (tests only, see [`Messenger::detached`]: the test
    /// stands where the session's driver would).
    #[cfg(any(test, feature = "testing"))]
    pub async fn next_sent(&self) -> Vec<u8> {
        std::future::poll_fn(|cx| {
            self.outbox.driver.register(cx.waker());
            match self.lock().messages.pop_front() {
                Some(message) => std::task::Poll::Ready(message),
                None => std::task::Poll::Pending,
            }
        })
        .await
    }

    /// Ends a detached messenger's pretend session (tests only).
    #[cfg(any(test, feature = "testing"))]
    pub fn close(&self) {
        self.lock().closed = true;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Only whole messages are pushed and popped: a panic cannot leave one half-queued.
        self.outbox.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the WebSocket under a session needs for messages: where the peer's go, and what to send.
pub(crate) struct Messages {
    info: SessionInfo,
    handler: Arc<dyn OnMessage>,
    messenger: Messenger,
}

impl Messages {
    pub(crate) fn new(
        info: SessionInfo,
        handler: Arc<dyn OnMessage>,
        messenger: Messenger,
    ) -> Self {
        Self {
            info,
            handler,
            messenger,
        }
    }

    /// Takes the messages queued to send; `cx` is woken when more are. An error once a
    /// message found the queue full: the session must end.
    pub(crate) fn take_outgoing(&self, cx: &mut Context<'_>) -> Result<Vec<Vec<u8>>, String> {
        self.messenger.outbox.driver.register(cx.waker());
        let mut queue = self.messenger.lock();
        if queue.overflowed {
            return Err(format!(
                "more than {MAX_QUEUED} messages waited to be sent: the peer does not read"
            ));
        }
        Ok(if queue.messages.is_empty() {
            Vec::new()
        } else {
            queue.messages.drain(..).collect()
        })
    }

    /// A text frame's payload from the peer; what to send back at once, if anything.
    pub(crate) fn received(&self, payload: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let message = base64::engine::general_purpose::STANDARD
            .decode(payload)
            .map_err(|e| format!("a message that is not base64 ({e})"))?;
        Ok(self
            .handler
            .on_message(&self.info, &message, &self.messenger))
    }
}

impl Drop for Messages {
    fn drop(&mut self) {
        // The driver is gone with the session: senders learn it from `send` and `is_closed`.
        let mut queue = self.messenger.lock();
        queue.closed = true;
        queue.messages.clear();
    }
}

/// A message as a text frame's payload.
pub(crate) fn encode(message: &[u8]) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .encode(message)
        .into_bytes()
}

/// The hub's handler of every session's messages, for [`crate::AcceptorConfig`].
#[derive(Clone)]
pub struct MessageHandler(pub(crate) Arc<dyn OnMessage>);

impl MessageHandler {
    pub fn new(handler: impl OnMessage) -> Self {
        Self(Arc::new(handler))
    }
}

impl fmt::Debug for MessageHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageHandler").finish_non_exhaustive()
    }
}

/// An agent's end of its session's messages: it tells, and the hub answers when it has
/// something to say.
#[derive(Debug, Clone)]
pub struct Conversation {
    messenger: Messenger,
    answers: Arc<tokio::sync::Mutex<mpsc::Receiver<Vec<u8>>>>,
}

/// Answers not yet taken that an agent keeps; past that the newest are dropped.
const ANSWERS_KEPT: usize = 16;

impl Conversation {
    /// The conversation and the handler to give the session, which hands it the answers.
    pub(crate) fn new() -> (Self, Arc<dyn OnMessage>, Messenger) {
        let (tx, rx) = mpsc::channel(ANSWERS_KEPT);
        let handler = move |_: &SessionInfo, message: &[u8], _: &Messenger| {
            // Full only while nobody takes them.
            let _ = tx.try_send(message.to_vec());
            None
        };
        let messenger = Messenger::new();
        let conversation = Self {
            messenger: messenger.clone(),
            answers: Arc::new(tokio::sync::Mutex::new(rx)),
        };
        (conversation, Arc::new(handler), messenger)
    }

    /// Sends `message`; it leaves with the session's next write.
    pub fn tell(&self, message: Vec<u8>) -> Result<(), NotSent> {
        self.messenger.send(message)
    }

    /// The hub's next message; `None` once the session has ended.
    pub async fn answer(&self) -> Option<Vec<u8>> {
        self.answers.lock().await.recv().await
    }
}
