use serde_json::json;

use super::*;

/// A slice of the core v1 document, in the API server's shapes (`allOf` around `$ref`,
/// `oneOf` for quantities, `additionalProperties` for maps).
fn document() -> Value {
    json!({"components": {"schemas": {
        "io.k8s.api.core.v1.Pod": {
            "type": "object",
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}],
            "properties": {
                "metadata": {"default": {}, "allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},
                "spec": {"default": {}, "allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}]},
            },
        },
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
            "type": "object",
            "properties": {"labels": {"type": "object", "additionalProperties": {"type": "string"}}},
        },
        "io.k8s.api.core.v1.PodSpec": {
            "type": "object",
            "properties": {
                "containers": {"type": "array", "items": {"$ref": "#/components/schemas/io.k8s.api.core.v1.Container"}},
                "hostNetwork": {"type": "boolean"},
            },
        },
        "io.k8s.api.core.v1.Container": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "image": {"type": "string"},
                "args": {"type": "array", "items": {"type": "string"}},
                "resources": {"default": {}, "allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.ResourceRequirements"}]},
                "securityContext": {"allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.SecurityContext"}]},
                "livenessProbe": {"allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.Probe"}]},
            },
        },
        "io.k8s.api.core.v1.SecurityContext": {
            "type": "object",
            "properties": {
                "runAsUser": {"type": "integer"},
                "seccompProfile": {"allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.SeccompProfile"}]},
            },
        },
        "io.k8s.api.core.v1.SeccompProfile": {
            "type": "object",
            "properties": {"type": {"type": "string", "default": ""}, "localhostProfile": {"type": "string"}},
        },
        "io.k8s.api.core.v1.Probe": {
            "type": "object",
            "properties": {"periodSeconds": {"type": "integer"}, "httpGet": {"type": "object", "properties": {"port": {"type": "integer"}}}},
        },
        "io.k8s.api.core.v1.ResourceRequirements": {
            "type": "object",
            "properties": {"limits": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.api.resource.Quantity"}}},
        },
        "io.k8s.apimachinery.pkg.api.resource.Quantity": {"oneOf": [{"type": "string"}, {"type": "number"}]},
    }}})
}

fn m(merge: Value, for_each: Option<&str>) -> Mutation {
    Mutation {
        for_each: for_each.map(str::to_string),
        merge,
        ..Mutation::default()
    }
}

#[test]
fn merges_naming_fields_of_the_schema_fit() {
    let doc = document();
    let pod = kind_schema(&doc, "", "v1", "Pod").unwrap();
    let ok = [
        m(json!({"metadata": {"labels": {"any-key": "v"}}}), None),
        m(
            json!({"spec": {"containers": [{"name": "proxy", "image": "x", "args": ["--a"]}]}}),
            None,
        ),
        m(
            json!({"resources": {"limits": {"memory": "64Mi", "cpu": 1}}}),
            Some("spec.containers"),
        ),
        m(
            json!({"securityContext": {"runAsUser": 1000}}),
            Some("spec.containers"),
        ),
        m(json!({"metadata": {"labels": {"gone": null}}}), None),
        m(
            json!({"livenessProbe": {"httpGet": {"port": 8080}}, "securityContext": {"seccompProfile": {"localhostProfile": "p"}}}),
            Some("spec.containers"),
        ),
    ];
    // Created structs that get defaults: the probe (a type with a defaulting function) and the
    // seccomp profile (a field with a `default`). Not the securityContext (a pointer without
    // defaults), nor the probe's inline httpGet (neither), nor `spec` and `resources` (value
    // fields, present from the start), nor labels (a map).
    let at = |keys: &[&str]| -> Vec<String> {
        ["spec", "containers", "[]"]
            .iter()
            .chain(keys)
            .map(|k| k.to_string())
            .collect()
    };
    assert_eq!(
        fits(&ok, &pod),
        Ok(vec![
            OptionalStruct {
                mutation: 5,
                path: at(&["livenessProbe"]),
            },
            OptionalStruct {
                mutation: 5,
                path: at(&["securityContext", "seccompProfile"]),
            },
        ])
    );
    assert!(kind_schema(&doc, "", "v1", "ConfigMap").is_none());
}

#[test]
fn an_unknown_field_or_a_wrong_type_is_named() {
    let doc = document();
    let pod = kind_schema(&doc, "", "v1", "Pod").unwrap();
    let refused = |merge: Value, for_each: Option<&str>| {
        fits(
            &[
                m(json!({"metadata": {"labels": {"a": "b"}}}), None),
                m(merge, for_each),
            ],
            &pod,
        )
        .unwrap_err()
    };
    assert_eq!(
        refused(json!({"spec": {"hostNetwrok": true}}), None),
        "spec.mutate[1]: spec.hostNetwrok: the Pod schema has no such field"
    );
    assert_eq!(
        refused(
            json!({"securityContext": {"runAsUser": "1000"}}),
            Some("spec.containers")
        ),
        "spec.mutate[1]: spec.containers[].securityContext.runAsUser: a string where the Pod schema wants integer"
    );
    assert_eq!(
        refused(
            json!({"spec": {"containers": [{"name": "a", "ports": []}]}}),
            None
        ),
        "spec.mutate[1]: spec.containers[].ports: the Pod schema has no such field"
    );
    assert_eq!(
        refused(json!({"image": "x"}), Some("spec.initContainers")),
        "spec.mutate[1]: spec.initContainers: the Pod schema has no such field"
    );
    assert_eq!(
        refused(json!({"metadata": {"labels": {"a": 1}}}), None),
        "spec.mutate[1]: metadata.labels.a: an integer where the Pod schema wants string"
    );
}
