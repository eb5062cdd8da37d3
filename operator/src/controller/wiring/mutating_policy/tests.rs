use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::HashMap;

use serde_json::json;

use super::*;
use crate::controller::wiring::schema_fit::{OptionalStruct, SchemaFit};
use crate::controller::wiring::{Endpoint, Wiring};
use gatehouse_api::v1alpha1::{
    FailurePolicy, MatchCondition, Mutation as Merge, Operation, PolicySpec, ReinvocationPolicy,
    sample_spec,
};
use gatehouse_cel as cel;

/// The wiring the mutating placement tests place with.
pub(in crate::controller::wiring) fn wiring() -> Wiring {
    Wiring {
        endpoint: Endpoint::Url {
            base: "https://gatehouse.test".into(),
        },
        excluded_namespaces: vec!["kube-system".into()],
        home_namespace: "gatehouse-system".into(),
        owner_cluster_role: None,
        owner: None,
        max_admission_policies:
            crate::controller::wiring::in_process_cap::DEFAULT_MAX_ADMISSION_POLICIES,
    }
}

fn policy(name: &str, priority: i32, enforcement: Enforcement) -> Policy {
    let mut spec = sample_spec(priority, true, false);
    spec.enforcement = enforcement;
    spec.match_.rules = vec![Rule {
        operations: vec![Operation::Create],
        api_groups: vec!["".into()],
        api_versions: vec!["v1".into()],
        resources: vec!["pods".into()],
        scope: Default::default(),
    }];
    Policy::new(name, spec)
}

/// Places `policies` with every one's merges fitting its kinds' schemas.
fn place(
    policies: &[&Policy],
    served: bool,
) -> (Vec<(String, MutatingPlacement)>, Vec<InProcessMutation>) {
    let fit = policies
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                SchemaFit::Fits(Vec::new()),
            )
        })
        .collect();
    place_mutating(policies, &wiring(), served, &fit)
}

/// The members of each generated policy.
fn members(generated: &[InProcessMutation]) -> Vec<Vec<&str>> {
    generated
        .iter()
        .map(|g| g.members.iter().map(String::as_str).collect())
        .collect()
}

fn placement_of<'a>(
    placements: &'a [(String, MutatingPlacement)],
    name: &str,
) -> &'a MutatingPlacement {
    &placements.iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn members_are_the_in_process_prefix_in_priority_then_name_order() {
    let c = policy("c", 20, Enforcement::InProcess);
    let b = policy("b", 10, Enforcement::InProcess);
    let a = policy("a", 10, Enforcement::InProcess);
    let validating = Policy::new("v", sample_spec(1, false, true));
    let (placements, generated) = place(&[&c, &b, &a, &validating], true);
    let [generated] = generated.as_slice() else {
        panic!("one group: {generated:?}");
    };
    assert_eq!(generated.members, ["a", "b", "c"]);
    assert_eq!(
        placements.len(),
        3,
        "validating Policies are not placed here"
    );
    let spec = generated.policy.spec.as_ref().unwrap();
    // One plain merge each, with one match: joined into one mutation.
    assert_eq!(spec.mutations.as_ref().unwrap().len(), 1);
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(spec.reinvocation_policy.as_deref(), Some("Never"));
    let rules = spec
        .match_constraints
        .as_ref()
        .unwrap()
        .resource_rules
        .as_ref()
        .unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        generated.policy.metadata.annotations.as_ref().unwrap()[MEMBERS_ANNOTATION],
        "a,b,c"
    );
    assert_eq!(
        generated
            .binding
            .spec
            .as_ref()
            .unwrap()
            .policy_name
            .as_deref(),
        Some("gatehouse-mutating-a")
    );
}

#[test]
fn a_policy_after_one_on_the_webhook_cannot_move_in() {
    let first = policy("first", 10, Enforcement::Webhook);
    let later = policy("later", 20, Enforcement::InProcess);
    let auto = policy("auto", 30, Enforcement::Auto);
    let (placements, generated) = place(&[&later, &first, &auto], true);
    assert!(generated.is_empty());
    assert!(matches!(
        placement_of(&placements, "first"),
        MutatingPlacement::Webhook(_)
    ));
    let MutatingPlacement::Refused(reason) = placement_of(&placements, "later") else {
        panic!("{placements:?}");
    };
    assert!(reason.contains("Policy first comes before it"), "{reason}");
    assert!(matches!(
        placement_of(&placements, "auto"),
        MutatingPlacement::Webhook(_)
    ));
}

