//! Opening a scheduling gate Gatehouse set at admission: a JSON patch that removes the gate only
//! while the Pod is the one with its UID and the gate is still where it was, so a Pod
//! re-created under the same name, or a gate list changed meanwhile, is left as it is.
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

use crate::runtime::error_chain::chain;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{NotLeading, fenced};

/// A Pod at a gate.
pub struct AtGate<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    /// Where the gate is in `spec.schedulingGates`.
    pub index: usize,
    /// The gate's name.
    pub gate: &'a str,
}

/// Removes the gate; `Ok(Err)` with the API server's reason. A Pod gone, another Pod by now,
/// or a gate moved counts as done: the next pass sees the Pod as it is.
pub async fn open(
    client: &Client,
    pod: AtGate<'_>,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, NotLeading> {
    let at = format!("/spec/schedulingGates/{}", pod.index);
    let patch = json!([
        {"op": "test", "path": "/metadata/uid", "value": pod.uid},
        {"op": "test", "path": format!("{at}/name"), "value": pod.gate},
        {"op": "remove", "path": at},
    ]);
    let patch: json_patch::Patch = match serde_json::from_value(patch) {
        Ok(patch) => patch,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), pod.namespace);
    let written = fenced(
        leader,
        || {
            format!(
                "opening the gate {} of Pod {}/{}",
                pod.gate, pod.namespace, pod.name
            )
        },
        pods.patch(pod.name, &PatchParams::default(), &Patch::Json::<()>(patch)),
    )
    .await?;
    Ok(match written {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if [404, 409, 422].contains(&e.code) => Ok(()),
        Err(kube::Error::Api(e)) => Err(format!("{} ({})", e.message, e.reason)),
        Err(other) => Err(chain(&other).to_string()),
    })
}
