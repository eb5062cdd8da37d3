use super::checks::is_valid_resource;
use super::*;

fn policy(spec: serde_json::Value) -> Policy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gatehouse.dev/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": "p", "generation": 3},
        "spec": spec,
    }))
    .unwrap()
}

const RULES: &str = r#"{"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}"#;

fn rules() -> serde_json::Value {
    serde_json::from_str(RULES).unwrap()
}

fn named(name: &str, spec: serde_json::Value) -> Policy {
    let mut p = policy(spec);
    p.metadata.name = Some(name.to_string());
    p
}

#[test]
fn expressions_over_the_cost_budget_are_refused_with_their_estimate() {
    let list: Vec<String> = (0..40).map(|i| i.to_string()).collect();
    let l = format!("[{}]", list.join(","));
    let four = format!("{l}.all(a, {l}.all(b, {l}.all(c, {l}.all(d, a+b+c+d >= 0))))");
    let three = "object.spec.containers.all(a, object.spec.containers.all(b, object.spec.containers.all(c, a.name != b.name || b.name != c.name)))";
    let two =
        "object.spec.containers.all(a, object.spec.containers.all(b, a.name != b.name || a == b))";
    let p = policy(serde_json::json!({
        "match": {"rules": rules()["rules"], "conditions": [{"name": "heavy", "expression": three}]},
        "validate": [{"expression": four, "message": "m"}, {"expression": two, "message": "fine"}],
        "mutate": [{"when": three, "merge": {"metadata": {"labels": {"a": "b"}}}}],
    }));
    let problems: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0].starts_with("spec.match.conditions[0].expression: estimated cost"),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(
            |m| m.starts_with("spec.validate[0].expression: estimated cost")
                && m.contains("exceeds the budget of 1000000")
                && m.contains("[0,1,2")
        ),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|m| m.starts_with("spec.mutate[0].when: estimated cost")),
        "{problems:?}"
    );
    assert!(
        !problems.iter().any(|m| m.contains("validate[1]")),
        "{problems:?}"
    );
}

/// A valid Policy with `match_` (which should hold `rules`) as its match.
fn problems_of_match(match_: serde_json::Value) -> Vec<String> {
    let p = policy(serde_json::json!({
        "match": match_,
        "validate": [{"expression": "true", "message": "m"}],
    }));
    validate(&p).iter().map(ToString::to_string).collect()
}

fn problems_of_conditions(conditions: serde_json::Value) -> Vec<String> {
    let mut match_ = rules();
    match_["conditions"] = conditions;
    problems_of_match(match_)
}

fn problems_of_resources(resources: &[&str]) -> Vec<String> {
    let mut match_ = rules();
    match_["rules"][0]["resources"] = serde_json::json!(resources);
    problems_of_match(match_)
}

#[test]
fn compiled_policy_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CompiledPolicy>();
    assert_send_sync::<std::sync::Arc<CompiledPolicy>>();
}

