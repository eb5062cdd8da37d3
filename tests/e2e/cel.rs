//! Policies in Kubernetes' CEL dialect on the real API server.

use anyhow::ensure;
use gatehouse_e2e::await_condition;
use gatehouse_e2e::instance::Options;
use serde_json::{Value, json};

use crate::operator::{WAIT, apply_ready, pod, policy, stderr};
use crate::scene::scenario;

/// A Pod `name` in `ns` whose container declares `memory` as its memory limit.
fn pod_with_memory(name: &str, ns: &str, memory: &str) -> anyhow::Result<String> {
    let mut pod: Value = serde_saphyr::from_str(&pod(name, ns))?;
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!(memory);
    Ok(pod.to_string())
}

#[tokio::test]
async fn a_quantity_limit_admits_pods_within_it_and_denies_the_rest() {
    scenario("gh-cel", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let name = scene.policy("memory-cap");
        let spec = json!({"failurePolicy": "Fail", "validate": [{
            "expression": "object.spec.containers.all(c, has(c.resources.limits.memory) && quantity(c.resources.limits.memory).compareTo(quantity('128Mi')) <= 0)",
            "message": "every container's memory limit must be at most 128Mi",
        }]});
        apply_ready(cluster, &policy(&name, &ns, spec)).await?;
        // Denied once the entry is in effect (the API server picks configurations up with a
        // lag); a Pod created before that is deleted and the create tried again.
        let big = pod_with_memory("big", &ns, "1Gi")?;
        let out = await_condition("the memory cap in effect", WAIT, || async {
            let out = cluster.kubectl_output(["create", "-f", "-"], Some(&big)).await?;
            if out.status.success() {
                cluster
                    .kubectl_ok(["delete", "pod", "big", "-n", &ns, "--grace-period=0"], None)
                    .await?;
                return Ok(None);
            }
            Ok(Some(out))
        })
        .await?;
        ensure!(
            stderr(&out).contains("every container's memory limit must be at most 128Mi"),
            "a Pod over the limit was not denied with the Policy's message: {}",
            stderr(&out)
        );
        for (pod_name, memory) in [("small", "64Mi"), ("exact", "0.125Gi"), ("milli", "100M")] {
            let out = cluster
                .kubectl_output(["create", "-f", "-"], Some(&pod_with_memory(pod_name, &ns, memory)?))
                .await?;
            ensure!(out.status.success(), "a Pod with {memory} was refused: {}", stderr(&out));
        }
        Ok(())
    })
    .await;
}
