//! Scope before order: in-process mutating Policies no request can reach two of get generated
//! policies of their own; Policies that can meet share one, in (priority, name) order.
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::controller::wiring::mutating_policy::tests::wiring;
use crate::controller::wiring::mutating_policy::{
    InProcessMutation, MutatingPlacement, place_mutating,
};
use crate::controller::wiring::schema_fit::SchemaFit;
use gatehouse_api::v1alpha1::{Operation, Rule, Scope, sample_spec};
use gatehouse_engine::admission::Request;
use gatehouse_engine::matcher::{rule_matches, selector_matches};

fn pods_rule() -> Rule {
    Rule {
        operations: vec![Operation::Create],
        api_groups: vec!["".into()],
        api_versions: vec!["v1".into()],
        resources: vec!["pods".into()],
        scope: Scope::All,
    }
}

/// A mutating Policy on Pods at `priority`, in the namespace `ns` (everywhere if `None`).
fn tenant(name: &str, priority: i32, ns: Option<&str>) -> Policy {
    let mut spec = sample_spec(priority, true, false);
    spec.enforcement = Enforcement::Auto;
    spec.match_.rules = vec![pods_rule()];
    spec.match_.namespace_selector = ns.map(|ns| LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".to_string(),
            ns.to_string(),
        )])),
        match_expressions: None,
    });
    Policy::new(name, spec)
}

fn fits(policies: &[&Policy]) -> HashMap<String, SchemaFit> {
    policies
        .iter()
        .map(|p| (p.name_any(), SchemaFit::Fits(Vec::new())))
        .collect()
}

fn place(policies: &[&Policy]) -> (Vec<(String, MutatingPlacement)>, Vec<InProcessMutation>) {
    place_mutating(policies, &wiring(), true, &fits(policies))
}

fn members(generated: &[InProcessMutation]) -> Vec<Vec<&str>> {
    generated
        .iter()
        .map(|g| g.members.iter().map(String::as_str).collect())
        .collect()
}

use kube::ResourceExt;

#[test]
fn tenants_get_a_generated_policy_each_called_for_their_namespace_only() {
    let tenants: Vec<Policy> = (0..4)
        .map(|i| tenant(&format!("t{i}"), 10, Some(&format!("tenant-{i}"))))
        .collect();
    let refs: Vec<&Policy> = tenants.iter().collect();
    let (placements, generated) = place(&refs);
    assert_eq!(
        members(&generated),
        [vec!["t0"], vec!["t1"], vec!["t2"], vec!["t3"]]
    );
    for (i, g) in generated.iter().enumerate() {
        assert_eq!(g.name(), format!("gatehouse-mutating-t{i}"));
        assert_eq!(
            g.binding.spec.as_ref().unwrap().policy_name.as_deref(),
            Some(g.name())
        );
        let spec = g.policy.spec.as_ref().unwrap();
        assert_eq!(spec.mutations.as_ref().unwrap().len(), 1);
        let selector = spec
            .match_constraints
            .as_ref()
            .unwrap()
            .namespace_selector
            .as_ref()
            .unwrap();
        let ns = format!("tenant-{i}");
        let labels = |name: &str| {
            BTreeMap::from([("kubernetes.io/metadata.name".to_string(), name.to_string())])
        };
        let own = labels(&ns);
        let other = labels(&format!("tenant-{}", (i + 1) % 4));
        assert!(selector_matches(selector, |k| own
            .get(k)
            .map(String::as_str)));
        assert!(!selector_matches(selector, |k| other
            .get(k)
            .map(String::as_str)));
    }
    assert!(placements.iter().all(|(name, placement)| {
        *placement == MutatingPlacement::InProcess(format!("gatehouse-mutating-{name}"))
    }));
}

#[test]
fn overlapping_policies_between_disjoint_ones_share_one_policy_in_order() {
    let first = tenant("a-first", 10, Some("one"));
    let x = tenant("x", 20, Some("two"));
    let y = tenant("y", 30, Some("two"));
    let last = tenant("z-last", 40, Some("three"));
    let (_, generated) = place(&[&last, &y, &first, &x]);
    assert_eq!(
        members(&generated),
        [vec!["a-first"], vec!["x", "y"], vec!["z-last"]]
    );
    // A Policy for every namespace meets them all: one policy, in order (forced in-process:
    // under Auto its five mutations are past the crossover).
    let everywhere = tenant("m-everywhere", 25, None);
    let mut forced: Vec<Policy> = [&last, &y, &first, &x, &everywhere]
        .into_iter()
        .cloned()
        .collect();
    for p in &mut forced {
        p.spec.enforcement = Enforcement::InProcess;
    }
    let (_, generated) = place(&forced.iter().collect::<Vec<_>>());
    assert_eq!(
        members(&generated),
        [vec!["a-first", "x", "m-everywhere", "y", "z-last"]]
    );
}

