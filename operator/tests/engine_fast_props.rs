//! Each speed layer of `engine::fast` answers exactly as the simple path it stands in for.
//!
//! The request parser: generated AdmissionReview bodies (fields present, missing, of the wrong
//! type, repeated, unknown; objects of any shape; wrong envelopes) must parse to the same request,
//! or fail with the same message, either way.
use gatehouse::engine::{fast, parse_request};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "[a-zA-Z0-9 /*.-]{0,12}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A field's value: usually well-formed, sometimes anything.
fn or_anything(good: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    prop_oneof![4 => good, 1 => value()]
}

fn gvk() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["", "apps"]),
        prop::sample::select(vec!["v1"]),
        prop::sample::select(vec!["Pod", "Namespace"]),
    )
        .prop_map(|(g, v, k)| json!({"group": g, "version": v, "kind": k}))
}

fn gvr() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["", "apps"]),
        prop::sample::select(vec!["v1"]),
        prop::sample::select(vec!["pods", "namespaces"]),
    )
        .prop_map(|(g, v, r)| json!({"group": g, "version": v, "resource": r}))
}

/// A request: each field present or not, well-formed or not, plus an unknown one now and then.
fn request() -> impl Strategy<Value = Value> {
    let fields = (
        prop::option::of(or_anything(
            prop::sample::select(vec!["u-1", ""]).prop_map(Value::from),
        )),
        prop::option::of(or_anything(gvk())),
        prop::option::of(or_anything(gvr())),
        prop::option::of(or_anything(
            prop::sample::select(vec![
                "CREATE", "UPDATE", "DELETE", "CONNECT", "*", "EXPLODE",
            ])
            .prop_map(Value::from),
        )),
        prop::option::of(or_anything(
            prop::sample::select(vec!["web", ""]).prop_map(Value::from),
        )),
        prop::option::of(value()),
        prop::option::of(value()),
        prop::option::of(or_anything(any::<bool>().prop_map(Value::Bool))),
        prop::option::of(or_anything(Just(
            json!({"username": "alice", "groups": ["a"], "extra": {"k": ["v"]}}),
        ))),
        prop::option::of(or_anything(
            prop::sample::select(vec!["status", "scale"]).prop_map(Value::from),
        )),
        prop::option::of(value()),
    );
    fields.prop_map(
        |(uid, kind, resource, operation, name, object, old, dry, user, sub, unknown)| {
            let mut r = Map::new();
            let mut put = |key: &str, v: Option<Value>| {
                if let Some(v) = v {
                    r.insert(key.to_string(), v);
                }
            };
            put("uid", uid);
            put("kind", kind);
            put("resource", resource);
            put("operation", operation);
            put("name", name);
            put("object", object);
            put("oldObject", old);
            put("dryRun", dry);
            put("userInfo", user);
            put("subResource", sub);
            put("somethingNew", unknown);
            Value::Object(r)
        },
    )
}

/// A body: the review as JSON text, sometimes with the envelope wrong, a key repeated or the text
/// cut short.
fn body() -> impl Strategy<Value = Vec<u8>> {
    (
        request(),
        prop::sample::select(vec!["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]),
        prop::sample::select(vec!["AdmissionReview", "AdmissionResponse"]),
        0u8..8,
    )
        .prop_map(|(request, api_version, kind, twist)| {
            let review = json!({"apiVersion": api_version, "kind": kind, "request": request});
            let text = review.to_string();
            match twist {
                // The uid said twice: the last one counts.
                0 => text.replacen("\"uid\":", "\"uid\":\"first\",\"uid\":", 1),
                1 => text[..text.len() / 2].to_string(),
                2 => json!({"apiVersion": api_version, "kind": kind}).to_string(),
                3 => format!("[{text}]"),
                _ => text,
            }
            .into_bytes()
        })
}

fn outcome(parsed: Result<gatehouse::engine::Request, gatehouse::engine::ReviewError>) -> String {
    match parsed {
        Ok(request) => serde_json::to_string(&request).expect("a request serialises"),
        Err(e) => format!("error: {e}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn the_typed_parse_answers_as_the_simple_one(body in body()) {
        prop_assert_eq!(outcome(fast::parse_request(&body)), outcome(parse_request(&body)));
    }
}

#[test]
fn what_the_api_server_sends_parses_alike() {
    for body in [
        include_str!("../testdata/reviews/pod-create.json"),
        include_str!("../benches/fixtures/pod-create.json"),
    ] {
        assert_eq!(
            outcome(fast::parse_request(body.as_bytes())),
            outcome(parse_request(body.as_bytes()))
        );
        assert!(fast::parse_request(body.as_bytes()).is_ok());
    }
}
