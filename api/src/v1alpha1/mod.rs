//! `gatehouse.dev/v1alpha1`.
mod companions;
mod ipam;
mod policy;

pub use companions::*;
pub use ipam::*;
pub use policy::*;
