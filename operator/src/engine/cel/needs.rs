//! What expressions read of each variable, so that only that is converted to CEL.
//!
//! What it saves (`cargo bench -p gatehouse --bench engine`, "needs"): evaluating the bench's five
//! validations over a 10-container Pod, 64.5 against 225.3 µs when the whole Pod is converted,
//! 3.49x faster; 32 µs per validation, 60 % of a single-Policy review.
use std::collections::BTreeMap;

use ::cel::Program;

use super::scope::{self, Root, Visitor};

/// What expressions read of one JSON variable, found by walking their AST ([`Needs::of`]): the
/// conversion to CEL ([`to_val_pruned`](super::to_val_pruned)) then skips the rest, which no evaluation can observe.
///
/// A variable reached only through constant field selections (`element.image`,
/// `has(c.resources.limits)`) and as the range of one-variable comprehensions needs only those
/// fields and elements; any other use (the bare variable, an index, an optional selection) needs
/// the whole value. Selecting a field keeps the key exactly when the JSON has it, so a missing
/// key fails with the same error, and a value that is not an object is always converted whole,
/// so a selection on it fails the same way.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Need {
    /// The whole value: everything below is ignored.
    pub(super) full: bool,
    /// Fields selected on the value, when it is an object.
    pub(super) fields: BTreeMap<String, Need>,
    /// What a comprehension reads of each element, when the value is a list it iterates.
    pub(super) elements: Option<Box<Need>>,
}

impl Need {
    pub(super) fn full() -> Self {
        Need {
            full: true,
            ..Need::default()
        }
    }

    /// Only tested with `has()` by its parent: its value is never read.
    pub(super) fn presence_only(&self) -> bool {
        !self.full && self.fields.is_empty() && self.elements.is_none()
    }

    fn merge(&mut self, other: Need) {
        if self.full {
            return;
        }
        if other.full {
            *self = Need::full();
            return;
        }
        for (field, need) in other.fields {
            self.fields.entry(field).or_default().merge(need);
        }
        if let Some(elements) = other.elements {
            match &mut self.elements {
                Some(mine) => mine.merge(*elements),
                None => self.elements = Some(elements),
            }
        }
    }

    /// The need at `path` below this one, created on the way.
    fn at(&mut self, path: &[&str]) -> &mut Need {
        path.iter().fold(self, |need, field| {
            need.fields.entry((*field).to_string()).or_default()
        })
    }
}

/// What a set of programs reads of each variable; `None` for a variable none of them references.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Needs {
    pub(super) object: Option<Need>,
    pub(super) old_object: Option<Need>,
    pub(super) request: Option<Need>,
    element: Option<Need>,
}

/// The variables [`Needs`] tracks, in slot order.
const TRACKED: [&str; 4] = ["object", "oldObject", "request", "element"];

impl Needs {
    /// What `program` reads of `object`, `oldObject`, `request` and `element`.
    pub fn of(program: &Program) -> Needs {
        let mut walk = NeedWalk {
            slots: vec![None; TRACKED.len()],
        };
        scope::walk(program.expression(), &mut walk);
        let mut slots = walk.slots.into_iter();
        let mut next = || slots.next().flatten();
        Needs {
            object: next(),
            old_object: next(),
            request: next(),
            element: next(),
        }
    }

    /// What any of `programs` reads.
    pub fn union<'p>(programs: impl IntoIterator<Item = &'p Program>) -> Needs {
        let mut all = Needs::default();
        for program in programs {
            all.merge(Needs::of(program));
        }
        all
    }

    fn merge(&mut self, other: Needs) {
        fn one(mine: &mut Option<Need>, other: Option<Need>) {
            match (mine.as_mut(), other) {
                (Some(m), Some(o)) => m.merge(o),
                (None, o @ Some(_)) => *mine = o,
                (_, None) => {}
            }
        }
        one(&mut self.object, other.object);
        one(&mut self.old_object, other.old_object);
        one(&mut self.request, other.request);
        one(&mut self.element, other.element);
    }

    /// Whether the programs reference `request` at all: when not, the caller need not build it.
    pub fn reads_request(&self) -> bool {
        self.request.is_some()
    }

    /// Whether the programs reference `object` at all.
    pub fn reads_object(&self) -> bool {
        self.object.is_some()
    }

    /// What the programs read of `element`; `None` when they do not reference it.
    pub fn element(&self) -> Option<&Need> {
        self.element.as_ref()
    }
}

/// The [`Visitor`] of [`Needs::of`]: a binding is the slot of a comprehension variable that
/// iterates a tracked path.
struct NeedWalk {
    /// The [`TRACKED`] variables, then one slot per comprehension taken.
    slots: Vec<Option<Need>>,
}

impl NeedWalk {
    /// The slot `root` reads, if tracked. A leading-dot name skips the comprehension scopes:
    /// not worth modelling, so all of it is needed.
    fn slot(&mut self, root: Root<'_, '_, usize>) -> Option<usize> {
        match root {
            Root::Free(name) => TRACKED.iter().position(|t| *t == name),
            Root::Bound(slot) => slot.copied(),
            Root::Absolute(name) => {
                if let Some(i) = TRACKED
                    .iter()
                    .position(|t| Some(*t) == name.strip_prefix('.'))
                {
                    self.slots[i] = Some(Need::full());
                }
                None
            }
        }
    }

    /// Records that `need` is read at `path` of `root`.
    fn record(&mut self, root: Root<'_, '_, usize>, path: &[&str], need: Need) {
        if let Some(i) = self.slot(root) {
            self.slots[i].get_or_insert_default().at(path).merge(need);
        }
    }
}

