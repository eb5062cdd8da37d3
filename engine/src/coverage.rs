//! Which requests a shared webhook entry must be called for: the union of its members' rules,
//! namespaceSelectors and objectSelectors, kept exact.
//!
//! Gatehouse matches every member itself, so an entry only has to *cover* its members. But the
//! API server calls an entry — and, when Gatehouse is unreachable, fails a `Fail` entry's
//! requests — for everything the entry's own rules and selectors select. If an entry selected
//! more than its members do, an outage would refuse requests no Policy applies to. So members
//! share an entry only when the union of their coverages is one that rules and two label
//! selectors express **exactly** ([`Coverage::union`]):
//!
//! * one coverage contains the other: the union is the larger one;
//! * the same selectors: the rules are listed together (rules × selectors distributes);
//! * the same rules and one selector in common: the other selectors' union, when one selector
//!   says it exactly (one contains the other, or they differ in one key's `In` values only).
//!
//! Containment is decided syntactically ([`Selector::contains`], [`rules_cover`]): it may miss
//! that one coverage contains another (then they get two entries), never claim it wrongly.
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use gatehouse_api::v1alpha1::{Operation, PolicySpec, Rule, Scope};

/// The requests an entry is called for: any of `rules`, in a namespace `namespaces` selects,
/// for an object `objects` selects.
#[derive(Clone, Debug, PartialEq)]
pub struct Coverage {
    rules: Vec<Rule>,
    namespaces: Selector,
    objects: Selector,
}

impl Coverage {
    /// What one Policy's `match` selects, conditions left out (the API server never sees a
    /// shared entry's conditions; Gatehouse evaluates them).
    pub fn of(spec: &PolicySpec) -> Self {
        Self {
            rules: spec.match_.rules.clone(),
            namespaces: Selector::of(spec.match_.namespace_selector.as_ref()),
            objects: Selector::of(spec.match_.object_selector.as_ref()),
        }
    }

    /// The exact union of the given Policies' coverages where there is one; otherwise one that
    /// covers them all (the same rules, with each selector the exact union or everything).
    pub fn of_members<'a>(specs: impl IntoIterator<Item = &'a PolicySpec>) -> Self {
        let mut specs = specs.into_iter();
        let Some(first) = specs.next() else {
            return Self::everything_of(Vec::new());
        };
        specs.fold(Self::of(first), |acc, spec| {
            let next = Self::of(spec);
            acc.union(&next).unwrap_or_else(|| acc.covering(&next))
        })
    }

    fn everything_of(rules: Vec<Rule>) -> Self {
        Self {
            rules,
            namespaces: Selector::default(),
            objects: Selector::default(),
        }
    }

    /// The entry's namespaceSelector (before the system exclusion is ANDed in); `None` selects
    /// every namespace.
    pub fn namespace_selector(&self) -> Option<LabelSelector> {
        self.namespaces.to_label_selector()
    }

    /// The entry's objectSelector; `None` selects every object.
    pub fn object_selector(&self) -> Option<LabelSelector> {
        self.objects.to_label_selector()
    }

    /// Whether every request `other` selects, `self` selects too.
    pub fn contains(&self, other: &Coverage) -> bool {
        rules_cover(&self.rules, &other.rules)
            && self.namespaces.contains(&other.namespaces)
            && self.objects.contains(&other.objects)
    }

    /// Whether no request can be selected by both: their rules share no operation, scope and
    /// resource, or every request both rules select is namespaced (not a Namespace) and no
    /// namespace's labels satisfy both namespaceSelectors. Object selectors are not weighed:
    /// a mutation may change the labels they read before the other is matched.
    ///
    /// Decided syntactically, like [`Coverage::contains`]: it may miss a disjointness, never
    /// claim one wrongly.
    pub fn disjoint(&self, other: &Coverage) -> bool {
        let meeting: Vec<(&Rule, &Rule)> = self
            .rules
            .iter()
            .flat_map(|a| other.rules.iter().map(move |b| (a, b)))
            .filter(|(a, b)| rules_meet(a, b))
            .collect();
        meeting.is_empty()
            || (meeting.iter().all(|(a, b)| only_namespaced(a, b))
                && self.namespaces.disjoint(&other.namespaces))
    }

    /// The coverage that selects exactly what `self` or `other` selects, if rules and two
    /// selectors can say it (see the module documentation).
    pub fn union(&self, other: &Coverage) -> Option<Coverage> {
        if self.contains(other) {
            return Some(self.clone());
        }
        if other.contains(self) {
            return Some(other.clone());
        }
        if self.namespaces == other.namespaces && self.objects == other.objects {
            let mut rules = self.rules.clone();
            rules.extend(other.rules.iter().cloned());
            return Some(Self {
                rules,
                ..self.clone()
            });
        }
        let same_rules =
            rules_cover(&self.rules, &other.rules) && rules_cover(&other.rules, &self.rules);
        if !same_rules {
            return None;
        }
        if self.namespaces == other.namespaces {
            let objects = self.objects.union(&other.objects)?;
            return Some(Self {
                objects,
                ..self.clone()
            });
        }
        if self.objects == other.objects {
            let namespaces = self.namespaces.union(&other.namespaces)?;
            return Some(Self {
                namespaces,
                ..self.clone()
            });
        }
        None
    }

    /// A coverage of both, not necessarily exact: for a membership that was not formed by
    /// [`Coverage::union`] (never the case for [`super::group::groups`]).
    fn covering(&self, other: &Coverage) -> Coverage {
        let mut rules = self.rules.clone();
        rules.extend(other.rules.iter().cloned());
        Self {
            rules,
            namespaces: self.namespaces.union(&other.namespaces).unwrap_or_default(),
            objects: self.objects.union(&other.objects).unwrap_or_default(),
        }
    }
}

