//! Policies → webhook configurations, as a pure function of the valid Policies, the way the API
//! server reaches Gatehouse, and the CA bundle.
//!
//! Policies share entries ([`gatehouse_engine::group`]): a shared entry's rules are the union of its
//! members' rules, its namespaceSelector and objectSelector the exact union of theirs (the system
//! exclusion ANDed in), its timeout the largest of theirs, with no matchConditions; Gatehouse
//! matches each member itself, and the entry's selectors keep an outage to the members' scope. A Policy whose conditions use `authorizer` keeps an entry of its own with all of its
//! match fields, as every Policy had before. Both configurations carry the membership of every
//! entry in the annotation [`GROUPS_ANNOTATION`], so every replica can answer every entry the
//! API server may call.
pub mod admission_policy;
pub mod defaulting;
pub mod derived_defaults;
pub mod in_process_cap;
pub mod jsonpatch_cel;
mod mutating_footprints;
mod mutating_groups;
pub mod mutating_join;
pub mod mutating_policy;
mod mutating_translation;
pub mod placement;
pub mod probe;
pub mod schema_fit;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};

use gatehouse_api::v1alpha1::{
    GROUP, NAMESPACE_NAME_LABEL, NAMESPACED_POLICY_PLURAL, Policy, Rule,
};
use gatehouse_engine::Phase;
use gatehouse_engine::coverage::{Coverage, Selector};
use gatehouse_engine::entry::VALIDATE_POLICY_PATH;
use gatehouse_engine::group::{self, Group};

/// Name of both webhook configurations Gatehouse owns.
pub const CONFIGURATION_NAME: &str = "gatehouse";
/// Name of the configuration only ever dry-run, to have the API server check match conditions
/// ([`condition_check`]).
pub const CONDITION_CHECK_NAME: &str = "gatehouse-condition-check";
/// Annotation on both configurations: the membership of every entry, as JSON.
pub const GROUPS_ANNOTATION: &str = "gatehouse.dev/groups";
/// Largest `timeoutSeconds` the API server accepts.
const MAX_TIMEOUT_SECONDS: i32 = 30;
/// Entry that validates Policy objects themselves.
pub const SELF_ENTRY_NAME: &str = "policies.validation.gatehouse.dev";
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
    /// Gatehouse's own namespace: where the probe of in-process enforcement creates (dry run)
    /// its Lease.
    pub home_namespace: String,
    /// Name of the installation's ClusterRole, which owns both configurations: deleting the
    /// installation lets the garbage collector remove them, so an uninstalled Gatehouse leaves
    /// no webhook behind to lock the cluster out.
    pub owner_cluster_role: Option<String>,
    /// That ClusterRole as an owner reference, once read.
    pub owner: Option<OwnerReference>,
    /// How many generated admission policies `enforcement: Auto` keeps in-process, at most
    /// ([`in_process_cap`]).
    pub max_admission_policies: usize,
}

/// The desired pair of configurations.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub mutating: MutatingWebhookConfiguration,
    pub validating: ValidatingWebhookConfiguration,
}

/// Builds both configurations from valid Policies: the entries of their groups, mutating ones
/// in the order the API server must call them.
pub fn desired(policies: &[&Policy], wiring: &Wiring, ca_bundle: &str) -> Desired {
    let groups = group::groups(policies);
    let by_name: BTreeMap<&str, &Policy> = policies.iter().map(|p| (policy_name(p), *p)).collect();
    let members = |g: &Group| -> Vec<&Policy> {
        g.members
            .iter()
            .filter_map(|m| by_name.get(m.as_str()).copied())
            .collect()
    };
    let mutating = groups
        .mutating
        .iter()
        .map(|g| mutating_entry(&Entry::new(g, &members(g), wiring, ca_bundle)))
        .collect();
    let mut validating: Vec<ValidatingWebhook> = vec![self_entry(wiring, ca_bundle)];
    validating.extend(
        groups
            .validating
            .iter()
            .map(|g| validating_entry(&Entry::new(g, &members(g), wiring, ca_bundle))),
    );
    let all: Vec<&Group> = groups.iter().collect();
    // Plain structs of strings always serialise.
    let annotation = serde_json::to_string(&all).unwrap_or_default();
    let metadata = owned_meta(&annotation, wiring.owner.as_ref());
    Desired {
        mutating: MutatingWebhookConfiguration {
            metadata: metadata.clone(),
            webhooks: Some(mutating),
        },
        validating: ValidatingWebhookConfiguration {
            metadata,
            webhooks: Some(validating),
        },
    }
}

