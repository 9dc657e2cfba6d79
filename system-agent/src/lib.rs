//! Drover's system-agent (installed on a bare host by `system-agent-install.sh`).
//!
//! Not built yet: the provisioning issue (issue 5) gives it plans, applying and reporting.
//! The crate exists so the workspace has its final shape.