impl<'e> Visitor<'e> for NeedWalk {
    type Binding = usize;

    fn read(&mut self, root: Root<'_, 'e, usize>, path: &[&'e str], whole: bool) {
        let need = if whole { Need::full() } else { Need::default() };
        self.record(root, path, need);
    }

    fn enter_range(&mut self, root: Root<'_, 'e, usize>, _: &[&'e str]) -> Option<usize> {
        // Only a tracked range: the elements of anything else are needed whole anyway.
        self.slot(root).map(|_| {
            self.slots.push(None);
            self.slots.len() - 1
        })
    }

    fn leave_range(&mut self, root: Root<'_, 'e, usize>, path: &[&'e str], slot: usize) {
        // An unused element still counts: the comprehension iterates every one.
        let elements = self.slots[slot].take().unwrap_or_default();
        let need = Need {
            elements: Some(Box::new(elements)),
            ..Need::default()
        };
        self.record(root, path, need);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cel::{Activation, compile, eval_bool, to_val, to_val_pruned};
    use serde_json::json;

    #[test]
    fn pruned_conversion_evaluates_like_the_whole_value() {
        let objects = [
            json!({"spec": {"containers": [
                {"name": "a", "image": "x:1", "resources": {"limits": {"cpu": 1}}, "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "registry.internal/y", "resources": null},
                "not-an-object",
                {"name": "c", "securityContext": {"runAsNonRoot": true}}
            ]}, "metadata": {"labels": {"tier": "web"}, "name": "n"}}),
            json!({"spec": {"containers": {"a": {"image": "x"}}}, "metadata": "s"}),
            json!({"spec": "nope"}),
            json!({"spec": {"containers": []}}),
            json!([1, 2]),
            json!(null),
        ];
        let sources = [
            "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))",
            "object.spec.containers.all(c, c.image.contains(':'))",
            "object.spec.containers.exists(c, !has(c.ports) || c.ports.all(p, p.containerPort > 1024))",
            "object.spec.containers.exists_one(c, true)",
            "object.spec.containers.filter(c, has(c.name)).size() == 2",
            "object.spec.containers.map(c, c.name).size() > 0",
            "size(object.spec.containers) == 4",
            "object.spec.containers.all(i, c, true)",
            "object.spec.containers.all(i, c, i > 1 || has(c.name))",
            "object.metadata.labels.exists(k, v, k == 'tier' && v == 'web')",
            "object.spec.containers.transformList(i, c, i).size() == 4",
            "object.spec.containers.all(i, c, i == 2 || c.image.size() > 0)",
            "object.metadata.labels.tier in ['web', 'worker']",
            "has(object.metadata.name) && object.metadata.labels.all(k, k == 'tier')",
            "object.metadata == {'labels': {'tier': 'web'}, 'name': 'n'}",
            "[object.spec].all(s, has(s.containers))",
            "object.spec.containers.all(object, has(object.name))",
            ".object.metadata.name == 'n'",
            "object.?spec.hasValue()",
            "object['spec'].containers.size() == 4",
            "type(object.spec) == map",
            "object.spec.containers[0].image == 'x:1'",
            "element.image.startsWith('registry.internal/')",
            "!has(element.securityContext.runAsNonRoot)",
            "element.resources.limits.cpu == 1",
            "has(element.resources)",
            "object.spec",
        ];
        let request = json!({"namespace": "shop"});
        for source in sources {
            let program = compile(source).unwrap();
            let needs = Needs::of(&program);
            for object in &objects {
                let full = Activation::new(Some(object), None, &request);
                let pruned = Activation::with_needs(Some(object), None, &request, &needs);
                assert_eq!(
                    eval_bool(&program, &pruned),
                    eval_bool(&program, &full),
                    "{source} on {object}"
                );
                for element in object
                    .pointer("/spec/containers")
                    .into_iter()
                    .flat_map(|c| c.as_array().into_iter().flatten())
                {
                    assert_eq!(
                        eval_bool(
                            &program,
                            &pruned.with_element_need(element, needs.element())
                        ),
                        eval_bool(&program, &full.with_element(element)),
                        "{source} on element {element}"
                    );
                }
            }
        }
    }

    #[test]
    fn needs_keep_only_what_is_read() {
        let needs = |src: &str| Needs::of(&compile(src).unwrap());
        let n = needs("object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))");
        let object = json!({"metadata": {"name": "x"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": 1}, "requests": {}}}, {"name": "b"}]}});
        let pruned = to_val_pruned(&object, n.object.as_ref().unwrap());
        let expected = json!({"spec": {"containers": [{"resources": {"limits": null}}, {}]}});
        assert!(pruned.equals(to_val(&expected).as_ref()), "{pruned:?}");
        assert!(!n.reads_request() && n.element().is_none());
        let n = needs("!element.image.startsWith('registry.internal/')");
        assert!(n.object.is_none());
        let element = json!({"name": "a", "image": "x", "env": [{"name": "A"}]});
        let pruned = to_val_pruned(&element, n.element().unwrap());
        assert!(pruned.equals(to_val(&json!({"image": "x"})).as_ref()));
        assert_eq!(
            needs("object.spec == {}").object,
            Some(Need {
                fields: [("spec".to_string(), Need::full())].into(),
                ..Need::default()
            })
        );
        assert_eq!(needs("size(object) > 0").object, Some(Need::full()));
        assert_eq!(needs(".object.x == 1").object, Some(Need::full()));
        assert!(needs("request.namespace == 'a'").reads_request());
    }
}
