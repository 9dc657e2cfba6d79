//! What the API's handlers share; used by the handlers outside this module too (registration,
//! agents, health, the dashboard), which name it here rather than through the router's module.

use std::sync::Arc;

use crate::{
    auth::{LoginLimiter, known::Known, streams::Streams},
    store::Store,
};

/// What handlers share.
#[derive(Clone, Debug)]
pub struct Api {
    pub store: Arc<dyn Store>,
    pub limiter: Arc<LoginLimiter>,
    /// Tokens, users, bindings and clusters kept between requests.
    pub known: Arc<Known>,
    /// Where agents reach the hub, for registration commands.
    pub server_url: String,
    pub ca_checksum: String,
    /// The hub's CA, for kubeconfigs.
    pub ca_pem: Arc<str>,
    /// Watches and streams each user holds open (the API's and the proxy's).
    pub streams: Arc<Streams>,
    /// The audit log (its writer, and where `/v1/audit` reads it).
    pub audit: Arc<crate::audit::Audit>,
    /// Rotated audit files kept.
    pub audit_keep: usize,
    /// Shell sessions' recordings.
    pub recordings: Arc<crate::recording::Recordings>,
}
