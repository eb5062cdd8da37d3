//! The rules of a whole group of Policies in one table, matched against a request at once.
//!
//! [`rule_matches`] follows each member's rules through its own allocations: the Policy, its
//! spec, the rule list, every list of strings and every string. At 128 members matching the
//! rules took 15 % of `webhook_bench`'s CPU per request (240 ns a member, for one rule of four
//! short strings), most likely because the TLS records and the parsed review push all of that
//! out of the CPU's caches between requests. Here every string of the group's rules is numbered
//! once, when the group's membership changes; a request's group, version, resource and
//! subresource are looked up once, and each member's rules are a few numbers side by side in
//! one array.
//!
//! `webhook_bench` serving 128 mutating Policies in one group (admission-load's, on the Pod
//! review of `benches/webhook-https.sh`), three interleaved 6 s runs of each with wrk: 9248
//! requests a second with each member's rules matched on their own, 10668 with the table
//! (+15 %). The server also keeps, per group, whether a member is heavy or has a
//! namespaceSelector, instead of asking every member on every request.
//!
//! The answer is exactly [`rule_matches`]'s for every member (a property test compares them).
//!
//! [`rule_matches`]: super::matcher::rule_matches
use std::collections::HashMap;

use super::CompiledPolicy;
use super::admission::{GroupVersionResource, Request};
use crate::api::v1alpha1::{Operation, Rule, Scope};

/// The number of `*` in every list: it matches anything.
const ANY: u32 = 0;
/// The number of a request's string that no rule names: only `*` matches it.
const UNNAMED: u32 = u32::MAX;

/// Every member's rules, numbered; see the module documentation.
#[derive(Clone, Debug, Default)]
pub struct RuleTable {
    /// Every string the rules name (but `*`), numbered from 1.
    numbers: HashMap<String, u32>,
    /// Per member, its rules in `rules` (start, end).
    members: Vec<(u32, u32)>,
    rules: Vec<NumberedRule>,
    /// The lists the rules point into: groups, versions, and (resource, subresource) pairs.
    lists: Vec<u32>,
}

/// One rule with its lists as ranges of [`RuleTable::lists`].
#[derive(Clone, Debug)]
struct NumberedRule {
    /// One bit per [`Operation`], see [`operation_bit`]; `*` sets them all.
    operations: u8,
    scope: Scope,
    groups: (u32, u32),
    versions: (u32, u32),
    /// Pairs: resource, subresource (`""` for none).
    resources: (u32, u32),
}

fn operation_bit(op: Operation) -> u8 {
    match op {
        Operation::Create => 1,
        Operation::Update => 2,
        Operation::Delete => 4,
        Operation::Connect => 8,
        // A request never carries `*`; if one did, only a rule's `*` would match it.
        Operation::All => 16,
    }
}

/// A request's resource as the table numbers it.
#[derive(Clone, Copy)]
struct Numbered {
    group: u32,
    version: u32,
    resource: u32,
    sub_resource: u32,
}

