//! `gatehouse-ipam`: the CNI IPAM plugin that gives a Pod the address Gatehouse allocated to it.
//!
//! Gatehouse's effects loop allocates an address to a Pod by its UID and writes it in the Pod's
//! `gatehouse.dev/ipam-address` annotation; the kubelet and containerd hand the annotations to
//! this plugin (capability `io.kubernetes.cri.pod-annotations`) with the Pod's UID in `CNI_ARGS`.
//! The plugin answers the main plugin (`bridge`, `macvlan`, …) with that address, asks the
//! kubelet to try again while a marked Pod's address is not there yet, and hands every other Pod
//! to the `fallback` IPAM configured beside it. It reads nothing else: no API access on the node.
//!
//! * [`annotation`]: the annotations, shared with the operator that writes them;
//! * [`protocol`]: the CNI environment, configuration, errors and results;
//! * [`plugin`]: the decision for one invocation, a pure function;
//! * [`delegate`]: running the fallback;
//! * [`install`]: copying itself onto a node (the `config/cni` DaemonSet).
#![forbid(unsafe_code)]

pub mod annotation;
pub mod delegate;
pub mod install;
pub mod plugin;
pub mod protocol;
