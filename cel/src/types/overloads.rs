//! The signatures of [`SIGNATURES`] parsed into overloads, and the matching of argument types
//! against an overload's patterns.
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use super::signatures::SIGNATURES;
use super::ty::Ty;

/// A parameter or result of a signature.
#[derive(Clone, Debug, PartialEq)]
enum Pattern {
    Exactly(Ty),
    /// A type parameter, bound by its first use.
    Param(char),
    List(Box<Pattern>),
    Map(Box<Pattern>, Box<Pattern>),
    Optional(Box<Pattern>),
}

/// One overload of a function, as a signature writes it.
#[derive(Debug)]
pub(super) struct Overload {
    receiver: Option<Pattern>,
    args: Vec<Pattern>,
    result: Pattern,
}

/// The overloads of [`SIGNATURES`], parsed once: the table is a constant.
pub(super) static OVERLOADS: LazyLock<HashMap<String, Vec<Overload>>> = LazyLock::new(overloads);

fn overloads() -> HashMap<String, Vec<Overload>> {
    let mut table: HashMap<String, Vec<Overload>> = HashMap::new();
    for signature in SIGNATURES {
        if let Some((name, overload)) = parse_signature(signature) {
            table.entry(name).or_default().push(overload);
        }
    }
    table
}

fn parse_signature(signature: &str) -> Option<(String, Overload)> {
    let (receiver, rest) = match signature.strip_prefix('[') {
        Some(rest) => {
            let (receiver, rest) = rest.split_once("] ")?;
            (Some(parse_pattern(receiver)?), rest)
        }
        None => (None, signature),
    };
    let open = rest.find('(')?;
    let close = rest.rfind(") ")?;
    let name = rest[..open].to_string();
    let args = split_top(&rest[open + 1..close])
        .into_iter()
        .filter(|a| !a.is_empty())
        .map(parse_pattern)
        .collect::<Option<Vec<_>>>()?;
    let result = parse_pattern(&rest[close + 2..])?;
    Some((
        name,
        Overload {
            receiver,
            args,
            result,
        },
    ))
}

fn parse_pattern(text: &str) -> Option<Pattern> {
    let text = text.trim();
    if let Some((kind, inner)) = text.split_once('(') {
        let params: Vec<Pattern> = split_top(inner.strip_suffix(')')?)
            .into_iter()
            .map(parse_pattern)
            .collect::<Option<_>>()?;
        return match (kind, params.as_slice()) {
            ("list", [e]) => Some(Pattern::List(Box::new(e.clone()))),
            ("optional_type", [e]) => Some(Pattern::Optional(Box::new(e.clone()))),
            ("map", [k, v]) => Some(Pattern::Map(Box::new(k.clone()), Box::new(v.clone()))),
            _ => None,
        };
    }
    Some(match text {
        "A" | "B" | "C" => Pattern::Param(text.chars().next()?),
        "dyn" => Pattern::Exactly(Ty::Dyn),
        "bool" => Pattern::Exactly(Ty::Bool),
        "int" => Pattern::Exactly(Ty::Int),
        "uint" => Pattern::Exactly(Ty::Uint),
        "double" => Pattern::Exactly(Ty::Double),
        "string" => Pattern::Exactly(Ty::String),
        "bytes" => Pattern::Exactly(Ty::Bytes),
        "type" => Pattern::Exactly(Ty::Type),
        "google.protobuf.Duration" => Pattern::Exactly(Ty::Duration),
        "google.protobuf.Timestamp" => Pattern::Exactly(Ty::Timestamp),
        other => Pattern::Exactly(Ty::Opaque(other.to_string())),
    })
}