/// A label selector in a canonical form: `matchLabels` as `In` requirements of one value,
/// requirements sorted and deduplicated, values sorted and deduplicated. Two selectors with the
/// same form select the same label sets; the empty one selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Requirement {
    key: String,
    operator: String,
    values: Vec<String>,
}

const IN: &str = "In";
const NOT_IN: &str = "NotIn";
const EXISTS: &str = "Exists";
const DOES_NOT_EXIST: &str = "DoesNotExist";

impl Requirement {
    fn new(key: &str, operator: &str, values: &[String]) -> Self {
        let mut values = values.to_vec();
        values.sort();
        values.dedup();
        Self {
            key: key.to_string(),
            operator: operator.to_string(),
            values,
        }
    }

    /// Whether every label set `self` selects, `other` selects too.
    fn implies(&self, other: &Requirement) -> bool {
        if self == other {
            return true;
        }
        if self.key != other.key {
            return false;
        }
        let subset = |a: &[String], b: &[String]| a.iter().all(|v| b.contains(v));
        match (self.operator.as_str(), other.operator.as_str()) {
            (IN, IN) => subset(&self.values, &other.values),
            (IN, EXISTS) => !self.values.is_empty(),
            (IN, NOT_IN) => !self.values.iter().any(|v| other.values.contains(v)),
            (NOT_IN, NOT_IN) => subset(&other.values, &self.values),
            (DOES_NOT_EXIST, NOT_IN) => true,
            _ => false,
        }
    }
}

impl Requirement {
    /// Whether no label set satisfies both `self` and `other`.
    fn excludes(&self, other: &Requirement) -> bool {
        if self.key != other.key {
            return false;
        }
        let shared = |a: &[String], b: &[String]| a.iter().any(|v| b.contains(v));
        let within = |a: &[String], b: &[String]| a.iter().all(|v| b.contains(v));
        match (self.operator.as_str(), other.operator.as_str()) {
            (IN, IN) => !shared(&self.values, &other.values),
            (IN, NOT_IN) => within(&self.values, &other.values),
            (NOT_IN, IN) => within(&other.values, &self.values),
            (IN | EXISTS, DOES_NOT_EXIST) | (DOES_NOT_EXIST, IN | EXISTS) => true,
            _ => false,
        }
    }
}

