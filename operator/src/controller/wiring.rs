//! Policies → webhook configurations, as a pure function of the valid Policies, the way the API
//! server reaches Gatehouse, and the CA bundle.
use std::collections::{BTreeMap, HashSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use crate::api::v1alpha1::{GROUP, Policy, Rule};
use crate::webhook::{MUTATE_PREFIX, VALIDATE_POLICY_PATH, VALIDATE_PREFIX};

/// Name of both webhook configurations Gatehouse owns.
pub const CONFIGURATION_NAME: &str = "gatehouse";
/// Suffix of every entry name (`<policy>.gatehouse.dev`).
pub const ENTRY_SUFFIX: &str = ".gatehouse.dev";
/// Entry that validates Policy objects themselves.
pub const SELF_ENTRY_NAME: &str = "policies.validation.gatehouse.dev";
/// Label the API server sets on every Namespace; the exclusion selects on it.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Label on the owned configurations, so they can be found (and watched) by label.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "gatehouse");

/// How the API server reaches the webhook server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `clientConfig.service`: the in-cluster production form.
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
    /// `clientConfig.url`: out of cluster; the base has no trailing slash.
    Url { base: String },
}

impl Endpoint {
    fn client_config(&self, path: &str, ca_bundle: &str) -> WebhookClientConfig {
        let ca_bundle = Some(ByteString(ca_bundle.as_bytes().to_vec()));
        match self {
            Endpoint::Service {
                namespace,
                name,
                port,
            } => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    port: Some(*port),
                    path: Some(path.to_string()),
                }),
                url: None,
            },
            Endpoint::Url { base } => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
        }
    }
}

/// Everything about the wiring that does not come from the Policies.
#[derive(Clone, Debug)]
pub struct Wiring {
    pub endpoint: Endpoint,
    /// Namespaces no Policy ever touches: kube-system and friends plus Gatehouse's own.
    pub excluded_namespaces: Vec<String>,
}

/// The desired pair of configurations.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub mutating: MutatingWebhookConfiguration,
    pub validating: ValidatingWebhookConfiguration,
}

/// Builds both configurations from valid Policies. Mutating entries are ordered by
/// (priority, name): within one configuration the API server calls them in list order, which
/// gives Gatehouse Policies a defined order.
pub fn desired(policies: &[&Policy], wiring: &Wiring, ca_bundle: &str) -> Desired {
    let mut sorted: Vec<&Policy> = policies.to_vec();
    sorted
        .sort_by(|a, b| (a.spec.priority, policy_name(a)).cmp(&(b.spec.priority, policy_name(b))));

    let mutating = sorted
        .iter()
        .filter(|p| crate::engine::is_mutating(&p.spec))
        .map(|p| mutating_entry(p, wiring, ca_bundle))
        .collect();
    let mut validating: Vec<ValidatingWebhook> = vec![self_entry(wiring, ca_bundle)];
    validating.extend(
        sorted
            .iter()
            .filter(|p| !p.spec.validate.is_empty())
            .map(|p| validating_entry(p, wiring, ca_bundle)),
    );
    Desired {
        mutating: MutatingWebhookConfiguration {
            metadata: owned_meta(),
            webhooks: Some(mutating),
        },
        validating: ValidatingWebhookConfiguration {
            metadata: owned_meta(),
            webhooks: Some(validating),
        },
    }
}

