//! The effects loops: side effects performed after the object is stored, keyed by its UID, never
//! at admission. One skeleton ([`effect_loop`]: pacing, backoff, leader fencing, a term's memory)
//! runs each kind, a module of its own:
//! - [`ipam`]: IP addresses for Pods, one IPAllocation each (`allocator`, `index` and `network`
//!   are its pure part);
//! - [`companions`]: companion objects for the stored objects a Policy selects;
//! - [`calls`]: calls to external systems for the stored objects a Policy selects, one
//!   ExternalCall record each.
//!
//! The loops that act on the objects a Policy selects share how they discover and watch kinds
//! ([`kinds`], [`watches`]).
pub mod allocator;
pub mod calls;
pub mod companions;
pub(crate) mod condition;
pub mod effect_loop;
pub(crate) mod finalizers;
pub(crate) mod gates;
pub mod index;
pub mod ipam;
pub(crate) mod kinds;
pub mod network;
pub(crate) mod settled;
pub(crate) mod triggers;
pub(crate) mod watches;

use kube::core::ApiResource;

/// The resource of an audited kind, for a watch.
pub(crate) fn resource_of(kind: &crate::audit::judge::AuditedKind) -> ApiResource {
    ApiResource {
        group: kind.group.clone(),
        version: kind.version.clone(),
        api_version: kind.api_version(),
        kind: kind.kind.clone(),
        plural: kind.resource.clone(),
    }
}