#[test]
fn a_webhook_policy_holds_back_only_the_later_policies_it_can_meet() {
    let mut on_webhook = tenant("a-webhook", 10, Some("one"));
    on_webhook.spec.enforcement = Enforcement::Webhook;
    let same = tenant("b-same", 20, Some("one"));
    let other = tenant("c-other", 20, Some("two"));
    let (placements, generated) = place(&[&on_webhook, &same, &other]);
    assert_eq!(members(&generated), [vec!["c-other"]]);
    let (_, placement) = placements.iter().find(|(n, _)| n == "b-same").unwrap();
    let MutatingPlacement::Webhook(reason) = placement else {
        panic!("{placements:?}");
    };
    assert!(
        reason.contains("Policy a-webhook comes before it"),
        "{reason}"
    );
}

#[test]
fn generated_names_stay_object_names() {
    assert_eq!(generated_name("team-a"), "gatehouse-mutating-team-a");
    let long = "a".repeat(253);
    let name = generated_name(&long);
    assert_eq!(name.len(), 253);
    assert!(name.starts_with("gatehouse-mutating-aaa"));
    assert_ne!(name, generated_name(&"a".repeat(252)));
    assert!(
        name.chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric())
    );
}

/// A random rule: operations, a group and resources from a small set, a scope.
fn arb_rule() -> impl Strategy<Value = Rule> {
    (
        prop::sample::select(vec![Operation::Create, Operation::Update, Operation::All]),
        prop::sample::select(vec!["", "example.com", "*"]),
        prop::sample::subsequence(vec!["pods", "configmaps", "widgets", "*"], 1..=2),
        prop::sample::select(vec![Scope::All, Scope::Namespaced, Scope::Cluster]),
    )
        .prop_map(|(operation, group, resources, scope)| Rule {
            operations: vec![operation],
            api_groups: vec![group.to_string()],
            api_versions: vec!["*".into()],
            resources: resources.iter().map(|r| r.to_string()).collect(),
            scope,
        })
}

const TEAMS: [&str; 3] = ["a", "b", "c"];

fn arb_namespace_selector() -> impl Strategy<Value = Option<LabelSelector>> {
    let requirement = (
        prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist"]),
        prop::sample::subsequence(TEAMS.to_vec(), 1..=2),
    )
        .prop_map(|(operator, values)| LabelSelectorRequirement {
            key: "team".into(),
            operator: operator.into(),
            values: matches!(operator, "In" | "NotIn")
                .then(|| values.iter().map(|v| v.to_string()).collect()),
        });
    prop_oneof![
        Just(None),
        prop::sample::select(TEAMS.to_vec()).prop_map(|t| Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("team".to_string(), t.to_string())])),
            match_expressions: None,
        })),
        requirement.prop_map(|r| Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![r]),
        })),
    ]
}

fn arb_policy(i: usize) -> impl Strategy<Value = Policy> {
    (arb_rule(), arb_namespace_selector(), 0..4i32).prop_map(move |(rule, selector, priority)| {
        let mut spec = sample_spec(priority, true, false);
        spec.enforcement = Enforcement::Auto;
        spec.match_.rules = vec![rule];
        spec.match_.namespace_selector = selector;
        Policy::new(&format!("p{i}"), spec)
    })
}

/// A request: (resource, group, namespaced), operation, and the team label of its namespace.
fn requests() -> Vec<(Request, Option<&'static str>)> {
    let kinds = [
        ("pods", "", true),
        ("configmaps", "", true),
        ("widgets", "example.com", true),
        ("widgets", "example.com", false),
    ];
    let mut out = Vec::new();
    for (resource, group, namespaced) in kinds {
        for operation in ["CREATE", "UPDATE"] {
            for team in [None, Some("a"), Some("b"), Some("c")] {
                if !namespaced && team.is_some() {
                    continue;
                }
                let request: Request = serde_json::from_value(json!({
                    "uid": "u",
                    "kind": {"group": group, "version": "v1", "kind": "K"},
                    "resource": {"group": group, "version": "v1", "resource": resource},
                    "namespace": if namespaced { "ns" } else { "" },
                    "operation": operation,
                    "userInfo": {},
                }))
                .expect("a request");
                out.push((request, team));
            }
        }
    }
    out
}

