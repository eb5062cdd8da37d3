//! The effects loop: side effects performed after the object is stored, keyed by its UID.
//! `allocator` is the pure part.
pub mod allocator;
pub mod index;
pub mod ipam;
