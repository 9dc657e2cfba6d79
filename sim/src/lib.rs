//! Simulated downstream clusters and hosts (a Kubernetes-API-speaking cluster and a stand-in
//! K3s/RKE2 installer), because real kube-apiserver and K3s binaries cannot be had here.
//!
//! Not built yet: the import issue (issue 4) brings the simulated cluster, the provisioning
//! issue (issue 5) the stand-in installer.
