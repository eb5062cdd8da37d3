use super::*;
use gatehouse_api::v1alpha1::{IPPoolSpec, NamespacedPolicy};

fn policy(name: &str, spec: serde_json::Value) -> Arc<Policy> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1},
            "spec": spec,
        }))
        .expect("a Policy"),
    )
}

fn pods() -> serde_json::Value {
    serde_json::json!({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]})
}

#[test]
fn a_pass_judges_every_policy_and_serves_only_the_valid_ones() {
    let good = policy(
        "good",
        serde_json::json!({"match": pods(), "validate": [{"expression": "true", "message": "m"}]}),
    );
    let broken = policy(
        "broken",
        serde_json::json!({"match": pods(), "validate": [{"expression": "object.", "message": "m"}]}),
    );
    let pooled = |name: &str, pool: &str| {
        policy(
            name,
            serde_json::json!({"match": pods(), "effects": [{"ipam": {"pool": pool}}]}),
        )
    };
    let all = [
        good.clone(),
        broken,
        pooled("has-pool", "pods-v4"),
        pooled("no-pool", "missing"),
    ];
    let store = PolicyStore::new();
    let validated = validate_each(&all, |p| compile(&store, p), pool_named("pods-v4"));
    let names = |ps: &[Arc<Policy>]| ps.iter().map(|p| p.name_any()).collect::<Vec<_>>();
    assert_eq!(names(&validated.valid), ["good", "has-pool"]);
    assert_eq!(store.names().len(), 3, "the broken Policy is not served");
    let problems = |name: &str| match &validated
        .verdicts
        .iter()
        .find(|(p, _)| p.name_any() == name)
    {
        Some((_, Verdict::Invalid(problems))) => problems.join("; "),
        other => panic!("{name}: {other:?}"),
    };
    assert!(problems("broken").contains("spec.validate[0].expression"));
    assert!(problems("no-pool").contains("IPPool \"missing\" does not exist"));
    // A second pass finds the served spec in the store and compiles nothing.
    let mut compiled = 0;
    validate_each(
        &all[..1],
        |p| {
            compiled += usize::from(store.get(&p.name_any()).is_none());
            compile(&store, p)
        },
        |name| Some(Arc::new(IPPool::new(name, IPPoolSpec::default()))),
    );
    assert_eq!(compiled, 0);
}

/// The pool lookup of a cluster with only the IPPool `only`.
fn pool_named(only: &'static str) -> impl Fn(&str) -> Option<Arc<IPPool>> {
    move |name| (name == only).then(|| Arc::new(IPPool::new(name, IPPoolSpec::default())))
}

#[test]
fn a_namespaced_policy_allocates_only_from_a_pool_that_allows_its_namespace() {
    let tenant = |namespace: &str| {
        let spec = serde_json::from_value(serde_json::json!({
            "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""],
                                 "apiVersions": ["v1"], "resources": ["pods"]}]},
            "effects": [{"ipam": {"pool": "shared"}}]
        }))
        .unwrap();
        Arc::new(NamespacedPolicy::new(namespace, "addresses", spec).scoped_policy())
    };
    let shared = |name: &str| {
        (name == "shared").then(|| {
            Arc::new(IPPool::new(
                name,
                IPPoolSpec {
                    namespaces: vec!["team-a".into()],
                    ..IPPoolSpec::default()
                },
            ))
        })
    };
    let all = [tenant("team-a"), tenant("team-b")];
    let store = PolicyStore::new();
    let validated = validate_each(&all, |p| compile(&store, p), shared);
    assert_eq!(validated.valid.len(), 1);
    assert_eq!(validated.valid[0].name_any(), "addresses.team-a.namespaced");
    let refused = validated
        .verdicts
        .iter()
        .find_map(|(p, v)| match v {
            Verdict::Invalid(problems) if p.name_any() == "addresses.team-b.namespaced" => {
                Some(problems.join("; "))
            }
            _ => None,
        })
        .unwrap();
    assert!(
        refused.contains("does not allow namespace \"team-b\""),
        "{refused}"
    );
}

fn wired() -> Verdict {
    Verdict::Wired {
        own_entry: false,
        webhook_because: "spec.enforcement is Webhook".into(),
    }
}

#[test]
fn statuses_report_refusals_and_wired_only_once_written() {
    let a = policy("a", serde_json::json!({"match": pods()}));
    let b = policy("b", serde_json::json!({"match": pods()}));
    let c = policy("c", serde_json::json!({"match": pods()}));
    let verdicts = vec![
        (a.clone(), wired()),
        (b.clone(), wired()),
        (c.clone(), Verdict::Invalid(vec!["bad".into()])),
    ];
    let rejected = HashMap::from([(
        "b".to_string(),
        Refusal {
            spec: SpecVersion::of(&b),
            message: "the API server says no".into(),
        },
    )]);
    let kinds = |statuses: Vec<(Arc<Policy>, Verdict)>| {
        statuses
            .into_iter()
            .map(|(p, v)| format!("{}:{v:?}", p.name_any()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        kinds(statuses(verdicts.clone(), &rejected, true)),
        [
            "a:Wired { own_entry: false, webhook_because: \"spec.enforcement is Webhook\" }",
            "b:Rejected(\"the API server says no\")",
            "c:Invalid([\"bad\"])"
        ]
    );
    // The write failed: nobody is reported wired.
    assert_eq!(
        kinds(statuses(verdicts, &rejected, false)),
        [
            "b:Rejected(\"the API server says no\")",
            "c:Invalid([\"bad\"])"
        ]
    );
}

#[test]
fn the_groups_this_replica_wrote_count_as_wired_before_the_watch_brings_them_back() {
    let p = policy(
        "written",
        serde_json::json!({"match": pods(), "validate": [{"expression": "true", "message": "m"}]}),
    );
    let groups = gatehouse_engine::group::groups(&[p.as_ref()]);
    let written: Vec<Group> = groups.iter().cloned().collect();
    assert!(!written.is_empty());
    let annotation = serde_json::to_string(&written).unwrap();
    let memory = LeaderMemory {
        validating: Some(crate::controller::LastWrite {
            body: serde_json::json!({"metadata": {"annotations": {wiring::GROUPS_ANNOTATION: annotation}}}),
            resource_version: None,
        }),
        ..LeaderMemory::default()
    };
    assert_eq!(written_groups(&memory), written);
    assert!(written_groups(&LeaderMemory::default()).is_empty());
    // The webhook server then answers its path, though no configuration was read back.
    let store = PolicyStore::new();
    compile(&store, &p).unwrap();
    store.set_wired(written.clone());
    assert!(matches!(
        store.lookup(written[0].phase, &written[0].id),
        crate::webhook::Lookup::Group { .. }
    ));
}
