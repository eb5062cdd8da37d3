use serde_json::{Value, json};

use super::*;
use gatehouse_api::v1alpha1::{CloneSource, ComputedField};

fn effect(template: Value, fields: &[(&str, &str)]) -> ObjectEffect {
    ObjectEffect {
        template,
        fields: fields
            .iter()
            .map(|(path, expression)| ComputedField {
                path: path.to_string(),
                expression: expression.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn problems_of(effect: &ObjectEffect) -> Vec<String> {
    let mut problems = Vec::new();
    check("spec.effects[0].object", effect, &mut problems);
    problems
        .into_iter()
        .map(|p| format!("{}: {}", p.path, p.message))
        .collect()
}

fn quota() -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team"},
           "spec": {"hard": {"pods": "10"}}})
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {"team": "blue"}}})
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web"}})
}

fn compiled(e: &ObjectEffect) -> CompiledObjectEffect {
    let mut problems = Vec::new();
    let c = check("p", e, &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    c.unwrap()
}

fn input(namespaced: bool) -> RenderInput<'static> {
    RenderInput {
        policy_uid: "uid-policy",
        namespaced,
        clone_source: None,
    }
}

#[test]
fn a_template_names_its_kind_and_name() {
    let problems = problems_of(&effect(json!({"metadata": {}}), &[]));
    assert!(
        problems
            .iter()
            .any(|p| p.contains("template.kind: must be set")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("template.apiVersion: must be set"))
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("template.metadata.name: must be set"))
    );
    // A field may compute the name instead.
    let named = effect(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}),
        &[("metadata.name", "object.metadata.name + '-config'")],
    );
    assert_eq!(problems_of(&named), Vec::<String>::new());
    let bad = effect(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_A_Name"}}),
        &[],
    );
    assert!(problems_of(&bad)[0].starts_with("spec.effects[0].object.template.metadata.name"));
}

#[test]
fn fields_stay_inside_the_template_and_type_check() {
    let outside = problems_of(&effect(quota(), &[("data.team", "'x'")]));
    assert!(
        outside[0].contains("fields[0].path: names a path outside the template"),
        "{outside:?}"
    );
    let kind = problems_of(&effect(quota(), &[("kind", "'x'")]));
    assert!(
        kind[0].contains("kind is not the template's to set"),
        "{kind:?}"
    );
    let deep = problems_of(&effect(quota(), &[("metadata.uid", "'x'")]));
    assert!(deep[0].contains("inside metadata only"), "{deep:?}");
    let crossing = problems_of(&effect(quota(), &[("spec.hard.pods.x", "'x'")]));
    assert!(crossing[0].contains("not an object"), "{crossing:?}");
    let typed = problems_of(&effect(
        quota(),
        &[("spec.hard.pods", "object.metadata.name.size() + '-x'")],
    ));
    assert!(typed[0].contains("fields[0].expression"), "{typed:?}");
    let unknown = problems_of(&effect(quota(), &[("spec.hard.pods", "request.name")]));
    assert!(
        unknown[0].contains("unknown variable \"request\""),
        "{unknown:?}"
    );
    let parse = problems_of(&effect(quota(), &[("spec.hard.pods", "object.(")]));
    assert!(parse[0].contains("does not compile"), "{parse:?}");
    // A clone's data comes from its source: any top-level field.
    let mut clone = effect(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"}}),
        &[("data.team", "'eA=='")],
    );
    clone.clone_from = Some(CloneSource {
        namespace: "base".into(),
        name: "pull".into(),
    });
    assert_eq!(problems_of(&clone), Vec::<String>::new());
}

#[test]
fn gatehouse_labels_are_not_a_templates() {
    let mut template = quota();
    template["metadata"]["labels"] = json!({"gatehouse.dev/companion-of": "x"});
    assert!(problems_of(&effect(template, &[]))[0].contains("Gatehouse's own"));
}

#[test]
fn a_namespace_trigger_gets_its_companion_inside_owned_and_labelled() {
    let ns = namespace("blue");
    let e = compiled(&effect(
        quota(),
        &[("metadata.labels.team", "object.metadata.labels['team']")],
    ));
    let trigger = Trigger {
        api_version: "v1",
        kind: "Namespace",
        object: &ns,
        namespaced: false,
    };
    let c = render(&e, trigger, input(true)).unwrap();
    assert_eq!(c["metadata"]["namespace"], "blue");
    assert_eq!(c["metadata"]["labels"]["team"], "blue");
    assert_eq!(c["metadata"]["labels"][COMPANION_TRIGGER_LABEL], "uid-blue");
    assert_eq!(
        c["metadata"]["labels"][COMPANION_POLICY_LABEL],
        "uid-policy"
    );
    assert_eq!(c["metadata"]["ownerReferences"][0]["uid"], "uid-blue");
    assert_eq!(c["spec"]["hard"]["pods"], "10");
}

