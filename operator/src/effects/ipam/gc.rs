//! The garbage collection of allocations whose owner Pod is gone.
use super::*;

/// Re-checks one candidate against the API server and deletes it if its owner is really gone;
/// true when it was collected.
pub(super) async fn collect_orphan(
    ctx: &IpamContext,
    a: &IPAllocation,
    leader: &watch::Receiver<Leadership>,
) -> Result<bool, IpamError> {
    // Compare by UID, never by name: a Pod of the same name may be its successor.
    let owner = &a.spec.owner;
    let current = Api::<Pod>::namespaced(ctx.client.clone(), &owner.namespace)
        .get_opt(&owner.name)
        .await
        .map_err(|source| IpamError::ReadPod {
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
            source,
        })?;
    if current
        .as_ref()
        .is_some_and(|p| p.metadata.uid.as_deref() == Some(owner.uid.as_str()) && !is_finished(p))
    {
        return Ok(false);
    }
    let uid = a.uid().unwrap_or_default();
    if !delete_allocation(ctx, &a.name_any(), &uid, leader).await? {
        return Ok(false);
    }
    ctx.metrics.orphans_collected.inc();
    let event = Event {
        type_: EventType::Normal,
        reason: "OrphanCollected".into(),
        note: Some(format!(
            "{} released: its owner Pod {}/{} (uid {}) no longer exists",
            a.spec.address, owner.namespace, owner.name, owner.uid
        )),
        action: "Collect".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &a.object_ref(&())).await {
        warn!(error = %e, "recording event failed");
    }
    Ok(true)
}

/// Deletes allocations whose owner is gone; returns how many.
pub(super) async fn collect_orphans(
    ctx: &IpamContext,
    leader: &watch::Receiver<Leadership>,
) -> Result<usize, IpamError> {
    // Allocations first, then owners: an allocation created after the Pod list was read is
    // younger than that list and can never be judged against it.
    let allocations: Api<IPAllocation> = Api::all(ctx.client.clone());
    let allocations = allocations
        .list(&ListParams::default())
        .await
        .map_err(|source| IpamError::List {
            what: "IPAllocations",
            source,
        })?;
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let pods = pods
        .list(&ListParams::default().labels(IPAM_POOL_LABEL))
        .await
        .map_err(|source| IpamError::List {
            what: "Pods",
            source,
        })?;
    let live: HashSet<String> = pods
        .items
        .iter()
        .filter(|p| !is_finished(p))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let now = Timestamp::now();
    let grace =
        k8s_openapi::jiff::SignedDuration::try_from(ctx.config.gc_grace).unwrap_or_default();
    let candidates = allocations.items.iter().filter(|a| {
        !live.contains(&a.spec.owner.uid)
            && a.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| t.0 + grace <= now)
    });
    let outcomes: Vec<Result<bool, IpamError>> = futures::stream::iter(candidates)
        .map(|a| collect_orphan(ctx, a, leader))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect()
        .await;
    let mut collected = 0;
    for outcome in outcomes {
        if outcome? {
            collected += 1;
        }
    }
    Ok(collected)
}
