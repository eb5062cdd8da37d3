//! `IPPool` and `IPAllocation`: the first side effect Gatehouse performs, outside admission.
//!
//! Admission only marks a Pod (a scheduling gate, a pool label and annotation); the effects loop
//! allocates after the Pod is stored, keyed by its UID, one `IPAllocation` object per address,
//! and writes it where the node's CNI plugin reads it. The
//! object's name is derived from the address, so the API server itself refuses a second
//! allocation of the same address, whoever tries.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use gatehouse_ipam::annotation::{Dns, Route};

/// Label on a Pod naming the pool it waits for an address from (set at admission).
pub const IPAM_POOL_LABEL: &str = "gatehouse.dev/ipam-pool";
/// Scheduling gate that holds a Pod until its address is allocated.
pub const IPAM_GATE: &str = "gatehouse.dev/ipam";
/// Annotation the address is written to unless an effect names another.
pub const DEFAULT_IPAM_ANNOTATION: &str = "gatehouse.dev/ip";
/// Label on an IPAllocation naming its pool.
pub const POOL_LABEL: &str = "gatehouse.dev/pool";
/// Label on an IPAllocation carrying its owner's UID.
pub const OWNER_UID_LABEL: &str = "gatehouse.dev/owner-uid";

/// A range of addresses Gatehouse hands out, one per Pod.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "gatehouse.dev",
    version = "v1alpha1",
    kind = "IPPool",
    plural = "ippools",
    shortname = "gpool",
    status = "IPPoolStatus",
    doc = "A pool of IP addresses that Gatehouse allocates to Pods, one IPAllocation per address.",
    printcolumn = r#"{"name":"CIDR","type":"string","jsonPath":".spec.cidr"}"#,
    printcolumn = r#"{"name":"Allocated","type":"integer","jsonPath":".status.allocated"}"#,
    printcolumn = r#"{"name":"Capacity","type":"integer","jsonPath":".status.capacity"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolSpec {
    /// The pool's network, IPv4 or IPv6, e.g. `10.20.0.0/24` or `fd00:20::/120`. IPv4 pools
    /// shorter than /31 never hand out the network and broadcast addresses.
    #[schemars(length(min = 1))]
    pub cidr: String,

    /// Namespaces whose NamespacedPolicies may allocate from this pool. A Policy may always; a
    /// NamespacedPolicy only from a pool that lists its namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,

    /// CIDRs inside `cidr` that are never handed out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,

    /// The gateway of the pool's network, given to each Pod with its address by the node's
    /// `gatehouse-ipam` CNI plugin. Must be inside `cidr`; it is never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,

    /// Routes given to each Pod with its address, e.g. `{dst: 0.0.0.0/0}` for a default route
    /// through the gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,

    /// DNS settings given to each Pod with its address (runtimes that write the Pod's resolver
    /// from the kubelet's settings, as containerd does, ignore them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
}

/// Observed state of an IPPool, written by the effects loop. Counters are `int64`, a format
/// Kubernetes knows (`uint64` makes `kubectl apply` of the CRD warn).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolStatus {
    /// How many addresses the pool can hand out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<i64>,
    /// How many are allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<i64>,
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the spec is valid and the pool in use), `Exhausted` (every address allocated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One address allocated to one object. Its name is `<pool>-<address>` with `.` and `:` as `-`,
/// so an address can only ever be allocated once.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gatehouse.dev",
    version = "v1alpha1",
    kind = "IPAllocation",
    plural = "ipallocations",
    shortname = "galloc",
    doc = "An IP address allocated from an IPPool to one object, identified by its UID.",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address"}"#,
    printcolumn = r#"{"name":"Owner","type":"string","jsonPath":".spec.owner.name"}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.owner.namespace"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPAllocationSpec {
    /// The IPPool the address belongs to.
    pub pool: String,
    /// The address, in canonical form.
    pub address: String,
    /// The object holding the address. Matched by UID, never by name: a Pod re-created under
    /// the same name is another owner.
    pub owner: Owner,
}

/// The object an allocation belongs to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A side effect a Policy asks for, performed by the effects loop after the object is stored.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Effect {
    /// Allocate an address from an IPPool to each Pod the Policy matches. Admission only adds
    /// the scheduling gate `gatehouse.dev/ipam` and the label `gatehouse.dev/ipam-pool` (on
    /// CREATE); the address is allocated once the Pod is stored, written to the annotation, and
    /// the gate removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<IpamEffect>,

    /// Keep a companion object in place for every stored object the Policy selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<super::ObjectEffect>,

    /// Call an external system for each stored object the Policy selects: Apply once, Release
    /// when the object goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<super::CallEffect>,
}

/// Where a Pod's address comes from and where it is written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpamEffect {
    /// Name of the IPPool.
    #[schemars(length(min = 1))]
    pub pool: String,
    /// Annotation the address is written to (default `gatehouse.dev/ip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation: Option<String>,
}

impl IpamEffect {
    /// The annotation the address goes to.
    pub fn annotation(&self) -> &str {
        self.annotation
            .as_deref()
            .unwrap_or(DEFAULT_IPAM_ANNOTATION)
    }
}