impl Selector {
    pub fn of(selector: Option<&LabelSelector>) -> Self {
        let Some(selector) = selector else {
            return Self::default();
        };
        let labels = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::new(k, IN, std::slice::from_ref(v)));
        let expressions = selector.match_expressions.iter().flatten().map(|r| {
            Requirement::new(&r.key, &r.operator, r.values.as_deref().unwrap_or_default())
        });
        let mut requirements: Vec<Requirement> = labels.chain(expressions).collect();
        requirements.sort();
        requirements.dedup();
        Self { requirements }
    }

    /// Whether every label set `other` selects, `self` selects too: each of `self`'s
    /// requirements follows from one of `other`'s.
    pub fn contains(&self, other: &Selector) -> bool {
        self.requirements
            .iter()
            .all(|mine| other.requirements.iter().any(|theirs| theirs.implies(mine)))
    }

    /// Whether no label set satisfies both: one key has requirements that exclude each
    /// other.
    pub fn disjoint(&self, other: &Selector) -> bool {
        self.requirements.iter().any(|mine| {
            other
                .requirements
                .iter()
                .any(|theirs| mine.excludes(theirs))
        })
    }

    /// The selector that selects exactly what `self` or `other` selects, when one of them
    /// contains the other or they differ in one key's `In` values only.
    pub fn union(&self, other: &Selector) -> Option<Selector> {
        if self.contains(other) {
            return Some(self.clone());
        }
        if other.contains(self) {
            return Some(other.clone());
        }
        let only_in = |a: &Selector, b: &Selector| -> Vec<Requirement> {
            a.requirements
                .iter()
                .filter(|r| !b.requirements.contains(r))
                .cloned()
                .collect()
        };
        let (mine, theirs) = (only_in(self, other), only_in(other, self));
        match (mine.as_slice(), theirs.as_slice()) {
            ([a], [b]) if a.key == b.key && a.operator == IN && b.operator == IN => {
                let mut values = a.values.clone();
                values.extend(b.values.iter().cloned());
                let merged = Requirement::new(&a.key, IN, &values);
                let mut requirements: Vec<Requirement> = self
                    .requirements
                    .iter()
                    .filter(|r| *r != a)
                    .cloned()
                    .chain(std::iter::once(merged))
                    .collect();
                requirements.sort();
                Some(Self { requirements })
            }
            _ => None,
        }
    }

    /// As a webhook entry carries it: `In` of one value as `matchLabels` where its key has no
    /// other requirement, the rest as `matchExpressions`; `None` for the empty selector.
    pub fn to_label_selector(&self) -> Option<LabelSelector> {
        if self.requirements.is_empty() {
            return None;
        }
        let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &self.requirements {
            *per_key.entry(r.key.as_str()).or_default() += 1;
        }
        let mut labels = BTreeMap::new();
        let mut expressions = Vec::new();
        for r in &self.requirements {
            if r.operator == IN && r.values.len() == 1 && per_key[r.key.as_str()] == 1 {
                labels.insert(r.key.clone(), r.values[0].clone());
            } else {
                expressions.push(LabelSelectorRequirement {
                    key: r.key.clone(),
                    operator: r.operator.clone(),
                    values: match r.operator.as_str() {
                        EXISTS | DOES_NOT_EXIST => None,
                        _ => Some(r.values.clone()),
                    },
                });
            }
        }
        Some(LabelSelector {
            match_labels: (!labels.is_empty()).then_some(labels),
            match_expressions: (!expressions.is_empty()).then_some(expressions),
        })
    }
}

/// Whether every request one of `inner` matches, one of `outer` matches too (each inner rule
/// inside one outer rule).
pub fn rules_cover(outer: &[Rule], inner: &[Rule]) -> bool {
    inner
        .iter()
        .all(|r| outer.iter().any(|o| rule_contains(o, r)))
}