fn owned_meta() -> ObjectMeta {
    ObjectMeta {
        name: Some(CONFIGURATION_NAME.to_string()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.0.to_string(),
            MANAGED_BY_LABEL.1.to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

fn policy_name(p: &Policy) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

/// Entry name of a Policy: `<policy>.gatehouse.dev`.
pub fn entry_name(policy: &str) -> String {
    format!("{policy}{ENTRY_SUFFIX}")
}

/// The Policies whose entries the given (live) configurations hold, by entry name.
pub fn wired_policies<'a>(
    mutating: impl IntoIterator<Item = &'a MutatingWebhookConfiguration>,
    validating: impl IntoIterator<Item = &'a ValidatingWebhookConfiguration>,
) -> HashSet<String> {
    let mutating = mutating
        .into_iter()
        .flat_map(|c| c.webhooks.iter().flatten().map(|w| w.name.as_str()));
    let validating = validating
        .into_iter()
        .flat_map(|c| c.webhooks.iter().flatten().map(|w| w.name.as_str()));
    mutating
        .chain(validating)
        .filter(|name| *name != SELF_ENTRY_NAME)
        .filter_map(|name| name.strip_suffix(ENTRY_SUFFIX))
        .map(str::to_string)
        .collect()
}

/// The fields a mutating and a validating entry of one Policy share.
struct Entry {
    name: String,
    client_config: WebhookClientConfig,
    failure_policy: Option<String>,
    match_conditions: Option<Vec<MatchCondition>>,
    namespace_selector: Option<LabelSelector>,
    object_selector: Option<LabelSelector>,
    rules: Option<Vec<RuleWithOperations>>,
    timeout_seconds: Option<i32>,
}

impl Entry {
    fn new(p: &Policy, wiring: &Wiring, ca_bundle: &str, prefix: &str) -> Self {
        let name = policy_name(p);
        Self {
            name: entry_name(name),
            client_config: wiring
                .endpoint
                .client_config(&format!("{prefix}{name}"), ca_bundle),
            failure_policy: Some(p.spec.failure_policy.as_str().to_string()),
            match_conditions: match_conditions(p),
            namespace_selector: Some(namespace_selector(
                p.spec.match_.namespace_selector.as_ref(),
                &wiring.excluded_namespaces,
            )),
            object_selector: p.spec.match_.object_selector.clone(),
            rules: Some(rules(&p.spec.match_.rules)),
            timeout_seconds: Some(p.spec.timeout_seconds),
        }
    }
}

/// `sideEffects: None` is true by construction: admission never writes anything.
const SIDE_EFFECTS: &str = "None";
/// Rules match every version a resource is served at, as users expect of a policy.
const MATCH_POLICY: &str = "Equivalent";

fn mutating_entry(p: &Policy, wiring: &Wiring, ca_bundle: &str) -> MutatingWebhook {
    let e = Entry::new(p, wiring, ca_bundle, MUTATE_PREFIX);
    MutatingWebhook {
        name: e.name,
        admission_review_versions: vec!["v1".to_string()],
        client_config: e.client_config,
        failure_policy: e.failure_policy,
        match_conditions: e.match_conditions,
        match_policy: Some(MATCH_POLICY.to_string()),
        namespace_selector: e.namespace_selector,
        object_selector: e.object_selector,
        reinvocation_policy: Some(p.spec.reinvocation_policy.as_str().to_string()),
        rules: e.rules,
        side_effects: SIDE_EFFECTS.to_string(),
        timeout_seconds: e.timeout_seconds,
    }
}

fn validating_entry(p: &Policy, wiring: &Wiring, ca_bundle: &str) -> ValidatingWebhook {
    let e = Entry::new(p, wiring, ca_bundle, VALIDATE_PREFIX);
    ValidatingWebhook {
        name: e.name,
        admission_review_versions: vec!["v1".to_string()],
        client_config: e.client_config,
        failure_policy: e.failure_policy,
        match_conditions: e.match_conditions,
        match_policy: Some(MATCH_POLICY.to_string()),
        namespace_selector: e.namespace_selector,
        object_selector: e.object_selector,
        rules: e.rules,
        side_effects: SIDE_EFFECTS.to_string(),
        timeout_seconds: e.timeout_seconds,
    }
}

/// Gatehouse's own check of Policy objects. `failurePolicy: Ignore` on purpose: if Gatehouse is
/// down, Policies can still be applied (the controller marks invalid ones Ready=False), so the
/// operator can never lock users out of its own API.
fn self_entry(wiring: &Wiring, ca_bundle: &str) -> ValidatingWebhook {
    ValidatingWebhook {
        name: SELF_ENTRY_NAME.to_string(),
        admission_review_versions: vec!["v1".to_string()],
        client_config: wiring
            .endpoint
            .client_config(VALIDATE_POLICY_PATH, ca_bundle),
        failure_policy: Some("Ignore".to_string()),
        match_conditions: None,
        match_policy: Some(MATCH_POLICY.to_string()),
        namespace_selector: None,
        object_selector: None,
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![GROUP.to_string()]),
            api_versions: Some(vec!["*".to_string()]),
            operations: Some(vec!["CREATE".to_string(), "UPDATE".to_string()]),
            resources: Some(vec!["policies".to_string()]),
            scope: Some("Cluster".to_string()),
        }]),
        side_effects: SIDE_EFFECTS.to_string(),
        timeout_seconds: Some(5),
    }
}

