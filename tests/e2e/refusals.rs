//! A Policy the API server would refuse is refused at `kubectl apply`, with the field and the
//! reason; one that slips in is `Ready=False` and never wired.
//! Each scenario runs its own Gatehouse (service mode unless said otherwise) in its own
//! namespace, and its Policies select only the scenario's namespace.

use anyhow::ensure;
use gatehouse_e2e::await_condition;
use gatehouse_e2e::instance::Options;
use serde_json::{Value, json};

use crate::fixtures::*;
use crate::scene::scenario;

#[tokio::test]
async fn invalid_policies_are_refused_or_marked_not_ready() {
    scenario("gh-invalid", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let (bad, slipped) = (scene.policy("bad-cel"), scene.policy("slipped"));
        let broken = json!({"priority": 100, "validate": [{"expression": "object.spec.containers.all(c, ", "message": "broken"}]});
        // With Gatehouse up, kubectl apply fails with the exact reason.
        let out = await_condition("invalid policy refused", WAIT, || async {
            let out = try_apply(cluster, &policy(&bad, scene.ns(), broken.clone())).await?;
            if out.status.success() {
                // Our validation webhook was not yet registered; try again.
                cluster.kubectl_ok(["delete", "policy", &bad], None).await?;
                return Ok(None);
            }
            Ok(Some(out))
        })
        .await?;
        let err = stderr(&out);
        ensure!(err.contains("spec.validate[0].expression"), "kubectl said: {err}");
        ensure!(get_json(cluster, &["policy", &bad]).await?.is_none(), "refused policy was stored");
        // An expression over the cost budget is refused with its estimate.
        let costly = format!("costly-{id}");
        let three = "object.spec.containers.all(a, object.spec.containers.all(b, object.spec.containers.all(c, a.name != b.name || b.name != c.name)))";
        let costly_spec = json!({"priority": 100, "validate": [{"expression": three, "message": "too costly"}]});
        let out = try_apply(cluster, &policy(&costly, scene.ns(), costly_spec)).await?;
        let err = stderr(&out);
        ensure!(
            !out.status.success()
                && err.contains("spec.validate[0].expression: estimated cost")
                && err.contains("exceeds the budget of 1000000"),
            "an over-budget Policy was not refused with its estimate: {err}"
        );
        ensure!(get_json(cluster, &["policy", &costly]).await?.is_none(), "refused policy was stored");
        // A function the environment does not declare is refused by name, not failed at run time.
        let unknown = format!("unknown-fn-{id}");
        let unknown_spec = json!({"priority": 100, "validate": [{"expression": "foo(object)", "message": "never runs"}]});
        let out = try_apply(cluster, &policy(&unknown, scene.ns(), unknown_spec)).await?;
        let err = stderr(&out);
        ensure!(
            !out.status.success() && err.contains("spec.validate[0].expression: unknown function \"foo\""),
            "a Policy calling an unknown function was not refused with its name: {err}"
        );
        ensure!(get_json(cluster, &["policy", &unknown]).await?.is_none(), "refused policy was stored");
        // So is a library call no overload takes, as the API server's checker reports it.
        let overload = format!("no-overload-{id}");
        let overload_spec = json!({"priority": 100, "validate": [{
            "expression": "object.spec.containers.all(c, quantity(c.resources.limits.cpu).isLessThan(2))",
            "message": "never runs",
        }]});
        let out = try_apply(cluster, &policy(&overload, scene.ns(), overload_spec)).await?;
        let err = stderr(&out);
        ensure!(
            !out.status.success()
                && err.contains("spec.validate[0].expression: found no matching overload for 'isLessThan' applied to 'kubernetes.Quantity.(int)'"),
            "a Policy calling a library function with the wrong types was not refused with the reason: {err}"
        );
        ensure!(get_json(cluster, &["policy", &overload]).await?.is_none(), "refused policy was stored");

        // With Gatehouse away, an invalid Policy slips in; once back, it is Ready=False with
        // reason InvalidSpec and is not wired.
        scene.gh.stop().await?;
        // What the schema can say, the API server enforces even with Gatehouse away.
        let empty = policy_object(&format!("empty-{id}"), json!({
            "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
        }));
        let out = try_apply(cluster, &empty).await?;
        ensure!(
            !out.status.success() && stderr(&out).contains("a Policy needs at least one of mutate, validate or effects"),
            "a Policy with neither mutate nor validate was not refused: {}",
            stderr(&out)
        );
        apply(cluster, &policy(&slipped, scene.ns(), broken)).await?;
        scene.gh.restart().await?;
        let cond = await_ready(cluster, &slipped, "False").await?;
        ensure!(cond["reason"] == "InvalidSpec", "condition {cond}");
        ensure!(
            cond["message"].as_str().unwrap_or_default().contains("spec.validate[0].expression"),
            "condition {cond}"
        );
        let wired = wired_groups(cluster).await?;
        ensure!(
            !wired.iter().any(|g| g.members.contains(&slipped)),
            "the invalid Policy is wired: {wired:?}"
        );
        let events = await_condition("InvalidSpec event", WAIT, || async {
            let out = cluster
                .kubectl_ok(["get", "events.events.k8s.io", "-A", "-o", "json"], None)
                .await?;
            let v: Value = serde_json::from_str(&out)?;
            Ok(v["items"].as_array().and_then(|items| {
                items.iter().find(|e| e["regarding"]["name"] == slipped.as_str() && e["reason"] == "InvalidSpec").cloned()
            }))
        })
        .await?;
        ensure!(events["type"] == "Warning");
        Ok(())
    })
    .await;
}