fn rule_contains(outer: &Rule, inner: &Rule) -> bool {
    let listed = |outer: &[String], inner: &[String]| {
        outer.iter().any(|o| o == "*") || inner.iter().all(|i| outer.contains(i))
    };
    let operations = outer.operations.contains(&Operation::All)
        || inner
            .operations
            .iter()
            .all(|op| *op != Operation::All && outer.operations.contains(op));
    let scope = outer.scope == Scope::All || outer.scope == inner.scope;
    operations
        && scope
        && listed(&outer.api_groups, &inner.api_groups)
        && listed(&outer.api_versions, &inner.api_versions)
        && inner
            .resources
            .iter()
            .all(|r| outer.resources.iter().any(|o| resource_contains(o, r)))
}

/// Whether one request can match both rules. Groups and versions are not weighed: with
/// `matchPolicy: Equivalent` a rule also matches a request for another group or version of the
/// same resource.
fn rules_meet(a: &Rule, b: &Rule) -> bool {
    let operations = a.operations.iter().any(|x| {
        b.operations
            .iter()
            .any(|y| x == y || *x == Operation::All || *y == Operation::All)
    });
    let scope = a.scope == Scope::All || b.scope == Scope::All || a.scope == b.scope;
    let resources = a
        .resources
        .iter()
        .any(|x| b.resources.iter().any(|y| resources_meet(x, y)));
    operations && scope && resources
}

/// Whether one resource (or subresource) matches both patterns ([`resource_contains`] reads
/// them).
fn resources_meet(a: &str, b: &str) -> bool {
    if a == "*/*" || b == "*/*" {
        return true;
    }
    let split = |p: &str| match p.split_once('/') {
        Some((resource, sub)) => (resource.to_string(), Some(sub.to_string())),
        None => (p.to_string(), None),
    };
    let ((ra, sa), (rb, sb)) = (split(a), split(b));
    let resource = ra == "*" || rb == "*" || ra == rb;
    let sub = match (sa.as_deref(), sb.as_deref()) {
        (None, None) => true,
        (Some(x), Some(y)) => x == "*" || y == "*" || x == y,
        _ => false,
    };
    resource && sub
}

/// Resources of the built-in groups known to be namespaced: a request for them is never for a
/// Namespace or another cluster-scoped object (which a namespaceSelector would not narrow).
const NAMESPACED_BUILT_INS: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "pods",
            "configmaps",
            "secrets",
            "services",
            "serviceaccounts",
            "persistentvolumeclaims",
            "endpoints",
            "events",
            "limitranges",
            "resourcequotas",
            "replicationcontrollers",
            "podtemplates",
        ],
    ),
    (
        "apps",
        &[
            "deployments",
            "statefulsets",
            "daemonsets",
            "replicasets",
            "controllerrevisions",
        ],
    ),
    ("batch", &["jobs", "cronjobs"]),
];

/// Whether every request both rules match is for a namespaced object: one of them matches
/// namespaced objects only, or names built-in namespaced resources only.
fn only_namespaced(a: &Rule, b: &Rule) -> bool {
    let built_in = |r: &Rule| {
        r.api_groups.iter().all(|g| {
            NAMESPACED_BUILT_INS.iter().any(|(group, resources)| {
                group == g
                    && r.resources.iter().all(|res| {
                        let resource = res.split('/').next().unwrap_or_default();
                        resources.contains(&resource)
                    })
            })
        })
    };
    [a, b]
        .iter()
        .any(|r| r.scope == Scope::Namespaced || built_in(r))
}

/// Resource patterns as the API server reads them: `*` is every resource but no subresource,
/// `*/*` everything, `pods/*` every subresource of pods, `*/scale` every scale subresource.
fn resource_contains(outer: &str, inner: &str) -> bool {
    if outer == inner || outer == "*/*" {
        return true;
    }
    let (inner_resource, inner_sub) = match inner.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (inner, None),
    };
    match outer.split_once('/') {
        None => outer == "*" && inner_sub.is_none(),
        Some((resource, "*")) => inner_resource == resource && inner_sub.is_some(),
        Some(("*", sub)) => inner_sub == Some(sub),
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests;
