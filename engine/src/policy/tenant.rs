//! What a NamespacedPolicy may not do beside what a Policy may not: reach past its namespace.
//!
//! The Policy a NamespacedPolicy runs as ([`NamespacedPolicy::scoped_policy`]) has its namespace
//! pinned where the tenant left the field unset; what the tenant set against it is still there
//! for these checks to refuse, at the field the tenant wrote.
use gatehouse_api::v1alpha1::{
    NAMESPACED_STEM_SUFFIX, NamespacedPolicy, Policy, PolicySource, PolicySpec, ReinvocationPolicy,
    Scope, only_namespace,
};
use serde_json::Value;

use crate::problem::Problem;

/// Resources that are cluster-scoped in every cluster. A tenant's rule naming one could never
/// match (its rules are narrowed to namespaced objects): it is refused.
const CLUSTER_SCOPED: &[&str] = &[
    "namespaces",
    "nodes",
    "persistentvolumes",
    "clusterroles",
    "clusterrolebindings",
    "customresourcedefinitions",
    "apiservices",
    "storageclasses",
    "csidrivers",
    "csinodes",
    "volumeattachments",
    "priorityclasses",
    "runtimeclasses",
    "ingressclasses",
    "certificatesigningrequests",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
    "flowschemas",
    "prioritylevelconfigurations",
    "policies",
    "ippools",
    "ipallocations",
];

/// The kinds a NamespacedPolicy's companions may be (`apiVersion`, `kind`): what a namespace's
/// `admin` may write itself and that carries no rights. Companions are written with Gatehouse's
/// rights, so a kind that grants or limits anything (RoleBinding, ResourceQuota, LimitRange)
/// stays the platform's.
pub const TENANT_COMPANION_KINDS: &[(&str, &str)] = &[
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("policy/v1", "PodDisruptionBudget"),
];

/// The checks of `policy` that depend on what it was written as: a NamespacedPolicy is held to
/// its namespace; a Policy may not take a name only NamespacedPolicies run under.
pub(super) fn check_source(policy: &Policy, problems: &mut Vec<Problem>) {
    match PolicySource::of(policy) {
        PolicySource::Namespaced { namespace, .. } => {
            check_namespaced(&policy.spec, &namespace, problems)
        }
        PolicySource::Policy { name } => {
            if name.ends_with(NAMESPACED_STEM_SUFFIX) {
                problems.push(Problem::new(
                    "metadata.name",
                    format!(
                        "must not end with {NAMESPACED_STEM_SUFFIX:?}: names that end so are \
                         those NamespacedPolicies run under"
                    ),
                ));
            }
        }
    }
}

/// Every problem of a NamespacedPolicy, at the fields of the object the tenant wrote.
pub fn validate_namespaced(policy: &NamespacedPolicy) -> Vec<Problem> {
    let mut problems = Vec::new();
    if policy
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        problems.push(Problem::new("metadata.namespace", "must be set"));
        return problems;
    }
    problems.extend(super::validate(&policy.scoped_policy()));
    problems
}

fn check_namespaced(spec: &PolicySpec, namespace: &str, problems: &mut Vec<Problem>) {
    if spec.match_.namespace_selector != Some(only_namespace(namespace)) {
        problems.push(Problem::new(
            "spec.match.namespaceSelector",
            "a NamespacedPolicy applies only to objects in its own namespace: namespaceSelector \
             is not allowed",
        ));
    }
    for (i, rule) in spec.match_.rules.iter().enumerate() {
        if rule.scope == Scope::Cluster {
            problems.push(Problem::new(
                format!("spec.match.rules[{i}].scope"),
                "a NamespacedPolicy cannot select cluster-scoped kinds: scope Cluster is not allowed",
            ));
        }
        for (j, resource) in rule.resources.iter().enumerate() {
            let base = resource.split('/').next().unwrap_or_default();
            if CLUSTER_SCOPED.contains(&base) {
                problems.push(Problem::new(
                    format!("spec.match.rules[{i}].resources[{j}]"),
                    format!(
                        "{resource:?} is cluster-scoped: a NamespacedPolicy selects only objects \
                         in its own namespace"
                    ),
                ));
            }
        }
    }
    if spec.reinvocation_policy == ReinvocationPolicy::IfNeeded {
        problems.push(Problem::new(
            "spec.reinvocationPolicy",
            "a NamespacedPolicy is not called again after the platform's Policies: IfNeeded is \
             not allowed",
        ));
    }
    for (i, effect) in spec.effects.iter().enumerate() {
        if effect.call.is_some() {
            problems.push(Problem::new(
                format!("spec.effects[{i}].call"),
                "calls to external systems are the platform's: a NamespacedPolicy cannot make them",
            ));
        }
        if let Some(object) = &effect.object {
            check_companion(
                &format!("spec.effects[{i}].object"),
                object,
                namespace,
                problems,
            );
        }
    }
}