#[test]
fn a_valid_policy_compiles() {
    let p = policy(serde_json::json!({
        "match": rules(),
        "mutate": [{"forEach": "spec.containers", "when": "element.name != 'x'", "merge": {"a": 1}}],
        "validate": [{"expression": "object.spec.containers.all(c, has(c.resources))", "message": "m"}],
    }));
    assert_eq!(validate(&p), vec![]);
    let c = compile(&p).unwrap();
    assert_eq!(c.name(), "p");
    assert_eq!(c.generation(), Some(3));
    assert!(c.has_mutations() && c.has_validations());
    assert_eq!(c.whens.len(), 1);
    assert_eq!(c.validations.len(), 1);
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let p = policy(serde_json::json!({
        "match": {
            "rules": [{"operations": [], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/a/b", "Pods"]}],
            "conditions": [
                {"name": "c", "expression": "objct.x == 1"},
                {"name": "c", "expression": "authorizer.requestResource.check('get').allowed()"},
            ],
            "objectSelector": {"matchExpressions": [{"key": "k", "operator": "Maybe"}]},
        },
        "timeoutSeconds": 31,
        "reinvocationPolicy": "IfNeeded",
        "mutate": [],
        "validate": [{"expression": "object.spec.(", "message": " "}],
    }));
    let got: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
    let want = [
        "spec.timeoutSeconds: must be between 1 and 30, got 31",
        "spec.reinvocationPolicy: IfNeeded is only meaningful for mutating policies (spec.mutate is empty)",
        "spec.match.rules[0].operations: must not be empty",
        "spec.match.rules[0].resources[0]: ",
        "spec.match.rules[0].resources[1]: ",
        "spec.match.objectSelector.matchExpressions[0].operator: ",
        "spec.match.conditions[0].expression: unknown variable \"objct\"",
        "spec.match.conditions[1].name: duplicate condition name \"c\"",
        "spec.validate[0].message: must not be empty",
        "spec.validate[0].expression: does not compile: ",
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for w in want {
        assert!(
            got.iter().any(|g| g.starts_with(w)),
            "missing {w:?} in {got:#?}"
        );
    }
    let err = compile(&p).unwrap_err();
    assert_eq!(err.problems.len(), want.len());
    assert!(err.to_string().contains("spec.timeoutSeconds"));
}

#[test]
fn mutation_problems() {
    let p = policy(serde_json::json!({
        "match": rules(),
        "mutate": [
            {"merge": [1]},
            {"forEach": "spec..containers", "merge": {}},
            {"forEach": "spec.containers", "merge": {"name": null}},
            {"when": "element.name == 'a'", "merge": {}},
        ],
    }));
    let got: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
    assert_eq!(got.len(), 4, "{got:#?}");
    assert!(got[0].starts_with("spec.mutate[0].merge: must be a JSON object, got an array"));
    assert!(got[1].starts_with("spec.mutate[1].forEach: \"spec..containers\""));
    assert!(got[2].starts_with("spec.mutate[2].merge.name: a forEach merge must not"));
    assert!(got[3].starts_with("spec.mutate[3].when: unknown variable \"element\""));
}

#[test]
fn empty_policy() {
    let p = policy(serde_json::json!({"match": {"rules": []}}));
    let got: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "spec: at least one of mutate, validate or effects must be set",
            "spec.match.rules: must not be empty"
        ]
    );
}

#[test]
fn condition_names_are_qualified_names() {
    let got = problems_of_conditions(serde_json::json!([
        {"name": "has space", "expression": "true"}
    ]));
    assert_eq!(
        got,
        [
            "spec.match.conditions[0].name: \"has space\" is not a valid qualified name: name \
          part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
          end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex \
          used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        ]
    );

    let ok = serde_json::json!([
        {"name": "in-shop", "expression": "true"},
        {"name": "example.com/My_Name.1", "expression": "true"},
        {"name": "a".repeat(63), "expression": "true"},
    ]);
    assert_eq!(problems_of_conditions(ok), Vec::<String>::new());

    let got = problems_of_conditions(serde_json::json!([
        {"name": "a/b/c", "expression": "true"},
        {"name": "Example.com/x", "expression": "true"},
        {"name": "-x", "expression": "true"},
        {"name": "a".repeat(64), "expression": "true"},
        {"name": "", "expression": "true"},
        {"name": "ok", "expression": " "},
        {"name": "x_", "expression": "true"},
        {"name": "x_", "expression": "true"},
    ]));
    let want = [
        "spec.match.conditions[0].name: \"a/b/c\" is not a valid qualified name: a qualified \
         name must consist of",
        "spec.match.conditions[1].name: \"Example.com/x\" is not a valid qualified name: \
         prefix part a lowercase RFC 1123 subdomain must consist of",
        "spec.match.conditions[2].name: \"-x\" is not a valid qualified name: name part must \
         consist of",
        "spec.match.conditions[3].name: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
         aaaaaaaa\" is not a valid qualified name: name part must be no more than 63 characters",
        "spec.match.conditions[4].name: must not be empty",
        "spec.match.conditions[5].expression: must not be empty",
        "spec.match.conditions[6].name: \"x_\" is not a valid qualified name: name part must \
         consist of",
        "spec.match.conditions[7].name: \"x_\" is not a valid qualified name: name part must \
         consist of",
        "spec.match.conditions[7].name: duplicate condition name \"x_\"",
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (got, want) in got.iter().zip(want) {
        assert!(
            got.starts_with(want),
            "{got:?} does not start with {want:?}"
        );
    }
}

#[test]
fn at_most_64_match_conditions() {
    let conditions = |n: usize| {
        let list: Vec<serde_json::Value> = (0..n)
            .map(|i| serde_json::json!({"name": format!("c{i}"), "expression": "true"}))
            .collect();
        problems_of_conditions(serde_json::Value::Array(list))
    };
    assert_eq!(conditions(64), Vec::<String>::new());
    assert_eq!(
        conditions(65),
        ["spec.match.conditions: must have at most 64 items, got 65"]
    );
}

#[test]
fn selectors_follow_the_api_server_label_rules() {
    let mut match_ = rules();
    match_["namespaceSelector"] = serde_json::json!({
        "matchLabels": {
            "kubernetes.io/metadata.name": "shop",
            "app.kubernetes.io/name": "",
            "tier": "v".repeat(63),
        },
        "matchExpressions": [
            {"key": "example.com/team", "operator": "In", "values": ["a", "B_2"]},
            {"key": "env", "operator": "Exists"},
        ],
    });
    match_["objectSelector"] = serde_json::json!({"matchLabels": {"app": "web"}});
    assert_eq!(problems_of_match(match_.clone()), Vec::<String>::new());

    match_["objectSelector"] = serde_json::json!({
        "matchLabels": {
            "app": "x y",
            "has space": "ok",
            "long": "v".repeat(64),
            "": "v",
        },
        "matchExpressions": [
            {"key": "a/b/c", "operator": "Exists"},
            {"key": "tier", "operator": "NotIn", "values": ["ok", "-bad", ""]},
            {"key": "tier", "operator": "In", "values": []},
        ],
    });
    let got = problems_of_match(match_);
    let path = "spec.match.objectSelector";
    let want = [
        format!("{path}.matchLabels[\"\"]: key must not be empty"),
        format!(
            "{path}.matchLabels[\"app\"]: \"x y\" is not a valid label value: a valid label \
                 must be an empty string or consist of"
        ),
        format!(
            "{path}.matchLabels[\"has space\"]: \"has space\" is not a valid qualified \
                 name: name part must consist of"
        ),
        format!(
            "{path}.matchLabels[\"long\"]: \"{}\" is not a valid label value: must be no \
                 more than 63 characters",
            "v".repeat(64)
        ),
        format!(
            "{path}.matchExpressions[0].key: \"a/b/c\" is not a valid qualified name: a \
                 qualified name must consist of"
        ),
        format!(
            "{path}.matchExpressions[1].values[1]: \"-bad\" is not a valid label value: a \
                 valid label must be an empty string or consist of"
        ),
        format!("{path}.matchExpressions[2].values: must not be empty for operator In"),
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (got, want) in got.iter().zip(&want) {
        assert!(
            got.starts_with(want),
            "{got:?} does not start with {want:?}"
        );
    }
}

#[test]
fn the_policy_name_must_leave_room_for_the_entry_suffix() {
    let spec = || serde_json::json!({"match": rules(), "validate": [{"expression": "true", "message": "m"}]});
    let longest = format!("{}.x", "a".repeat(237));
    assert_eq!(longest.len(), 239);
    for ok in [
        "p",
        "my-policy",
        "team.example.com",
        "0abc",
        longest.as_str(),
    ] {
        assert_eq!(validate(&named(ok, spec())), vec![], "{ok:?}");
        let entry = crate::entry::entry_name(ok);
        assert_eq!(
            gatehouse_cel::k8s_names::is_dns1123_subdomain(&entry),
            Ok(()),
            "{entry}"
        );
    }

    let too_long = "a".repeat(240);
    let got: Vec<String> = validate(&named(&too_long, spec()))
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        [
            "metadata.name: must be no more than 239 characters, got 240: the webhook entry \
          name <name>.gatehouse.dev must be no more than 253 characters"
        ]
    );
    assert!(
        gatehouse_cel::k8s_names::is_dns1123_subdomain(&crate::entry::entry_name(&too_long))
            .is_err()
    );

    for bad in ["My-Policy", "a_b", "-a", "a.", "a..b"] {
        let got = validate(&named(bad, spec()));
        assert_eq!(got.len(), 1, "{bad:?}: {got:#?}");
        assert_eq!(got[0].path, "metadata.name");
        assert!(
            got[0].message.starts_with(&format!(
                "{bad:?} would make the webhook entry name {bad}.gatehouse.dev invalid: a \
                 lowercase RFC 1123 subdomain must consist of"
            )),
            "{}",
            got[0]
        );
    }
    let got: Vec<String> = validate(&named("", spec()))
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(got, ["metadata.name: must not be empty"]);
}

#[test]
fn resource_wildcard_conflicts() {
    let r = "spec.match.rules[0].resources";
    let cases: &[(&[&str], &[&str])] = &[
        (&["*"], &[]),
        (&["*/*"], &[]),
        (&["*", "*/scale"], &[]),
        (&["*", "pods/status"], &[]),
        (&["pods", "pods/status", "deployments/scale"], &[]),
        (&["pods/*", "deployments/*", "*/scale"], &[]),
        (
            &["*", "pods"],
            &["if '*' is present, must not specify other resources without subresources"],
        ),
        // The API server lets this order through; refusing it too costs nothing.
        (
            &["pods", "*"],
            &["if '*' is present, must not specify other resources without subresources"],
        ),
        (
            &["*/*", "pods"],
            &["if '*/*' is present, must not specify other resources"],
        ),
        (
            &["*/*", "*"],
            &["if '*/*' is present, must not specify other resources"],
        ),
        (
            &["pods/status", "*/*"],
            &["if '*/*' is present, must not specify other resources"],
        ),
        (
            &["*/*", "pods/*"],
            &[
                "[1]: if '*/*' is present, must not specify pods/*",
                "if '*/*' is present, must not specify other resources",
            ],
        ),
        (
            &["*/scale", "deployments/scale"],
            &["[1]: if '*/scale' is present, must not specify deployments/scale"],
        ),
        (
            &["deployments/scale", "*/scale"],
            &["[0]: if '*/scale' is present, must not specify deployments/scale"],
        ),
        (
            &["pods/*", "pods/status", "pods/log"],
            &[
                "[1]: if 'pods/*' is present, must not specify pods/status",
                "[2]: if 'pods/*' is present, must not specify pods/log",
            ],
        ),
        (
            &["pods/status", "pods/*"],
            &["[0]: if 'pods/*' is present, must not specify pods/status"],
        ),
        (
            &["pods/*", "*/status", "pods/status"],
            &[
                "[2]: if '*/status' is present, must not specify pods/status",
                "[2]: if 'pods/*' is present, must not specify pods/status",
            ],
        ),
        (&["", "pods"], &["[0]: must not be empty"]),
    ];
    for (resources, want) in cases {
        let got = problems_of_resources(resources);
        let want: Vec<String> = want
            .iter()
            .map(|w| {
                if w.starts_with('[') {
                    format!("{r}{w}")
                } else {
                    format!("{r}: {w}")
                }
            })
            .collect();
        assert_eq!(got, want, "{resources:?}");
    }
}

#[test]
fn resource_forms() {
    for ok in [
        "*",
        "pods",
        "pods/status",
        "*/scale",
        "pods/*",
        "*/*",
        "foos.example.com",
    ] {
        assert!(is_valid_resource(ok), "{ok}");
    }
    for bad in ["", "/", "pods/", "/status", "a/b/c", "Pods", "pods status"] {
        assert!(!is_valid_resource(bad), "{bad}");
    }
}
