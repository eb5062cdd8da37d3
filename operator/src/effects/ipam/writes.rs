//! The writes of a pass: allocations created and deleted, gates released, Events published.
use super::*;

/// JSON pointer escaping of one path segment (RFC 6901).
pub(super) fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Creates the Pod's IPAllocation if it has none yet, then writes the address to the Pod.
pub(super) async fn record(
    ctx: &IpamContext,
    place: Assignment,
    leader: &watch::Receiver<Leadership>,
) -> Recorded {
    let mut recorded = Recorded {
        pool: place.pool.clone(),
        address: place.address,
        picked: place.create,
        created: None,
        outcome: Ok(false),
    };
    if place.create {
        match create_allocation(ctx, &place, leader).await {
            Ok(Some(created)) => {
                ctx.metrics.allocations.inc();
                debug!(pod = %place.pod.name_any(), address = %place.address, "allocated");
                recorded.created = Held::of(&created);
            }
            Ok(None) => {
                recorded.outcome = Ok(true);
                return recorded;
            }
            Err(e) => {
                recorded.outcome = Err(e);
                return recorded;
            }
        }
    }
    recorded.outcome = release_gate(ctx, &place, leader).await.map(|()| false);
    recorded
}

/// Creates the IPAllocation of `place`; `None` when its name (its address) is taken.
pub(super) async fn create_allocation(
    ctx: &IpamContext,
    place: &Assignment,
    leader: &watch::Receiver<Leadership>,
) -> Result<Option<IPAllocation>, IpamError> {
    let api: Api<IPAllocation> = Api::all(ctx.client.clone());
    let name = allocation_name(&place.pool, place.address);
    let allocation = IPAllocation {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([
                (POOL_LABEL.to_string(), place.pool.clone()),
                (OWNER_UID_LABEL.to_string(), place.uid.clone()),
            ])),
            ..ObjectMeta::default()
        },
        spec: IPAllocationSpec {
            pool: place.pool.clone(),
            address: place.address.to_string(),
            owner: Owner {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: place.pod.namespace().unwrap_or_default(),
                name: place.pod.name_any(),
                uid: place.uid.clone(),
            },
        },
    };
    let created = fenced(
        leader,
        || format!("IPAllocation {name}"),
        api.create(&PostParams::default(), &allocation),
    )
    .await?;
    match created {
        Ok(created) => Ok(Some(created)),
        // Taken by someone the index has not seen yet: the next pass picks another address.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(source) => Err(IpamError::CreateAllocation { name, source }),
    }
}

/// Writes the address and removes the gate, only on this very Pod with the gate still there.
pub(super) async fn release_gate(
    ctx: &IpamContext,
    place: &Assignment,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), IpamError> {
    let Assignment {
        pod,
        uid,
        gate,
        annotation,
        node_annotation,
        address,
        ..
    } = place;
    let address = address.to_string();
    let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": uid}),
        json!({"op": "test", "path": format!("/spec/schedulingGates/{gate}/name"), "value": IPAM_GATE}),
        json!({"op": "remove", "path": format!("/spec/schedulingGates/{gate}")}),
    ];
    // `add` replaces a value already there: the effects loop's is the only one that counts.
    if pod.metadata.annotations.is_some() {
        ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", pointer_segment(annotation)), "value": address}));
        ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", pointer_segment(IPAM_ADDRESS_ANNOTATION)), "value": node_annotation}));
    } else {
        ops.push(
            json!({"op": "add", "path": "/metadata/annotations", "value": {
                annotation: address,
                IPAM_ADDRESS_ANNOTATION: node_annotation,
            }}),
        );
    }
    let patch: json_patch::Patch =
        serde_json::from_value(json!(ops)).map_err(|e| IpamError::PatchPod {
            namespace: namespace.clone(),
            name: name.clone(),
            source: kube::Error::SerdeError(e),
        })?;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = fenced(
        leader,
        || format!("Pod {namespace}/{name}"),
        api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch)),
    )
    .await?;
    match result {
        Ok(_) => Ok(()),
        // Gone, or changed under us (the tests failed): the next event brings it back.
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => {
            debug!(%namespace, %name, reason = %e.message, "Pod changed before its gate was removed");
            Ok(())
        }
        Err(source) => Err(IpamError::PatchPod {
            namespace,
            name,
            source,
        }),
    }
}

/// Deletes an allocation, only if it is still the object we judged (same UID); false when it
/// was gone or replaced already.
pub(super) async fn delete_allocation(
    ctx: &IpamContext,
    name: &str,
    uid: &str,
    leader: &watch::Receiver<Leadership>,
) -> Result<bool, IpamError> {
    let api: Api<IPAllocation> = Api::all(ctx.client.clone());
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match fenced(
        leader,
        || format!("IPAllocation {name}"),
        api.delete(name, &params),
    )
    .await?
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => Ok(false),
        Err(source) => Err(IpamError::DeleteAllocation {
            name: name.to_string(),
            source,
        }),
    }
}

/// Publishes Events many at a time. An Event is a courtesy: a failure is logged, and a slow
/// API server (hundreds of Pods waiting for a pool that is gone) must not hold up the pass.
pub(super) async fn publish(ctx: &IpamContext, events: Vec<(ObjectReference, Event)>) {
    futures::stream::iter(events)
        .for_each_concurrent(WRITES_IN_FLIGHT, |(regarding, event)| async move {
            if let Err(e) = ctx.recorder.publish(&event, &regarding).await {
                warn!(error = %e, "recording event failed");
            }
        })
        .await;
}
