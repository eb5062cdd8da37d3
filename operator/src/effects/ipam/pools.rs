//! The IPPools judged (valid, overlapping, invalid) and their status written back.
use super::*;

/// The pools, judged.
pub(super) struct ValidatedPools {
    /// The pools that can hand out addresses, by name.
    pub(super) valid: BTreeMap<String, Pool>,
    /// What each valid pool gives a Pod besides its address.
    pub(super) networks: BTreeMap<String, PoolNetwork>,
    /// The others, with the reason.
    pub(super) invalid: BTreeMap<String, String>,
}

/// Judges every pool. Among overlapping pools the older keeps its addresses and the younger is
/// refused.
pub(super) fn validate_pools(pools: &[Arc<IPPool>]) -> ValidatedPools {
    let mut sorted: Vec<&Arc<IPPool>> = pools.iter().collect();
    sorted.sort_by_key(|p| {
        (
            p.metadata.creation_timestamp.clone().map(|t| t.0),
            p.name_any(),
        )
    });
    let mut judged = ValidatedPools {
        valid: BTreeMap::new(),
        networks: BTreeMap::new(),
        invalid: BTreeMap::new(),
    };
    for p in sorted {
        if p.name_any().len() > MAX_POOL_NAME_LEN {
            judged.invalid.insert(
                p.name_any(),
                format!(
                    "the name must be at most {MAX_POOL_NAME_LEN} characters, so that every \
                     allocation's name (<pool>-<address>) is a valid object name"
                ),
            );
            continue;
        }
        let parsed = Pool::parse(&p.spec.cidr, &p.spec.exclude)
            .map_err(|e| e.to_string())
            .and_then(|mut pool| {
                let network = PoolNetwork::parse(&p.spec, &mut pool).map_err(|e| e.to_string())?;
                Ok((pool, network))
            });
        match parsed {
            Ok((pool, network)) => {
                match judged
                    .valid
                    .iter()
                    .find(|(_, other)| overlaps(&pool, other))
                {
                    Some((other, other_pool)) => {
                        judged.invalid.insert(
                            p.name_any(),
                            format!("{} overlaps IPPool {other} ({other_pool})", p.spec.cidr),
                        );
                    }
                    None => {
                        judged.valid.insert(p.name_any(), pool);
                        judged.networks.insert(p.name_any(), network);
                    }
                }
            }
            Err(e) => {
                judged.invalid.insert(p.name_any(), e);
            }
        }
    }
    judged
}

pub(super) async fn write_pools(
    ctx: &IpamContext,
    pools: &[Arc<IPPool>],
    valid: &BTreeMap<String, Pool>,
    invalid: &BTreeMap<String, String>,
    index: &Index,
    waiting: &HashMap<String, usize>,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), IpamError> {
    let api: Api<IPPool> = Api::all(ctx.client.clone());
    let now = Time(Timestamp::now());
    for p in pools {
        let name = p.name_any();
        let finalizers = p.metadata.finalizers.clone().unwrap_or_default();
        let held = index.count(&name);
        if p.metadata.deletion_timestamp.is_some() {
            if held == 0 && finalizers.iter().any(|f| f == POOL_FINALIZER) {
                let kept: Vec<&String> =
                    finalizers.iter().filter(|f| *f != POOL_FINALIZER).collect();
                let patch = json!({"metadata": {"finalizers": kept, "resourceVersion": p.metadata.resource_version}});
                write_pool(leader, &api, &name, &patch, false).await?;
            }
            continue;
        }
        if !finalizers.iter().any(|f| f == POOL_FINALIZER) {
            let mut all = finalizers.clone();
            all.push(POOL_FINALIZER.to_string());
            let patch = json!({"metadata": {"finalizers": all, "resourceVersion": p.metadata.resource_version}});
            write_pool(leader, &api, &name, &patch, false).await?;
        }
        let status = pool_status(
            p,
            valid.get(&name),
            invalid.get(&name),
            index.allocator(&name),
            waiting.get(&name).copied().unwrap_or(0),
            now.clone(),
        );
        if p.status.as_ref() != Some(&status) {
            write_pool(leader, &api, &name, &json!({"status": status}), true).await?;
        }
    }
    Ok(())
}

pub(super) async fn write_pool(
    leader: &watch::Receiver<Leadership>,
    api: &Api<IPPool>,
    name: &str,
    patch: &serde_json::Value,
    status: bool,
) -> Result<(), IpamError> {
    let params = PatchParams::apply(FIELD_MANAGER);
    let merge = Patch::Merge(patch);
    let write = async {
        if status {
            api.patch_status(name, &PatchParams::default(), &merge)
                .await
        } else {
            api.patch(
                name,
                &PatchParams {
                    field_manager: params.field_manager.clone(),
                    ..PatchParams::default()
                },
                &merge,
            )
            .await
        }
    };
    match fenced(leader, || format!("IPPool {name}"), write).await? {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => Ok(()),
        Err(source) => Err(IpamError::WritePool {
            name: name.to_string(),
            source,
        }),
    }
}

/// Pure: the status an IPPool should have. Condition times move only when a status flips.
pub(super) fn pool_status(
    pool: &IPPool,
    parsed: Option<&Pool>,
    invalid: Option<&String>,
    allocator: Option<&Allocator>,
    waiting: usize,
    now: Time,
) -> IPPoolStatus {
    let previous = pool.status.clone().unwrap_or_default();
    let condition = |type_: &str, status: bool, reason: &str, message: String| {
        let status = if status { "True" } else { "False" };
        let last_transition_time = previous
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or(now.clone(), |c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: pool.metadata.generation,
            last_transition_time,
        }
    };
    let (capacity, allocated) = match (parsed, allocator) {
        (Some(p), Some(a)) => (
            Some(i64::try_from(p.capacity()).unwrap_or(i64::MAX)),
            Some(i64::try_from(a.allocated_count()).unwrap_or(i64::MAX)),
        ),
        _ => (None, None),
    };
    let ready = match invalid {
        Some(reason) => condition("Ready", false, "Invalid", reason.clone()),
        None => condition(
            "Ready",
            true,
            "Valid",
            "the pool hands out addresses".into(),
        ),
    };
    let free = allocator.map_or(0, Allocator::free_count);
    let exhausted = if parsed.is_some() && free == 0 {
        condition(
            "Exhausted",
            true,
            "NoFreeAddress",
            format!("every address is allocated; {waiting} Pods wait"),
        )
    } else {
        condition(
            "Exhausted",
            false,
            "FreeAddresses",
            format!("{free} addresses free"),
        )
    };
    IPPoolStatus {
        capacity,
        allocated,
        observed_generation: pool.metadata.generation,
        conditions: vec![ready, exhausted],
    }
}