#[test]
fn a_tenant_on_the_webhook_never_holds_the_platform_back_it_is_refused() {
    let mut tenant = policy("labels.team-a.namespaced", 1, Enforcement::Webhook);
    tenant.spec.match_.namespace_selector = Some(gatehouse_api::v1alpha1::only_namespace("team-a"));
    let platform = policy("platform", 100, Enforcement::InProcess);
    let (placements, generated) = place(&[&platform, &tenant], true);
    assert_eq!(members(&generated), [vec!["platform"]]);
    let MutatingPlacement::Refused(reason) =
        placement_of(&placements, tenant.metadata.name.as_deref().unwrap())
    else {
        panic!("{placements:?}");
    };
    assert!(reason.contains("Policy platform"), "{reason}");
    // A platform Policy that can never select the tenant's requests leaves it on the webhook.
    let mut elsewhere = policy("elsewhere", 100, Enforcement::InProcess);
    elsewhere.spec.match_.namespace_selector =
        Some(gatehouse_api::v1alpha1::only_namespace("team-b"));
    let (placements, _) = place(&[&elsewhere, &tenant], true);
    assert!(matches!(
        placement_of(&placements, tenant.metadata.name.as_deref().unwrap()),
        MutatingPlacement::Webhook(_)
    ));
}

#[test]
fn a_refused_policy_runs_nowhere_and_so_does_not_block_later_ones() {
    let mut effects = policy("effects", 10, Enforcement::InProcess);
    effects.spec.effects = vec![gatehouse_api::v1alpha1::Effect {
        ipam: Some(gatehouse_api::v1alpha1::IpamEffect {
            pool: "p".into(),
            annotation: None,
        }),
        ..Default::default()
    }];
    let later = policy("later", 20, Enforcement::InProcess);
    let (placements, generated) = place(&[&effects, &later], true);
    let MutatingPlacement::Refused(reason) = placement_of(&placements, "effects") else {
        panic!("{placements:?}");
    };
    assert!(reason.starts_with("spec.effects"), "{reason}");
    assert_eq!(members(&generated), [vec!["later"]]);
}

#[test]
fn auto_moves_in_when_its_merges_fit_and_unserved_is_refused() {
    let auto = policy("auto", 10, Enforcement::Auto);
    let (placements, _) = place(&[&auto], true);
    assert_eq!(
        placement_of(&placements, "auto"),
        &MutatingPlacement::InProcess("gatehouse-mutating-auto".to_string())
    );
    let unfit = HashMap::from([(
        "auto".to_string(),
        SchemaFit::Unfit("spec.mutate[0]: x".to_string()),
    )]);
    let (placements, _) = place_mutating(&[&auto], &wiring(), true, &unfit);
    assert_eq!(
        placement_of(&placements, "auto"),
        &MutatingPlacement::Webhook("spec.mutate[0]: x".into())
    );
    let (placements, _) = place_mutating(&[&auto], &wiring(), true, &HashMap::new());
    assert!(
        matches!(placement_of(&placements, "auto"), MutatingPlacement::Webhook(r) if r.contains("not read yet"))
    );
    // Schemas not read say nothing: an InProcess Policy stays enforced, on the webhook.
    let required = policy("required", 10, Enforcement::InProcess);
    let unread = HashMap::from([(
        "required".to_string(),
        SchemaFit::Unread("discovery failed".to_string()),
    )]);
    let (placements, _) = place_mutating(&[&required], &wiring(), true, &unread);
    assert_eq!(
        placement_of(&placements, "required"),
        &MutatingPlacement::Webhook("discovery failed".into())
    );
    let (placements, generated) = place(&[&required], false);
    assert!(generated.is_empty());
    assert!(
        matches!(placement_of(&placements, "required"), MutatingPlacement::Refused(r) if r.contains("does not serve"))
    );
}

fn with(spec: impl FnOnce(&mut PolicySpec)) -> Policy {
    let mut p = policy("p", 10, Enforcement::InProcess);
    spec(&mut p.spec);
    p
}

