//! The IPAM loop: addresses for Pods, allocated after the Pod is stored, keyed by its UID.
//!
//! Admission only marked the Pod (gate `gatehouse.dev/ipam`, label `gatehouse.dev/ipam-pool`).
//! This loop, on the leader only, watches exactly the marked Pods, the IPPools and the
//! IPAllocations, and for each marked, gated, live Pod:
//! 1. reuses the IPAllocation that already names the Pod's UID (a retry or a restart after a
//!    crash between creating the allocation and patching the Pod), or picks the lowest free
//!    address from the pool's in-memory index and creates its IPAllocation. The object's name
//!    is derived from the address, so the API server refuses a second allocation of an address
//!    (AlreadyExists: the next candidate is tried), whoever tries — another replica, a
//!    restarted process, a stale cache;
//! 2. writes the address to the Pod's annotation and removes the gate in one JSON patch that
//!    first tests the Pod's UID and the gate, so it can never land on another Pod.
//!
//! A Pod that is deleted, or finishes (Succeeded/Failed), releases its address at once. What
//! the loop did not see go — Pods deleted while Gatehouse was down, a crash between the two
//! writes — the garbage collection finds: every `--gc-interval`, it lists allocations *before*
//! Pods (so an allocation made after the owner list was read is never judged against it),
//! takes allocations whose owner UID is not a live Pod and older than `--gc-grace`, re-checks
//! each against the API server, and deletes it (Event, `gatehouse_ipam_orphans_collected`).
//! Owners are compared by UID, never by name: a Pod re-created under the same name is another
//! owner, and the old allocation is an orphan.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::allocator::{Allocator, MAX_POOL_NAME_LEN, Pool, allocation_name, overlaps};
use super::index::{Held, Index};
use super::network::PoolNetwork;
use crate::api::v1alpha1::{
    DEFAULT_IPAM_ANNOTATION, IPAM_GATE, IPAM_POOL_LABEL, IPAllocation, IPAllocationSpec, IPPool,
    IPPoolStatus, OWNER_UID_LABEL, Owner, POOL_LABEL, Policy,
};
use crate::error_chain::chain;
use crate::lease::Leadership;
use crate::reconcile::{
    FIELD_MANAGER, Next, NotLeading, Pacing, Window, fenced, reflect, run_loop, watch_events,
};
use crate::telemetry::Metrics;
use gatehouse_ipam::annotation::IPAM_ADDRESS_ANNOTATION;

/// Finalizer that holds a deleted IPPool until its allocations are gone.
pub const POOL_FINALIZER: &str = "gatehouse.dev/allocations";
/// Writes here are one per object whatever the batch, and every Pod waits gated until its
/// pass: collect only what arrives together (the Policy loop's longer window made a burst of
/// Pods wait for it, `tests/bench/ipam-load`).
const COALESCE: Window = Window {
    quiet: Duration::from_millis(50),
    max: Duration::from_millis(250),
};
/// Level-triggered safety net in case a watch event was missed; also how often the address
/// index is rebuilt from the allocations it holds (dropping picks that never became objects).
const RESYNC: Duration = Duration::from_secs(30);

/// Timings of the loop.
#[derive(Clone, Debug)]
pub struct IpamConfig {
    /// How often orphaned allocations are looked for.
    pub gc_interval: Duration,
    /// How old an orphaned allocation must be before it is collected.
    pub gc_grace: Duration,
}

/// Errors of one pass, named after the failing step.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error("creating IPAllocation {name}")]
    CreateAllocation { name: String, source: kube::Error },
    #[error("deleting IPAllocation {name}")]
    DeleteAllocation { name: String, source: kube::Error },
    #[error("patching Pod {namespace}/{name}")]
    PatchPod {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("writing IPPool {name}")]
    WritePool { name: String, source: kube::Error },
    #[error("listing {what} for garbage collection")]
    List {
        what: &'static str,
        source: kube::Error,
    },
    #[error("re-reading Pod {namespace}/{name} before collecting its allocation")]
    ReadPod {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(transparent)]
    NotLeading(#[from] NotLeading),
}

/// What the loop needs, passed explicitly.
pub struct IpamContext {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub config: IpamConfig,
}

struct IpamCaches {
    pods: Store<Pod>,
    pools: Store<IPPool>,
    policies: Store<Policy>,
}

