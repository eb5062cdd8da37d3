//! What a pass decides, before any write: which gated Pod gets which address, which
//! allocations go back, and which Pods are told why they still wait.
use super::*;
use gatehouse_api::v1alpha1::PolicySource;

/// What one pass is to do.
pub(super) struct Plan {
    /// Gated Pods and the address each gets, reused or picked now.
    pub(super) places: Vec<Assignment>,
    /// Allocations whose Pod finished or is gone.
    pub(super) releases: Vec<Held>,
    /// Pods told why they still wait.
    pub(super) tells: Vec<(ObjectReference, Event)>,
    /// Pods waiting for a free address, by pool.
    pub(super) waiting: HashMap<String, usize>,
    /// The marked Pods seen, by UID, with the allocations each holds (or gets now): what the
    /// next pass compares with to find Pods deleted meanwhile.
    pub(super) seen: HashMap<String, Vec<String>>,
}

/// Decides one pass, one Pod after another: addresses are picked from `index` (so that they are
/// distinct), and Pods are told only once per wait (`memory`). No I/O.
pub(super) fn plan(
    pods: &[Arc<Pod>],
    policies: &[Arc<Policy>],
    judged: &ValidatedPools,
    deleting: &HashSet<String>,
    index: &mut Index,
    memory: &mut Memory,
) -> Plan {
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    let mut waiting: HashMap<String, usize> = HashMap::new();
    let mut releases: Vec<Held> = Vec::new();
    let mut places: Vec<Assignment> = Vec::new();
    let mut tells: Vec<(ObjectReference, Event)> = Vec::new();
    for pod in pods {
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
        let (address, create) = match pick(&pool_name, recorded, judged, deleting, index) {
            Pick::Recorded(address) => (address, false),
            Pick::Fresh(address) => (address, true),
            Pick::NotReady(note) => {
                tells.extend(tell(pod, memory, "PoolNotReady", note));
                continue;
            }
            Pick::Exhausted => {
                *waiting.entry(pool_name.clone()).or_default() += 1;
                let note = format!("IPPool {pool_name} has no free address; the Pod waits for one");
                tells.extend(tell(pod, memory, "PoolExhausted", note));
                continue;
            }
        };
        memory.told_exhausted.remove(&uid);
        if create {
            seen.insert(uid.clone(), vec![allocation_name(&pool_name, address)]);
        }
        let prefix = judged.valid.get(&pool_name).map_or(0, Pool::prefix_len);
        let node_annotation = judged
            .networks
            .get(&pool_name)
            .map(|n| n.annotation(&pool_name, address, prefix, &uid))
            .unwrap_or_default();
        places.push(Assignment {
            pod: pod.clone(),
            uid,
            gate,
            annotation: annotation_for(&pool_name, pod.namespace().as_deref(), policies),
            node_annotation,
            pool: pool_name,
            address,
            create,
        });
    }
    releases.extend(gone(memory, &seen, index));
    Plan {
        places,
        releases,
        tells,
        waiting,
        seen,
    }
}

/// What a gated Pod gets from its pool this pass.
enum Pick {
    /// The address an allocation of its already records.
    Recorded(IpAddr),
    /// A free address, for a new allocation.
    Fresh(IpAddr),
    /// Nothing: the pool cannot allocate (why, for the Pod's Event).
    NotReady(String),
    /// Nothing: every address is taken.
    Exhausted,
}

/// The address of a Pod marked for `pool_name` that holds `recorded` there, if anything.
fn pick(
    pool_name: &str,
    recorded: Option<IpAddr>,
    judged: &ValidatedPools,
    deleting: &HashSet<String>,
    index: &mut Index,
) -> Pick {
    if let Some(address) = recorded {
        return Pick::Recorded(address);
    }
    if deleting.contains(pool_name) || !index.has_pool(pool_name) {
        let reason = judged
            .invalid
            .get(pool_name)
            .cloned()
            .unwrap_or_else(|| "no such IPPool".to_string());
        return Pick::NotReady(format!("IPPool {pool_name} cannot allocate: {reason}"));
    }
    index.pick(pool_name).map_or(Pick::Exhausted, Pick::Fresh)
}

/// The allocations of marked Pods gone since the last pass (`memory`, against `seen` now):
/// they were deleted, and their addresses go back at once.
fn gone(memory: &Memory, seen: &HashMap<String, Vec<String>>, index: &Index) -> Vec<Held> {
    let mut releases = Vec::new();
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
    releases
}

pub(super) fn is_finished(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

pub(super) fn gate_index(pod: &Pod) -> Option<usize> {
    pod.spec
        .as_ref()?
        .scheduling_gates
        .as_ref()?
        .iter()
        .position(|g| g.name == IPAM_GATE)
}

/// The annotation a pool's addresses are written to in a Pod of `namespace`: the one the (first,
/// by name) Policy naming that pool asks for, of the Policies and the NamespacedPolicies of the
/// Pod's own namespace (another namespace's never decide for it).
pub(super) fn annotation_for(
    pool: &str,
    namespace: Option<&str>,
    policies: &[Arc<Policy>],
) -> String {
    let mut named: Vec<&Arc<Policy>> = policies
        .iter()
        .filter(|p| {
            PolicySource::of(p)
                .namespace()
                .is_none_or(|own| Some(own) == namespace)
        })
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

/// A gated Pod and the address it gets.
pub(super) struct Assignment {
    pub(super) pod: Arc<Pod>,
    pub(super) uid: String,
    pub(super) gate: usize,
    pub(super) pool: String,
    pub(super) address: IpAddr,
    /// The IPAllocation does not exist yet.
    pub(super) create: bool,
    /// The annotation the Policy names for the address.
    pub(super) annotation: String,
    /// The value of [`IPAM_ADDRESS_ANNOTATION`] for the node's CNI plugin.
    pub(super) node_annotation: String,
}

/// One Event per Pod per wait: why it is still gated.
/// The Event telling a waiting Pod why, once per wait.
pub(super) fn tell(
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
