//! Marking a Pod for the effects loop: the only thing admission does for an effect.
//!
//! The mark is a scheduling gate (the Pod waits, unscheduled, until its address is written) and
//! a pool label (so the effects loop can watch exactly these Pods). Both are "add if absent",
//! so a reinvoked webhook changes nothing, and nothing outside the reviewed object is touched:
//! the allocation itself happens after the Pod is stored, keyed by its UID.
use serde_json::{Map, Value};

use super::admission::Request;
use crate::api::v1alpha1::{IPAM_GATE, IPAM_POOL_LABEL, Operation};

/// Whether admission marks this request: the creation of a Pod. The API server refuses new
/// scheduling gates on any later update, so CREATE is the only chance.
pub fn marks(req: &Request) -> bool {
    req.operation == Operation::Create
        && req.kind.group.is_empty()
        && req.kind.kind == "Pod"
        && req.sub_resource().is_empty()
}

/// Adds the IPAM gate and the pool label to `pod` where absent; returns whether it changed.
/// A pool label already present (another Policy's) is left as it is: one address per Pod.
pub fn mark_for_ipam(pod: &mut Value, pool: &str) -> bool {
    let Some(pod) = pod.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    let labels = object_at(pod, "metadata").and_then(|m| object_at(m, "labels"));
    if let Some(labels) = labels
        && !labels.contains_key(IPAM_POOL_LABEL)
    {
        labels.insert(IPAM_POOL_LABEL.to_string(), Value::String(pool.to_string()));
        changed = true;
    }
    let spec = object_at(pod, "spec");
    if let Some(spec) = spec {
        let gates = spec
            .entry("schedulingGates")
            .or_insert_with(|| Value::Array(Vec::new()));
        if gates.is_null() {
            *gates = Value::Array(Vec::new());
        }
        if let Some(gates) = gates.as_array_mut()
            && !gates.iter().any(|g| g["name"] == IPAM_GATE)
        {
            let mut gate = Map::new();
            gate.insert("name".into(), Value::String(IPAM_GATE.into()));
            gates.push(Value::Object(gate));
            changed = true;
        }
    }
    changed
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
        assert!(mark_for_ipam(&mut pod, "pods-v4"));
        assert_eq!(pod["metadata"]["labels"][IPAM_POOL_LABEL], "pods-v4");
        assert_eq!(pod["spec"]["schedulingGates"], json!([{"name": IPAM_GATE}]));
        let once = pod.clone();
        assert!(
            !mark_for_ipam(&mut pod, "pods-v4"),
            "reinvocation must change nothing"
        );
        assert_eq!(pod, once);
    }

    #[test]
    fn existing_gates_and_labels_are_kept() {
        let mut pod = json!({
            "metadata": {"labels": {"app": "web", IPAM_POOL_LABEL: "other"}},
            "spec": {"schedulingGates": [{"name": "example.com/quota"}]}
        });
        assert!(mark_for_ipam(&mut pod, "pods-v4"));
        assert_eq!(pod["metadata"]["labels"][IPAM_POOL_LABEL], "other");
        assert_eq!(pod["metadata"]["labels"]["app"], "web");
        assert_eq!(
            pod["spec"]["schedulingGates"],
            json!([{"name": "example.com/quota"}, {"name": IPAM_GATE}])
        );
    }
}
