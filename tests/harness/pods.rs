//! Pod helpers the e2e tests and the benchmarks share.

use std::time::Duration;

use gatehouse_api::v1alpha1::IPAM_GATE;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use crate::await_condition;

/// Deletes every Pod `api` reaches, without grace, and waits until none is left.
pub async fn delete_all(api: &Api<Pod>) -> anyhow::Result<()> {
    api.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await?;
    await_condition("pods deleted", Duration::from_secs(120), || async {
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await
}

/// Whether the Pod still waits at Gatehouse's IPAM scheduling gate.
pub fn ipam_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == IPAM_GATE))
}
