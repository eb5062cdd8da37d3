//! kubectl as the tests use it: apply JSON, read objects back as JSON.
use serde_json::{Value, json};

use crate::Cluster;

/// `kubectl apply` of one object, or of a `v1` `List` of them.
pub async fn apply(cluster: &Cluster, object: &Value) -> anyhow::Result<String> {
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&object.to_string()))
        .await
}

/// `kubectl apply` of `object`, succeeding or not.
pub async fn try_apply(cluster: &Cluster, object: &Value) -> anyhow::Result<std::process::Output> {
    cluster
        .kubectl_output(["apply", "-f", "-"], Some(&object.to_string()))
        .await
}

/// The objects as one `v1` `List`, applied with one `kubectl apply`.
pub fn list(items: impl IntoIterator<Item = Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": items.into_iter().collect::<Vec<_>>()})
}

/// `kubectl get <args> -o json`, `None` when there is no such object.
pub async fn get_json(cluster: &Cluster, args: &[&str]) -> anyhow::Result<Option<Value>> {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    full.extend(["-o", "json", "--ignore-not-found"]);
    let out = cluster.kubectl_ok(full, None).await?;
    if out.trim().is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_str(&out)?))
}

/// What a kubectl run printed on stderr.
pub fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
