//! What the hub, the agents and the simulated cluster all need to agree on about Kubernetes'
//! shapes, written once: label selectors and JSON merge patch (and, as they arrive, field
//! selectors and the like).
//! No Drover crate is a dependency of this one.

pub mod patch;
pub mod selector;

pub use selector::{LabelSelector, SelectorError};
