//! `gatehouse.dev/v1alpha1`.
mod calls;
mod companions;
mod exception;
mod ipam;
mod namespaced;
mod policy;

pub use calls::*;
pub use companions::*;
pub use exception::*;
pub use ipam::*;
pub use namespaced::*;
pub use policy::*;
