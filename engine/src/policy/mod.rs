//! Validation and compilation of Policies.
//!
//! [`validate`] is the single judge of what a valid Policy is: the Policy admission webhook, the
//! controller (which writes the problems into status) and `gatehouse eval` all call it, so a
//! Policy is never accepted by one and rejected by another. It reports every problem at once,
//! each with the field path a user has to edit. The checks themselves are in `checks`.
use std::collections::BTreeSet;
use std::fmt;

use ::cel::Program;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::entry::ENTRY_SUFFIX;
use super::merge::is_valid_path;
use gatehouse_api::v1alpha1::{
    DEFAULT_IPAM_ANNOTATION, IpamEffect, Operation, Policy, PolicySource, PolicySpec,
    ReinvocationPolicy,
};
use gatehouse_cel::k8s_names::{
    DNS1123_SUBDOMAIN_MAX_LENGTH, dns1123_subdomain_form_error, has_dns1123_subdomain_form,
    is_dns1123_subdomain, is_label_value, is_qualified_name,
};
use gatehouse_cel::{self as cel, Expression, Site};
use gatehouse_ipam::annotation::{IPAM_ADDRESS_ANNOTATION, IPAM_POOL_ANNOTATION};

mod checks;
mod tenant;

use checks::analyse;
pub use tenant::validate_namespaced;

pub use crate::problem::Problem;

/// The API server refuses a webhook entry with more match conditions than this.
pub const MAX_MATCH_CONDITIONS: usize = 64;

/// A Policy that [`compile`] refused, with every problem [`validate`] found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct InvalidPolicy {
    pub problems: Vec<Problem>,
}

impl fmt::Display for InvalidPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid Policy: ")?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// A valid Policy with its CEL compiled, shared by every review of its generation.
///
/// `Send + Sync` (asserted in the tests): `cel::Program` is plain AST data, and the CEL
/// environment lives in a process-wide static, so the webhook server can hand
/// `Arc<CompiledPolicy>` to any task.
#[derive(Debug)]
pub struct CompiledPolicy {
    name: String,
    /// What it was written as.
    source: PolicySource,
    generation: Option<i64>,
    spec: PolicySpec,
    /// `spec.match.conditions[i]`.
    pub(crate) conditions: Vec<Expression>,
    /// `spec.mutate[i].when`.
    pub(crate) whens: Vec<Option<Expression>>,
    /// `spec.validate[i].expression`.
    pub(crate) validations: Vec<Expression>,
    /// A match condition reads `authorizer`: see [`needs_own_entry`].
    own_entry: bool,
    /// The largest write-time cost estimate among its expressions ([`gatehouse_cel::cost`]).
    heaviest: u64,
}

impl CompiledPolicy {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How its messages name it: `policy "name"`, or `NamespacedPolicy "namespace/name"`.
    pub fn named(&self) -> String {
        match &self.source {
            PolicySource::Policy { name } => format!("policy {name:?}"),
            PolicySource::Namespaced { namespace, name } => {
                format!("NamespacedPolicy {:?}", format!("{namespace}/{name}"))
            }
        }
    }

    /// `metadata.generation` this was compiled from.
    pub fn generation(&self) -> Option<i64> {
        self.generation
    }

    /// The spec this was compiled from.
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// Whether the Policy has a `mutate` list.
    pub fn has_mutations(&self) -> bool {
        !self.spec.mutate.is_empty()
    }

    /// The IPAM effect, if any (validation allows at most one).
    pub fn ipam(&self) -> Option<&IpamEffect> {
        self.spec.effects.iter().find_map(|e| e.ipam.as_ref())
    }

    /// Whether admission holds the Pods it creates at the companions gate.
    pub fn gates_companions(&self) -> bool {
        gates_companions(&self.spec)
    }

    /// Whether admission holds the Pods it creates at the calls gate.
    pub fn gates_calls(&self) -> bool {
        gates_calls(&self.spec)
    }

    /// Whether the Policy belongs in the MutatingWebhookConfiguration: it mutates, or it marks
    /// objects for the effects loop.
    pub fn is_mutating(&self) -> bool {
        is_mutating(&self.spec)
    }

    /// Whether the Policy belongs in the ValidatingWebhookConfiguration.
    pub fn has_validations(&self) -> bool {
        !self.spec.validate.is_empty()
    }

    /// Whether one of its expressions may cost more than [`gatehouse_cel::cost::HEAVY`] at the assumed
    /// collection size: its reviews take turns on a few threads, so that cheap ones never wait
    /// for a CPU behind them.
    pub fn is_heavy(&self) -> bool {
        self.heaviest > gatehouse_cel::cost::HEAVY
    }
}

