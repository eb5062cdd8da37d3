//! End-to-end tests against a real kube-apiserver (see `tests/cluster/up`).

mod audit;
mod cel;
mod chart;
mod failover;
mod faults;
mod fixtures;
mod generated_merges;
mod hostile;
mod in_process;
mod in_process_mutation;
mod in_process_mutation_parity;
mod in_process_parity;
mod install;
mod ipam;
mod lockout;
mod mutation_translation;
mod ordering;
mod outage;
mod previews;
mod refusals;
mod scene;
mod shared;
mod smoke;
mod system_namespaces;
mod tenants;
mod wiring;
