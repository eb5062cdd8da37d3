//! `gatehouse.dev/v1alpha1`.
mod ipam;
mod policy;

pub use ipam::*;
pub use policy::*;
