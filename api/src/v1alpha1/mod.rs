//! `gatehouse.dev/v1alpha1`.
mod calls;
mod companions;
mod ipam;
mod policy;

pub use calls::*;
pub use companions::*;
pub use ipam::*;
pub use policy::*;
