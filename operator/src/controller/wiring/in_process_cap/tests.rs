use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::*;
use crate::controller::wiring::mutating_policy::tests::wiring;
use crate::controller::wiring::placement::{Served, place_all};
use crate::controller::wiring::schema_fit::SchemaFit;
use gatehouse_api::v1alpha1::{Operation, Rule, Scope, sample_spec};

/// Tenant `i`'s mutating or validating Policy on Pods in its own namespace.
fn tenant(i: usize, mutating: bool, enforcement: Enforcement) -> Policy {
    let mut spec = sample_spec(100, mutating, !mutating);
    spec.enforcement = enforcement;
    spec.match_.rules = vec![Rule {
        operations: vec![Operation::Create],
        api_groups: vec!["".into()],
        api_versions: vec!["v1".into()],
        resources: vec!["pods".into()],
        scope: Scope::Namespaced,
    }];
    spec.match_.namespace_selector = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".to_string(),
            format!("tenant-{i}"),
        )])),
        match_expressions: None,
    });
    let kind = if mutating { "mutate" } else { "validate" };
    Policy::new(&format!("t{i}-{kind}"), spec)
}

/// Where each Policy runs with at most `cap` generated admission policies, as
/// (name, generated object or webhook reason), and the generated MutatingAdmissionPolicies.
fn placed(policies: &[Policy], cap: usize) -> (Vec<(String, String)>, Vec<String>) {
    let refs: Vec<&Policy> = policies.iter().collect();
    let fit: HashMap<String, SchemaFit> = policies
        .iter()
        .map(|p| (policy_name(p).to_string(), SchemaFit::Fits(Vec::new())))
        .collect();
    let mut wiring = wiring();
    wiring.max_admission_policies = cap;
    let served = Served {
        validating: true,
        mutating: true,
    };
    let (placements, generated) = place_all(&refs, &wiring, served, &fit);
    let placements = placements
        .iter()
        .map(|(p, placement)| {
            let at = match placement {
                Placement::InProcess(objects) => objects.policy.metadata.name.clone().unwrap(),
                Placement::InProcessMutating(name) => name.clone(),
                Placement::Webhook(reason) => format!("webhook: {reason}"),
                Placement::Refused(reason) => format!("refused: {reason}"),
            };
            (policy_name(p).to_string(), at)
        })
        .collect();
    (
        placements,
        generated.iter().map(|g| g.name().to_string()).collect(),
    )
}

fn tenants(n: usize, enforcement: impl Fn(usize) -> Enforcement) -> Vec<Policy> {
    (0..n)
        .flat_map(|i| {
            [
                tenant(i, true, enforcement(i)),
                tenant(i, false, enforcement(i)),
            ]
        })
        .collect()
}

#[test]
fn past_the_cap_auto_keeps_the_later_generated_policies_on_the_webhook_with_the_reason() {
    let (placements, generated) = placed(&tenants(3, |_| Enforcement::Auto), 3);
    let at: BTreeMap<&str, &str> = placements
        .iter()
        .map(|(n, at)| (n.as_str(), at.as_str()))
        .collect();
    // (priority, name) order: t0-mutate, t0-validate, t1-mutate stay; the rest move.
    assert_eq!(at["t0-mutate"], "gatehouse-mutating-t0-mutate");
    assert_eq!(at["t0-validate"], "gatehouse-t0-validate");
    assert_eq!(at["t1-mutate"], "gatehouse-mutating-t1-mutate");
    for moved in ["t1-validate", "t2-mutate", "t2-validate"] {
        assert!(
            at[moved].starts_with("webhook: past the 3 generated admission policies")
                && at[moved].contains("--max-admission-policies"),
            "{moved}: {}",
            at[moved]
        );
    }
    assert_eq!(
        generated,
        [
            "gatehouse-mutating-t0-mutate",
            "gatehouse-mutating-t1-mutate"
        ]
    );
}

#[test]
fn under_the_cap_nothing_moves_and_in_process_enforcement_is_never_capped() {
    let (placements, generated) = placed(&tenants(3, |_| Enforcement::Auto), 6);
    assert!(
        placements
            .iter()
            .all(|(_, at)| at.starts_with("gatehouse-"))
    );
    assert_eq!(generated.len(), 3);
    // Tenant 2 says InProcess: past a cap of 1 it stays, and counts.
    let forced = |i| {
        if i == 2 {
            Enforcement::InProcess
        } else {
            Enforcement::Auto
        }
    };
    let (placements, generated) = placed(&tenants(3, forced), 1);
    let in_process: Vec<&str> = placements
        .iter()
        .filter(|(_, at)| at.starts_with("gatehouse-"))
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(in_process, ["t0-mutate", "t2-mutate", "t2-validate"]);
    assert_eq!(
        generated,
        [
            "gatehouse-mutating-t0-mutate",
            "gatehouse-mutating-t2-mutate"
        ]
    );
}