/// What one leader term remembers between passes.
#[derive(Default)]
struct Memory {
    /// UIDs of the marked Pods seen last pass: one gone since was deleted, release at once.
    pods: HashMap<String, Vec<String>>,
    /// Pods already told their pool is exhausted (one Event per wait).
    told_exhausted: HashSet<String>,
}

/// Runs the loop until `shutdown`. Every replica keeps its caches warm; only the leader acts.
pub async fn run(
    ctx: Arc<IpamContext>,
    mut leader: watch::Receiver<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let trigger = Arc::new(Notify::new());
    let marked = watcher::Config::default().labels(IPAM_POOL_LABEL);
    let (pods, pods_watch) = reflect::<Pod>(ctx.client.clone(), marked, trigger.clone());
    let all = watcher::Config::default;
    let (pools, pools_watch) = reflect::<IPPool>(ctx.client.clone(), all(), trigger.clone());
    let (mut allocations, allocations_watch) =
        watch_events::<IPAllocation>(ctx.client.clone(), all(), trigger.clone());
    let (policies, policies_watch) = reflect::<Policy>(ctx.client.clone(), all(), trigger.clone());
    let caches = IpamCaches {
        pods,
        pools,
        policies,
    };
    let watches = tokio::spawn(async move {
        tokio::join!(pods_watch, pools_watch, allocations_watch, policies_watch);
    });
    let work = async {
        let mut index = Index::default();
        let _ = tokio::join!(
            caches.pods.wait_until_ready(),
            caches.pools.wait_until_ready(),
            caches.policies.wait_until_ready(),
            async {
                while !index.is_synced() {
                    match allocations.recv().await {
                        Some(event) => index.apply(event),
                        None => return,
                    }
                }
            },
        );
        info!(allocations = index.len(), "IPAM caches synced");
        let mut memory = Memory::default();
        let mut next_gc = Instant::now() + ctx.config.gc_interval;
        let mut next_rebuild = Instant::now() + RESYNC;
        let pacing = Pacing {
            window: COALESCE,
            resync: RESYNC,
        };
        let leader_view = leader.clone();
        run_loop(
            "ipam",
            &ctx.metrics,
            &trigger,
            &mut leader,
            pacing,
            async |leading| {
                while let Ok(event) = allocations.try_recv() {
                    index.apply(event);
                }
                if Instant::now() >= next_rebuild {
                    next_rebuild = Instant::now() + RESYNC;
                    index.rebuild();
                }
                if !leading {
                    // A new term must not trust what an earlier one remembered.
                    memory = Memory::default();
                    return Ok(Next::By(next_rebuild));
                }
                let more = place_and_release(&ctx, &caches, &mut index, &mut memory, &leader_view)
                    .instrument(info_span!("reconcile", controller = "ipam"))
                    .await?;
                if Instant::now() >= next_gc {
                    next_gc = Instant::now() + ctx.config.gc_interval;
                    match collect_orphans(&ctx, &leader_view)
                        .instrument(info_span!("gc", controller = "ipam"))
                        .await
                    {
                        Ok(0) => {}
                        Ok(n) => info!(collected = n, "collected orphaned IP allocations"),
                        Err(e) => warn!(error = %chain(&e), "IPAM garbage collection failed"),
                    }
                }
                Ok::<_, IpamError>(Next::By(if more {
                    Instant::now()
                } else {
                    next_gc.min(next_rebuild)
                }))
            },
        )
        .await;
    };
    tokio::select! {
        () = work => {}
        () = shutdown => {}
    }
    watches.abort();
}

/// The pools, judged.
struct JudgedPools {
    /// The pools that can hand out addresses, by name.
    valid: BTreeMap<String, Pool>,
    /// What each valid pool gives a Pod besides its address.
    networks: BTreeMap<String, PoolNetwork>,
    /// The others, with the reason.
    invalid: BTreeMap<String, String>,
}

