//! Drover's node-agent (a DaemonSet, one per node).
//!
//! Not built yet: the health issue (issue 6) gives it host facts, usage reports and the
//! fallback route. The crate exists so the workspace has its final shape.
