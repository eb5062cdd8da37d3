use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::matcher::selector_matches;

fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        match_expressions: None,
    }
}

fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }]),
    }
}

fn selector(s: &LabelSelector) -> Selector {
    Selector::of(Some(s))
}

fn rule(operations: &[Operation], resources: &[&str]) -> Rule {
    Rule {
        operations: operations.to_vec(),
        api_groups: vec!["".into()],
        api_versions: vec!["v1".into()],
        resources: resources.iter().map(|r| r.to_string()).collect(),
        scope: Scope::Namespaced,
    }
}

fn coverage(
    rules: Vec<Rule>,
    namespaces: Option<&LabelSelector>,
    objects: Option<&LabelSelector>,
) -> Coverage {
    Coverage {
        rules,
        namespaces: Selector::of(namespaces),
        objects: Selector::of(objects),
    }
}

#[test]
fn the_same_key_with_other_values_merges_into_one_in() {
    let a = selector(&labels(&[("team", "a")]));
    let b = selector(&expression("team", "In", &["b", "c"]));
    let union = a
        .union(&b)
        .expect("one In says it")
        .to_label_selector()
        .unwrap();
    assert_eq!(union.match_labels, None);
    let req = &union.match_expressions.unwrap()[0];
    assert_eq!((req.key.as_str(), req.operator.as_str()), ("team", "In"));
    assert_eq!(req.values.as_deref().unwrap(), ["a", "b", "c"]);
}

#[test]
fn unrelated_selectors_have_no_exact_union() {
    let team = selector(&labels(&[("team", "a")]));
    let tier = selector(&labels(&[("tier", "db")]));
    assert_eq!(team.union(&tier), None);
    let both = selector(&labels(&[("team", "a"), ("tier", "db")]));
    // {team=a, tier=db} is inside {team=a}: the union is the broader one.
    assert_eq!(team.union(&both), Some(team.clone()));
    assert!(team.contains(&both) && !both.contains(&team));
    // Everything contains everything else.
    assert!(Selector::default().contains(&both));
    assert_eq!(both.union(&Selector::default()), Some(Selector::default()));
}

#[test]
fn match_labels_and_an_in_of_one_value_are_the_same_selector() {
    assert_eq!(
        selector(&labels(&[("team", "a")])),
        selector(&expression("team", "In", &["a"]))
    );
    let rendered = selector(&expression("team", "In", &["a"]))
        .to_label_selector()
        .unwrap();
    assert_eq!(rendered, labels(&[("team", "a")]));
    assert_eq!(Selector::of(None).to_label_selector(), None);
    assert_eq!(
        Selector::of(Some(&LabelSelector::default())).to_label_selector(),
        None
    );
}

#[test]
fn resources_follow_the_api_servers_wildcards() {
    assert!(resource_contains("*", "pods"));
    assert!(!resource_contains("*", "pods/status"));
    assert!(resource_contains("*/*", "pods/status"));
    assert!(resource_contains("pods/*", "pods/status"));
    assert!(!resource_contains("pods/*", "pods"));
    assert!(resource_contains("*/scale", "deployments/scale"));
    assert!(!resource_contains("*/scale", "deployments"));
    assert!(!resource_contains("pods", "pods/status"));
    assert!(!resource_contains("pods", "*"));
}

#[test]
fn a_rule_contains_one_it_names_every_part_of() {
    use Operation::*;
    let pods_cu = rule(&[Create, Update], &["pods"]);
    assert!(rules_cover(
        std::slice::from_ref(&pods_cu),
        &[rule(&[Create], &["pods"])]
    ));
    assert!(!rules_cover(
        std::slice::from_ref(&pods_cu),
        &[rule(&[Delete], &["pods"])]
    ));
    assert!(!rules_cover(
        std::slice::from_ref(&pods_cu),
        &[rule(&[All], &["pods"])]
    ));
    assert!(rules_cover(
        &[rule(&[All], &["*"])],
        std::slice::from_ref(&pods_cu)
    ));
    let mut any_scope = rule(&[All], &["pods"]);
    any_scope.scope = Scope::All;
    let mut cluster = rule(&[Create], &["pods"]);
    cluster.scope = Scope::Cluster;
    assert!(rules_cover(&[any_scope], &[cluster.clone()]));
    assert!(!rules_cover(std::slice::from_ref(&pods_cu), &[cluster]));
    let mut apps = rule(&[Create], &["deployments"]);
    apps.api_groups = vec!["apps".into()];
    let mut all_groups = rule(&[Create], &["deployments"]);
    all_groups.api_groups = vec!["*".into()];
    assert!(rules_cover(
        std::slice::from_ref(&all_groups),
        &[apps.clone()]
    ));
    assert!(!rules_cover(&[apps], &[all_groups]));
    // Each inner rule inside one outer rule.
    assert!(rules_cover(
        &[rule(&[Create], &["pods"]), rule(&[Create], &["services"])],
        &[rule(&[Create], &["services"])]
    ));
}