/// Whether a Policy with this spec needs a mutating entry: it mutates, or admission marks what
/// it selects for the effects loop (IPAM, the companions or calls gate). Companion objects need no other
/// mark: their loop judges stored objects itself.
pub fn is_mutating(spec: &PolicySpec) -> bool {
    !spec.mutate.is_empty() || marks_for_effects(spec)
}

/// Whether admission marks the objects `spec` selects for the effects loop.
pub fn marks_for_effects(spec: &PolicySpec) -> bool {
    spec.effects.iter().any(|e| e.ipam.is_some()) || gates_companions(spec) || gates_calls(spec)
}

/// Whether admission holds the Pods `spec` selects at the calls gate.
pub fn gates_calls(spec: &PolicySpec) -> bool {
    spec.effects
        .iter()
        .any(|e| e.call.as_ref().is_some_and(|c| c.gate))
}

/// Whether admission holds the Pods `spec` selects at the companions gate.
pub fn gates_companions(spec: &PolicySpec) -> bool {
    spec.effects
        .iter()
        .any(|e| e.object.as_ref().is_some_and(|o| o.gate))
}

/// Whether `spec` asks for anything at admission (a mutation, a mark or a validation): a Policy
/// of companion objects only has no webhook entry and no in-process policy.
pub fn admits(spec: &PolicySpec) -> bool {
    is_mutating(spec) || !spec.validate.is_empty()
}

/// The match-condition variable only the API server can evaluate.
pub const AUTHORIZER: &str = "authorizer";

/// Whether `spec` needs a webhook entry of its own: a match condition reads `authorizer`, which
/// only the API server can evaluate, so the API server must match this Policy itself instead of
/// Gatehouse matching it inside a shared entry ([`super::group`]).
pub fn needs_own_entry(spec: &PolicySpec) -> bool {
    spec.match_
        .conditions
        .iter()
        .any(|c| cel::compile(&c.expression).is_ok_and(|p| cel::reads_variable(&p, AUTHORIZER)))
}

impl super::group::Member for CompiledPolicy {
    fn name(&self) -> &str {
        &self.name
    }
    fn spec(&self) -> &PolicySpec {
        &self.spec
    }
    fn needs_own_entry(&self) -> bool {
        self.own_entry
    }
}

impl super::group::Member for Policy {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn spec(&self) -> &PolicySpec {
        &self.spec
    }
    fn needs_own_entry(&self) -> bool {
        needs_own_entry(&self.spec)
    }
}

/// References of members are members.
impl<T: super::group::Member + ?Sized> super::group::Member for &T {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn spec(&self) -> &PolicySpec {
        (**self).spec()
    }
    fn needs_own_entry(&self) -> bool {
        (**self).needs_own_entry()
    }
}

/// `Arc`s of members are members.
impl<T: super::group::Member + ?Sized> super::group::Member for std::sync::Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn spec(&self) -> &PolicySpec {
        (**self).spec()
    }
    fn needs_own_entry(&self) -> bool {
        (**self).needs_own_entry()
    }
}

/// Every problem of `policy`; empty means valid.
pub fn validate(policy: &Policy) -> Vec<Problem> {
    analyse(policy).0
}

/// Validates `policy` and compiles its CEL once.
pub fn compile(policy: &Policy) -> Result<CompiledPolicy, InvalidPolicy> {
    match analyse(policy) {
        (problems, Some(programs)) if problems.is_empty() => Ok(CompiledPolicy {
            name: policy.metadata.name.clone().unwrap_or_default(),
            source: PolicySource::of(policy),
            generation: policy.metadata.generation,
            spec: policy.spec.clone(),
            own_entry: programs
                .conditions
                .iter()
                .any(|p| cel::reads_variable(p, AUTHORIZER)),
            heaviest: programs
                .conditions
                .iter()
                .chain(programs.whens.iter().flatten())
                .chain(&programs.validations)
                .map(|p| {
                    gatehouse_cel::cost::estimate(p, gatehouse_cel::cost::ASSUMED_COLLECTION_SIZE)
                })
                .max()
                .unwrap_or(0),
            conditions: expressions(programs.conditions),
            whens: programs
                .whens
                .into_iter()
                .map(|when| when.map(Expression::new))
                .collect(),
            validations: expressions(programs.validations),
        }),
        // An expression that does not compile always leaves a problem behind.
        (problems, _) => Err(InvalidPolicy { problems }),
    }
}

fn expressions(programs: Vec<Program>) -> Vec<Expression> {
    programs.into_iter().map(Expression::new).collect()
}

/// The compiled expressions of a Policy, once every one compiled.
pub(super) struct Programs {
    pub(super) conditions: Vec<Program>,
    pub(super) whens: Vec<Option<Program>>,
    pub(super) validations: Vec<Program>,
}

#[cfg(test)]
mod tests;
