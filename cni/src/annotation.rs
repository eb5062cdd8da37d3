//! What Gatehouse writes on a Pod for the node, and the only thing the plugin reads of it.
//!
//! The kubelet copies a Pod's annotations into its sandbox config and containerd hands them to a
//! CNI plugin that declares the capability [`POD_ANNOTATIONS_CAPABILITY`], so these two
//! annotations are the whole interface between the cluster and the node:
//!
//! - [`IPAM_POOL_ANNOTATION`] (`gatehouse.dev/ipam-pool: <pool>`): admission marks every Pod it
//!   gates for an address (labels do not reach a CNI plugin);
//! - [`IPAM_ADDRESS_ANNOTATION`] (`gatehouse.dev/ipam-address`): the effects loop writes the
//!   allocation, a JSON [`IpamAddress`], when it removes the gate. Admission removes one a client
//!   sent on CREATE, so only the effects loop ever writes it; and it names the owner's UID, so a
//!   copy on another Pod (a manifest saved and re-applied) is never that Pod's address.
use serde::{Deserialize, Serialize};

/// Annotation naming the pool a Pod waits for an address from (set at admission).
pub const IPAM_POOL_ANNOTATION: &str = "gatehouse.dev/ipam-pool";
/// Annotation carrying the Pod's allocated address, as an [`IpamAddress`] in JSON.
pub const IPAM_ADDRESS_ANNOTATION: &str = "gatehouse.dev/ipam-address";
/// The `runtimeConfig` key under which containerd passes a Pod's annotations.
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";

/// One Pod's address, as the effects loop allocated it:
/// `{"pool":"pods-v4","address":"10.244.0.130/24","gateway":"10.244.0.1",
/// "routes":[{"dst":"0.0.0.0/0"}],"ownerUID":"…"}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IpamAddress {
    /// The IPPool the address comes from.
    pub pool: String,
    /// The address with the pool's prefix length (`10.244.0.130/24`).
    pub address: String,
    /// The pool's gateway, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The pool's routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// The pool's DNS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// The UID of the Pod the address is allocated to.
    #[serde(rename = "ownerUID")]
    pub owner_uid: String,
}

// As CNI results carry it; also `IPPool.spec.routes[]`.
/// A route given to the Pods of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Route {
    /// The destination CIDR, of the pool's IP family (`0.0.0.0/0` for a default route).
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub dst: String,
    /// The next hop; the pool's gateway when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

// As CNI results carry them; also `IPPool.spec.dns`.
/// DNS settings given to the Pods of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Dns {
    /// Name server addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}