/// A tenant's companions go into its own namespace: of a [`TENANT_COMPANION_KINDS`] kind, in no
/// other namespace, with no data cloned from elsewhere.
fn check_companion(
    path: &str,
    object: &gatehouse_api::v1alpha1::ObjectEffect,
    namespace: &str,
    problems: &mut Vec<Problem>,
) {
    let template = &object.template;
    let api_version = template.get("apiVersion").and_then(Value::as_str);
    let kind = template.get("kind").and_then(Value::as_str);
    if let (Some(api_version), Some(kind)) = (api_version, kind)
        && !TENANT_COMPANION_KINDS.contains(&(api_version, kind))
    {
        let allowed: Vec<String> = TENANT_COMPANION_KINDS
            .iter()
            .map(|(v, k)| format!("{v} {k}"))
            .collect();
        problems.push(Problem::new(
            format!("{path}.template.kind"),
            format!(
                "{api_version} {kind}: a NamespacedPolicy's companions are of the kinds a \
                 namespace's admin writes itself, without rights attached: {}",
                allowed.join(", ")
            ),
        ));
    }
    if let Some(other) = template
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| *n != namespace)
    {
        problems.push(Problem::new(
            format!("{path}.template.metadata.namespace"),
            format!("{other:?} is another namespace: a NamespacedPolicy's companions stay in {namespace:?}"),
        ));
    }
    for (i, field) in object.fields.iter().enumerate() {
        if field.path == "metadata.namespace" {
            problems.push(Problem::new(
                format!("{path}.fields[{i}].path"),
                "a NamespacedPolicy's companions stay in its namespace: metadata.namespace cannot be computed",
            ));
        }
    }
    if let Some(source) = &object.clone_from
        && source.namespace != namespace
    {
        problems.push(Problem::new(
            format!("{path}.cloneFrom.namespace"),
            format!(
                "{:?} is another namespace: a NamespacedPolicy copies only from its own, {namespace:?}",
                source.namespace
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::{Operation, Rule, sample_spec};

    fn tenant(resources: &[&str], scope: Scope) -> NamespacedPolicy {
        let mut spec = sample_spec(100, true, false);
        spec.match_.rules = vec![Rule {
            operations: vec![Operation::Create],
            api_groups: vec![String::new()],
            api_versions: vec!["v1".into()],
            resources: resources.iter().map(ToString::to_string).collect(),
            scope,
        }];
        NamespacedPolicy::new("team-a", "labels", spec)
    }

    fn paths(problems: &[Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.path.as_str()).collect()
    }

    #[test]
    fn a_tenant_policy_of_its_namespace_is_valid() {
        assert_eq!(validate_namespaced(&tenant(&["pods"], Scope::All)), vec![]);
    }

    #[test]
    fn another_namespace_or_a_cluster_scoped_kind_is_refused_with_the_field() {
        let mut np = tenant(&["pods", "namespaces"], Scope::Cluster);
        np.spec.match_.namespace_selector = Some(only_namespace("team-b"));
        let problems = validate_namespaced(&np);
        assert_eq!(
            paths(&problems),
            vec![
                "spec.match.namespaceSelector",
                "spec.match.rules[0].scope",
                "spec.match.rules[0].resources[1]"
            ],
            "{problems:?}"
        );
    }

    #[test]
    fn companions_stay_in_the_namespace() {
        let mut np = tenant(&["pods"], Scope::All);
        np.spec.mutate.clear();
        np.spec.effects.push(gatehouse_api::v1alpha1::Effect {
            object: Some(
                serde_json::from_value(serde_json::json!({
                    "template": {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "c", "namespace": "kube-system"}},
                    "fields": [{"path": "metadata.namespace", "expression": "'x'"}],
                    "cloneFrom": {"namespace": "team-b", "name": "src"}
                }))
                .unwrap(),
            ),
            ..Default::default()
        });
        let problems = validate_namespaced(&np);
        assert_eq!(
            paths(&problems),
            vec![
                "spec.effects[0].object.template.metadata.namespace",
                "spec.effects[0].object.fields[0].path",
                "spec.effects[0].object.cloneFrom.namespace"
            ],
            "{problems:?}"
        );
    }

    #[test]
    fn no_calls_no_reinvocation_and_companions_of_harmless_kinds_only() {
        let mut np = tenant(&["pods"], Scope::All);
        np.spec.reinvocation_policy = ReinvocationPolicy::IfNeeded;
        np.spec.effects = serde_json::from_value(serde_json::json!([
            {"call": {"url": "https://example.com/hook", "tokenSecret": "platform-token"}},
            {"object": {"template": {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"}}}},
            {"object": {"template": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}}},
            {"object": {"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}}},
        ]))
        .unwrap();
        let problems = validate_namespaced(&np);
        let paths = paths(&problems);
        for wanted in [
            "spec.reinvocationPolicy",
            "spec.effects[0].call",
            "spec.effects[1].object.template.kind",
            "spec.effects[2].object.template.kind",
        ] {
            assert!(paths.contains(&wanted), "{wanted}: {problems:?}");
        }
        assert!(
            !paths.iter().any(|p| p.starts_with("spec.effects[3]")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_policy_cannot_take_a_tenant_name() {
        let policy = Policy::new("x.team-a.namespaced", sample_spec(1, true, false));
        let problems = super::super::validate(&policy);
        assert!(paths(&problems).contains(&"metadata.name"), "{problems:?}");
    }
}
