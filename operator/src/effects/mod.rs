//! The effects loop: side effects performed after the object is stored, keyed by its UID.
//! `allocator` and `network` are the pure part.
pub mod allocator;
pub mod companions;
pub mod index;
pub mod ipam;
pub mod network;
