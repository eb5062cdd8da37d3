use super::*;
use gatehouse_api::v1alpha1::{MatchSpec, Operation, ReinvocationPolicy, Scope};

fn policy(name: &str, priority: i32, mutate: bool, validate: bool) -> Policy {
    let mut spec = gatehouse_api::v1alpha1::sample_spec(priority, mutate, validate);
    spec.match_ = MatchSpec {
        rules: vec![Rule {
            operations: vec![Operation::Create],
            api_groups: vec!["".into()],
            api_versions: vec!["v1".into()],
            resources: vec!["pods".into()],
            scope: Scope::Namespaced,
        }],
        ..MatchSpec::default()
    };
    spec.timeout_seconds = 7;
    spec.reinvocation_policy = ReinvocationPolicy::IfNeeded;
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
        home_namespace: "gatehouse-system".into(),
        owner_cluster_role: None,
        owner: None,
        max_admission_policies:
            crate::controller::wiring::in_process_cap::DEFAULT_MAX_ADMISSION_POLICIES,
    }
}

fn groups_of(d: &Desired) -> Vec<Group> {
    wired_groups([&d.mutating], [&d.validating])
}

#[test]
fn alike_policies_share_one_entry_in_priority_then_name_order() {
    let (a, b, c) = (
        policy("zeta", 10, true, false),
        policy("alpha", 100, true, false),
        policy("beta", 10, true, false),
    );
    let d = desired(&[&a, &b, &c], &wiring(), "CA");
    let m = d.mutating.webhooks.as_ref().unwrap();
    assert_eq!(m.len(), 1);
    let g = &groups_of(&d)[0];
    assert_eq!(g.members, ["beta", "zeta", "alpha"]);
    assert_eq!(m[0].name, format!("{}.mutate.gatehouse.dev", g.id));
}

#[test]
fn entries_carry_paths_bundle_and_truthful_side_effects() {
    let p = policy("both", 100, true, true);
    let d = desired(&[&p], &wiring(), "PEM");
    let groups = groups_of(&d);
    let m = &d.mutating.webhooks.as_ref().unwrap()[0];
    assert_eq!(m.side_effects, "None");
    assert_eq!(m.match_policy.as_deref(), Some("Equivalent"));
    assert_eq!(m.reinvocation_policy.as_deref(), Some("IfNeeded"));
    assert_eq!(m.timeout_seconds, Some(7));
    assert_eq!(m.admission_review_versions, ["v1"]);
    let svc = m.client_config.service.as_ref().unwrap();
    assert_eq!(svc.path, Some(format!("/mutate/{}", groups[0].id)));
    assert_eq!(svc.port, Some(443));
    assert_eq!(m.client_config.ca_bundle.as_ref().unwrap().0, b"PEM");
    let v = d.validating.webhooks.as_ref().unwrap();
    assert_eq!(v[0].name, SELF_ENTRY_NAME);
    assert_eq!(v[0].failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(
        v[1].name,
        format!("{}.validate.gatehouse.dev", groups[1].id)
    );
    assert_eq!(
        v[1].client_config.service.as_ref().unwrap().path,
        Some(format!("/validate/{}", groups[1].id))
    );
}

fn team(value: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("team".into(), value.into())])),
        match_expressions: None,
    })
}

#[test]
fn a_shared_entry_unions_rules_keeps_its_members_selectors_and_takes_the_largest_timeout() {
    let mut a = policy("a", 1, true, false);
    let mut b = policy("b", 2, true, false);
    // An empty objectSelector selects everything, as none does.
    a.spec.match_.object_selector = Some(LabelSelector::default());
    a.spec.match_.namespace_selector = team("a");
    b.spec.match_.namespace_selector = team("a");
    b.spec.timeout_seconds = 12;
    b.spec.match_.rules[0].operations = vec![Operation::Update];
    b.spec.match_.rules.push(Rule {
        operations: vec![Operation::Create],
        api_groups: vec!["apps".into()],
        api_versions: vec!["v1".into()],
        resources: vec!["deployments".into()],
        scope: Scope::Namespaced,
    });
    let d = desired(&[&a, &b], &wiring(), "CA");
    let m = d.mutating.webhooks.as_ref().unwrap();
    assert_eq!(m.len(), 1, "one scope, one entry: {m:?}");
    let m = &m[0];
    assert_eq!(m.timeout_seconds, Some(12));
    assert!(m.object_selector.is_none() && m.match_conditions.is_none());
    let ns = m.namespace_selector.as_ref().unwrap();
    assert_eq!(ns.match_labels, team("a").unwrap().match_labels);
    let exclusion = &ns.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (exclusion.key.as_str(), exclusion.operator.as_str()),
        ("kubernetes.io/metadata.name", "NotIn")
    );
    let rules: Vec<(Vec<String>, Vec<String>)> = m
        .rules
        .iter()
        .flatten()
        .map(|r| (r.resources.clone().unwrap(), r.operations.clone().unwrap()))
        .collect();
    // pods CREATE (a) and pods UPDATE (b) become one rule.
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules,
        [
            (strings(&["pods"]), strings(&["CREATE", "UPDATE"])),
            (strings(&["deployments"]), strings(&["CREATE"])),
        ]
    );
}

