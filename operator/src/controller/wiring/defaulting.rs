//! Where the API server's defaulting between mutations can change what a merge does.
//!
//! The webhook path runs a chain of merges on one copy of the object, and the API server
//! defaults the result once. A MutatingAdmissionPolicy's mutations are defaulted one by one:
//! an element a mutation appends (a container, a volume, an env var) gets its defaults
//! (`imagePullPolicy`, `terminationMessagePath`, …) before the next mutation runs. A later
//! merge that sets a field only when absent, or a guard that reads the element, may then see a
//! default the webhook path's merge never saw, and store something else.
//!
//! Which fields have defaults is the schema's business, so this is conservative: every element
//! a merge may append to an array of objects (and all below it) counts as defaulted, and a later
//! mutation that reads or writes anything there interacts — even an overwrite, since some
//! defaults are copied from other fields (a container's `resources.requests` from its limits)
//! and would keep the value from before it. The same holds for a struct a merge may create (a
//! container's `livenessProbe` gets `periodSeconds`): which keys are structs that may be absent
//! only the schema says, so the caller adds those to [`Footprint::appends`]
//! (`controller::wiring::schema_fit`). Maps of scalars have no defaults.
use serde_json::Value;

use gatehouse_api::v1alpha1::Mutation;
use gatehouse_cel as cel;

/// A place in the object: keys, with `[]` for "any element of this array".
pub type Path = Vec<String>;

/// The key standing for "any element of this array".
pub const ELEMENT: &str = "[]";

/// What one mutation may append and what it reads or sets only when absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Elements it may append to a named array, and structs it may create: defaulted before the
    /// next mutation.
    pub appends: Vec<Path>,
    /// Every field it writes (or sets only when absent).
    pub writes: Vec<Path>,
    /// What it reads to decide: the array of a `forEach` and, with a guard, its elements (or
    /// the whole object, for a guard reading `object` or outside `forEach`).
    pub guards: Vec<Path>,
    /// A `forEach` whose guard reads the object: one pass may not settle even alone.
    pub self_dependent: bool,
}

fn path_of(dotted: &str) -> Path {
    dotted.split('.').map(str::to_string).collect()
}

/// The footprint of `mutation`.
pub fn footprint(mutation: &Mutation) -> Footprint {
    let mut fp = Footprint::default();
    // A guard that reads `object` reads everything; one that reads only `element` reads the
    // elements of its array.
    let reads_object = mutation.when.as_deref().is_some_and(|w| {
        cel::compile(w).map_or(true, |program| cel::reads_variable(&program, "object"))
    });
    let base = match &mutation.for_each {
        Some(p) => {
            let array = path_of(p);
            let mut base = array.clone();
            base.push(ELEMENT.to_string());
            // Which elements there are is read whatever the guard.
            fp.guards.push(array);
            if reads_object {
                fp.guards.push(Vec::new());
                // Its merges into some elements may change its guard on others.
                fp.self_dependent = true;
            } else if mutation.when.is_some() {
                fp.guards.push(base.clone());
            }
            base
        }
        None => {
            if mutation.when.is_some() {
                fp.guards.push(Vec::new());
            }
            Vec::new()
        }
    };
    if let Value::Object(patch) = &mutation.merge {
        walk(&base, patch, &mut fp);
    }
    fp
}

fn walk(at: &Path, patch: &serde_json::Map<String, Value>, fp: &mut Footprint) {
    for (key, value) in patch {
        let mut here = at.clone();
        here.push(key.clone());
        match value {
            Value::Object(inner) => walk(&here, inner, fp),
            // Elements appended to a named array, or an array of objects set whole: defaulted.
            Value::Array(items) if items.iter().any(Value::is_object) => {
                let mut element = here.clone();
                element.push(ELEMENT.to_string());
                fp.appends.push(element.clone());
                for item in items {
                    if let Value::Object(fields) = item {
                        let rest: serde_json::Map<String, Value> = fields
                            .iter()
                            .filter(|(k, _)| k.as_str() != "name")
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        walk(&element, &rest, fp);
                    }
                }
            }
            _ => fp.writes.push(here),
        }
    }
}

/// Whether one path lies within the other (or they are equal).
fn nested(a: &Path, b: &Path) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// Whether `later` may read or write something `earlier` appends: then the API server's defaulting
/// between them can change what `later` does.
pub fn interacts(earlier: &Footprint, later: &Footprint) -> bool {
    earlier.appends.iter().any(|a| {
        later
            .writes
            .iter()
            .chain(&later.guards)
            .any(|r| nested(a, r))
    })
}

/// Whether one pass of `list` is its fixed point: no guard reads what another mutation writes
/// or appends. (Mutations that interact through appends are refused before this is asked.)
/// Without guards, each merge does the same whatever the others did before it, and a merge
/// applied twice changes nothing the second time.
pub fn settles_in_one_pass(list: &[Footprint]) -> bool {
    if list.iter().any(|fp| fp.self_dependent) {
        return false;
    }
    list.iter().enumerate().all(|(i, guarded)| {
        list.iter().enumerate().all(|(j, writer)| {
            i == j
                || !guarded.guards.iter().any(|g| {
                    writer
                        .writes
                        .iter()
                        .chain(&writer.appends)
                        .any(|w| nested(g, w))
                })
        })
    })
}

/// The root every object holds: ops under it never create it (a custom resource may lack
/// `spec`).
const ALWAYS_PRESENT: [&str; 1] = ["metadata"];