#[test]
fn coverages_merge_only_where_the_union_is_exact() {
    use Operation::*;
    let pods = vec![rule(&[Create], &["pods"])];
    let deployments = vec![rule(&[Create], &["deployments"])];
    let (team_a, team_b) = (labels(&[("team", "a")]), labels(&[("team", "b")]));
    let tier = labels(&[("tier", "db")]);

    // Same selectors: the rules are listed together.
    let u = coverage(pods.clone(), Some(&team_a), None)
        .union(&coverage(deployments.clone(), Some(&team_a), None))
        .expect("same selectors");
    assert_eq!(u.rules.len(), 2);
    assert_eq!(u.namespace_selector(), Some(team_a.clone()));

    // Same rules, namespaces by one key: one In.
    let u = coverage(pods.clone(), Some(&team_a), None)
        .union(&coverage(pods.clone(), Some(&team_b), None))
        .expect("same rules, one key");
    assert_eq!(
        u.namespace_selector(),
        Some(expression("team", "In", &["a", "b"]))
    );

    // Other rules and other namespaces: pods in team b would be selected, which neither does.
    assert_eq!(
        coverage(pods.clone(), Some(&team_a), None).union(&coverage(
            deployments.clone(),
            Some(&team_b),
            None
        )),
        None
    );
    // Both selectors differ: (team a, any object) ∪ (any namespace, tier db) is no product.
    assert_eq!(
        coverage(pods.clone(), Some(&team_a), None).union(&coverage(
            pods.clone(),
            None,
            Some(&tier)
        )),
        None
    );
    // Containment in every part: the larger one.
    let broad = coverage(vec![rule(&[All], &["pods"])], None, None);
    let narrow = coverage(pods.clone(), Some(&team_a), Some(&tier));
    assert_eq!(broad.union(&narrow), Some(broad.clone()));
    assert_eq!(narrow.union(&broad), Some(broad.clone()));
    // A narrower selector but broader rules: no containment, no exact union.
    assert_eq!(
        coverage(pods.clone(), None, None).union(&coverage(
            vec![rule(&[All], &["pods"])],
            Some(&team_a),
            None
        )),
        None
    );
}

#[test]
fn members_that_were_never_grouped_are_still_covered() {
    let mut a = gatehouse_api::v1alpha1::sample_spec(1, true, false);
    a.match_.namespace_selector = Some(labels(&[("team", "a")]));
    let mut b = a.clone();
    b.match_.namespace_selector = None;
    b.match_.object_selector = Some(labels(&[("tier", "db")]));
    let c = Coverage::of_members([&a, &b]);
    // No exact union: the cover selects everything either selects (and more).
    assert_eq!(c.namespace_selector(), None);
    assert_eq!(c.object_selector(), None);
    assert!(c.contains(&Coverage::of(&a)) && c.contains(&Coverage::of(&b)));
}

// Every label set over two keys and three values (absent or one of them): 16 sets, so a claim
// about a selector is checked against all the label sets it could tell apart.
const KEYS: [&str; 2] = ["a", "b"];
const VALUES: [&str; 3] = ["x", "y", "z"];

fn every_label_set() -> Vec<BTreeMap<String, String>> {
    let mut sets = vec![BTreeMap::new()];
    for key in KEYS {
        sets = sets
            .into_iter()
            .flat_map(|set| {
                let mut out = vec![set.clone()];
                for v in VALUES {
                    let mut with = set.clone();
                    with.insert(key.to_string(), v.to_string());
                    out.push(with);
                }
                out
            })
            .collect();
    }
    sets
}

fn selects(s: &LabelSelector, set: &BTreeMap<String, String>) -> bool {
    selector_matches(s, |k| set.get(k).map(String::as_str))
}

fn arb_requirement() -> impl Strategy<Value = LabelSelectorRequirement> {
    (
        prop::sample::select(KEYS.to_vec()),
        prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist"]),
        prop::sample::subsequence(VALUES.to_vec(), 1..=3),
    )
        .prop_map(|(key, operator, values)| LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: matches!(operator, "In" | "NotIn")
                .then(|| values.iter().map(|v| v.to_string()).collect()),
        })
}