#[test]
fn an_owner_reference_only_where_kubernetes_allows_one() {
    let p = pod();
    let trigger = Trigger {
        api_version: "v1",
        kind: "Pod",
        object: &p,
        namespaced: true,
    };
    let mut elsewhere = quota();
    elsewhere["metadata"]["namespace"] = json!("audit");
    let c = render(&compiled(&effect(elsewhere, &[])), trigger, input(true)).unwrap();
    assert_eq!(c["metadata"]["namespace"], "audit");
    assert!(c["metadata"].get("ownerReferences").is_none());
    let here = render(&compiled(&effect(quota(), &[])), trigger, input(true)).unwrap();
    assert_eq!(here["metadata"]["namespace"], "shop");
    assert_eq!(here["metadata"]["ownerReferences"][0]["kind"], "Pod");
    // A cluster-scoped companion of a namespaced trigger: no owner reference can be valid.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}});
    let c = render(&compiled(&effect(role, &[])), trigger, input(false)).unwrap();
    assert!(c["metadata"].get("ownerReferences").is_none());
    assert!(c["metadata"].get("namespace").is_none());
}

#[test]
fn a_namespace_on_a_cluster_scoped_kind_is_an_error() {
    let ns = namespace("blue");
    let trigger = Trigger {
        api_version: "v1",
        kind: "Namespace",
        object: &ns,
        namespaced: false,
    };
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": "r", "namespace": "blue"}});
    assert_eq!(
        render(&compiled(&effect(role, &[])), trigger, input(false)),
        Err(RenderError::NamespaceOnClusterScoped {
            kind: "ClusterRole".into()
        })
    );
}

#[test]
fn a_clone_takes_its_sources_data_under_the_template() {
    let ns = namespace("blue");
    let trigger = Trigger {
        api_version: "v1",
        kind: "Namespace",
        object: &ns,
        namespaced: false,
    };
    let mut e = effect(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"}, "data": {"extra": "eA=="}}),
        &[],
    );
    e.clone_from = Some(CloneSource {
        namespace: "base".into(),
        name: "pull".into(),
    });
    let source = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": {"name": "pull", "namespace": "base", "uid": "s"},
                        "data": {"token": "dA==", "extra": "old"}});
    let c = render(
        &compiled(&e),
        trigger,
        RenderInput {
            clone_source: Some(&source),
            ..input(true)
        },
    )
    .unwrap();
    assert_eq!(c["data"], json!({"token": "dA==", "extra": "eA=="}));
    assert_eq!(c["type"], "Opaque");
    assert_eq!(c["metadata"]["namespace"], "blue");
    assert!(c["metadata"].get("uid").is_none());
}

#[test]
fn a_field_that_fails_names_itself() {
    let ns = namespace("blue");
    let trigger = Trigger {
        api_version: "v1",
        kind: "Namespace",
        object: &ns,
        namespaced: false,
    };
    let e = compiled(&effect(
        quota(),
        &[("metadata.labels.owner", "object.metadata.labels['owner']")],
    ));
    let error = render(&e, trigger, input(true)).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("fields[0] (metadata.labels.owner): evaluation failed"),
        "{error}"
    );
}

#[test]
fn in_place_ignores_what_others_added_and_sees_what_they_changed() {
    let desired = json!({"metadata": {"labels": {"a": "1"}, "ownerReferences": [{"uid": "u"}]},
                         "spec": {"hard": {"pods": "10"}, "list": [1, 2]}});
    let mut stored = desired.clone();
    stored["metadata"]["labels"]["foreign"] = json!("x");
    stored["metadata"]["ownerReferences"] =
        json!([{"uid": "other"}, {"uid": "u", "kind": "Namespace"}]);
    stored["metadata"]["uid"] = json!("c");
    assert!(in_place(&desired, &stored));
    let mut edited = stored.clone();
    edited["spec"]["hard"]["pods"] = json!("11");
    assert!(!in_place(&desired, &edited));
    let mut longer = stored.clone();
    longer["spec"]["list"] = json!([1, 2, 3]);
    assert!(!in_place(&desired, &longer));
    let mut disowned = stored;
    disowned["metadata"]["ownerReferences"] = json!([]);
    assert!(!in_place(&desired, &disowned));
}