fn owned_meta(groups: &str, owner: Option<&OwnerReference>) -> ObjectMeta {
    ObjectMeta {
        owner_references: owner.map(|o| vec![o.clone()]),
        name: Some(CONFIGURATION_NAME.to_string()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.0.to_string(),
            MANAGED_BY_LABEL.1.to_string(),
        )])),
        annotations: Some(BTreeMap::from([(
            GROUPS_ANNOTATION.to_string(),
            groups.to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

fn policy_name(p: &Policy) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

/// A configuration that gives each of `policies` an entry of its own with every match field, as
/// the API server would judge them: never stored, only dry-run. Shared entries carry no match
/// conditions, so without it the API server (its CEL checker, and whatever admission policies
/// the cluster has on webhook configurations) would never judge them, and a condition it refuses would fail on every request instead
/// of being reported when the Policy is applied.
pub fn condition_check(
    policies: &[&Policy],
    wiring: &Wiring,
    ca_bundle: &str,
) -> ValidatingWebhookConfiguration {
    let webhooks = policies
        .iter()
        .map(|p| {
            let g = group::own(p, Phase::Validating);
            validating_entry(&Entry::new(&g, &[p], wiring, ca_bundle))
        })
        .collect();
    let mut metadata = owned_meta("[]", None);
    metadata.name = Some(CONDITION_CHECK_NAME.to_string());
    ValidatingWebhookConfiguration {
        metadata,
        webhooks: Some(webhooks),
    }
}

/// The groups the given (live) configurations hold, from their membership annotation.
pub fn wired_groups<'a>(
    mutating: impl IntoIterator<Item = &'a MutatingWebhookConfiguration>,
    validating: impl IntoIterator<Item = &'a ValidatingWebhookConfiguration>,
) -> Vec<Group> {
    let annotations = mutating
        .into_iter()
        .map(|c| &c.metadata)
        .chain(validating.into_iter().map(|c| &c.metadata))
        .filter_map(|m| m.annotations.as_ref()?.get(GROUPS_ANNOTATION));
    let mut out: Vec<Group> = Vec::new();
    for text in annotations {
        for g in serde_json::from_str::<Vec<Group>>(text).unwrap_or_default() {
            if !out.contains(&g) {
                out.push(g);
            }
        }
    }
    out
}

/// The fields a mutating and a validating entry share.
struct Entry {
    name: String,
    client_config: WebhookClientConfig,
    failure_policy: Option<String>,
    reinvocation_policy: Option<String>,
    match_conditions: Option<Vec<MatchCondition>>,
    namespace_selector: Option<LabelSelector>,
    object_selector: Option<LabelSelector>,
    rules: Option<Vec<RuleWithOperations>>,
    timeout_seconds: Option<i32>,
}

impl Entry {
    fn new(g: &Group, members: &[&Policy], wiring: &Wiring, ca_bundle: &str) -> Self {
        let client_config = wiring.endpoint.client_config(&g.path(), ca_bundle);
        let timeout = members
            .iter()
            .map(|p| p.spec.timeout_seconds)
            .max()
            .unwrap_or(MAX_TIMEOUT_SECONDS)
            .min(MAX_TIMEOUT_SECONDS);
        // A Policy's own entry keeps every match field: the API server matches it. A shared
        // entry selects the exact union of its members' selectors (the grouping made sure
        // there is one), so the API server calls it only where some member may apply.
        let own = members.first().filter(|_| g.is_own());
        let (rules, conditions, namespaces, objects) = match own {
            Some(p) => (
                rules(&p.spec.match_.rules),
                match_conditions(p),
                p.spec.match_.namespace_selector.clone(),
                p.spec.match_.object_selector.clone(),
            ),
            None => {
                let coverage = Coverage::of_members(members.iter().map(|p| &p.spec));
                (
                    union_of_rules(members.iter().flat_map(|p| &p.spec.match_.rules)),
                    None,
                    coverage.namespace_selector(),
                    coverage.object_selector(),
                )
            }
        };
        Self {
            name: g.entry_name(),
            client_config,
            failure_policy: Some(g.failure_policy.as_str().to_string()),
            reinvocation_policy: Some(g.reinvocation_policy.as_str().to_string()),
            match_conditions: conditions,
            namespace_selector: Some(namespace_selector(
                namespaces.as_ref(),
                &wiring.excluded_namespaces,
            )),
            object_selector: objects,
            rules: Some(rules),
            timeout_seconds: Some(timeout),
        }
    }
}

/// `sideEffects: None` is true by construction: admission never writes anything.
const SIDE_EFFECTS: &str = "None";
/// Rules match every version a resource is served at, as users expect of a policy.
const MATCH_POLICY: &str = "Equivalent";

/// Builds a webhook entry of type `$kind` from an `Entry`. The mutating and the validating
/// types are distinct structs with the same fields, but for the `$extra` ones only a mutating
/// entry has (`reinvocation_policy`), so one macro rather than a function serves both.
macro_rules! webhook_entry {
    ($kind:ident, $e:expr $(, $extra:ident)*) => {{
        let e: &Entry = $e;
        $kind {
            name: e.name.clone(),
            admission_review_versions: vec!["v1".to_string()],
            client_config: e.client_config.clone(),
            failure_policy: e.failure_policy.clone(),
            match_conditions: e.match_conditions.clone(),
            match_policy: Some(MATCH_POLICY.to_string()),
            namespace_selector: e.namespace_selector.clone(),
            object_selector: e.object_selector.clone(),
            rules: e.rules.clone(),
            side_effects: SIDE_EFFECTS.to_string(),
            timeout_seconds: e.timeout_seconds,
            $($extra: e.$extra.clone(),)*
        }
    }};
}

fn mutating_entry(e: &Entry) -> MutatingWebhook {
    webhook_entry!(MutatingWebhook, e, reinvocation_policy)
}

fn validating_entry(e: &Entry) -> ValidatingWebhook {
    webhook_entry!(ValidatingWebhook, e)
}

/// Gatehouse's own check of Policy and NamespacedPolicy objects. `failurePolicy: Ignore` on purpose: if Gatehouse is
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
            resources: Some(vec![
                "policies".to_string(),
                NAMESPACED_POLICY_PLURAL.to_string(),
            ]),
            scope: Some("*".to_string()),
        }]),
        side_effects: SIDE_EFFECTS.to_string(),
        timeout_seconds: Some(5),
    }
}

