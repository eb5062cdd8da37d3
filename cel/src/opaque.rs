//! The values Kubernetes' libraries add to CEL (quantities, IPs, CIDRs, versions, URLs) are
//! opaque values of the `cel` crate: one `Val` implementation each, written by [`opaque_val`].

/// Implements `Val` (and `StaticVal`) for `$t`, of the CEL type `$cel_type` (a `static`), equal
/// to another `$t` when `$equal(a, b)` says so.
macro_rules! opaque_val {
    ($t:ty, $cel_type:expr, $equal:expr) => {
        impl ::cel::common::value::Val for $t {
            fn get_type(&self) -> &::cel::common::types::Type {
                &$cel_type
            }

            fn cel_type() -> &'static ::cel::common::types::Type {
                &$cel_type
            }

            fn equals(&self, other: &dyn ::cel::common::value::Val) -> bool {
                let equal: fn(&$t, &$t) -> bool = $equal;
                other
                    .as_any()
                    .and_then(|a| a.downcast_ref::<$t>())
                    .is_some_and(|o| equal(self, o))
            }

            fn clone_as_boxed<'v>(&self) -> Box<dyn ::cel::common::value::Val + 'v> {
                Box::new(self.clone())
            }

            fn as_any(&self) -> Option<&dyn ::std::any::Any> {
                Some(self)
            }
        }

        impl ::cel::common::value::StaticVal for $t {}
    };
}

pub(super) use opaque_val;
