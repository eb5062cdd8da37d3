//! `NamespacedPolicy`: a tenant's Policy, confined to its own namespace.
//!
//! A NamespacedPolicy has a Policy's spec and runs as a Policy: [`NamespacedPolicy::scoped_policy`]
//! is the Policy it runs as, named by its [stem](namespaced_stem), matching only objects of its
//! namespace, and marked with [`NAMESPACED_POLICY_ANNOTATION`] so that whatever is written back
//! (status, finalizers, Events) goes to the NamespacedPolicy itself.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use kube::{CustomResourceExt, Resource};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize};

use super::{Policy, PolicySpec, PolicyStatus, Scope};

/// Kind of the namespaced Policy.
pub const NAMESPACED_POLICY_KIND: &str = "NamespacedPolicy";
/// Its plural, as the API serves it.
pub const NAMESPACED_POLICY_PLURAL: &str = "namespacedpolicies";
/// Its short name (`kubectl get gnpol -A`).
pub const NAMESPACED_POLICY_SHORT_NAME: &str = "gnpol";
/// Annotation on the Policy a NamespacedPolicy runs as: `<namespace>/<name>` of the
/// NamespacedPolicy.
pub const NAMESPACED_POLICY_ANNOTATION: &str = "gatehouse.dev/namespaced-policy";
/// The end of every [stem](namespaced_stem); no Policy name may end with it.
pub const NAMESPACED_STEM_SUFFIX: &str = ".namespaced";
/// The label Kubernetes puts on every Namespace: its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A NamespacedPolicy: a Policy written by a namespace's own team. It applies only to objects in
/// its namespace (it cannot select other namespaces or cluster-scoped kinds), its effects stay
/// there, and every Policy's mutations run after its own: the platform has the last word.
#[derive(Deserialize, Clone, Debug, PartialEq)]
pub struct NamespacedPolicy {
    pub metadata: ObjectMeta,
    pub spec: PolicySpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PolicyStatus>,
}

impl NamespacedPolicy {
    /// A NamespacedPolicy `name` in `namespace` with `spec`.
    pub fn new(namespace: &str, name: &str, spec: PolicySpec) -> Self {
        NamespacedPolicy {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }

    /// The Policy this one runs as: named by its [stem](namespaced_stem), marked with
    /// [`NAMESPACED_POLICY_ANNOTATION`], its `namespaceSelector` pinned to its namespace (when it
    /// has none) and its rules of scope `*` narrowed to `Namespaced`. What it sets against that
    /// (a selector of its own, a `Cluster` rule) is left for validation to refuse, with the
    /// field.
    pub fn scoped_policy(&self) -> Policy {
        let namespace = self.metadata.namespace.clone().unwrap_or_default();
        let name = self.metadata.name.clone().unwrap_or_default();
        let mut metadata = self.metadata.clone();
        metadata.name = Some(namespaced_stem(&namespace, &name));
        metadata.namespace = None;
        metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                NAMESPACED_POLICY_ANNOTATION.to_string(),
                format!("{namespace}/{name}"),
            );
        let mut spec = self.spec.clone();
        if spec.match_.namespace_selector.is_none() {
            spec.match_.namespace_selector = Some(only_namespace(&namespace));
        }
        for rule in &mut spec.match_.rules {
            if rule.scope == Scope::All {
                rule.scope = Scope::Namespaced;
            }
        }
        Policy {
            metadata,
            spec,
            status: self.status.clone(),
        }
    }
}

/// `policy`, a Policy as stored, without the mark only [`NamespacedPolicy::scoped_policy`] sets:
/// a Policy carrying [`NAMESPACED_POLICY_ANNOTATION`] itself is still a Policy.
pub fn unmarked(mut policy: Policy) -> Policy {
    if let Some(annotations) = policy.metadata.annotations.as_mut() {
        annotations.remove(NAMESPACED_POLICY_ANNOTATION);
    }
    policy
}

/// The selector of exactly the Namespace `namespace`.
pub fn only_namespace(namespace: &str) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.to_string(),
            operator: "In".to_string(),
            values: Some(vec![namespace.to_string()]),
        }]),
        match_labels: None,
    }
}

/// The name the NamespacedPolicy `namespace/name` runs under, unique beside every Policy name:
/// `<name>.<namespace>.namespaced`. It names its webhook entry and generated admission policies.
pub fn namespaced_stem(namespace: &str, name: &str) -> String {
    format!("{name}.{namespace}{NAMESPACED_STEM_SUFFIX}")
}