#[test]
fn what_one_fail_closed_never_reinvoked_policy_cannot_do_is_refused_with_the_field() {
    let refused = |p: Policy, later_overwrites: bool| {
        policy_mutations(&p, &footprints_of(&p, None), later_overwrites).unwrap_err()
    };
    let guarded_ignore = with(|s| {
        s.failure_policy = FailurePolicy::Ignore;
        s.mutate[0].when = Some("true".into());
    });
    assert!(refused(guarded_ignore, false).starts_with("spec.failurePolicy"));
    let if_needed_for_each = with(|s| {
        s.reinvocation_policy = ReinvocationPolicy::IfNeeded;
        s.mutate[0].for_each = Some("spec.containers".into());
    });
    assert!(refused(if_needed_for_each, false).starts_with("spec.reinvocationPolicy"));
    let if_needed = with(|s| s.reinvocation_policy = ReinvocationPolicy::IfNeeded);
    assert!(policy_mutations(&if_needed, &footprints_of(&if_needed, None), false).is_ok());
    assert!(refused(if_needed, true).starts_with("spec.reinvocationPolicy"));
    let selected_twice = with(|s| {
        s.match_.object_selector = Some(LabelSelector::default());
        s.mutate.push(s.mutate[0].clone());
    });
    assert!(refused(selected_twice, false).starts_with("spec.match"));
    let selected_once = with(|s| s.match_.object_selector = Some(LabelSelector::default()));
    assert_eq!(
        policy_mutations(&selected_once, &footprints_of(&selected_once, None), false)
            .unwrap()
            .len(),
        1
    );
    let subresource = with(|s| s.match_.rules[0].resources = vec!["pods/status".into()]);
    assert!(refused(subresource, false).starts_with("spec.match.rules[0].resources"));
    let repeated_name = with(|s| {
        s.mutate[0].merge = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
    });
    assert!(refused(repeated_name, false).starts_with("spec.mutate[0]: spec.containers"));
}

#[test]
fn a_list_of_mutations_is_repeated_as_the_engine_passes_and_every_one_is_guarded() {
    let p = with(|s| {
        s.mutate.push(Merge {
            merge: json!({"metadata": {"labels": {"c": "d"}}}),
            ..Merge::default()
        });
    });
    // Two label merges that do not read each other: one pass, in two mutations (both may add
    // metadata.labels whole).
    assert_eq!(
        policy_mutations(&p, &footprints_of(&p, None), false)
            .unwrap()
            .len(),
        2
    );
    // Writing apart, they go in one.
    let apart = with(|s| {
        s.mutate.push(Merge {
            for_each: Some("spec.containers".into()),
            merge: json!({"securityContext": {"capabilities": {"drop": ["BPF"]}}}),
            ..Merge::default()
        });
    });
    let joined = policy_mutations(&apart, &footprints_of(&apart, None), false).unwrap();
    assert_eq!(joined.len(), 1);
    let expression = joined[0]
        .json_patch
        .as_ref()
        .unwrap()
        .expression
        .as_ref()
        .unwrap();
    // Each translation parenthesised: a forEach's is a conditional, which `+` would split.
    assert!(
        expression.contains(") + (type(object) == map && \"spec\""),
        "{expression}"
    );
    let p = with(|s| {
        s.mutate.push(Merge {
            merge: json!({"metadata": {"labels": {"c": "d"}}}),
            when: Some("has(object.metadata.labels)".into()),
            ..Merge::default()
        });
    });
    let mutations = policy_mutations(&p, &footprints_of(&p, None), false).unwrap();
    assert_eq!(mutations.len(), 2 * (2 + 2));
    let guard = match_expression(&p);
    for m in &mutations {
        let expression = m.json_patch.as_ref().unwrap().expression.as_ref().unwrap();
        assert!(
            expression.starts_with(&format!("{guard} ? (")),
            "{expression}"
        );
    }
}

