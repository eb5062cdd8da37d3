use super::*;
use gatehouse_api::v1alpha1::IPPoolSpec;

fn pool(name: &str, cidr: &str, created: i64) -> Arc<IPPool> {
    let mut p = IPPool::new(
        name,
        IPPoolSpec {
            cidr: cidr.into(),
            ..IPPoolSpec::default()
        },
    );
    p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
    Arc::new(p)
}

#[test]
fn the_younger_of_two_overlapping_pools_is_refused() {
    let long = "p".repeat(MAX_POOL_NAME_LEN + 1);
    let pools = [
        pool(&long, "10.9.0.0/24", 1),
        pool("b", "10.0.0.0/24", 100),
        pool("a", "10.0.0.128/25", 200),
        pool("c", "10.0.1.0/24", 50),
        pool("bad", "10.0.0.5/24", 1),
        {
            let mut gateway_outside = (*pool("gw", "10.0.2.0/24", 1)).clone();
            gateway_outside.spec.gateway = Some("10.0.3.1".into());
            Arc::new(gateway_outside)
        },
    ];
    let ValidatedPools { valid, invalid, .. } = validate_pools(&pools);
    assert_eq!(valid.keys().collect::<Vec<_>>(), ["b", "c"]);
    assert!(invalid["a"].contains("overlaps IPPool b"), "{invalid:?}");
    assert!(invalid["bad"].contains("10.0.0.0/24"), "{invalid:?}");
    assert!(
        invalid["gw"].contains("gateway \"10.0.3.1\" is not inside cidr 10.0.2.0/24"),
        "{invalid:?}"
    );
    assert!(
        invalid[&long].contains("at most 213 characters"),
        "{invalid:?}"
    );
}

#[test]
fn pool_status_counts_and_flags_exhaustion() {
    let p = pool("tiny", "10.0.0.0/30", 1);
    let parsed = Pool::parse("10.0.0.0/30", &[]).unwrap();
    let now = Time(Timestamp::from_second(10).unwrap());
    let mut a = Allocator::new(parsed.clone(), []);
    let s = pool_status(&p, Some(&parsed), None, Some(&a), 0, now.clone());
    assert_eq!((s.capacity, s.allocated), (Some(2), Some(0)));
    assert_eq!(s.conditions[1].status, "False");
    a.pick();
    a.pick();
    let s = pool_status(&p, Some(&parsed), None, Some(&a), 3, now.clone());
    assert_eq!(s.allocated, Some(2));
    assert_eq!(
        (
            s.conditions[1].type_.as_str(),
            s.conditions[1].status.as_str()
        ),
        ("Exhausted", "True")
    );
    let bad = pool_status(&p, None, Some(&"no".to_string()), None, 0, now);
    assert_eq!(
        (
            bad.conditions[0].status.as_str(),
            bad.conditions[0].reason.as_str()
        ),
        ("False", "Invalid")
    );
}

#[test]
fn annotation_keys_are_escaped_for_json_pointers() {
    assert_eq!(pointer_segment("gatehouse.dev/ip"), "gatehouse.dev~1ip");
    assert_eq!(pointer_segment("a~b"), "a~0b");
}

/// A marked Pod of `pool`: gated unless `gated` is false, finished when `phase` says so.
fn marked_pod(name: &str, pool: &str, gated: bool, phase: Option<&str>) -> Arc<Pod> {
    let mut pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                     "labels": {IPAM_POOL_LABEL: pool}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }))
    .unwrap();
    if gated {
        pod.spec.as_mut().unwrap().scheduling_gates =
            Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
                name: IPAM_GATE.into(),
            }]);
    }
    if let Some(phase) = phase {
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
    }
    Arc::new(pod)
}

#[test]
fn a_plan_gives_gated_pods_distinct_addresses_and_releases_what_finished_or_went() {
    let pools = [pool("small", "10.0.0.0/30", 1)];
    let judged = validate_pools(&pools);
    let mut index = Index::default();
    index.set_pools(&judged.valid);
    let mut memory = Memory::default();
    // Held already: a Pod that finished, and a Pod the last pass saw that is gone now.
    for (owner, ip) in [("uid-done", "10.0.0.1"), ("uid-gone", "10.0.0.2")] {
        let ip: IpAddr = ip.parse().unwrap();
        index.observe(Held {
            name: allocation_name("small", ip),
            uid: format!("alloc-{owner}"),
            owner_uid: owner.into(),
            pool: "small".into(),
            address: ip.to_string(),
            ip: Some(ip),
        });
    }
    memory.pods.insert(
        "uid-gone".into(),
        vec![allocation_name("small", "10.0.0.2".parse().unwrap())],
    );
    let pods = [
        marked_pod("done", "small", false, Some("Succeeded")),
        marked_pod("a", "small", true, None),
        marked_pod("b", "small", true, None),
        marked_pod("running", "small", false, None),
        marked_pod("lost", "nowhere", true, None),
    ];
    let planned = plan(
        &pods,
        &[],
        &judged,
        &HashSet::new(),
        &mut index,
        &mut memory,
    );

    let released: Vec<&str> = planned
        .releases
        .iter()
        .map(|h| h.owner_uid.as_str())
        .collect();
    assert_eq!(released, ["uid-done", "uid-gone"]);
    // A /30 hands out .1 and .2, both still held until the releases are written: the two gated
    // Pods wait this pass.
    assert!(planned.places.is_empty());
    assert_eq!(planned.waiting.get("small"), Some(&2));
    // Told once: the Pod of a pool that does not exist, and the one waiting.
    let told: Vec<String> = planned
        .tells
        .iter()
        .map(|(regarding, _)| regarding.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(told, ["a", "b", "lost"]);
    let again = plan(
        &pods,
        &[],
        &judged,
        &HashSet::new(),
        &mut index,
        &mut memory,
    );
    assert!(
        again
            .tells
            .iter()
            .all(|(r, _)| r.name.as_deref() != Some("lost")),
        "told twice"
    );
    assert!(planned.seen.contains_key("uid-a") && !planned.seen.contains_key("uid-done"));
}