/// Whether a Policy named `name` is a NamespacedPolicy's [stem](namespaced_stem).
pub fn is_namespaced_stem(name: &str) -> bool {
    name.ends_with(NAMESPACED_STEM_SUFFIX)
}

/// The object a Policy the engine runs was written as.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicySource {
    /// A Policy.
    Policy { name: String },
    /// A NamespacedPolicy.
    Namespaced { namespace: String, name: String },
}

impl PolicySource {
    /// What `policy` was written as: a NamespacedPolicy when it carries
    /// [`NAMESPACED_POLICY_ANNOTATION`] and the stem that annotation gives as its name (as
    /// [`NamespacedPolicy::scoped_policy`] makes it).
    pub fn of(policy: &Policy) -> Self {
        let origin = policy
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NAMESPACED_POLICY_ANNOTATION))
            .and_then(|v| v.split_once('/'))
            .filter(|(namespace, name)| {
                policy.metadata.name.as_deref() == Some(&namespaced_stem(namespace, name))
            });
        match origin {
            Some((namespace, name)) => PolicySource::Namespaced {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            None => PolicySource::Policy {
                name: policy.metadata.name.clone().unwrap_or_default(),
            },
        }
    }

    /// The namespace of a NamespacedPolicy.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            PolicySource::Policy { .. } => None,
            PolicySource::Namespaced { namespace, .. } => Some(namespace),
        }
    }

    /// `metadata.name` of the object.
    pub fn name(&self) -> &str {
        match self {
            PolicySource::Policy { name } | PolicySource::Namespaced { name, .. } => name,
        }
    }

    /// The object's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            PolicySource::Policy { .. } => "Policy",
            PolicySource::Namespaced { .. } => NAMESPACED_POLICY_KIND,
        }
    }

    /// The object's plural.
    pub fn plural(&self) -> &'static str {
        match self {
            PolicySource::Policy { .. } => "policies",
            PolicySource::Namespaced { .. } => NAMESPACED_POLICY_PLURAL,
        }
    }
}

/// `Policy name` or `NamespacedPolicy namespace/name`.
impl fmt::Display for PolicySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicySource::Policy { name } => write!(f, "Policy {name}"),
            PolicySource::Namespaced { namespace, name } => {
                write!(f, "{NAMESPACED_POLICY_KIND} {namespace}/{name}")
            }
        }
    }
}

impl Serialize for NamespacedPolicy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = if self.status.is_some() { 5 } else { 4 };
        let mut s = serializer.serialize_struct(NAMESPACED_POLICY_KIND, fields)?;
        s.serialize_field("apiVersion", &Self::api_version(&()))?;
        s.serialize_field("kind", NAMESPACED_POLICY_KIND)?;
        s.serialize_field("metadata", &self.metadata)?;
        s.serialize_field("spec", &self.spec)?;
        if let Some(status) = &self.status {
            s.serialize_field("status", status)?;
        }
        s.end()
    }
}

