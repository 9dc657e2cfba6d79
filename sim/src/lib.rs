//! Simulated downstream clusters and hosts, because real kube-apiserver and K3s binaries cannot
//! be had on these machines: a Kubernetes-API-speaking cluster ([`cluster`]) that real
//! `kubectl` accepts, and a stand-in K3s/RKE2 installer ([`standin`]). Used by
//! tests, benchmarks and the demo; every other code path in Drover is the real one.

pub mod cluster;
pub mod demo;
pub mod fleet;
pub mod host;
pub mod standin;
