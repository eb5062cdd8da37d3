//! A loop's finalizer on a Policy: added while the Policy has effects of the loop's kind,
//! removed once what it made is collected or released. Written under the Policy's
//! resourceVersion, so a Policy changed meanwhile is looked at again by the next pass.
use crate::policies::PolicyObject;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{NotLeading, fenced};
use gatehouse_api::v1alpha1::Policy;

/// Whether `policy` holds `finalizer`.
pub fn holds(policy: &Policy, finalizer: &str) -> bool {
    policy.finalizers().iter().any(|f| f == finalizer)
}

/// Adds (`hold`) or removes `finalizer` on `policy`; a Policy gone or changed meanwhile counts
/// as done. `Ok(Err)` with the API server's refusal.
pub async fn set(
    client: &Client,
    policy: &Policy,
    finalizer: &str,
    hold: bool,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), kube::Error>, NotLeading> {
    let mut finalizers = policy.finalizers().to_vec();
    finalizers.retain(|f| f != finalizer);
    if hold {
        finalizers.push(finalizer.to_string());
    }
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": policy.resource_version(),
    }});
    let object = PolicyObject::of(client, policy);
    let written = fenced(
        leader,
        || format!("finalizer {finalizer} of {}", object.source()),
        object.patch(&patch),
    )
    .await?;
    Ok(match written {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    })
}
