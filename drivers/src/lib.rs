//! Machine drivers: how the hub reaches and makes the machines of a cluster's machine pools,
//! each behind the one interface the machine controller uses ([`Driver`]). Knows nothing of
//! the hub.
//!
//! - [`ssh`]: existing machines reached over SSH (docker-machine's "generic" driver), with each
//!   machine's host key pinned once recorded.
//! - [`ec2`]: Amazon EC2, or a cloud that speaks its Query API ([`aws`]).
//!
//! And hosted Kubernetes ([`hosted`]: clusters whose control plane a cloud runs), the other
//! interface, for the hosted-cluster controller: [`eks`].

use std::{collections::BTreeMap, future::Future, pin::Pin};

pub mod aws;
pub mod ec2;
pub mod eks;
pub mod hosted;
pub mod ssh;
pub mod xml;

/// What a driver's calls return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A machine as its driver sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// The driver's id for it (an EC2 instance id; `ssh://USER@ADDRESS:PORT`).
    pub id: String,
    /// Its addresses, private first.
    pub addresses: Vec<String>,
    pub state: MachineState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineState {
    Starting,
    Running,
    Stopped,
    /// Terminated, or being.
    Gone,
}

/// A machine to make.
#[derive(Debug, Clone)]
pub struct CreateRequest<'a> {
    /// The machine's name: unique, and how the driver finds it again.
    pub name: &'a str,
    /// Tags beside the name's (the cluster's, the pool's).
    pub tags: &'a BTreeMap<String, String>,
    /// What the machine runs at first boot, for drivers that boot it ([`Driver::boots_user_data`]).
    pub user_data: &'a str,
    /// The provider's idempotency key (EC2's `ClientToken`): a request repeated with it and
    /// the same settings makes nothing new. Empty: the name.
    pub client_token: &'a str,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DriverError {
    /// The provider refuses the request as made (settings, credentials): fix them.
    #[error("{0}")]
    Refused(String),
    /// The provider cannot be reached or cannot serve now: retry.
    #[error("{0}")]
    Unavailable(String),
    /// Nothing left to make a machine from (an SSH pool's every address in use).
    #[error("{0}")]
    Exhausted(String),
    /// The request's idempotency key was used before with other settings, and no machine of
    /// the name is found: it needs a new key (EC2's `IdempotentParameterMismatch`).
    #[error("{0}")]
    KeySpent(String),
}

/// One way of making machines. Every call is safe to repeat: `create` for a name already made
/// returns that machine, `delete` of a machine already gone succeeds.
pub trait Driver: Send + Sync + std::fmt::Debug {
    /// Makes the machine `request.name`, or returns the one already made under that name.
    fn create<'a>(
        &'a self,
        request: &'a CreateRequest<'a>,
    ) -> BoxFuture<'a, Result<Machine, DriverError>>;
    /// As [`Driver::create`], for a caller that has just [listed](Driver::list) the name's
    /// machines and found none: a driver that looks before it makes need not look again (one
    /// provider call fewer per machine). Still safe to repeat where the provider makes it so
    /// (EC2's client token).
    fn create_unlisted<'a>(
        &'a self,
        request: &'a CreateRequest<'a>,
    ) -> BoxFuture<'a, Result<Machine, DriverError>> {
        self.create(request)
    }
    /// The machine `id`, unless it is gone.
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Machine>, DriverError>>;
    /// Destroys (or gives back) the machine `id`.
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DriverError>>;
    /// The machines tagged `key=value` that are not gone.
    fn list<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Machine>, DriverError>>;
    /// Whether a machine runs [`CreateRequest::user_data`] at first boot (cloud-init); if not,
    /// the caller bootstraps it itself (over SSH).
    fn boots_user_data(&self) -> bool;
}