/// The union of `rules`, readable: rules that differ only in their operations become one, with
/// the union of the operations; the result is sorted and has no duplicates.
fn union_of_rules<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> Vec<RuleWithOperations> {
    type Target = (Vec<String>, Vec<String>, Vec<String>, &'static str);
    let sorted = |v: &[String]| -> Vec<String> {
        v.iter()
            .cloned()
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect()
    };
    let mut merged: BTreeMap<Target, BTreeSet<&'static str>> = BTreeMap::new();
    for r in rules {
        let target = (
            sorted(&r.api_groups),
            sorted(&r.api_versions),
            sorted(&r.resources),
            r.scope.as_str(),
        );
        merged
            .entry(target)
            .or_default()
            .extend(r.operations.iter().map(|o| o.as_str()));
    }
    merged
        .into_iter()
        .map(|((groups, versions, resources, scope), ops)| {
            // `*` covers every operation; listing others beside it is noise.
            let ops: Vec<String> = if ops.contains("*") {
                vec!["*".to_string()]
            } else {
                ops.into_iter().map(str::to_string).collect()
            };
            RuleWithOperations {
                api_groups: Some(groups),
                api_versions: Some(versions),
                operations: Some(ops),
                resources: Some(resources),
                scope: Some(scope.to_string()),
            }
        })
        .collect()
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
///
/// A selector that already selects no excluded namespace (e.g. it pins the namespace name to
/// others) gets no `NotIn`: the API server parses an admission policy's selectors again for
/// every namespaced request, so each requirement costs every request of the cluster, selected
/// or not.
pub fn namespace_selector(user: Option<&LabelSelector>, excluded: &[String]) -> LabelSelector {
    let mut selector = user.cloned().unwrap_or_default();
    if excluded.is_empty() {
        return selector;
    }
    let mut values: Vec<String> = excluded.to_vec();
    values.sort();
    values.dedup();
    let exclusion = LabelSelectorRequirement {
        key: NAMESPACE_NAME_LABEL.to_string(),
        operator: "NotIn".to_string(),
        values: Some(values),
    };
    let excluding = LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![exclusion.clone()]),
    };
    if !Selector::of(Some(&excluding)).contains(&Selector::of(Some(&selector))) {
        selector
            .match_expressions
            .get_or_insert_with(Vec::new)
            .push(exclusion);
    }
    selector
}

#[cfg(test)]
mod tests;
