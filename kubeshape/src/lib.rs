//! What the hub, the agents and the simulated cluster all need to agree on about Kubernetes'
//! shapes, written once: label selectors, natural name order, the patch formats and server-side
//! apply's field ownership, the `Status` failure body, how ages print and SPDY/3.1's framing.
//! No Drover crate is a dependency of this one.

pub mod apply;
pub mod duration;
pub mod order;
pub mod patch;
pub mod selector;
pub mod spdy;
pub mod status;

pub use selector::{LabelSelector, SelectorError};