impl RuleTable {
    /// The table of `rules`: one list of rules per member, in member order.
    pub fn new<'r>(rules: impl IntoIterator<Item = &'r [Rule]>) -> Self {
        let mut table = RuleTable::default();
        for member in rules {
            let start = table.rules.len() as u32;
            for rule in member {
                let groups = table.push_list(rule.api_groups.iter().map(String::as_str));
                let versions = table.push_list(rule.api_versions.iter().map(String::as_str));
                let resources = table.push_list(rule.resources.iter().flat_map(|entry| {
                    let (resource, sub) = entry.split_once('/').unwrap_or((entry, ""));
                    [resource, sub]
                }));
                let operations = rule.operations.iter().fold(0, |bits, op| match op {
                    Operation::All => u8::MAX,
                    op => bits | operation_bit(*op),
                });
                table.rules.push(NumberedRule {
                    operations,
                    scope: rule.scope,
                    groups,
                    versions,
                    resources,
                });
            }
            table.members.push((start, table.rules.len() as u32));
        }
        table
    }

    /// The table of `members`' rules, in member order.
    pub fn of<'p>(members: impl IntoIterator<Item = &'p CompiledPolicy>) -> Self {
        Self::new(
            members
                .into_iter()
                .map(|p| p.spec().match_.rules.as_slice()),
        )
    }

    /// How many members the table holds.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Per member, in order: whether one of its rules matches `req`
    /// ([`rule_matches`](super::matcher::rule_matches)).
    pub fn matching(&self, req: &Request) -> Vec<bool> {
        let converted = self.numbered(&req.resource, req.sub_resource());
        let original = req
            .request_resource
            .as_ref()
            .map(|r| self.numbered(r, req.request_sub_resource.as_deref().unwrap_or_default()));
        let bit = operation_bit(req.operation);
        let namespaced = !req.namespace.is_empty();
        self.members
            .iter()
            .map(|&(start, end)| {
                self.rules[start as usize..end as usize].iter().any(|rule| {
                    let scope = match rule.scope {
                        Scope::All => true,
                        Scope::Namespaced => namespaced,
                        Scope::Cluster => !namespaced,
                    };
                    rule.operations & bit != 0
                        && scope
                        && (self.names(rule, converted)
                            || original.is_some_and(|o| self.names(rule, o)))
                })
            })
            .collect()
    }

    /// Whether `rule` names the resource `r` (the operation and scope aside).
    fn names(&self, rule: &NumberedRule, r: Numbered) -> bool {
        let any_of = |(start, end): (u32, u32), n: u32| {
            self.lists[start as usize..end as usize]
                .iter()
                .any(|&v| v == ANY || v == n)
        };
        let (start, end) = rule.resources;
        let resources = self.lists[start as usize..end as usize]
            .chunks_exact(2)
            .any(|pair| {
                (pair[0] == ANY || pair[0] == r.resource)
                    && (pair[1] == ANY || pair[1] == r.sub_resource)
            });
        resources && any_of(rule.groups, r.group) && any_of(rule.versions, r.version)
    }

    fn numbered(&self, r: &GroupVersionResource, sub_resource: &str) -> Numbered {
        Numbered {
            group: self.number_of(&r.group),
            version: self.number_of(&r.version),
            resource: self.number_of(&r.resource),
            sub_resource: self.number_of(sub_resource),
        }
    }

    fn number_of(&self, value: &str) -> u32 {
        if value == "*" {
            return ANY;
        }
        self.numbers.get(value).copied().unwrap_or(UNNAMED)
    }

    fn push_list<'s>(&mut self, values: impl Iterator<Item = &'s str>) -> (u32, u32) {
        let start = self.lists.len() as u32;
        for value in values {
            let number = if value == "*" {
                ANY
            } else {
                let next = self.numbers.len() as u32 + 1;
                *self.numbers.entry(value.to_string()).or_insert(next)
            };
            self.lists.push(number);
        }
        (start, self.lists.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::engine::admission::GroupVersionKind;
    use crate::engine::matcher;

    /// The reference: each member's rules matched one by one.
    fn matching_one_by_one<'r>(
        rules: impl IntoIterator<Item = &'r [Rule]>,
        req: &Request,
    ) -> Vec<bool> {
        rules
            .into_iter()
            .map(|member| member.iter().any(|rule| matcher::rule_matches(rule, req)))
            .collect()
    }

    const WORDS: &[&str] = &["", "*", "pods", "apps", "v1", "v2", "deployments", "status"];
    const RESOURCES: &[&str] = &[
        "pods",
        "pods/status",
        "pods/*",
        "*",
        "*/status",
        "*/*",
        "deployments/scale",
        "pods/",
        "/status",
        "a/b/c",
        "status",
    ];
    const OPERATIONS: &[Operation] = &[
        Operation::Create,
        Operation::Update,
        Operation::Delete,
        Operation::Connect,
        Operation::All,
    ];

    fn word() -> impl Strategy<Value = String> {
        prop::sample::select(WORDS).prop_map(str::to_string)
    }

    fn rule() -> impl Strategy<Value = Rule> {
        (
            prop::collection::vec(prop::sample::select(OPERATIONS), 1..3),
            prop::collection::vec(word(), 1..3),
            prop::collection::vec(word(), 1..3),
            prop::collection::vec(
                prop::sample::select(RESOURCES).prop_map(str::to_string),
                1..3,
            ),
            prop::sample::select(&[Scope::All, Scope::Namespaced, Scope::Cluster][..]),
        )
            .prop_map(
                |(operations, api_groups, api_versions, resources, scope)| Rule {
                    operations,
                    api_groups,
                    api_versions,
                    resources,
                    scope,
                },
            )
    }

    fn resource() -> impl Strategy<Value = GroupVersionResource> {
        (word(), word(), word()).prop_map(|(group, version, resource)| GroupVersionResource {
            group,
            version,
            resource,
        })
    }

    fn request() -> impl Strategy<Value = Request> {
        (
            resource(),
            prop::option::of(word()),
            prop::option::of((resource(), prop::option::of(word()))),
            prop::sample::select(OPERATIONS),
            prop::bool::ANY,
        )
            .prop_map(
                |(resource, sub_resource, original, operation, namespaced)| {
                    let (request_resource, request_sub_resource) = match original {
                        Some((r, sub)) => (Some(r), sub),
                        None => (None, None),
                    };
                    Request {
                        uid: "u".into(),
                        kind: GroupVersionKind {
                            group: resource.group.clone(),
                            version: resource.version.clone(),
                            kind: "Thing".into(),
                        },
                        resource,
                        sub_resource,
                        request_kind: None,
                        request_resource,
                        request_sub_resource,
                        name: "n".into(),
                        namespace: if namespaced {
                            "ns".into()
                        } else {
                            String::new()
                        },
                        operation,
                        user_info: Default::default(),
                        object: None,
                        old_object: None,
                        dry_run: false,
                        options: None,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn the_table_matches_as_each_members_rules_do(
            members in prop::collection::vec(prop::collection::vec(rule(), 0..3), 0..6),
            req in request(),
        ) {
            let table = RuleTable::new(members.iter().map(Vec::as_slice));
            prop_assert_eq!(table.len(), members.len());
            prop_assert_eq!(
                table.matching(&req),
                matching_one_by_one(members.iter().map(Vec::as_slice), &req)
            );
        }
    }

    #[test]
    fn a_subresource_needs_its_own_rule_and_a_wildcard_matches_every_value() {
        let rule = |resources: &[&str], groups: &[&str]| Rule {
            operations: vec![Operation::Create],
            api_groups: groups.iter().map(|s| s.to_string()).collect(),
            api_versions: vec!["*".into()],
            resources: resources.iter().map(|s| s.to_string()).collect(),
            scope: Scope::All,
        };
        let members = [
            vec![rule(&["pods"], &[""])],
            vec![rule(&["pods/status"], &[""])],
            vec![rule(&["*/status"], &["*"])],
            vec![rule(&["deployments"], &["apps"])],
        ];
        let mut req = Request {
            uid: "u".into(),
            kind: GroupVersionKind {
                group: String::new(),
                version: "v1".into(),
                kind: "Pod".into(),
            },
            resource: GroupVersionResource {
                group: String::new(),
                version: "v1".into(),
                resource: "pods".into(),
            },
            sub_resource: Some("status".into()),
            request_kind: None,
            request_resource: None,
            request_sub_resource: None,
            name: "p".into(),
            namespace: "default".into(),
            operation: Operation::Create,
            user_info: Default::default(),
            object: None,
            old_object: None,
            dry_run: false,
            options: None,
        };
        let table = RuleTable::new(members.iter().map(Vec::as_slice));
        assert_eq!(table.matching(&req), [false, true, true, false]);
        req.sub_resource = None;
        assert_eq!(table.matching(&req), [true, false, false, false]);
        req.operation = Operation::Delete;
        assert_eq!(table.matching(&req), [false, false, false, false]);
    }
}
