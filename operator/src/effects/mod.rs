//! The effects loops: side effects performed after the object is stored, keyed by its UID, never
//! at admission. One skeleton ([`effect_loop`]: pacing, backoff, leader fencing, a term's memory)
//! runs each kind, a module of its own:
//! - [`ipam`]: IP addresses for Pods, one IPAllocation each (`allocator`, `index` and `network`
//!   are its pure part);
//! - [`companions`]: companion objects for the stored objects a Policy selects.
pub mod allocator;
pub mod companions;
pub mod effect_loop;
pub mod index;
pub mod ipam;
pub mod network;