/// Whether the ops of `list`, each computed on the same object, may be applied together with
/// the result of applying the mutations one after the other: one pass settles it and no two
/// mutations write below a common place that may be absent (where each would add it whole, the
/// second add replacing the first).
pub fn independent(list: &[Footprint]) -> bool {
    if !settles_in_one_pass(list) {
        return false;
    }
    let places =
        |fp: &Footprint| -> Vec<Path> { fp.writes.iter().chain(&fp.appends).cloned().collect() };
    list.iter().enumerate().all(|(i, a)| {
        list.iter().enumerate().skip(i + 1).all(|(_, b)| {
            places(a).iter().all(|x| {
                places(b).iter().all(|y| {
                    let common = x.iter().zip(y).take_while(|(p, q)| p == q).count();
                    common == 0
                        || (common == 1
                            && x.len() > 1
                            && y.len() > 1
                            && ALWAYS_PRESENT.contains(&x[0].as_str()))
                })
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn m(merge: Value, for_each: Option<&str>, when: Option<&str>, overwrite: bool) -> Mutation {
        Mutation {
            for_each: for_each.map(str::to_string),
            when: when.map(str::to_string),
            merge,
            overwrite,
        }
    }

    #[test]
    fn an_appended_element_interacts_with_a_later_set_if_absent_into_its_array() {
        let sidecar = footprint(&m(
            json!({"spec": {"containers": [{"name": "side", "image": "busybox"}]}}),
            None,
            None,
            false,
        ));
        let pull = footprint(&m(
            json!({"imagePullPolicy": "IfNotPresent"}),
            Some("spec.containers"),
            None,
            false,
        ));
        assert!(interacts(&sidecar, &pull));
        // The other way round the forEach runs first and never sees the sidecar.
        assert!(!interacts(&pull, &sidecar));
        // Nor does overwriting: a default copied from the field keeps its old value.
        let forced = footprint(&m(
            json!({"resources": {"limits": {"memory": "1Gi"}}}),
            Some("spec.containers"),
            None,
            true,
        ));
        assert!(interacts(&sidecar, &forced));
        // A guard on the elements reads them whole.
        let guarded = footprint(&m(
            json!({"imagePullPolicy": "IfNotPresent"}),
            Some("spec.containers"),
            Some("element.name == 'side'"),
            true,
        ));
        assert!(interacts(&sidecar, &guarded));
    }

    #[test]
    fn a_list_settles_in_one_pass_unless_a_guard_reads_what_another_writes() {
        let labels = footprint(&m(
            json!({"metadata": {"labels": {"a": "b"}}}),
            None,
            None,
            false,
        ));
        let drop = footprint(&m(
            json!({"securityContext": {"capabilities": {"drop": ["BPF"]}}}),
            Some("spec.containers"),
            None,
            false,
        ));
        assert!(settles_in_one_pass(&[labels.clone(), drop.clone()]));
        let guarded = footprint(&m(
            json!({"securityContext": {"runAsNonRoot": true}}),
            Some("spec.containers"),
            Some("has(element.securityContext)"),
            false,
        ));
        assert!(!settles_in_one_pass(&[guarded.clone(), drop]));
        assert!(settles_in_one_pass(&[guarded, labels]));
    }

    #[test]
    fn mutations_writing_apart_are_independent() {
        let labels = footprint(&m(
            json!({"metadata": {"labels": {"a": "b"}}}),
            None,
            None,
            false,
        ));
        let annotations = footprint(&m(
            json!({"metadata": {"annotations": {"c": "d"}}}),
            None,
            None,
            false,
        ));
        let more_labels = footprint(&m(
            json!({"metadata": {"labels": {"e": "f"}}}),
            None,
            None,
            false,
        ));
        let drop = footprint(&m(
            json!({"securityContext": {"capabilities": {"drop": ["BPF"]}}}),
            Some("spec.containers"),
            None,
            false,
        ));
        let data = footprint(&m(json!({"data": {"x": "1"}}), None, None, false));
        let more_data = footprint(&m(json!({"data": {"y": "1"}}), None, None, false));
        assert!(independent(&[labels.clone(), drop.clone(), annotations]));
        // Both may add metadata.labels whole, or data whole.
        assert!(!independent(&[labels, more_labels]));
        assert!(!independent(&[data, more_data]));
        let pull = footprint(&m(
            json!({"imagePullPolicy": "Always"}),
            Some("spec.containers"),
            None,
            false,
        ));
        assert!(!independent(&[drop, pull]));
    }

    #[test]
    fn maps_and_other_arrays_do_not_interact() {
        let labels = footprint(&m(
            json!({"metadata": {"labels": {"a": "b"}}}),
            None,
            None,
            false,
        ));
        let more = footprint(&m(
            json!({"metadata": {"labels": {"c": "d"}}}),
            None,
            None,
            false,
        ));
        assert!(!interacts(&labels, &more));
        let volume = footprint(&m(
            json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}),
            None,
            None,
            false,
        ));
        let pull = footprint(&m(
            json!({"imagePullPolicy": "IfNotPresent"}),
            Some("spec.containers"),
            None,
            false,
        ));
        assert!(!interacts(&volume, &pull));
        // A guard outside forEach reads the whole object.
        let guarded = footprint(&m(
            json!({"metadata": {"labels": {"x": "y"}}}),
            None,
            Some("true"),
            false,
        ));
        assert!(interacts(&volume, &guarded));
    }
}
