//! The hub's sessions by agent identity, and the events it emits as agents come and go.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::sync::broadcast;

use crate::session::{Session, SessionInfo};

/// Events queued per subscriber before the slowest one starts losing them.
const EVENT_BUFFER: usize = 4096;

/// A change in who is connected.
#[derive(Debug, Clone)]
pub enum SessionEvent {
    /// A session completed its handshake and is now the agent's route.
    Connected(SessionInfo),
    /// A session stopped being the agent's route: it ended, or a newer one replaced it.
    Disconnected { info: SessionInfo, reason: String },
}

/// Live sessions, at most one per agent identity. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Registry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sessions: Mutex<HashMap<String, Session>>,
    events: broadcast::Sender<SessionEvent>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                sessions: Mutex::new(HashMap::new()),
                events: broadcast::channel(EVENT_BUFFER).0,
            }),
        }
    }
}

impl Registry {
    /// The live session of an agent, if it has one.
    pub fn get(&self, peer_id: &str) -> Option<Session> {
        self.lock().get(peer_id).cloned()
    }

    /// Every live session.
    pub fn sessions(&self) -> Vec<Session> {
        self.lock().values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Events from now on. A subscriber that falls more than a few thousand events behind gets
    /// `RecvError::Lagged` and should re-read [`Registry::sessions`].
    pub fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.inner.events.subscribe()
    }

    /// Makes `session` the route to its agent, closing the one it replaces.
    pub(crate) fn insert(&self, session: Session) {
        let info = session.info().clone();
        let mut sessions = self.lock();
        if let Some(old) = sessions.insert(info.peer.id.clone(), session) {
            old.close();
            let _ = self.inner.events.send(SessionEvent::Disconnected {
                info: old.info().clone(),
                reason: "replaced by a newer session from the same agent".to_owned(),
            });
        }
        // Sent under the lock so the order of events matches the order of changes.
        let _ = self.inner.events.send(SessionEvent::Connected(info));
    }

    /// Forgets `session` if it is still the agent's route (a replaced one is already gone).
    pub(crate) fn remove(&self, session: &Session, reason: &str) {
        let info = session.info();
        let mut sessions = self.lock();
        if sessions
            .get(&info.peer.id)
            .is_some_and(|s| s.info().id == info.id)
        {
            sessions.remove(&info.peer.id);
            let _ = self.inner.events.send(SessionEvent::Disconnected {
                info: info.clone(),
                reason: reason.to_owned(),
            });
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Session>> {
        // A panic while holding this lock cannot leave the map half-updated (each operation is
        // one insert or remove), so a poisoned lock is still safe to use.
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}