/// Whether the API server would call `p` for `request` in a namespace labelled `team`: its
/// rules, and its namespaceSelector for a namespaced object (a cluster-scoped one other than a
/// Namespace is not narrowed by it).
fn selects(p: &Policy, request: &Request, team: Option<&str>) -> bool {
    let labels: BTreeMap<String, String> = team
        .map(|t| BTreeMap::from([("team".to_string(), t.to_string())]))
        .unwrap_or_default();
    let rules = p.spec.match_.rules.iter().any(|r| rule_matches(r, request));
    let namespace = request.namespace.is_empty()
        || p.spec
            .match_
            .namespace_selector
            .as_ref()
            .is_none_or(|s| selector_matches(s, |k| labels.get(k).map(String::as_str)));
    rules && namespace
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The split is exact: every request two in-process members both select lands in one
    /// generated policy, so their order holds.
    #[test]
    fn members_one_request_can_reach_share_a_generated_policy(
        policies in (0..6usize).prop_flat_map(|n| (0..n).map(arb_policy).collect::<Vec<_>>()),
    ) {
        let refs: Vec<&Policy> = policies.iter().collect();
        let (_, generated) = place(&refs);
        let group_of = |name: &str| generated.iter().position(|g| g.members.iter().any(|m| m == name));
        for (request, team) in requests() {
            let selecting: Vec<&Policy> = refs
                .iter()
                .copied()
                .filter(|p| group_of(&p.name_any()).is_some() && selects(p, &request, team))
                .collect();
            for pair in selecting.windows(2) {
                prop_assert_eq!(
                    group_of(&pair[0].name_any()),
                    group_of(&pair[1].name_any()),
                    "{} and {} both select {:?} in team {:?}",
                    pair[0].name_any(), pair[1].name_any(), request.resource, team
                );
            }
        }
    }
}

/// Where each of `names` was placed: in-process, or the webhook's reason.
fn placed<'a>(placements: &'a [(String, MutatingPlacement)], name: &str) -> &'a MutatingPlacement {
    &placements.iter().find(|(n, _)| n == name).expect(name).1
}

/// Tenant `name` of `ns`, matched unlike every other (a match condition of its own), so that its
/// mutation is not joined with another's.
fn unlike(name: &str, priority: i32, ns: &str) -> Policy {
    let mut p = tenant(name, priority, Some(ns));
    p.spec.match_.conditions = vec![gatehouse_api::v1alpha1::MatchCondition {
        name: name.to_string(),
        expression: "true".to_string(),
    }];
    p
}

#[test]
fn auto_keeps_a_group_past_the_crossover_on_the_webhook_with_the_reason() {
    let scope = |n: usize| -> Vec<Policy> {
        (0..n)
            .map(|i| unlike(&format!("p{i}"), 10, "one"))
            .collect()
    };
    // Up to the crossover: in-process.
    let within = scope(CROSSOVER_MUTATIONS);
    let (_, generated) = place(&within.iter().collect::<Vec<_>>());
    assert_eq!(members(&generated), [vec!["p0"]]);
    // One more mutation than it: every Auto member on the webhook, saying why.
    let past = scope(CROSSOVER_MUTATIONS + 1);
    let (placements, generated) = place(&past.iter().collect::<Vec<_>>());
    assert!(generated.is_empty(), "{generated:?}");
    for p in &past {
        let MutatingPlacement::Webhook(reason) = placed(&placements, &p.name_any()) else {
            panic!("{placements:?}");
        };
        assert!(
            reason.contains("would pay the 2 mutations") && reason.contains("InProcess forces it"),
            "{reason}"
        );
    }
    // Other namespaces' groups are weighed apart: they stay in-process.
    let elsewhere = tenant("q", 10, Some("two"));
    let mut all: Vec<&Policy> = past.iter().collect();
    all.push(&elsewhere);
    let (_, generated) = place(&all);
    assert_eq!(members(&generated), [vec!["q"]]);
}

