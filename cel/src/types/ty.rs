//! The static types the checker infers.
use std::fmt;

use super::request;

/// A static type; `Dyn` is any.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Ty {
    Dyn,
    /// A value the API server's checker types `dyn` (`dyn(x)`, `object` and `oldObject` and what
    /// is read from them): any type to an overload, but a type of its own in a literal, whose
    /// elements must all be of one (`[1, dyn(2)]` and `['a', object.metadata.name]` are refused).
    DeclaredDyn,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    Type,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Optional(Box<Ty>),
    /// A library's value type (`kubernetes.Semver`).
    Opaque(String),
    /// One `[index or key, value]` element of a two-variable comprehension's `@entries`.
    Pair(Box<Ty>, Box<Ty>),
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Dyn | Ty::DeclaredDyn => f.write_str("dyn"),
            Ty::Null => f.write_str("null_type"),
            Ty::Bool => f.write_str("bool"),
            Ty::Int => f.write_str("int"),
            Ty::Uint => f.write_str("uint"),
            Ty::Double => f.write_str("double"),
            Ty::String => f.write_str("string"),
            Ty::Bytes => f.write_str("bytes"),
            Ty::Duration => f.write_str("google.protobuf.Duration"),
            Ty::Timestamp => f.write_str("google.protobuf.Timestamp"),
            Ty::Type => f.write_str("type"),
            Ty::List(e) => write!(f, "list({e})"),
            Ty::Map(k, v) => write!(f, "map({k}, {v})"),
            Ty::Optional(e) => write!(f, "optional_type({e})"),
            Ty::Opaque(name) => f.write_str(name),
            Ty::Pair(..) => f.write_str("list(dyn)"),
        }
    }
}

impl Ty {
    /// Whether a value of this type has no fields to select (`'a'.b`, `[1].b`).
    pub(super) fn is_scalar(&self) -> bool {
        if let Ty::Opaque(name) = self {
            // The libraries' values have no fields; `request`'s types and the authorizer's
            // (`authorizer.requestResource` is read as a field) do.
            return request::fields(name).is_none()
                && !name.starts_with("kubernetes.authorization.");
        }
        matches!(
            self,
            Ty::Bool
                | Ty::Int
                | Ty::Uint
                | Ty::Double
                | Ty::String
                | Ty::Bytes
                | Ty::Duration
                | Ty::Timestamp
                | Ty::Null
                | Ty::List(_)
        )
    }

    /// Types agree when equal, `dyn` agreeing with anything at any depth; `null` agrees with
    /// nothing else (`1 == null` and `[1, null]` are refused by the API server).
    pub(super) fn agrees(&self, other: &Ty) -> bool {
        match (self, other) {
            (Ty::Dyn | Ty::DeclaredDyn | Ty::Pair(..), _)
            | (_, Ty::Dyn | Ty::DeclaredDyn | Ty::Pair(..)) => true,
            (Ty::List(a), Ty::List(b)) | (Ty::Optional(a), Ty::Optional(b)) => a.agrees(b),
            (Ty::Map(ka, va), Ty::Map(kb, vb)) => ka.agrees(kb) && va.agrees(vb),
            (a, b) => a == b,
        }
    }

    /// Whether two agreeing element types of one literal are the same type, as Kubernetes'
    /// homogeneous-literal validator asks: a `dyn(x)` element is `dyn`, unlike an `int`.
    pub(super) fn same_in_literal(&self, other: &Ty) -> bool {
        match (self, other) {
            (Ty::DeclaredDyn, Ty::DeclaredDyn | Ty::Dyn) | (Ty::Dyn, Ty::DeclaredDyn) => true,
            (Ty::DeclaredDyn, _) | (_, Ty::DeclaredDyn) => false,
            (Ty::List(a), Ty::List(b)) | (Ty::Optional(a), Ty::Optional(b)) => a.same_in_literal(b),
            (Ty::Map(ka, va), Ty::Map(kb, vb)) => ka.same_in_literal(kb) && va.same_in_literal(vb),
            _ => true,
        }
    }

    /// Of two agreeing types, the one that says more; a declared `dyn` is the most general type,
    /// as the checker binds a type parameter (`true ? 1 : dyn(2)` is `dyn`).
    pub(super) fn narrower(self, other: Ty) -> Ty {
        match (self, other) {
            (Ty::DeclaredDyn, _) | (_, Ty::DeclaredDyn) => Ty::DeclaredDyn,
            (Ty::Dyn, t) | (t, Ty::Dyn) => t,
            (Ty::List(a), Ty::List(b)) => Ty::List(Box::new(a.narrower(*b))),
            (Ty::Map(ka, va), Ty::Map(kb, vb)) => {
                Ty::Map(Box::new(ka.narrower(*kb)), Box::new(va.narrower(*vb)))
            }
            (a, _) => a,
        }
    }
}
