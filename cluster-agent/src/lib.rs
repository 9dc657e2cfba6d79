//! Drover's cluster-agent (a Deployment in each downstream cluster).
//!
//! Not built yet: importing a cluster (issue 4) gives it its tunnel session, the API-server
//! allow-list and the watch-driven cache. The crate exists so the workspace has its final shape.
