//! End-to-end tests against a real kube-apiserver (see `tests/cluster/up`).

mod operator;
mod smoke;
