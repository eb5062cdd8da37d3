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
use crate::policies::{PolicyStores, reflect_policies};
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
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::allocator::{Allocator, MAX_POOL_NAME_LEN, Pool, allocation_name, overlaps};
use super::effect_loop::{EffectKind, run_effect};
use super::index::{Held, Index};
use super::network::PoolNetwork;
use crate::runtime::error_chain::chain;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{
    FIELD_MANAGER, Failure, Next, NotLeading, Pacing, ReconcileMetrics, Window, fenced, reflect,
    watch_events,
};
use gatehouse_api::v1alpha1::{
    DEFAULT_IPAM_ANNOTATION, IPAM_GATE, IPAM_POOL_LABEL, IPAllocation, IPAllocationSpec, IPPool,
    IPPoolStatus, OWNER_UID_LABEL, Owner, POOL_LABEL, Policy,
};
use gatehouse_ipam::annotation::IPAM_ADDRESS_ANNOTATION;

mod gc;
mod plan;
mod pools;
#[cfg(test)]
mod tests;
mod writes;

use gc::*;
use plan::*;
use pools::*;
use writes::*;

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

impl Failure for IpamError {
    fn step(&self) -> &'static str {
        match self {
            IpamError::CreateAllocation { .. } => "CreateAllocation",
            IpamError::DeleteAllocation { .. } => "DeleteAllocation",
            IpamError::PatchPod { .. } => "PatchPod",
            IpamError::WritePool { .. } => "WritePool",
            IpamError::List { .. } => "List",
            IpamError::ReadPod { .. } => "ReadPod",
            IpamError::NotLeading(_) => "NotLeading",
        }
    }
}

/// What the loop needs, passed explicitly.
pub struct IpamContext {
    pub client: Client,
    /// The reconcile loops' metrics, shared with the Policy controller.
    pub loops: Arc<ReconcileMetrics>,
    pub metrics: IpamMetrics,
    pub recorder: Recorder,
    pub config: IpamConfig,
}

/// The effects loop's own metrics (`gatehouse_ipam_*`).
pub struct IpamMetrics {
    pub allocations: Counter,
    pub orphans_collected: Counter,
}

impl IpamMetrics {
    /// Registers the loop's counters in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = IpamMetrics {
            allocations: Counter::default(),
            orphans_collected: Counter::default(),
        };
        let ipam = registry.sub_registry_with_prefix("ipam");
        ipam.register(
            "allocations",
            "IPAllocations created by the effects loop",
            metrics.allocations.clone(),
        );
        ipam.register(
            "orphans_collected",
            "IPAllocations deleted by garbage collection because their owner Pod was gone",
            metrics.orphans_collected.clone(),
        );
        metrics
    }
}

struct IpamCaches {
    pods: Store<Pod>,
    pools: Store<IPPool>,
    policies: PolicyStores,
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
    let (allocations, allocations_watch) =
        watch_events::<IPAllocation>(ctx.client.clone(), all(), trigger.clone());
    // Allocation follows the mark admission set, where exceptions applied already.
    let (policies, policies_watch) = reflect_policies(&ctx.client, &trigger, &[]);
    let caches = IpamCaches {
        pods,
        pools,
        policies,
    };
    let watches = tokio::spawn(async move {
        tokio::join!(pods_watch, pools_watch, allocations_watch, policies_watch);
    });
    let work = async {
        let mut kind = IpamKind {
            next_gc: Instant::now() + ctx.config.gc_interval,
            next_rebuild: Instant::now() + RESYNC,
            ctx: &ctx,
            caches,
            index: Index::default(),
            allocations,
        };
        if !kind.sync().await {
            return;
        }
        info!(allocations = kind.index.len(), "IPAM caches synced");
        let pacing = Pacing {
            window: COALESCE,
            resync: RESYNC,
        };
        run_effect(&mut kind, &ctx.loops, &trigger, &mut leader, pacing).await;
    };
    tokio::select! {
        () = work => {}
        () = shutdown => {}
    }
    watches.abort();
}

/// IP allocation as the effects skeleton runs it.
struct IpamKind<'a> {
    ctx: &'a IpamContext,
    caches: IpamCaches,
    /// The allocations, compact, fed by their watch and by the loop's own writes.
    index: Index,
    allocations: mpsc::UnboundedReceiver<watcher::Event<IPAllocation>>,
    next_gc: Instant,
    next_rebuild: Instant,
}

