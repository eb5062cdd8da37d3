//! Marking a Pod for the effects loop: the only thing admission does for an effect.
//!
//! The mark is a scheduling gate (the Pod waits, unscheduled, until its address is written), a
//! pool label (so the effects loop can watch exactly these Pods) and the same pool as an
//! annotation (labels do not reach the node's CNI plugin; annotations do). All are "add if
//! absent", so a reinvoked webhook changes nothing, and nothing outside the reviewed object is
//! touched: the allocation itself happens after the Pod is stored, keyed by its UID.
//!
//! An address annotation the client sent is removed: only the effects loop writes one, so a Pod
//! re-created from a saved manifest starts without its predecessor's address.
use serde_json::{Map, Value};

use super::admission::Request;
use gatehouse_api::v1alpha1::{CALLS_GATE, COMPANIONS_GATE, IPAM_GATE, IPAM_POOL_LABEL, Operation};
use gatehouse_ipam::annotation::{IPAM_ADDRESS_ANNOTATION, IPAM_POOL_ANNOTATION};

/// Whether admission marks this request: the creation of a Pod. The API server refuses new
/// scheduling gates on any later update, so CREATE is the only chance.
pub fn marks(req: &Request) -> bool {
    req.operation == Operation::Create
        && req.kind.group.is_empty()
        && req.kind.kind == "Pod"
        && req.sub_resource().is_empty()
}

/// Adds the IPAM gate, the pool label and the pool annotation to `pod` where absent, and
/// removes the address annotations (`address_annotation`, the Policy's, and the node's) a client
/// sent; returns whether it changed. A pool label already present (another Policy's) is left as
/// it is, and the annotation follows it: one address per Pod.
pub fn mark_for_ipam(pod: &mut Value, pool: &str, address_annotation: &str) -> bool {
    let Some(pod) = pod.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    let labels = object_at(pod, "metadata").and_then(|m| object_at(m, "labels"));
    let mut marked_pool = pool.to_string();
    if let Some(labels) = labels {
        match labels.get(IPAM_POOL_LABEL).and_then(Value::as_str) {
            Some(already) => marked_pool = already.to_string(),
            None => {
                labels.insert(IPAM_POOL_LABEL.to_string(), Value::String(pool.to_string()));
                changed = true;
            }
        }
    }
    let annotations = object_at(pod, "metadata").and_then(|m| object_at(m, "annotations"));
    if let Some(annotations) = annotations {
        for sent in [address_annotation, IPAM_ADDRESS_ANNOTATION] {
            changed |= annotations.remove(sent).is_some();
        }
        if annotations
            .get(IPAM_POOL_ANNOTATION)
            .and_then(Value::as_str)
            != Some(&marked_pool)
        {
            annotations.insert(IPAM_POOL_ANNOTATION.to_string(), Value::String(marked_pool));
            changed = true;
        }
    }
    changed |= add_gate(pod, IPAM_GATE);
    changed
}

/// Adds the companions gate to `pod` where absent; returns whether it changed.
pub fn gate_for_companions(pod: &mut Value) -> bool {
    pod.as_object_mut()
        .is_some_and(|pod| add_gate(pod, COMPANIONS_GATE))
}

/// Adds the calls gate to `pod` where absent; returns whether it changed.
pub fn gate_for_calls(pod: &mut Value) -> bool {
    pod.as_object_mut()
        .is_some_and(|pod| add_gate(pod, CALLS_GATE))
}

/// Adds the scheduling gate `name` to `pod` where absent; returns whether it changed.
fn add_gate(pod: &mut Map<String, Value>, name: &str) -> bool {
    let Some(spec) = object_at(pod, "spec") else {
        return false;
    };
    let gates = spec
        .entry("schedulingGates")
        .or_insert_with(|| Value::Array(Vec::new()));
    if gates.is_null() {
        *gates = Value::Array(Vec::new());
    }
    match gates.as_array_mut() {
        Some(gates) if !gates.iter().any(|g| g["name"] == name) => {
            let mut gate = Map::new();
            gate.insert("name".into(), Value::String(name.into()));
            gates.push(Value::Object(gate));
            true
        }
        _ => false,
    }
}

/// The object at `key`, created when absent or null; `None` when it holds something else.
fn object_at<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
) -> Option<&'a mut Map<String, Value>> {
    let slot = parent
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if slot.is_null() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn marking_adds_gate_and_label_once() {
        let mut pod = json!({
            "metadata": {"name": "web-0"},
            "spec": {"containers": [{"name": "app"}]}
        });
        assert!(mark_for_ipam(&mut pod, "pods-v4", "gatehouse.dev/ip"));
        assert_eq!(pod["metadata"]["labels"][IPAM_POOL_LABEL], "pods-v4");
        assert_eq!(
            pod["metadata"]["annotations"][IPAM_POOL_ANNOTATION],
            "pods-v4"
        );
        assert_eq!(pod["spec"]["schedulingGates"], json!([{"name": IPAM_GATE}]));
        let once = pod.clone();
        assert!(
            !mark_for_ipam(&mut pod, "pods-v4", "gatehouse.dev/ip"),
            "reinvocation must change nothing"
        );
        assert_eq!(pod, once);
    }

    #[test]
    fn the_companions_gate_is_added_once() {
        let mut pod = json!({"spec": {"schedulingGates": [{"name": IPAM_GATE}]}});
        assert!(gate_for_companions(&mut pod));
        assert!(
            !gate_for_companions(&mut pod),
            "reinvocation must change nothing"
        );
        assert_eq!(
            pod["spec"]["schedulingGates"],
            json!([{"name": IPAM_GATE}, {"name": COMPANIONS_GATE}])
        );
    }

    #[test]
    fn existing_gates_and_labels_are_kept() {
        let mut pod = json!({
            "metadata": {"labels": {"app": "web", IPAM_POOL_LABEL: "other"}},
            "spec": {"schedulingGates": [{"name": "example.com/quota"}]}
        });
        assert!(mark_for_ipam(&mut pod, "pods-v4", "gatehouse.dev/ip"));
        assert_eq!(pod["metadata"]["labels"][IPAM_POOL_LABEL], "other");
        assert_eq!(
            pod["metadata"]["annotations"][IPAM_POOL_ANNOTATION],
            "other"
        );
        assert_eq!(pod["metadata"]["labels"]["app"], "web");
        assert_eq!(
            pod["spec"]["schedulingGates"],
            json!([{"name": "example.com/quota"}, {"name": IPAM_GATE}])
        );
    }

    #[test]
    fn address_annotations_a_client_sent_are_removed() {
        let copied = r#"{"pool":"pods-v4","address":"10.244.0.130/24","ownerUID":"old"}"#;
        let mut pod = json!({
            "metadata": {"annotations": {
                "gatehouse.dev/ip": "10.244.0.130",
                IPAM_ADDRESS_ANNOTATION: copied,
                IPAM_POOL_ANNOTATION: "elsewhere",
                "team": "a",
            }},
            "spec": {}
        });
        assert!(mark_for_ipam(&mut pod, "pods-v4", "gatehouse.dev/ip"));
        assert_eq!(
            pod["metadata"]["annotations"],
            json!({IPAM_POOL_ANNOTATION: "pods-v4", "team": "a"})
        );
    }
}