/// Judges every pool. Among overlapping pools the older keeps its addresses and the younger is
/// refused.
fn judge_pools(pools: &[Arc<IPPool>]) -> JudgedPools {
    let mut sorted: Vec<&Arc<IPPool>> = pools.iter().collect();
    sorted.sort_by_key(|p| {
        (
            p.metadata.creation_timestamp.clone().map(|t| t.0),
            p.name_any(),
        )
    });
    let mut judged = JudgedPools {
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

fn is_finished(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

fn gate_index(pod: &Pod) -> Option<usize> {
    pod.spec
        .as_ref()?
        .scheduling_gates
        .as_ref()?
        .iter()
        .position(|g| g.name == IPAM_GATE)
}

/// The annotation a pool's addresses are written to: the one the (first, by name) Policy naming
/// that pool asks for.
fn annotation_for(pool: &str, policies: &[Arc<Policy>]) -> String {
    let mut named: Vec<&Arc<Policy>> = policies
        .iter()
        .filter(|p| {
            p.spec
                .effects
                .iter()
                .any(|e| e.ipam.as_ref().is_some_and(|i| i.pool == pool))
        })
        .collect();
    named.sort_by_key(|p| p.name_any());
    named
        .first()
        .and_then(|p| p.spec.effects.iter().find_map(|e| e.ipam.as_ref()))
        .map(|i| i.annotation().to_string())
        .unwrap_or_else(|| DEFAULT_IPAM_ANNOTATION.to_string())
}

/// JSON pointer escaping of one path segment (RFC 6901).
fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// How many writes one pass has in flight at once. Allocations are decided one after another
/// from the in-memory index (that is what keeps addresses distinct); only the API calls that
/// record them overlap: one write at a time kept a burst of Pods gated for a round trip each
/// (`tests/bench/ipam-load`).
const WRITES_IN_FLIGHT: usize = 32;

/// A gated Pod and the address it gets.
struct Place {
    pod: Arc<Pod>,
    uid: String,
    gate: usize,
    pool: String,
    address: IpAddr,
    /// The IPAllocation does not exist yet.
    create: bool,
    /// The annotation the Policy names for the address.
    annotation: String,
    /// The value of [`IPAM_ADDRESS_ANNOTATION`] for the node's CNI plugin.
    node_annotation: String,
}

/// What became of one [`Place`].
struct Recorded {
    pool: String,
    address: IpAddr,
    /// The address was picked this pass (not reused).
    picked: bool,
    /// The allocation this write created.
    created: Option<Held>,
    /// `Ok(true)`: the address was taken by an allocation the index had not seen yet; the next
    /// pass picks another.
    outcome: Result<bool, IpamError>,
}

/// One pass; `Ok(true)` asks for another one at once (an address turned out to be taken).
async fn place_and_release(
    ctx: &IpamContext,
    caches: &IpamCaches,
    index: &mut Index,
    memory: &mut Memory,
    leader: &watch::Receiver<Leadership>,
) -> Result<bool, IpamError> {
    let pools = caches.pools.state();
    let JudgedPools {
        valid,
        networks,
        invalid,
    } = judge_pools(&pools);
    index.set_pools(&valid);
    let deleting: HashSet<String> = pools
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .map(|p| p.name_any())
        .collect();

    // Decide, one Pod after another.
    let policies = caches.policies.state();
    let pods = caches.pods.state();
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    let mut waiting: HashMap<String, usize> = HashMap::new();
    let mut releases: Vec<Held> = Vec::new();
    let mut places: Vec<Place> = Vec::new();
    let mut tells: Vec<(ObjectReference, Event)> = Vec::new();
    for pod in &pods {
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        let held = index.held_by(&uid);
        if is_finished(pod) {
            releases.extend(held.into_iter().cloned());
            continue;
        }
        seen.insert(uid.clone(), held.iter().map(|h| h.name.clone()).collect());
        let Some(gate) = gate_index(pod) else {
            continue;
        };
        let Some(pool_name) = pod.labels().get(IPAM_POOL_LABEL).cloned() else {
            continue;
        };
        let recorded = held.iter().find(|h| h.pool == pool_name).and_then(|h| h.ip);
        let (address, create) = match recorded {
            Some(address) => (address, false),
            None => {
                if deleting.contains(&pool_name) || !index.has_pool(&pool_name) {
                    let reason = invalid
                        .get(&pool_name)
                        .cloned()
                        .unwrap_or_else(|| "no such IPPool".to_string());
                    let note = format!("IPPool {pool_name} cannot allocate: {reason}");
                    tells.extend(tell(pod, memory, "PoolNotReady", note));
                    continue;
                }
                match index.pick(&pool_name) {
                    Some(address) => (address, true),
                    None => {
                        *waiting.entry(pool_name.clone()).or_default() += 1;
                        let note = format!(
                            "IPPool {pool_name} has no free address; the Pod waits for one"
                        );
                        tells.extend(tell(pod, memory, "PoolExhausted", note));
                        continue;
                    }
                }
            }
        };
        memory.told_exhausted.remove(&uid);
        if create {
            seen.insert(uid.clone(), vec![allocation_name(&pool_name, address)]);
        }
        let prefix = valid.get(&pool_name).map_or(0, Pool::prefix_len);
        let node_annotation = networks
            .get(&pool_name)
            .map(|n| n.annotation(&pool_name, address, prefix, &uid))
            .unwrap_or_default();
        places.push(Place {
            pod: pod.clone(),
            uid,
            gate,
            annotation: annotation_for(&pool_name, &policies),
            node_annotation,
            pool: pool_name,
            address,
            create,
        });
    }
    // Marked Pods gone since the last pass were deleted: their addresses go back at once.
    for (uid, names) in &memory.pods {
        if seen.contains_key(uid) {
            continue;
        }
        for h in index.held_by(uid) {
            if names.contains(&h.name) {
                releases.push(h.clone());
            }
        }
    }

    // Record, many writes at a time.
    let released: Vec<Result<bool, IpamError>> = futures::stream::iter(&releases)
        .map(|h| delete_allocation(ctx, &h.name, &h.uid, leader))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect()
        .await;
    let recorded: Vec<Recorded> = futures::stream::iter(places)
        .map(|place| record(ctx, place, leader))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect()
        .await;
    let mut again = false;
    let mut first_error = None;
    for (h, outcome) in releases.iter().zip(released) {
        match outcome {
            // Gone now (or already): its address is free for the Pods waiting.
            Ok(_) => index.forget(&h.name, &h.uid),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    for r in recorded {
        if let Some(held) = r.created {
            index.observe(held);
        } else if r.picked && r.outcome.is_err() {
            index.unpick(&r.pool, r.address);
        }
        match r.outcome {
            Ok(taken) => again |= taken,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    memory.pods = seen;
    // Pool status reflects the index whatever a single write did; Events go with it.
    let (written, ()) = tokio::join!(
        write_pools(ctx, &pools, &valid, &invalid, index, &waiting, leader),
        publish(ctx, tells),
    );
    if let Some(e) = first_error {
        return Err(e);
    }
    written?;
    Ok(again)
}

/// Creates the Pod's IPAllocation if it has none yet, then writes the address to the Pod.
async fn record(ctx: &IpamContext, place: Place, leader: &watch::Receiver<Leadership>) -> Recorded {
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
                ctx.metrics.ipam_allocations.inc();
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
async fn create_allocation(
    ctx: &IpamContext,
    place: &Place,
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
async fn release_gate(
    ctx: &IpamContext,
    place: &Place,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), IpamError> {
    let Place {
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
async fn delete_allocation(
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

/// One Event per Pod per wait: why it is still gated.
/// The Event telling a waiting Pod why, once per wait.
fn tell(
    pod: &Pod,
    memory: &mut Memory,
    reason: &str,
    note: String,
) -> Option<(ObjectReference, Event)> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if !memory.told_exhausted.insert(uid) {
        return None;
    }
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note),
        action: "Allocate".into(),
        secondary: None,
    };
    Some((pod.object_ref(&()), event))
}

/// Publishes Events many at a time. An Event is a courtesy: a failure is logged, and a slow
/// API server (hundreds of Pods waiting for a pool that is gone) must not hold up the pass.
async fn publish(ctx: &IpamContext, events: Vec<(ObjectReference, Event)>) {
    futures::stream::iter(events)
        .for_each_concurrent(WRITES_IN_FLIGHT, |(regarding, event)| async move {
            if let Err(e) = ctx.recorder.publish(&event, &regarding).await {
                warn!(error = %e, "recording event failed");
            }
        })
        .await;
}

async fn write_pools(
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

async fn write_pool(
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
fn pool_status(
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
        (Some(p), Some(a)) => (Some(p.capacity()), Some(a.allocated_count())),
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

/// Re-checks one candidate against the API server and deletes it if its owner is really gone;
/// true when it was collected.
async fn collect_orphan(
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
    ctx.metrics.ipam_orphans_collected.inc();
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
async fn collect_orphans(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::IPPoolSpec;

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
        let JudgedPools { valid, invalid, .. } = judge_pools(&pools);
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
}