#[test]
fn policies_of_other_scopes_get_entries_that_select_only_their_scope() {
    let mut in_a = policy("in-a", 1, false, true);
    in_a.spec.match_.namespace_selector = team("a");
    let mut in_b = policy("in-b", 1, true, false);
    in_b.spec.match_.namespace_selector = team("b");
    let mut db = policy("db", 1, false, true);
    db.spec.match_.object_selector = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("tier".into(), "db".into())])),
        match_expressions: None,
    });
    let d = desired(&[&in_a, &in_b, &db], &wiring(), "CA");
    let m = d.mutating.webhooks.as_ref().unwrap();
    assert_eq!(m.len(), 1);
    let selects = |ns: &Option<LabelSelector>, team: &str| {
        ns.as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .and_then(|l| l.get("team"))
            == Some(&team.to_string())
    };
    assert!(selects(&m[0].namespace_selector, "b"), "{m:?}");
    // Self entry, then in-a's and db's: (team a, any object) and (any namespace, tier db)
    // have no exact union.
    let v = d.validating.webhooks.as_ref().unwrap();
    assert_eq!(v.len(), 3, "{v:?}");
    let by_team: Vec<&ValidatingWebhook> = v[1..]
        .iter()
        .filter(|w| selects(&w.namespace_selector, "a"))
        .collect();
    assert_eq!(by_team.len(), 1);
    assert!(by_team[0].object_selector.is_none());
    let by_tier: Vec<&ValidatingWebhook> = v[1..]
        .iter()
        .filter(|w| w.object_selector.is_some())
        .collect();
    assert_eq!(by_tier.len(), 1);
    let ns = by_tier[0].namespace_selector.as_ref().unwrap();
    assert!(
        ns.match_labels.is_none(),
        "only the system exclusion: {ns:?}"
    );
    assert_eq!(ns.match_expressions.as_ref().unwrap().len(), 1);
}

#[test]
fn an_authorizer_policy_keeps_its_own_entry_with_every_match_field() {
    let mut own = policy("own", 1, true, true);
    own.spec
        .match_
        .conditions
        .push(gatehouse_api::v1alpha1::MatchCondition {
            name: "admins".into(),
            expression: "authorizer.group('').resource('pods').check('create').allowed()".into(),
        });
    own.spec.match_.object_selector = Some(LabelSelector::default());
    let other = policy("other", 2, true, true);
    let d = desired(&[&own, &other], &wiring(), "CA");
    let m = d.mutating.webhooks.as_ref().unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].name, "own.gatehouse.dev");
    assert_eq!(
        m[0].client_config.service.as_ref().unwrap().path.as_deref(),
        Some("/mutate/policy/own")
    );
    assert_eq!(m[0].match_conditions.as_ref().unwrap()[0].name, "admins");
    assert!(m[0].object_selector.is_some());
    assert!(m[1].name.ends_with(".mutate.gatehouse.dev"));
}

#[test]
fn policies_land_only_in_the_configurations_they_need() {
    let (m, v) = (policy("m", 1, true, false), policy("v", 1, false, true));
    let d = desired(&[&m, &v], &wiring(), "CA");
    assert_eq!(d.mutating.webhooks.as_ref().unwrap().len(), 1);
    // The self entry plus v's group.
    assert_eq!(d.validating.webhooks.as_ref().unwrap().len(), 2);
}

#[test]
fn wired_groups_are_read_back_from_the_annotation() {
    let (m, v) = (policy("m", 1, true, false), policy("v", 1, false, true));
    let d = desired(&[&m, &v], &wiring(), "CA");
    let groups = groups_of(&d);
    let members: Vec<&[String]> = groups.iter().map(|g| g.members.as_slice()).collect();
    assert_eq!(members, [["m".to_string()], ["v".to_string()]]);
    assert!(wired_groups([], []).is_empty());
}

#[test]
fn url_mode_appends_the_path() {
    let w = Wiring {
        endpoint: Endpoint::Url {
            base: "https://127.0.0.1:9443/".into(),
        },
        excluded_namespaces: vec![],
        home_namespace: "gatehouse".into(),
        owner_cluster_role: None,
        owner: None,
        max_admission_policies:
            crate::controller::wiring::in_process_cap::DEFAULT_MAX_ADMISSION_POLICIES,
    };
    let p = policy("p", 1, true, false);
    let d = desired(&[&p], &w, "CA");
    let id = groups_of(&d)[0].id.clone();
    let cc = &d.mutating.webhooks.unwrap()[0].client_config;
    assert_eq!(cc.url, Some(format!("https://127.0.0.1:9443/mutate/{id}")));
    assert!(cc.service.is_none());
}

#[test]
fn a_selector_pinning_names_outside_the_exclusion_gets_no_not_in() {
    let excluded: Vec<String> = vec!["kube-system".into(), "gh".into()];
    let by_label = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".into(),
            "team-a".into(),
        )])),
        match_expressions: None,
    };
    assert_eq!(namespace_selector(Some(&by_label), &excluded), by_label);
    let by_in = LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "In".into(),
            values: Some(vec!["team-a".into(), "team-b".into()]),
        }]),
    };
    assert_eq!(namespace_selector(Some(&by_in), &excluded), by_in);
    // Naming an excluded namespace, or pinning with NotIn, keeps the guarantee.
    for (operator, values) in [("In", vec!["team-a", "gh"]), ("NotIn", vec!["team-a"])] {
        let user = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "kubernetes.io/metadata.name".into(),
                operator: operator.into(),
                values: Some(values.into_iter().map(String::from).collect()),
            }]),
        };
        let s = namespace_selector(Some(&user), &excluded);
        let last = s.match_expressions.unwrap().pop().unwrap();
        assert_eq!(
            (last.operator.as_str(), last.values.unwrap()),
            ("NotIn", vec!["gh".to_string(), "kube-system".to_string()])
        );
    }
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