fn arb_selector() -> impl Strategy<Value = LabelSelector> {
    (
        prop::collection::btree_map(
            prop::sample::select(KEYS.to_vec()),
            prop::sample::select(VALUES.to_vec()),
            0..=1,
        ),
        prop::collection::vec(arb_requirement(), 0..=2),
    )
        .prop_map(|(labels, expressions)| LabelSelector {
            match_labels: (!labels.is_empty()).then(|| {
                labels
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            match_expressions: (!expressions.is_empty()).then_some(expressions),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The canonical form selects what the user's selector selects; `contains` never claims a
    /// containment that does not hold; a union, when there is one, selects exactly what either
    /// selects.
    #[test]
    fn selector_unions_are_exact_and_containment_is_sound(a in arb_selector(), b in arb_selector()) {
        let (sa, sb) = (selector(&a), selector(&b));
        let rendered = |s: &Selector| s.to_label_selector().unwrap_or_default();
        let union = sa.union(&sb);
        for set in every_label_set() {
            prop_assert_eq!(selects(&rendered(&sa), &set), selects(&a, &set), "canonical form of {:?}", a);
            if sa.contains(&sb) && selects(&b, &set) {
                prop_assert!(selects(&a, &set), "{:?} does not contain {:?}: {:?}", a, b, set);
            }
            if let Some(u) = &union {
                prop_assert_eq!(
                    selects(&rendered(u), &set),
                    selects(&a, &set) || selects(&b, &set),
                    "union {:?} of {:?} and {:?} at {:?}", u, a, b, set
                );
            }
        }
    }
}

fn in_namespace(ns: &str) -> LabelSelector {
    labels(&[("kubernetes.io/metadata.name", ns)])
}

#[test]
fn policies_of_two_namespaces_are_disjoint() {
    let pods = || vec![rule(&[Operation::Create], &["pods"])];
    let a = coverage(pods(), Some(&in_namespace("a")), None);
    let b = coverage(pods(), Some(&in_namespace("b")), None);
    assert!(a.disjoint(&b) && b.disjoint(&a));
    assert!(!a.disjoint(&a.clone()));
    // Every namespace, or one selected otherwise: they may meet.
    let everywhere = coverage(pods(), None, None);
    assert!(!a.disjoint(&everywhere));
    let team = coverage(pods(), Some(&labels(&[("team", "x")])), None);
    assert!(!a.disjoint(&team));
}

#[test]
fn selectors_exclude_each_other_only_on_one_key() {
    let cases = [
        (
            expression("t", "In", &["a", "b"]),
            expression("t", "In", &["c"]),
            true,
        ),
        (
            expression("t", "In", &["a", "b"]),
            expression("t", "In", &["b"]),
            false,
        ),
        (
            expression("t", "In", &["a"]),
            expression("t", "NotIn", &["a", "b"]),
            true,
        ),
        (
            expression("t", "In", &["a", "c"]),
            expression("t", "NotIn", &["a"]),
            false,
        ),
        (
            expression("t", "Exists", &[]),
            expression("t", "DoesNotExist", &[]),
            true,
        ),
        (
            expression("t", "NotIn", &["a"]),
            expression("t", "DoesNotExist", &[]),
            false,
        ),
        (
            expression("t", "In", &["a"]),
            expression("u", "In", &["b"]),
            false,
        ),
    ];
    for (a, b, disjoint) in cases {
        assert_eq!(
            selector(&a).disjoint(&selector(&b)),
            disjoint,
            "{a:?} / {b:?}"
        );
        assert_eq!(
            selector(&b).disjoint(&selector(&a)),
            disjoint,
            "{b:?} / {a:?}"
        );
    }
}

#[test]
fn rules_apart_are_disjoint_whatever_the_selectors() {
    let pods = coverage(vec![rule(&[Operation::Create], &["pods"])], None, None);
    let maps = coverage(
        vec![rule(&[Operation::Create], &["configmaps"])],
        None,
        None,
    );
    let updates = coverage(vec![rule(&[Operation::Update], &["pods"])], None, None);
    let all = coverage(vec![rule(&[Operation::All], &["*"])], None, None);
    let status = coverage(
        vec![rule(&[Operation::Create], &["pods/status"])],
        None,
        None,
    );
    let subresources = coverage(vec![rule(&[Operation::Create], &["pods/*"])], None, None);
    assert!(pods.disjoint(&maps));
    assert!(pods.disjoint(&updates));
    assert!(!pods.disjoint(&all) && !maps.disjoint(&all));
    assert!(pods.disjoint(&status) && all.disjoint(&status));
    assert!(!status.disjoint(&subresources));
}

#[test]
fn a_namespace_selector_does_not_part_cluster_scoped_requests() {
    // A rule for every scope of a resource that may be cluster-scoped: a namespaceSelector does
    // not narrow a cluster-scoped object's requests, and a Namespace's is its own labels.
    let mut any = rule(&[Operation::Create], &["widgets"]);
    any.api_groups = vec!["example.com".into()];
    any.scope = Scope::All;
    let a = coverage(vec![any.clone()], Some(&in_namespace("a")), None);
    let b = coverage(vec![any.clone()], Some(&in_namespace("b")), None);
    assert!(!a.disjoint(&b));
    // Namespaced only, on one side: parted.
    let mut namespaced = any;
    namespaced.scope = Scope::Namespaced;
    let c = coverage(vec![namespaced], Some(&in_namespace("b")), None);
    assert!(a.disjoint(&c));
    // Pods of every scope are namespaced all the same.
    let mut pods = rule(&[Operation::Create], &["pods"]);
    pods.scope = Scope::All;
    let d = coverage(vec![pods.clone()], Some(&in_namespace("a")), None);
    let e = coverage(vec![pods], Some(&in_namespace("b")), None);
    assert!(d.disjoint(&e));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// No label set satisfies two selectors called disjoint.
    #[test]
    fn disjoint_selectors_select_no_label_set_together(a in arb_selector(), b in arb_selector()) {
        if selector(&a).disjoint(&selector(&b)) {
            for set in every_label_set() {
                prop_assert!(
                    !(selects(&a, &set) && selects(&b, &set)),
                    "{:?} and {:?} both select {:?}", a, b, set
                );
            }
        }
    }
}
