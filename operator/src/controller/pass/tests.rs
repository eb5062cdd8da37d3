use super::*;

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
    let validated = validate_each(&all, |p| compile(&store, p), |pool| pool == "pods-v4");
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
        |_| true,
    );
    assert_eq!(compiled, 0);
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
