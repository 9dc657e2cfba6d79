//! How many long-lived requests each user holds open: watches (the API's and proxied
//! Kubernetes ones), followed logs and upgraded streams (exec, attach, port-forward). Each
//! costs the hub a task, buffers and a descriptor for as long as it lasts, so one user must not
//! be able to open them without bound; past the limit, a clear 429.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

/// A user at the limit of open streams.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "user {user:?} has {limit} watches and streams open, the most one user may hold (--max-streams-per-user); close some first"
)]
pub struct TooManyStreams {
    pub user: String,
    pub limit: usize,
}

/// Open streams per user, against a limit (0: none).
#[derive(Debug, Default)]
pub struct Streams {
    limit: usize,
    open: Mutex<HashMap<String, usize>>,
}

/// One open stream, counted until dropped.
#[derive(Debug)]
pub struct StreamGuard {
    streams: Arc<Streams>,
    user: String,
}

impl Streams {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            open: Mutex::default(),
        })
    }

    /// Counts a new stream of `user`, or says why not.
    pub fn open(self: &Arc<Self>, user: &str) -> Result<StreamGuard, TooManyStreams> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(user.to_owned()).or_insert(0);
        if self.limit > 0 && *count >= self.limit {
            return Err(TooManyStreams {
                user: user.to_owned(),
                limit: self.limit,
            });
        }
        *count += 1;
        Ok(StreamGuard {
            streams: self.clone(),
            user: user.to_owned(),
        })
    }

    /// Streams `user` holds now.
    pub fn held(&self, user: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(user).copied().unwrap_or(0)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.user) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_user_holds_at_most_the_limit_and_closing_frees_a_place() {
        let streams = Streams::new(2);
        let a = streams.open("ann").unwrap();
        let _b = streams.open("ann").unwrap();
        let refused = streams.open("ann").unwrap_err();
        // The API answers it as 429 saying which limit it is.
        let answer = crate::api::ApiError::from(refused);
        assert_eq!(answer.code, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert!(answer.message.contains("--max-streams-per-user"));
        // Another user is not held back by ann.
        let _c = streams.open("bob").unwrap();
        drop(a);
        assert!(streams.open("ann").is_ok());
        assert_eq!(streams.held("bob"), 1);
    }
}