#[test]
fn what_a_user_forces_in_process_stays_with_what_it_needs() {
    let mut a = unlike("a", 10, "one");
    let b = unlike("b", 20, "one");
    let c = unlike("c", 30, "one");
    let d = unlike("d", 40, "one");
    // The forced one last: the Auto ones before it stay in-process with it.
    let mut forced_last = d.clone();
    forced_last.spec.enforcement = Enforcement::InProcess;
    let (_, generated) = place(&[&a, &b, &c, &forced_last]);
    assert_eq!(members(&generated), [vec!["a", "b", "c", "d"]]);
    // The forced one first: it stays, the Auto ones after it go to the webhook.
    a.spec.enforcement = Enforcement::InProcess;
    let (placements, generated) = place(&[&a, &b, &c, &d]);
    assert_eq!(members(&generated), [vec!["a"]]);
    for name in ["b", "c", "d"] {
        assert!(
            matches!(placed(&placements, name), MutatingPlacement::Webhook(r) if r.starts_with("Auto:")),
            "{placements:?}"
        );
    }
}

/// The one generated policy of `generated`, and its mutations.
fn only_group(
    generated: &[InProcessMutation],
) -> (
    &InProcessMutation,
    &[k8s_openapi::api::admissionregistration::v1::Mutation],
) {
    let [objects] = generated else {
        panic!("one generated policy: {generated:?}");
    };
    let mutations = objects
        .policy
        .spec
        .as_ref()
        .unwrap()
        .mutations
        .as_ref()
        .unwrap();
    (objects, mutations)
}

#[test]
fn consecutive_members_with_one_match_are_joined_into_one_mutation() {
    // Three Policies of one scope and one match, a label each: one mutation, in-process under
    // Auto (within the crossover), every label set.
    let same: Vec<Policy> = (0..3)
        .map(|i| {
            let mut p = tenant(&format!("s{i}"), 10, Some("one"));
            p.spec.mutate[0].merge = json!({"metadata": {"labels": {format!("l{i}"): "yes"}}});
            p
        })
        .collect();
    let between = unlike("s1b", 10, "one");
    let refs: Vec<&Policy> = same.iter().collect();
    let (_, generated) = place(&refs);
    let (_, mutations) = only_group(&generated);
    assert_eq!(mutations.len(), 1, "{mutations:?}");
    let expression = mutations[0]
        .json_patch
        .as_ref()
        .unwrap()
        .expression
        .as_ref()
        .unwrap();
    for i in 0..3 {
        assert!(expression.contains(&format!("l{i}")), "{expression}");
    }
    // A member matched otherwise in between breaks the run: s0 and s1 joined, then s1b, then s2
    // (three mutations: forced in-process, past the crossover).
    let mut forced: Vec<Policy> = vec![same[0].clone(), same[1].clone(), between, same[2].clone()];
    for p in &mut forced {
        p.spec.enforcement = Enforcement::InProcess;
    }
    let (_, generated) = place(&forced.iter().collect::<Vec<_>>());
    let (objects, mutations) = only_group(&generated);
    assert_eq!(objects.members, ["s0", "s1", "s1b", "s2"]);
    assert_eq!(mutations.len(), 3, "{mutations:?}");
}

#[test]
fn single_mutations_matched_apart_are_concatenated_where_they_write_apart() {
    let forced = |mut p: Policy, mutate: serde_json::Value| {
        p.spec.enforcement = Enforcement::InProcess;
        p.spec.mutate = vec![serde_json::from_value(mutate).unwrap()];
        p
    };
    let label = |name: &str, key: &str| {
        forced(
            unlike(name, 10, "one"),
            json!({"merge": {"metadata": {"labels": {key: "yes"}}}}),
        )
    };
    let drop_bpf = |p: Policy| {
        forced(
            p,
            json!({"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}),
        )
    };
    let mutations_of = |policies: &[&Policy]| {
        let (_, generated) = place(policies);
        only_group(&generated).1.len()
    };
    // A label, and every container's capability: apart, one mutation.
    let (a, b) = (label("a", "x"), drop_bpf(unlike("b", 10, "one")));
    assert_eq!(mutations_of(&[&a, &b]), 1);
    // Two labels: both may create `metadata.labels`, so two mutations.
    let c = label("c", "y");
    assert_eq!(mutations_of(&[&a, &c]), 2);
    // A later match that reads the object (an objectSelector): two mutations.
    let mut selective = drop_bpf(unlike("d", 10, "one"));
    selective.spec.match_.object_selector = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("x".to_string(), "yes".to_string())])),
        match_expressions: None,
    });
    assert_eq!(mutations_of(&[&a, &selective]), 2);
}
