//! The audit's judgement of one stored object, pure: the object as an UPDATE onto itself
//! (`oldObject` = `object`, no user, as Gatekeeper's audit does), matched and judged by the
//! admission engine, rule by rule.
use std::collections::BTreeMap;

use serde_json::Value;

use gatehouse_api::reports::{ReportResult, ResourceReference, ResultKind, Timestamp};
use gatehouse_api::v1alpha1::{Operation, Policy, Rule, ValidationAction};
use gatehouse_engine::admission::{
    GroupVersionKind, GroupVersionResource, Request, RuleEvaluation, Variables, evaluate_rules,
};
use gatehouse_engine::exception::{CompiledExemption, Exemption};
use gatehouse_engine::matcher::{self, Namespace};
use gatehouse_engine::policy::{self, CompiledPolicy, InvalidPolicy};

/// The `source` of every result.
pub const SOURCE: &str = "gatehouse";

/// A kind the audit lists, as discovery gives it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AuditedKind {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub kind: String,
    pub namespaced: bool,
}

impl AuditedKind {
    /// Whether these are Namespaces (cluster-scoped, yet their requests name a namespace).
    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.version == "v1" && self.resource == "namespaces"
    }

    /// `apiVersion` of its objects.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Why a Policy cannot be audited at all.
#[derive(Debug, thiserror::Error)]
pub enum NotAuditable {
    #[error(transparent)]
    Invalid(#[from] InvalidPolicy),
    /// Only the API server can decide such a match, for a requesting user.
    #[error(
        "spec.match.conditions read `authorizer`, which asks about the requesting user: an \
         audit has none, so it cannot decide what the Policy matches"
    )]
    MatchNeedsUser,
}

/// The resources of `rule` whose stored objects the audit judges, or `None` when the rule
/// admits neither CREATE nor UPDATE (nothing it admits is stored by it). A subresource names no
/// stored object, but `x/*` also matches `x` itself, as in the API server.
pub fn audited_resources(rule: &Rule) -> Option<Vec<String>> {
    let stores = rule
        .operations
        .iter()
        .any(|o| matches!(o, Operation::All | Operation::Create | Operation::Update));
    let resources: Vec<String> = rule
        .resources
        .iter()
        .filter_map(|res| match res.split_once('/') {
            None => Some(res.clone()),
            Some((base, "*")) => Some(base.to_string()),
            Some(_) => None,
        })
        .collect();
    (stores && !resources.is_empty()).then_some(resources)
}

/// `p` as the audit runs it: every rule matches every operation (stored objects are judged
/// whatever the operations their Policy admits), with the resources [`audited_resources`] keeps.
pub fn audit_copy(p: &Policy) -> Result<CompiledPolicy, NotAuditable> {
    // An invalid Policy is Ready=False already, whatever else it is.
    policy::compile(p)?;
    if policy::needs_own_entry(&p.spec) {
        return Err(NotAuditable::MatchNeedsUser);
    }
    let mut copy = p.clone();
    copy.spec.match_.rules = p
        .spec
        .match_
        .rules
        .iter()
        .filter_map(|rule| {
            audited_resources(rule).map(|resources| Rule {
                operations: vec![Operation::All],
                resources,
                ..rule.clone()
            })
        })
        .collect();
    Ok(policy::compile(&copy)?)
}

