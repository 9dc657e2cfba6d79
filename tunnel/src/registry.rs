//! The hub's sessions by agent identity, and the events it emits as agents come and go.

use std::{
    collections::BTreeMap,
    ops::Bound,
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
    // Ordered, so that the sessions of one agent's copies (`ID` and `ID/…`) are a range.
    sessions: Mutex<BTreeMap<String, Session>>,
    events: broadcast::Sender<SessionEvent>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                sessions: Mutex::new(BTreeMap::new()),
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

    /// Whether a live session of `id` or of one of its copies (`id/…`) satisfies `test`; in
    /// time proportional to those sessions, not to all of them.
    pub fn any_of(&self, id: &str, test: impl Fn(&SessionInfo) -> bool) -> bool {
        let sessions = self.lock();
        copies_of(&sessions, id).any(|s| test(s.info()))
    }

    /// The newest live session (the last to connect) of `id` or of one of its copies (`id/…`)
    /// that satisfies `test`; in time proportional to those sessions, not to all of them.
    pub fn newest_of(&self, id: &str, test: impl Fn(&SessionInfo) -> bool) -> Option<Session> {
        let sessions = self.lock();
        copies_of(&sessions, id)
            .filter(|s| test(s.info()))
            .max_by_key(|s| s.info().id)
            .cloned()
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

    /// Forgets the session `info` names if it is still its agent's route (a replaced one is
    /// already gone).
    pub(crate) fn remove(&self, info: &SessionInfo, reason: &str) {
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

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Session>> {
        // A panic while holding this lock cannot leave the map half-updated (each operation is
        // one insert or remove), so a poisoned lock is still safe to use.
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// The session of `id` and those of its copies (`id/…`), which sort right after it.
fn copies_of<'a>(
    sessions: &'a BTreeMap<String, Session>,
    id: &str,
) -> impl Iterator<Item = &'a Session> {
    let copies = format!("{id}/");
    sessions.get(id).into_iter().chain(
        sessions
            .range::<str, _>((Bound::Included(copies.as_str()), Bound::Unbounded))
            .take_while(move |(key, _)| key.starts_with(&copies))
            .map(|(_, s)| s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::Role;

    fn session(id: &str, kind: &str) -> Session {
        // The far end is never read: only the session's identity matters here.
        let (io, far) = tokio::io::duplex(1024);
        std::mem::forget(far);
        crate::session::spawn_for_test(io, Role::Server, id, kind, None)
    }

    #[tokio::test]
    async fn an_agent_and_its_newest_copy_are_found_and_names_that_merely_start_alike_are_not() {
        let registry = Registry::default();
        for (id, kind) in [
            ("host/h-1", "system-agent"),
            ("host/h-10", "system-agent"),
            ("host/h-1-b", "system-agent"),
            ("cluster/edge/pod-a", "cluster-agent"),
            ("cluster/edge-2", "cluster-agent"),
        ] {
            registry.insert(session(id, kind));
        }
        let any = |id: &str| registry.any_of(id, |_| true);
        assert!(any("host/h-1"), "the agent itself");
        assert!(any("cluster/edge"), "a copy of the agent");
        assert!(!any("host/h-2"));
        assert!(!any("cluster/edg"), "a prefix of a name is not the name");
        assert!(!registry.any_of("host/h-1", |s| s.peer.kind == "cluster-agent"));

        // The newest of an agent's copies, passing the test; never a look-alike's.
        registry.insert(session("cluster/edge/pod-b", "cluster-agent"));
        let newest = |id: &str| {
            registry
                .newest_of(id, |_| true)
                .map(|s| s.info().peer.id.clone())
        };
        assert_eq!(
            newest("cluster/edge").as_deref(),
            Some("cluster/edge/pod-b")
        );
        assert_eq!(newest("cluster/edge-2").as_deref(), Some("cluster/edge-2"));
        assert_eq!(newest("cluster/edg"), None);
        assert_eq!(
            registry
                .newest_of("cluster/edge", |s| s.peer.id.ends_with("pod-a"))
                .map(|s| s.info().peer.id.clone())
                .as_deref(),
            Some("cluster/edge/pod-a")
        );
        let b = registry.get("cluster/edge/pod-b").unwrap();
        registry.remove(b.info(), "gone");

        let copy = registry.get("cluster/edge/pod-a").unwrap();
        registry.remove(copy.info(), "gone");
        assert!(!any("cluster/edge"), "cluster/edge-2 is another cluster");
        assert!(any("cluster/edge-2"));
    }
}