#[test]
fn the_match_in_cel_covers_rules_selectors_and_conditions() {
    let p = with(|s| {
        s.match_.rules[0].operations = vec![Operation::All];
        s.match_.namespace_selector = Some(LabelSelector {
            match_labels: Some([("team".to_string(), "a".to_string())].into()),
            match_expressions: None,
        });
        s.match_.object_selector = Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "skip".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        });
        s.match_.conditions = vec![MatchCondition {
            name: "c".into(),
            expression: "request.userInfo.username != 'x'".into(),
        }];
    });
    let guard = match_expression(&p);
    assert!(
        guard.contains(r#"request.operation in ["CREATE", "UPDATE"]"#),
        "{guard}"
    );
    assert!(
        guard.contains(r#"request.requestResource.resource in ["pods"]"#),
        "{guard}"
    );
    assert!(
        guard.contains(r#"namespaceObject.metadata.labels["team"] == "a""#),
        "{guard}"
    );
    assert!(
        guard.contains(
            r#"!(has(oldObject.metadata.labels) && "skip" in oldObject.metadata.labels)"#
        ),
        "{guard}"
    );
    assert!(
        guard.ends_with("((request.userInfo.username != 'x') ? true : false)"),
        "{guard}"
    );
    // Every guard is valid CEL.
    assert!(cel::compile(&guard).is_ok(), "{guard}");
}

#[test]
fn a_policy_appending_what_a_later_one_reads_stays_out() {
    let mut sidecar = policy("a-sidecar", 10, Enforcement::InProcess);
    sidecar.spec.mutate[0].merge =
        json!({"spec": {"containers": [{"name": "side", "image": "busybox"}]}});
    let mut pull = policy("b-pull", 20, Enforcement::InProcess);
    pull.spec.mutate[0] = Merge {
        for_each: Some("spec.containers".into()),
        merge: json!({"imagePullPolicy": "IfNotPresent"}),
        ..Merge::default()
    };
    // In-process, the API server would default the appended container before the later
    // Policy runs: asked to run in-process the appending one runs nowhere (blocking nothing),
    // under Auto it stays on the webhook (and so does everything after it).
    let (placements, generated) = place(&[&sidecar, &pull], true);
    assert_eq!(members(&generated), [vec!["b-pull"]]);
    let MutatingPlacement::Refused(reason) = placement_of(&placements, "a-sidecar") else {
        panic!("{placements:?}");
    };
    assert!(
        reason.contains(
            "Policy b-pull's mutate[0], later in the order, reads or writes what it may append"
        ),
        "{reason}"
    );
    let mut auto = sidecar.clone();
    auto.spec.enforcement = Enforcement::Auto;
    let (placements, generated) = place(&[&auto, &pull], true);
    assert!(generated.is_empty());
    assert!(matches!(
        placement_of(&placements, "a-sidecar"),
        MutatingPlacement::Webhook(_)
    ));
    // Unless no request can match both: another namespace.
    let in_namespace = |p: &mut Policy, ns: &str| {
        p.spec.match_.rules[0].scope = gatehouse_api::v1alpha1::Scope::Namespaced;
        p.spec.match_.namespace_selector = Some(LabelSelector {
            match_labels: Some(
                [("kubernetes.io/metadata.name".to_string(), ns.to_string())].into(),
            ),
            match_expressions: None,
        });
    };
    let (mut elsewhere, mut there) = (sidecar.clone(), pull.clone());
    in_namespace(&mut elsewhere, "a");
    in_namespace(&mut there, "b");
    let (_, generated) = place(&[&elsewhere, &there], true);
    assert_eq!(members(&generated), [vec!["a-sidecar"], vec!["b-pull"]]);
    // In one Policy, the second pass runs the forEach after the append.
    let chained = with(|s| {
        s.mutate = vec![pull.spec.mutate[0].clone(), sidecar.spec.mutate[0].clone()];
    });
    let reason = policy_mutations(&chained, &footprints_of(&chained, None), false).unwrap_err();
    assert!(
        reason.starts_with("spec.mutate[0]: it reads or writes what spec.mutate[1]")
            || reason.starts_with("spec.mutate[1]: it reads or writes what spec.mutate[0]"),
        "{reason}"
    );
}

#[test]
fn a_policy_creating_a_struct_a_later_one_fills_stays_out() {
    let mut probe = policy("a-probe", 10, Enforcement::Auto);
    probe.spec.mutate[0] = Merge {
        for_each: Some("spec.containers".into()),
        merge: json!({"livenessProbe": {"httpGet": {"port": 8080}}}),
        ..Merge::default()
    };
    let mut period = policy("b-period", 20, Enforcement::Auto);
    period.spec.mutate[0] = Merge {
        for_each: Some("spec.containers".into()),
        merge: json!({"livenessProbe": {"periodSeconds": 30}}),
        ..Merge::default()
    };
    // Where the schema says the probe may be absent, the API server defaults the one the first
    // Policy creates (periodSeconds 10) before the second runs: both stay on the webhook.
    let created = |p: &Policy| {
        let path = ["spec", "containers", "[]", "livenessProbe"].map(str::to_string);
        (
            p.metadata.name.clone().unwrap_or_default(),
            SchemaFit::Fits(vec![OptionalStruct {
                mutation: 0,
                path: path.to_vec(),
            }]),
        )
    };
    let fit = HashMap::from([created(&probe), created(&period)]);
    let (placements, generated) = place_mutating(&[&probe, &period], &wiring(), true, &fit);
    assert!(generated.is_empty(), "{placements:?}");
    let MutatingPlacement::Webhook(reason) = placement_of(&placements, "a-probe") else {
        panic!("{placements:?}");
    };
    assert!(
        reason.starts_with("spec.mutate[0]: Policy b-period's mutate[0], later in the order"),
        "{reason}"
    );
    // Into a struct present from the start (no optional struct), both move in.
    let (_, generated) = place(&[&probe, &period], true);
    assert_eq!(members(&generated), [vec!["a-probe", "b-period"]]);
    // In one Policy, the second pass would fill the probe the first created and defaulted.
    let both = with(|s| {
        s.mutate = vec![probe.spec.mutate[0].clone(), period.spec.mutate[0].clone()];
    });
    let footprints = footprints_of(&both, fit.get("a-probe"));
    assert!(
        policy_mutations(&both, &footprints, false)
            .unwrap_err()
            .starts_with(
                "spec.mutate[1]: it reads or writes what spec.mutate[0] may append or create"
            )
    );
}
