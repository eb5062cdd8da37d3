//! One validating Policy as an audit pass takes it: how it is judged, the kinds it names, and
//! what kept some of it from being audited.
use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine::exception::CompiledExemption;
use gatehouse_engine::policy::CompiledPolicy;

use super::judge::{AuditedKind, NotAuditable, audit_copy};

/// One validating Policy in a pass.
pub struct AuditedPolicy {
    pub policy: Policy,
    /// How the audit runs it; `None` when it cannot be audited (the reason is a problem).
    pub copy: Option<CompiledPolicy>,
    /// What the honoured PolicyExceptions exempt from it: judged `skip`.
    pub exemptions: Vec<CompiledExemption>,
    /// The kinds it names that are listed.
    pub kinds: Vec<AuditedKind>,
    /// Why some of what it names is not audited.
    pub problems: Vec<String>,
    /// Whether a problem may pass by itself (a LIST, a write, a permission, discovery failed):
    /// its last reports stand until a pass succeeds. A Policy that cannot be audited as written
    /// loses them.
    pub keeps_reports: bool,
    /// Objects it matched.
    pub matched: u64,
}

impl AuditedPolicy {
    pub fn name(&self) -> &str {
        self.policy.metadata.name.as_deref().unwrap_or_default()
    }

    /// The Policy as a pass takes it: `None` when it has nothing to audit, or is invalid (it is
    /// Ready=False already and judges nothing).
    pub fn of(policy: Policy) -> Option<Self> {
        if policy.spec.validate.is_empty() {
            return None;
        }
        let (copy, problems) = match audit_copy(&policy) {
            Ok(copy) => (Some(copy), Vec::new()),
            Err(NotAuditable::Invalid(_)) => return None,
            Err(e @ NotAuditable::MatchNeedsUser) => (None, vec![e.to_string()]),
        };
        Some(AuditedPolicy {
            policy,
            copy,
            exemptions: Vec::new(),
            kinds: Vec::new(),
            problems,
            keeps_reports: false,
            matched: 0,
        })
    }

    /// Records a problem that may pass by itself.
    pub fn transient_problem(&mut self, reason: &str) {
        push_once(&mut self.problems, reason);
        self.keeps_reports = true;
    }
}

/// Adds `reason` to `problems` unless it is there.
pub fn push_once(problems: &mut Vec<String>, reason: &str) {
    if !problems.iter().any(|p| p == reason) {
        problems.push(reason.to_string());
    }
}
