//! Custom resource types. `v1alpha1` is the single source of truth for the CRD schema: the doc
//! comments on its fields become the descriptions `kubectl explain` shows.
#![forbid(unsafe_code)]
pub mod reports;
pub mod v1alpha1;