impl Resource for NamespacedPolicy {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        NAMESPACED_POLICY_KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        super::GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        NAMESPACED_POLICY_PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Rules the API server holds a NamespacedPolicy to, beside a Policy's: what it refuses here is
/// refused at `kubectl apply` even while Gatehouse is down.
const NAMESPACED_RULES: [(&str, &str, &str); 2] = [
    (
        "!has(self.match.namespaceSelector)",
        "a NamespacedPolicy applies only to objects in its own namespace: namespaceSelector is not allowed",
        ".match.namespaceSelector",
    ),
    (
        "self.match.rules.all(r, !has(r.scope) || r.scope != 'Cluster')",
        "a NamespacedPolicy cannot select cluster-scoped kinds: scope Cluster is not allowed",
        ".match.rules",
    ),
];

/// The NamespacedPolicy CRD: the Policy CRD's schema and columns, namespaced, with
/// [`NAMESPACED_RULES`] on the spec.
pub fn namespaced_policy_crd() -> CustomResourceDefinition {
    let mut crd = Policy::crd();
    crd.metadata.name = Some(format!("{NAMESPACED_POLICY_PLURAL}.{}", super::GROUP));
    crd.spec.scope = "Namespaced".to_string();
    let names = &mut crd.spec.names;
    names.kind = NAMESPACED_POLICY_KIND.to_string();
    names.list_kind = Some(format!("{NAMESPACED_POLICY_KIND}List"));
    names.plural = NAMESPACED_POLICY_PLURAL.to_string();
    names.singular = Some(NAMESPACED_POLICY_KIND.to_lowercase());
    names.short_names = Some(vec![NAMESPACED_POLICY_SHORT_NAME.to_string()]);
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        schema.description = Some(
            "A NamespacedPolicy: a Policy of one namespace's own, applying only to objects in \
             that namespace; every Policy's mutations run after its own."
                .to_string(),
        );
        let Some(spec) = schema.properties.as_mut().and_then(|p| p.get_mut("spec")) else {
            continue;
        };
        let rules = spec.x_kubernetes_validations.get_or_insert_with(Vec::new);
        for (rule, message, field_path) in NAMESPACED_RULES {
            rules.push(
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule {
                    rule: rule.to_string(),
                    message: Some(message.to_string()),
                    field_path: Some(field_path.to_string()),
                    reason: Some("FieldValueForbidden".to_string()),
                    message_expression: None,
                    optional_old_self: None,
                },
            );
        }
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant() -> NamespacedPolicy {
        let mut spec = crate::v1alpha1::sample_spec(100, true, false);
        spec.match_.rules.push(crate::v1alpha1::Rule {
            operations: vec![crate::v1alpha1::Operation::Create],
            api_groups: vec![String::new()],
            api_versions: vec!["v1".into()],
            resources: vec!["pods".into()],
            scope: Scope::All,
        });
        NamespacedPolicy::new("team-a", "labels", spec)
    }

    #[test]
    fn runs_as_a_policy_of_its_namespace_only() {
        let policy = tenant().scoped_policy();
        assert_eq!(
            policy.metadata.name.as_deref(),
            Some("labels.team-a.namespaced")
        );
        assert!(is_namespaced_stem(policy.metadata.name.as_deref().unwrap()));
        assert_eq!(
            policy.spec.match_.namespace_selector,
            Some(only_namespace("team-a"))
        );
        assert_eq!(policy.spec.match_.rules[0].scope, Scope::Namespaced);
        let source = PolicySource::of(&policy);
        assert_eq!(
            source,
            PolicySource::Namespaced {
                namespace: "team-a".into(),
                name: "labels".into()
            }
        );
        assert_eq!(source.to_string(), "NamespacedPolicy team-a/labels");
    }

    #[test]
    fn keeps_what_it_must_not_set_for_validation_to_refuse() {
        let mut np = tenant();
        let own = LabelSelector::default();
        np.spec.match_.namespace_selector = Some(own.clone());
        np.spec.match_.rules[0].scope = Scope::Cluster;
        let policy = np.scoped_policy();
        assert_eq!(policy.spec.match_.namespace_selector, Some(own));
        assert_eq!(policy.spec.match_.rules[0].scope, Scope::Cluster);
    }

    #[test]
    fn a_policy_cannot_pass_for_a_namespaced_one() {
        let mut forged = tenant().scoped_policy();
        forged.spec = crate::v1alpha1::sample_spec(1, true, false);
        assert!(matches!(
            PolicySource::of(&forged),
            PolicySource::Namespaced { .. }
        ));
        assert!(matches!(
            PolicySource::of(&unmarked(forged)),
            PolicySource::Policy { .. }
        ));
    }

    #[test]
    fn a_policy_is_its_own_source() {
        let policy = Policy::new("p", crate::v1alpha1::sample_spec(1, true, false));
        assert_eq!(
            PolicySource::of(&policy),
            PolicySource::Policy { name: "p".into() }
        );
        assert_eq!(PolicySource::of(&policy).to_string(), "Policy p");
    }

    #[test]
    fn serializes_with_its_type() {
        let json = serde_json::to_value(tenant()).unwrap();
        assert_eq!(json["apiVersion"], "gatehouse.dev/v1alpha1");
        assert_eq!(json["kind"], "NamespacedPolicy");
        let back: NamespacedPolicy = serde_json::from_value(json).unwrap();
        assert_eq!(back, tenant());
    }

    #[test]
    fn crd_is_namespaced_and_refuses_what_a_tenant_cannot_select() {
        let crd = namespaced_policy_crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("namespacedpolicies.gatehouse.dev")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, "NamespacedPolicy");
        let json = serde_json::to_value(&crd).unwrap();
        let rules = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["x-kubernetes-validations"];
        let text = rules.to_string();
        assert!(
            text.contains("!has(self.match.namespaceSelector)"),
            "{text}"
        );
        assert!(text.contains("r.scope != 'Cluster'"), "{text}");
    }
}
