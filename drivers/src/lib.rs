//! Machine drivers: how the hub reaches and makes the machines of a cluster's machine pools,
//! each behind the one interface the machine controller uses. Knows nothing of the hub.
//!
//! - [`ssh`]: existing machines reached over SSH (docker-machine's "generic" driver), with each
//!   machine's host key pinned once recorded.

pub mod ssh;