/// `int, list(map(int, dyn))` → `["int", "list(map(int, dyn))"]`.
fn split_top(params: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in params.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(params[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(params[start..].trim());
    out
}

/// Type parameters bound while matching one overload.
#[derive(Default)]
struct TypeBindings {
    params: HashMap<char, Ty>,
    /// Parameters bound by a value of unknown type.
    unknown: HashSet<char>,
}

fn matches(pattern: &Pattern, ty: &Ty, bound: &mut TypeBindings) -> bool {
    match (pattern, ty) {
        // A parameter inside a pattern that a value of unknown type matched stays unknown:
        // `x.orValue(1)` on such an `x` is no more an `int` than `x` is an `optional(int)`.
        (Pattern::Param(name), _) if bound.unknown.contains(name) => true,
        // First, so that a declared `dyn` binds its parameter (and makes it `dyn`).
        (Pattern::Param(name), t) => match bound.params.get(name) {
            Some(previous) if !previous.agrees(t) => false,
            Some(previous) => {
                let narrower = previous.clone().narrower(t.clone());
                bound.params.insert(*name, narrower);
                true
            }
            None => {
                bound.params.insert(*name, t.clone());
                true
            }
        },
        (_, Ty::Dyn) => {
            for name in pattern.params() {
                bound.unknown.insert(name);
                bound.params.insert(name, Ty::Dyn);
            }
            true
        }
        (_, Ty::DeclaredDyn) => {
            // What the parameters inside the pattern stand for is `dyn` too.
            for name in pattern.params() {
                matches(&Pattern::Param(name), ty, bound);
            }
            true
        }
        (Pattern::Exactly(Ty::Dyn), _) => true,
        (Pattern::Exactly(Ty::List(e)), Ty::Pair(..)) => **e == Ty::Dyn,
        (Pattern::Exactly(p), t) => p.agrees(t),
        (Pattern::List(e), Ty::List(t)) => matches(e, t, bound),
        (Pattern::List(e), Ty::Pair(..)) => matches(e, &Ty::Dyn, bound),
        (Pattern::Optional(e), Ty::Optional(t)) => matches(e, t, bound),
        (Pattern::Map(k, v), Ty::Map(tk, tv)) => matches(k, tk, bound) && matches(v, tv, bound),
        _ => false,
    }
}

impl Pattern {
    /// The type parameters in the pattern.
    fn params(&self) -> Vec<char> {
        match self {
            Pattern::Exactly(_) => Vec::new(),
            Pattern::Param(name) => vec![*name],
            Pattern::List(e) | Pattern::Optional(e) => e.params(),
            Pattern::Map(k, v) => [k.params(), v.params()].concat(),
        }
    }
}

fn result_of(pattern: &Pattern, bound: &TypeBindings) -> Ty {
    match pattern {
        Pattern::Exactly(t) => t.clone(),
        Pattern::Param(name) => bound.params.get(name).cloned().unwrap_or(Ty::Dyn),
        Pattern::List(e) => Ty::List(Box::new(result_of(e, bound))),
        Pattern::Map(k, v) => Ty::Map(Box::new(result_of(k, bound)), Box::new(result_of(v, bound))),
        Pattern::Optional(e) => Ty::Optional(Box::new(result_of(e, bound))),
    }
}

/// The type a field declared as `written` (a type as [`SIGNATURES`] writes it) holds.
pub(super) fn declared_type(written: &str) -> Option<Ty> {
    parse_pattern(written).map(|pattern| result_of(&pattern, &TypeBindings::default()))
}

/// The results of those of `overloads` that accept `receiver` and `args`; `None` when none
/// takes that many arguments, with or without a receiver.
pub(super) fn results(
    overloads: &[Overload],
    receiver: Option<&Ty>,
    args: &[Ty],
) -> Option<Vec<Ty>> {
    let candidates: Vec<&Overload> = overloads
        .iter()
        .filter(|o| o.receiver.is_some() == receiver.is_some() && o.args.len() == args.len())
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let mut results = Vec::new();
    for overload in candidates {
        let mut bound = TypeBindings::default();
        let receiver_fits = match (&overload.receiver, receiver) {
            (Some(p), Some(t)) => matches(p, t, &mut bound),
            _ => true,
        };
        if receiver_fits
            && overload
                .args
                .iter()
                .zip(args)
                .all(|(p, t)| matches(p, t, &mut bound))
        {
            results.push(result_of(&overload.result, &bound));
        }
    }
    Some(results)
}
