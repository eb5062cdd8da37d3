use serde_json::json;

use super::*;

fn mutation(merge: Value, for_each: Option<&str>, when: Option<&str>, overwrite: bool) -> Mutation {
    Mutation {
        for_each: for_each.map(str::to_string),
        when: when.map(str::to_string),
        merge,
        overwrite,
    }
}

fn expression(m: &Mutation) -> String {
    mutation_expression(m, false).unwrap().unwrap()
}

#[test]
fn what_the_api_server_cannot_do_exactly_is_refused_with_the_place() {
    let refused = |merge: Value, for_each: Option<&str>, when: Option<&str>, ignore: bool| {
        mutation_expression(&mutation(merge, for_each, when, false), ignore).unwrap_err()
    };
    assert_eq!(
        refused(
            json!({"spec": {"containers": [{"name": "a"}, {"name": "a", "image": "x"}]}}),
            None,
            None,
            false
        ),
        NotExact::RepeatedName {
            at: "spec.containers".into()
        }
    );
    assert_eq!(
        refused(json!({"spec": {"ports": [80, 443]}}), None, None, false),
        NotExact::NonStringScalars {
            at: "spec.ports".into()
        }
    );
    assert_eq!(
        refused(json!({"data": {"x": [[1, null]]}}), None, None, false),
        NotExact::NullInValue { at: "data".into() }
    );
    assert_eq!(
        refused(json!({"n": 9_007_199_254_740_993_i64}), None, None, false),
        NotExact::LargeInteger { at: "n".into() }
    );
    assert_eq!(
        refused(
            json!({"a": 1}),
            Some("spec.containers"),
            Some("element.name == 'x'"),
            true
        ),
        NotExact::GuardedForEachUnderIgnore
    );
    assert_eq!(
        refused(json!([1]), None, None, false),
        NotExact::RootNotObject
    );
    // The same guard under Fail fails the mutation on both sides: exact.
    assert!(
        mutation_expression(
            &mutation(
                json!({"a": 1}),
                Some("spec.containers"),
                Some("true"),
                false
            ),
            false
        )
        .is_ok()
    );
}

#[test]
fn an_empty_merge_needs_no_mutation() {
    assert_eq!(
        mutation_expression(&mutation(json!({}), None, None, false), false),
        Ok(None)
    );
    // A null without overwrite is ignored by the merge.
    assert_eq!(
        mutation_expression(&mutation(json!({"a": null}), None, None, false), false),
        Ok(None)
    );
    assert!(
        mutation_expression(&mutation(json!({"a": null}), None, None, true), false)
            .unwrap()
            .is_some()
    );
}

#[test]
fn keys_are_escaped_in_pointers_and_quoted_in_selections() {
    let e = expression(&mutation(
        json!({"metadata": {"labels": {"app.kubernetes.io/name": "web", "a~b": "c"}}}),
        None,
        None,
        false,
    ));
    assert!(
        e.contains(r#"path: "/metadata/labels/app.kubernetes.io~1name""#),
        "{e}"
    );
    assert!(e.contains(r#"path: "/metadata/labels/a~0b""#), "{e}");
    assert!(
        e.contains(r#"object["metadata"]["labels"]["app.kubernetes.io/name"]"#),
        "{e}"
    );
}

#[test]
fn element_paths_carry_their_index_at_run_time() {
    let e = expression(&mutation(
        json!({"securityContext": {"capabilities": {"drop": ["BPF"]}}}),
        Some("spec.containers"),
        None,
        false,
    ));
    assert!(
        e.starts_with(r#"type(object) == map && "spec" in object"#),
        "{e}"
    );
    assert!(
        e.contains(r#""/spec/containers/" + string(i) + "/securityContext""#),
        "{e}"
    );
    assert!(
        e.contains(r#""/spec/containers/" + string(i) + "/securityContext/capabilities/drop/-""#),
        "{e}"
    );
    // A named element found by its first index.
    let e = expression(&mutation(
        json!({"spec": {"containers": [{"name": "proxy", "image": "p"}]}}),
        None,
        None,
        false,
    ));
    assert!(
        e.contains(r#"[lists.range(size(object["spec"]["containers"])).filter(j0, "#),
        "{e}"
    );
    assert!(
        e.contains(r#""/spec/containers/" + string(j0) + "/image""#),
        "{e}"
    );
}

#[test]
fn literals_are_cel_with_dyn_members() {
    let at = Pointer::default();
    assert_eq!(
        literal(&json!({"a": 1, "b": "x", "c": [true, 1.5]}), &at).unwrap(),
        r#"{"a": dyn(1), "b": dyn("x"), "c": dyn([dyn(true), dyn(1.5)])}"#
    );
    assert_eq!(literal(&json!(2.0), &at).unwrap(), "2.0");
    assert_eq!(
        literal(&json!("quote\" and \\ and \n"), &at).unwrap(),
        r#""quote\" and \\ and \n""#
    );
}
