use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::audit::judge::{AuditedKind, audit_copy};
use gatehouse_api::v1alpha1::Policy;

const POLICY_UID: &str = "uid-policy";

/// A Policy on Namespaces labelled `team`, each with a ConfigMap `team` naming it.
fn live_policy(triggers: Vec<StoredJson>) -> LivePolicy {
    let policy: Policy = serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
        "metadata": {"name": "teams", "uid": POLICY_UID},
        "spec": {
            "match": {
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"]}],
                "objectSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
            },
            "effects": [{"object": {
                "template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team"}, "data": {"kept": "yes"}},
                "fields": [{"path": "data.team", "expression": "object.metadata.labels.team"}],
            }}],
        },
    }))
    .expect("a Policy");
    let object = policy.spec.effects[0]
        .object
        .clone()
        .expect("an object effect");
    let mut problems = Vec::new();
    let compiled =
        companion::check("spec.effects[0].object", &object, &mut problems).expect("a valid effect");
    LivePolicy {
        name: "teams".into(),
        uid: POLICY_UID.into(),
        matcher: audit_copy(&policy).expect("auditable"),
        effects: vec![PreparedEffect {
            index: 0,
            compiled,
            namespaced: true,
            clone_source: None,
        }],
        triggers: vec![TriggerObjects {
            kind: AuditedKind {
                group: String::new(),
                version: "v1".into(),
                resource: "namespaces".into(),
                kind: "Namespace".into(),
                namespaced: false,
            },
            objects: triggers,
        }],
    }
}

fn namespace(name: &str, team: Option<&str>) -> Value {
    let mut labels = json!({"kubernetes.io/metadata.name": name});
    if let Some(team) = team {
        labels["team"] = json!(team);
    }
    json!({"metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels}})
}

fn text(value: &Value) -> StoredJson {
    Arc::from(value.to_string())
}

/// `object` as stored: with a UID, a resourceVersion and `data`.
fn stored(object: &Value, data: Value) -> StoredCompanion {
    let mut object = object.clone();
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .expect("a namespace")
        .to_string();
    object["metadata"]["uid"] = json!(format!("cm-{namespace}"));
    object["metadata"]["resourceVersion"] = json!("7");
    object["data"] = data;
    let companion = StoredCompanion {
        key: CompanionKey::of("v1", "ConfigMap", &object),
        json: text(&object),
    };
    assert_eq!(
        companion.provenance(),
        Provenance {
            uid: format!("cm-{namespace}"),
            policy_uid: POLICY_UID.into(),
            trigger_uid: format!("uid-{namespace}"),
        }
    );
    companion
}

/// The companion `plan` renders for the Namespace `name`.
fn rendered(plan: &Plan, name: &str) -> Value {
    plan.apply
        .iter()
        .find(|d| d.key.namespace.as_deref() == Some(name))
        .map(|d| d.object.clone())
        .expect("rendered")
}

/// Plans `policy` with the Namespaces among its triggers and `stored`.
fn plan_of(policy: &LivePolicy, stored: &[StoredCompanion]) -> Plan {
    let labels: HashMap<String, BTreeMap<String, String>> = policy.triggers[0]
        .objects
        .iter()
        .map(|t| {
            let ns: Value = serde_json::from_str(t).expect("JSON");
            let labels = serde_json::from_value(ns["metadata"]["labels"].clone()).expect("labels");
            (ns["metadata"]["name"].as_str().unwrap().to_string(), labels)
        })
        .collect();
    let labels_of = |name: &str| labels.get(name).cloned();
    let (deleting, unplanned) = (HashMap::new(), BTreeSet::new());
    plan(
        std::slice::from_ref(policy),
        &World {
            namespaces: &labels_of,
            stored,
            deleting: &deleting,
            unplanned: &unplanned,
            gating_unplanned: false,
            left_gated: &[],
        },
    )
}

fn namespaces_of(companions: impl Iterator<Item = Option<String>>) -> Vec<String> {
    let mut found: Vec<String> = companions.map(Option::unwrap_or_default).collect();
    found.sort();
    found
}

#[test]
fn only_missing_or_changed_companions_are_applied_and_unwanted_ones_deleted() {
    let triggers = vec![
        text(&namespace("kept", Some("blue"))),
        text(&namespace("edited", Some("blue"))),
        text(&namespace("new", Some("red"))),
        text(&namespace("left", None)),
    ];
    let everything = plan_of(&live_policy(triggers.clone()), &[]);
    assert_eq!(
        rendered(&everything, "new")["data"],
        json!({"kept": "yes", "team": "red"})
    );
    let mut left = rendered(&everything, "kept");
    left["metadata"]["namespace"] = json!("left");
    left["metadata"]["labels"]["gatehouse.dev/companion-of"] = json!("uid-left");
    let stored = [
        // Fields others add are theirs: an extra key does not make it out of place.
        stored(
            &rendered(&everything, "kept"),
            json!({"kept": "yes", "team": "blue", "theirs": "1"}),
        ),
        stored(
            &rendered(&everything, "edited"),
            json!({"kept": "no", "team": "blue"}),
        ),
        stored(&left, json!({"kept": "yes", "team": "blue"})),
    ];
    let plan = plan_of(&live_policy(triggers), &stored);
    assert_eq!(
        namespaces_of(plan.apply.iter().map(|d| d.key.namespace.clone())),
        ["edited", "new"]
    );
    assert_eq!(
        namespaces_of(plan.delete.iter().map(|s| s.key.namespace.clone())),
        ["left"]
    );
    assert_eq!(plan.counts["teams"], (3, 1));
    assert!(!plan.more);
}

#[test]
fn a_trigger_being_deleted_wants_no_companion() {
    let mut going = namespace("going", Some("blue"));
    going["metadata"]["deletionTimestamp"] = json!("2026-12-07T00:00:00Z");
    let alive = plan_of(
        &live_policy(vec![text(&namespace("going", Some("blue")))]),
        &[],
    );
    let stored = [stored(
        &rendered(&alive, "going"),
        json!({"kept": "yes", "team": "blue"}),
    )];
    let plan = plan_of(&live_policy(vec![text(&going)]), &stored);
    assert!(plan.apply.is_empty());
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.counts["teams"], (0, 0));
}

#[test]
fn a_pass_applies_at_most_its_share_and_says_more_follow() {
    let triggers = (0..APPLIES_PER_PASS + 5)
        .map(|i| text(&namespace(&format!("ns-{i}"), Some("blue"))))
        .collect();
    let policy = live_policy(triggers);
    let plan = plan_of(&policy, &[]);
    assert_eq!(plan.apply.len(), APPLIES_PER_PASS);
    assert!(plan.more);
    // All of them are wanted: none is deleted or counted as missing from the Policy.
    let wanted = i64::try_from(APPLIES_PER_PASS + 5).expect("small");
    assert_eq!(plan.counts["teams"], (wanted, 0));
}