fn rules(rules: &[Rule]) -> Vec<RuleWithOperations> {
    rules
        .iter()
        .map(|r| RuleWithOperations {
            api_groups: Some(r.api_groups.clone()),
            api_versions: Some(r.api_versions.clone()),
            operations: Some(
                r.operations
                    .iter()
                    .map(|o| o.as_str().to_string())
                    .collect(),
            ),
            resources: Some(r.resources.clone()),
            scope: Some(r.scope.as_str().to_string()),
        })
        .collect()
}

fn match_conditions(p: &Policy) -> Option<Vec<MatchCondition>> {
    let conditions = &p.spec.match_.conditions;
    (!conditions.is_empty()).then(|| {
        conditions
            .iter()
            .map(|c| MatchCondition {
                name: c.name.clone(),
                expression: c.expression.clone(),
            })
            .collect()
    })
}

/// The Policy's namespaceSelector with the exclusion ANDed in. Requirements of a selector are
/// ANDed, so appending one `NotIn` keeps the user's meaning and adds the guarantee.
pub fn namespace_selector(user: Option<&LabelSelector>, excluded: &[String]) -> LabelSelector {
    let mut selector = user.cloned().unwrap_or_default();
    if !excluded.is_empty() {
        let mut values: Vec<String> = excluded.to_vec();
        values.sort();
        values.dedup();
        selector
            .match_expressions
            .get_or_insert_with(Vec::new)
            .push(LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.to_string(),
                operator: "NotIn".to_string(),
                values: Some(values),
            });
    }
    selector
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{
        MatchSpec, Mutation, Operation, PolicySpec, ReinvocationPolicy, Scope, ValidationRule,
    };
    use serde_json::json;

    fn policy(name: &str, priority: i32, mutate: bool, validate: bool) -> Policy {
        let mut spec = PolicySpec {
            priority,
            match_: MatchSpec {
                rules: vec![Rule {
                    operations: vec![Operation::Create],
                    api_groups: vec!["".into()],
                    api_versions: vec!["v1".into()],
                    resources: vec!["pods".into()],
                    scope: Scope::Namespaced,
                }],
                ..MatchSpec::default()
            },
            failure_policy: Default::default(),
            timeout_seconds: 7,
            reinvocation_policy: ReinvocationPolicy::IfNeeded,
            mutate: vec![],
            validate: vec![],
            effects: vec![],
        };
        if mutate {
            spec.mutate.push(Mutation {
                merge: json!({"metadata": {"labels": {"a": "b"}}}),
                ..Mutation::default()
            });
        }
        if validate {
            spec.validate.push(ValidationRule {
                expression: "true".into(),
                message: "m".into(),
                action: Default::default(),
            });
        }
        Policy::new(name, spec)
    }

    fn wiring() -> Wiring {
        Wiring {
            endpoint: Endpoint::Service {
                namespace: "gatehouse-system".into(),
                name: "gatehouse-webhook".into(),
                port: 443,
            },
            excluded_namespaces: vec![
                "kube-system".into(),
                "kube-node-lease".into(),
                "gatehouse-system".into(),
            ],
        }
    }

    #[test]
    fn mutating_entries_follow_priority_then_name() {
        let (a, b, c) = (
            policy("zeta", 10, true, false),
            policy("alpha", 100, true, false),
            policy("beta", 10, true, false),
        );
        let d = desired(&[&a, &b, &c], &wiring(), "CA");
        let names: Vec<_> = d
            .mutating
            .webhooks
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(
            names,
            [
                "beta.gatehouse.dev",
                "zeta.gatehouse.dev",
                "alpha.gatehouse.dev"
            ]
        );
    }

    #[test]
    fn entries_carry_paths_bundle_and_truthful_side_effects() {
        let p = policy("both", 100, true, true);
        let d = desired(&[&p], &wiring(), "PEM");
        let m = &d.mutating.webhooks.as_ref().unwrap()[0];
        assert_eq!(m.side_effects, "None");
        assert_eq!(m.match_policy.as_deref(), Some("Equivalent"));
        assert_eq!(m.reinvocation_policy.as_deref(), Some("IfNeeded"));
        assert_eq!(m.timeout_seconds, Some(7));
        assert_eq!(m.admission_review_versions, ["v1"]);
        let svc = m.client_config.service.as_ref().unwrap();
        assert_eq!(svc.path.as_deref(), Some("/mutate/both"));
        assert_eq!(svc.port, Some(443));
        assert_eq!(m.client_config.ca_bundle.as_ref().unwrap().0, b"PEM");
        let v = d.validating.webhooks.as_ref().unwrap();
        assert_eq!(v[0].name, SELF_ENTRY_NAME);
        assert_eq!(v[0].failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(v[1].name, "both.gatehouse.dev");
        assert_eq!(
            v[1].client_config.service.as_ref().unwrap().path.as_deref(),
            Some("/validate/both")
        );
    }

    #[test]
    fn policies_land_only_in_the_configurations_they_need() {
        let (m, v) = (policy("m", 1, true, false), policy("v", 1, false, true));
        let d = desired(&[&m, &v], &wiring(), "CA");
        assert_eq!(d.mutating.webhooks.as_ref().unwrap().len(), 1);
        // The self entry plus v.
        assert_eq!(d.validating.webhooks.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn wired_policies_are_read_back_from_entry_names() {
        let (m, v) = (policy("m", 1, true, false), policy("v", 1, false, true));
        let d = desired(&[&m, &v], &wiring(), "CA");
        let names = wired_policies([&d.mutating], [&d.validating]);
        assert_eq!(names, HashSet::from(["m".to_string(), "v".to_string()]));
        assert!(wired_policies([], []).is_empty());
    }

    #[test]
    fn url_mode_appends_the_path() {
        let w = Wiring {
            endpoint: Endpoint::Url {
                base: "https://127.0.0.1:9443/".into(),
            },
            excluded_namespaces: vec![],
        };
        let p = policy("p", 1, true, false);
        let d = desired(&[&p], &w, "CA");
        let cc = &d.mutating.webhooks.unwrap()[0].client_config;
        assert_eq!(cc.url.as_deref(), Some("https://127.0.0.1:9443/mutate/p"));
        assert!(cc.service.is_none());
    }

    #[test]
    fn exclusion_is_anded_with_the_users_selector() {
        let user = LabelSelector {
            match_labels: Some(BTreeMap::from([("inject".into(), "enabled".into())])),
            match_expressions: None,
        };
        let s = namespace_selector(
            Some(&user),
            &["kube-system".into(), "gh".into(), "gh".into()],
        );
        assert_eq!(s.match_labels, user.match_labels);
        let e = &s.match_expressions.unwrap()[0];
        assert_eq!(e.key, "kubernetes.io/metadata.name");
        assert_eq!(e.operator, "NotIn");
        assert_eq!(e.values.as_deref().unwrap(), ["gh", "kube-system"]);
    }
}