/// The review the audit makes of `object`, of `kind`.
pub fn audit_request(kind: &AuditedKind, object: &Value) -> Request {
    let metadata = &object["metadata"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Request {
        uid: format!("audit-{}", text(&metadata["uid"])),
        kind: GroupVersionKind {
            group: kind.group.clone(),
            version: kind.version.clone(),
            kind: kind.kind.clone(),
        },
        resource: GroupVersionResource {
            group: kind.group.clone(),
            version: kind.version.clone(),
            resource: kind.resource.clone(),
        },
        sub_resource: None,
        request_kind: None,
        request_resource: None,
        request_sub_resource: None,
        name: text(&metadata["name"]),
        // As the API server sends it: a Namespace's request names the Namespace itself.
        namespace: if kind.is_namespace() {
            text(&metadata["name"])
        } else {
            text(&metadata["namespace"])
        },
        operation: Operation::Update,
        user_info: Default::default(),
        object: Some(object.clone()),
        old_object: Some(object.clone()),
        dry_run: false,
        options: None,
    }
}

/// What one Policy made of one object.
#[derive(Clone, Debug, PartialEq)]
pub enum Judgement {
    /// The Policy does not match it.
    NotMatched,
    /// Matched: every rule that did not hold, as report results, and how many held.
    Judged {
        failing: Vec<ReportResult>,
        held: u64,
    },
}

/// Judges `object` (of `kind`) by `policy` (an [`audit_copy`]), with the honoured exemptions
/// from it: what they exempt is a `skip`, as at admission it would have been let through;
/// `namespace` holds the labels of its Namespace (for a namespaced object).
pub fn judge_excepting(
    policy: &CompiledPolicy,
    exemptions: &[CompiledExemption],
    kind: &AuditedKind,
    object: &Value,
    namespace: Namespace<'_>,
    now: &Timestamp,
) -> Judgement {
    let req = audit_request(kind, object);
    let reference = ResourceReference {
        api_version: kind.api_version(),
        kind: kind.kind.clone(),
        // The object's own (none for a Namespace, whose request names itself).
        namespace: object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        name: req.name.clone(),
        uid: object["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };
    let result = |rule: String, result: ResultKind, severity: &str, message: String| ReportResult {
        source: SOURCE.to_string(),
        policy: policy.name().to_string(),
        rule,
        result,
        severity: Some(severity.to_string()),
        message,
        resources: vec![reference.clone()],
        timestamp: now.clone(),
        scored: true,
        properties: BTreeMap::new(),
    };
    match matcher::matches(&req, policy, namespace) {
        Ok(false) => Judgement::NotMatched,
        Err(e) => Judgement::Judged {
            failing: vec![result(
                "match".to_string(),
                ResultKind::Error,
                "high",
                format!("the match could not be decided: {e}"),
            )],
            held: 0,
        },
        Ok(true) => {
            let holding: Vec<&Exemption> = exemptions
                .iter()
                .filter(|e| e.holds(&req))
                .map(|e| &e.exemption)
                .collect();
            if let Some(whole) = holding.iter().find(|e| e.rules.is_empty()) {
                let message = format!("exempted by PolicyException {}", whole.source);
                return Judgement::Judged {
                    failing: vec![result(
                        "exception".into(),
                        ResultKind::Skip,
                        "info",
                        message,
                    )],
                    held: 0,
                };
            }
            let (failing, held) = rule_results(policy, &req, &holding, &result);
            Judgement::Judged { failing, held }
        }
    }
}

/// Each rule's result (the ones `holding` exempts `skip`) but the held ones, and how many held.
fn rule_results(
    policy: &CompiledPolicy,
    req: &Request,
    holding: &[&Exemption],
    result: &impl Fn(String, ResultKind, &str, String) -> ReportResult,
) -> (Vec<ReportResult>, u64) {
    let variables = Variables::new(req);
    let outcomes = evaluate_rules(policy, &variables.activation());
    let mut failing = Vec::new();
    let mut held = 0;
    for (i, (rule, outcome)) in policy.spec().validate.iter().zip(outcomes).enumerate() {
        let name = format!("validate[{i}]");
        if let Some(by) = holding.iter().find(|e| e.rules.contains(&i)) {
            let message = format!("exempted by PolicyException {}", by.source);
            failing.push(result(name, ResultKind::Skip, "info", message));
            continue;
        }
        match outcome {
            RuleEvaluation::Held => held += 1,
            RuleEvaluation::Violated(ValidationAction::Deny) => {
                failing.push(result(name, ResultKind::Fail, "high", rule.message.clone()))
            }
            RuleEvaluation::Violated(ValidationAction::Warn) => failing.push(result(
                name,
                ResultKind::Warn,
                "medium",
                rule.message.clone(),
            )),
            RuleEvaluation::Failed { error, .. } => failing.push(result(
                name,
                ResultKind::Error,
                "high",
                format!("spec.validate[{i}].expression: {error}"),
            )),
        }
    }
    (failing, held)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn judge(
        policy: &CompiledPolicy,
        kind: &AuditedKind,
        object: &Value,
        namespace: Namespace<'_>,
        now: &Timestamp,
    ) -> Judgement {
        judge_excepting(policy, &[], kind, object, namespace, now)
    }

    fn pods() -> AuditedKind {
        AuditedKind {
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
            kind: "Pod".into(),
            namespaced: true,
        }
    }

    fn team_policy(action: &str) -> Policy {
        serde_json::from_value(json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": "team"},
            "spec": {
                "match": {
                    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                    "namespaceSelector": {"matchLabels": {"env": "prod"}},
                },
                "validate": [
                    {"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels", "message": "pods need a team label", "action": action},
                    {"expression": "request.operation == 'UPDATE' && oldObject == object && request.userInfo.username == ''", "message": "an audit is an UPDATE onto itself without a user"},
                ],
            },
        }))
        .unwrap()
    }

    fn pod(labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a", "uid": "u1", "labels": labels}, "spec": {}})
    }

    #[test]
    fn a_create_only_rule_judges_stored_objects_as_updates_onto_themselves() {
        let policy = audit_copy(&team_policy("Warn")).unwrap();
        let prod = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        let now = Timestamp {
            seconds: 10,
            nanos: 0,
        };
        let Judgement::Judged {
            failing: results,
            held,
            ..
        } = judge(
            &policy,
            &pods(),
            &pod(json!({})),
            Namespace::Labels(&prod),
            &now,
        )
        else {
            panic!("not matched");
        };
        assert_eq!(results.len(), 1, "{results:?}");
        // The second rule (an audit is an UPDATE onto itself without a user) held.
        assert_eq!(held, 1);
        let r = &results[0];
        assert_eq!(
            (r.rule.as_str(), r.result, r.message.as_str()),
            ("validate[0]", ResultKind::Warn, "pods need a team label")
        );
        assert_eq!(r.resources[0].name, "p");
        assert_eq!(r.resources[0].uid, "u1");
        assert_eq!(
            judge(
                &policy,
                &pods(),
                &pod(json!({"team": "x"})),
                Namespace::Labels(&prod),
                &now
            ),
            Judgement::Judged {
                failing: vec![],
                held: 2,
            }
        );
        // The namespace selector selects as in admission.
        let dev = BTreeMap::from([("env".to_string(), "dev".to_string())]);
        assert_eq!(
            judge(
                &policy,
                &pods(),
                &pod(json!({})),
                Namespace::Labels(&dev),
                &now
            ),
            Judgement::NotMatched
        );
        // Deny rules fail.
        let deny = audit_copy(&team_policy("Deny")).unwrap();
        let Judgement::Judged {
            failing: results, ..
        } = judge(
            &deny,
            &pods(),
            &pod(json!({})),
            Namespace::Labels(&prod),
            &now,
        )
        else {
            panic!("not matched");
        };
        assert_eq!(results[0].result, ResultKind::Fail);
    }

    fn policy(spec: Value) -> Policy {
        serde_json::from_value(json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": "p"}, "spec": spec,
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        Timestamp {
            seconds: 10,
            nanos: 0,
        }
    }

    #[test]
    fn a_subresource_beside_a_resource_leaves_the_resource_audited() {
        let p = policy(json!({
            "match": {"rules": [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "pods/status"]}]},
            "validate": [{"expression": "false", "message": "never"}],
        }));
        let audited = audit_copy(&p).unwrap();
        assert_eq!(audited.spec().match_.rules[0].resources, ["pods"]);
        // `pods/*` matches the Pods themselves too.
        let all_of_pods = policy(json!({
            "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/*"]}]},
            "validate": [{"expression": "false", "message": "never"}],
        }));
        let copy = audit_copy(&all_of_pods).unwrap();
        assert_eq!(copy.spec().match_.rules[0].resources, ["pods"]);
        let labels = BTreeMap::new();
        assert!(matches!(
            judge(&audited, &pods(), &pod(json!({})), Namespace::Labels(&labels), &now()),
            Judgement::Judged { ref failing, .. } if failing.len() == 1
        ));
    }

    #[test]
    fn a_match_asking_about_the_requesting_user_cannot_be_audited() {
        // Only the API server evaluates `authorizer`, for the user of a request; an audit has
        // none, so the Policy's matches cannot be decided.
        let by_user = policy(json!({
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "conditions": [{"name": "c", "expression": "authorizer.requestResource.check('get').allowed()"}],
            },
            "validate": [{"expression": "false", "message": "never"}],
        }));
        assert!(matches!(
            audit_copy(&by_user),
            Err(NotAuditable::MatchNeedsUser)
        ));
    }

    #[test]
    fn a_namespace_is_judged_as_admission_sees_it() {
        let namespaces = AuditedKind {
            group: String::new(),
            version: "v1".into(),
            resource: "namespaces".into(),
            kind: "Namespace".into(),
            namespaced: false,
        };
        let p = policy(json!({
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "Cluster"}],
                "namespaceSelector": {"matchLabels": {"audited": "yes"}},
            },
            "validate": [{"expression": "request.namespace == object.metadata.name", "message": "named"}],
        }));
        let audited = audit_copy(&p).unwrap();
        let none = BTreeMap::new();
        let ns = |labels: Value| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "uid": "n1", "labels": labels}});
        assert_eq!(
            judge(
                &audited,
                &namespaces,
                &ns(json!({"audited": "yes"})),
                Namespace::Labels(&none),
                &now()
            ),
            Judgement::Judged {
                failing: vec![],
                held: 1,
            }
        );
        // Its own labels decide the namespaceSelector.
        assert_eq!(
            judge(
                &audited,
                &namespaces,
                &ns(json!({})),
                Namespace::Labels(&none),
                &now()
            ),
            Judgement::NotMatched
        );
    }
}