impl IpamKind<'_> {
    /// Waits for the caches and the index's first list; `false` when a watch ended first.
    async fn sync(&mut self) -> bool {
        let (_, _, _, synced) = tokio::join!(
            self.caches.pods.wait_until_ready(),
            self.caches.pools.wait_until_ready(),
            self.caches.policies.wait_until_ready(),
            async {
                while !self.index.is_synced() {
                    match self.allocations.recv().await {
                        Some(event) => self.index.ingest(event),
                        None => return false,
                    }
                }
                true
            },
        );
        synced
    }
}

impl EffectKind for IpamKind<'_> {
    type Memory = Memory;
    type Error = IpamError;
    const NAME: &'static str = "ipam";

    fn refresh(&mut self) -> Option<Instant> {
        while let Ok(event) = self.allocations.try_recv() {
            self.index.ingest(event);
        }
        if Instant::now() >= self.next_rebuild {
            self.next_rebuild = Instant::now() + RESYNC;
            self.index.rebuild();
        }
        Some(self.next_rebuild)
    }

    async fn pass(
        &mut self,
        memory: &mut Memory,
        leader: &watch::Receiver<Leadership>,
    ) -> Result<Next, IpamError> {
        let placed =
            place_and_release(self.ctx, &self.caches, &mut self.index, memory, leader).await;
        if Instant::now() >= self.next_gc {
            self.next_gc = Instant::now() + self.ctx.config.gc_interval;
            match collect_orphans(self.ctx, leader)
                .instrument(info_span!("gc", controller = "ipam"))
                .await
            {
                Ok(0) => {}
                Ok(n) => info!(collected = n, "collected orphaned IP allocations"),
                Err(e) => warn!(error = %chain(&e), "IPAM garbage collection failed"),
            }
        }
        // Collected whatever the pass did: one write that keeps failing must not stop it.
        let more = placed?;
        Ok(Next::By(if more {
            Instant::now()
        } else {
            self.next_gc.min(self.next_rebuild)
        }))
    }

    fn not_leading(error: &IpamError) -> Option<&NotLeading> {
        match error {
            IpamError::NotLeading(e) => Some(e),
            _ => None,
        }
    }
}

/// How many writes one pass has in flight at once. Allocations are decided one after another
/// from the in-memory index (that is what keeps addresses distinct); only the API calls that
/// record them overlap: one write at a time kept a burst of Pods gated for a round trip each
/// (`tests/bench/ipam-load`).
const WRITES_IN_FLIGHT: usize = 32;

/// What became of one [`Assignment`].
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
    let ValidatedPools {
        valid,
        networks,
        invalid,
    } = validate_pools(&pools);
    index.set_pools(&valid);
    let deleting: HashSet<String> = pools
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .map(|p| p.name_any())
        .collect();

    let policies = caches.policies.state();
    let pods = caches.pods.state();
    let judged = ValidatedPools {
        valid,
        networks,
        invalid,
    };
    let Plan {
        places,
        releases,
        tells,
        waiting,
        seen,
    } = plan(&pods, &policies, &judged, &deleting, index, memory);
    let ValidatedPools { valid, invalid, .. } = judged;

    let written_allocations = write_allocations(ctx, index, &releases, places, leader).await;
    memory.pods = seen;
    // Pool status reflects the index whatever a single write did; Events go with it.
    let (written, ()) = tokio::join!(
        write_pools(ctx, &pools, &valid, &invalid, index, &waiting, leader),
        publish(ctx, tells),
    );
    let again = written_allocations?;
    written?;
    Ok(again)
}

/// Releases and records allocations, many writes at a time, keeping `index` in step with what
/// was written: whether an address was taken (the pass looks again), or the first error (after
/// every write was tried).
async fn write_allocations(
    ctx: &IpamContext,
    index: &mut Index,
    releases: &[Held],
    places: Vec<Assignment>,
    leader: &watch::Receiver<Leadership>,
) -> Result<bool, IpamError> {
    // Each outcome with its allocation: the writes finish in any order.
    let released: Vec<(&Held, Result<bool, IpamError>)> = futures::stream::iter(releases)
        .map(|h| async move { (h, delete_allocation(ctx, &h.name, &h.uid, leader).await) })
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
    for (h, outcome) in released {
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
    match first_error {
        Some(e) => Err(e),
        None => Ok(again),
    }
}
