//! What the effects loop knows of the IPAllocations between passes: each allocation in a compact
//! form, who holds what, and one [`Allocator`] per valid pool.
//!
//! Fed by the allocation watch ([`Index::apply`]) and by the loop's own writes; the allocators
//! are rebuilt from the held entries only when the watch (re-)lists, when a pool's spec changes,
//! and when the loop asks for a periodic rebuild. So a pass costs what changed since the
//! previous one, a pick is O(log r), and nothing scans every allocation per pass or per pick.
//! No full objects are kept: 10,000 allocations are a few hundred bytes each here.
//!
//! Pure: no I/O, no clock.
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use kube::ResourceExt;
use kube::runtime::watcher;

use gatehouse_api::v1alpha1::IPAllocation;

use super::allocator::{Allocator, Pool, allocation_name};

/// One allocation object, as much of it as the loop reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The object's name.
    pub name: String,
    /// The object's UID: deletes carry it as a precondition.
    pub uid: String,
    /// UID of the Pod it was made for.
    pub owner_uid: String,
    pub pool: String,
    /// The address as written; `ip` is `None` when it does not parse.
    pub address: String,
    pub ip: Option<IpAddr>,
}

impl Held {
    /// The entry for `a`, or `None` for an object without a name (never from the API server).
    pub fn of(a: &IPAllocation) -> Option<Held> {
        Some(Held {
            name: a.metadata.name.clone()?,
            uid: a.metadata.uid.clone().unwrap_or_default(),
            owner_uid: a.spec.owner.uid.clone(),
            pool: a.spec.pool.clone(),
            address: a.spec.address.clone(),
            ip: a.spec.address.parse().ok(),
        })
    }
}

/// The held entries, by name and by owner.
#[derive(Default, Debug)]
struct Entries {
    by_name: HashMap<String, Held>,
    by_owner: HashMap<String, Vec<String>>,
    /// Allocation objects per pool name (valid or not: a deleted pool waits for its count to
    /// reach zero).
    per_pool: HashMap<String, usize>,
}

impl Entries {
    /// Adds `held`, replacing an entry of the same name; returns the replaced one.
    fn insert(&mut self, held: Held) -> Option<Held> {
        let old = self.remove(&held.name);
        self.by_owner
            .entry(held.owner_uid.clone())
            .or_default()
            .push(held.name.clone());
        *self.per_pool.entry(held.pool.clone()).or_default() += 1;
        self.by_name.insert(held.name.clone(), held);
        old
    }

    fn remove(&mut self, name: &str) -> Option<Held> {
        let old = self.by_name.remove(name)?;
        if let Some(names) = self.by_owner.get_mut(&old.owner_uid) {
            names.retain(|n| n != name);
            if names.is_empty() {
                self.by_owner.remove(&old.owner_uid);
            }
        }
        if let Some(n) = self.per_pool.get_mut(&old.pool) {
            *n -= 1;
            if *n == 0 {
                self.per_pool.remove(&old.pool);
            }
        }
        Some(old)
    }
}

/// See the module documentation.
#[derive(Default, Debug)]
pub struct Index {
    entries: Entries,
    /// Entries of a re-list in progress, swapped in when it completes.
    relisting: Option<Entries>,
    synced: bool,
    pools: HashMap<String, Allocator>,
}

impl Index {
    /// Whether the first list has completed: before that, nothing may be judged free.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Takes in one watch event.
    pub fn ingest(&mut self, event: watcher::Event<IPAllocation>) {
        match event {
            watcher::Event::Init => self.relisting = Some(Entries::default()),
            watcher::Event::InitApply(a) => {
                if let (Some(entries), Some(held)) = (self.relisting.as_mut(), Held::of(&a)) {
                    entries.insert(held);
                }
            }
            watcher::Event::InitDone => {
                if let Some(entries) = self.relisting.take() {
                    self.entries = entries;
                }
                self.synced = true;
                self.rebuild();
            }
            watcher::Event::Apply(a) => {
                if let Some(held) = Held::of(&a) {
                    self.observe(held);
                }
            }
            watcher::Event::Delete(a) => {
                if let (Some(name), Some(uid)) = (a.metadata.name.as_deref(), a.uid()) {
                    self.forget(name, &uid);
                }
            }
        }
    }

    /// Records an allocation that exists (seen by the watch, or created by this loop).
    pub fn observe(&mut self, held: Held) {
        let (pool, ip) = (held.pool.clone(), held.ip);
        if let Some(old) = self.entries.insert(held)
            && (old.pool.as_str(), old.ip) != (pool.as_str(), ip)
        {
            self.release(&old.pool, old.ip);
        }
        if let (Some(allocator), Some(ip)) = (self.pools.get_mut(&pool), ip) {
            allocator.take(ip);
        }
    }

    /// Records that the allocation `name` with object UID `uid` is gone. A newer object of the
    /// same name (another UID) is left alone.
    pub fn forget(&mut self, name: &str, uid: &str) {
        if self.entries.by_name.get(name).is_none_or(|h| h.uid != uid) {
            return;
        }
        if let Some(old) = self.entries.remove(name) {
            self.release(&old.pool, old.ip);
        }
    }

    fn release(&mut self, pool: &str, ip: Option<IpAddr>) {
        if let (Some(allocator), Some(ip)) = (self.pools.get_mut(pool), ip) {
            allocator.release(ip);
        }
    }

    /// Keeps one allocator per pool of `valid`: a new pool, or one whose spec changed, is built
    /// from the held entries; a pool no longer valid is dropped.
    pub fn set_pools(&mut self, valid: &BTreeMap<String, Pool>) {
        self.pools.retain(|name, _| valid.contains_key(name));
        for (name, pool) in valid {
            if self.pools.get(name).is_none_or(|a| a.pool() != pool) {
                let allocator = self.allocator_from_entries(name, pool.clone());
                self.pools.insert(name.clone(), allocator);
            }
        }
    }

    /// Rebuilds every allocator from the held entries: drops picks that never became objects.
    pub fn rebuild(&mut self) {
        let pools: Vec<(String, Pool)> = self
            .pools
            .iter()
            .map(|(name, a)| (name.clone(), a.pool().clone()))
            .collect();
        for (name, pool) in pools {
            let allocator = self.allocator_from_entries(&name, pool);
            self.pools.insert(name, allocator);
        }
    }

    fn allocator_from_entries(&self, name: &str, pool: Pool) -> Allocator {
        let taken = self
            .entries
            .by_name
            .values()
            .filter(|h| h.pool == name)
            .filter_map(|h| h.ip);
        Allocator::new(pool, taken)
    }

    /// The allocations made for the Pod with UID `owner`.
    pub fn held_by(&self, owner: &str) -> Vec<&Held> {
        self.entries
            .by_owner
            .get(owner)
            .into_iter()
            .flatten()
            .filter_map(|name| self.entries.by_name.get(name))
            .collect()
    }

    /// Whether any allocation is held for the Pod with UID `owner`.
    pub fn holds_for(&self, owner: &str) -> bool {
        self.entries.by_owner.contains_key(owner)
    }

    /// A free address of `pool`, now taken until [`unpick`](Self::unpick) or a rebuild; `None`
    /// when the pool is full or not valid.
    pub fn pick(&mut self, pool: &str) -> Option<IpAddr> {
        self.pools.get_mut(pool)?.pick()
    }

    /// Gives back a picked address whose allocation was not created, unless an object holds it.
    pub fn unpick(&mut self, pool: &str, ip: IpAddr) {
        if !self
            .entries
            .by_name
            .contains_key(&allocation_name(pool, ip))
        {
            self.release(pool, Some(ip));
        }
    }

    /// Whether `pool` can hand out addresses.
    pub fn has_pool(&self, pool: &str) -> bool {
        self.pools.contains_key(pool)
    }

    /// The allocator of a valid pool.
    pub fn allocator(&self, pool: &str) -> Option<&Allocator> {
        self.pools.get(pool)
    }

    /// How many allocation objects name `pool`.
    pub fn count(&self, pool: &str) -> usize {
        self.entries.per_pool.get(pool).copied().unwrap_or(0)
    }

    /// How many allocation objects are held.
    pub fn len(&self) -> usize {
        self.entries.by_name.len()
    }

    /// Whether no allocation object is held.
    pub fn is_empty(&self) -> bool {
        self.entries.by_name.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::{IPAllocationSpec, Owner};
    use proptest::prelude::*;
    use watcher::Event;

    fn allocation(pool: &str, last: u8, object_uid: &str, owner: &str) -> IPAllocation {
        let address = format!("10.0.0.{last}");
        let ip: IpAddr = address.parse().unwrap();
        let mut a = IPAllocation::new(
            &allocation_name(pool, ip),
            IPAllocationSpec {
                pool: pool.into(),
                address,
                owner: Owner {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    namespace: "ns".into(),
                    name: owner.into(),
                    uid: owner.into(),
                },
            },
        );
        a.metadata.uid = Some(object_uid.into());
        a
    }

    fn pools(cidr: &str) -> BTreeMap<String, Pool> {
        BTreeMap::from([("p".to_string(), Pool::parse(cidr, &[]).unwrap())])
    }

    fn ip(last: u8) -> IpAddr {
        format!("10.0.0.{last}").parse().unwrap()
    }

    fn synced(objects: Vec<IPAllocation>) -> Index {
        let mut index = Index::default();
        index.set_pools(&pools("10.0.0.0/29"));
        index.ingest(Event::Init);
        for a in objects {
            index.ingest(Event::InitApply(a));
        }
        assert!(!index.is_synced());
        index.ingest(Event::InitDone);
        index
    }

    #[test]
    fn the_first_list_fills_the_pools_and_owners() {
        let mut index = synced(vec![allocation("p", 1, "o1", "pod-a")]);
        assert!(index.is_synced());
        assert_eq!(index.count("p"), 1);
        assert_eq!(index.held_by("pod-a")[0].ip, Some(ip(1)));
        assert_eq!(index.pick("p"), Some(ip(2)));
    }

    #[test]
    fn a_relist_replaces_what_was_known() {
        let mut index = synced(vec![allocation("p", 1, "o1", "pod-a")]);
        // The watch broke and missed the delete of .1; the re-list shows .3 instead.
        index.ingest(Event::Init);
        index.ingest(Event::InitApply(allocation("p", 3, "o3", "pod-c")));
        assert_eq!(
            index.count("p"),
            1,
            "the old view serves until the list completes"
        );
        assert!(index.holds_for("pod-a"));
        index.ingest(Event::InitDone);
        assert!(!index.holds_for("pod-a"));
        assert_eq!(index.pick("p"), Some(ip(1)));
        assert_eq!(index.pick("p"), Some(ip(2)));
        assert_eq!(index.pick("p"), Some(ip(4)));
    }

    #[test]
    fn a_delete_of_a_replaced_object_frees_nothing() {
        let mut index = synced(vec![allocation("p", 1, "old", "pod-a")]);
        // .1 was released and handed to pod-b before the old object's delete event arrived.
        index.forget(&allocation_name("p", ip(1)), "old");
        index.observe(Held::of(&allocation("p", 1, "new", "pod-b")).unwrap());
        index.ingest(Event::Delete(allocation("p", 1, "old", "pod-a")));
        assert!(index.holds_for("pod-b"));
        assert_eq!(index.count("p"), 1);
        assert_eq!(index.pick("p"), Some(ip(2)), ".1 stays taken by pod-b");
    }

    #[test]
    fn an_unused_pick_goes_back_unless_an_object_holds_it() {
        let mut index = synced(vec![]);
        let a = index.pick("p").unwrap();
        index.unpick("p", a);
        assert_eq!(index.pick("p"), Some(a));
        // Taken by an object the watch shows only now: unpicking must not free it.
        index.observe(Held::of(&allocation("p", 1, "o", "pod-x")).unwrap());
        index.unpick("p", a);
        assert_eq!(index.pick("p"), Some(ip(2)));
    }

    #[test]
    fn a_changed_pool_is_rebuilt_from_its_allocations() {
        let mut index = synced(vec![allocation("p", 5, "o5", "pod-e")]);
        index.set_pools(&pools("10.0.0.4/30"));
        assert_eq!(index.allocator("p").unwrap().allocated_count(), 1);
        assert_eq!(index.pick("p"), Some(ip(6)));
        assert_eq!(index.pick("p"), None);
        index.set_pools(&BTreeMap::new());
        assert!(!index.has_pool("p"));
        assert_eq!(
            index.count("p"),
            1,
            "objects are counted for an invalid pool too"
        );
    }

    /// One watch event in a generated history: an address (0..8) and whether it is held.
    #[derive(Clone, Debug)]
    enum Step {
        Apply(u8, u8),
        Delete(u8),
        Pick,
        Relist,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u8..15, 0u8..3).prop_map(|(a, o)| Step::Apply(a, o)),
            (1u8..15).prop_map(Step::Delete),
            Just(Step::Pick),
            Just(Step::Relist),
        ]
    }

    proptest! {
        /// After any history of watch events and picks, the index hands out exactly what an
        /// allocator built from scratch over the objects that exist (the simple version the loop
        /// used to rebuild every pass) would, once the unused picks are given back.
        #[test]
        fn the_index_matches_a_rebuild_from_the_objects(steps in prop::collection::vec(step(), 0..60)) {
            let cidr = "10.0.0.0/28";
            let mut index = Index::default();
            index.set_pools(&pools(cidr));
            index.ingest(Event::Init);
            index.ingest(Event::InitDone);
            // The objects that exist: address → (object uid, owner).
            let mut live: BTreeMap<u8, (String, String)> = BTreeMap::new();
            let mut picks = Vec::new();
            for (version, s) in steps.into_iter().enumerate() {
                match s {
                    Step::Apply(a, o) => {
                        let uid = live.get(&a).map_or_else(|| format!("u{version}"), |(u, _)| u.clone());
                        let owner = format!("pod-{o}");
                        live.insert(a, (uid.clone(), owner.clone()));
                        index.ingest(Event::Apply(allocation("p", a, &uid, &owner)));
                    }
                    Step::Delete(a) => {
                        if let Some((uid, owner)) = live.remove(&a) {
                            index.ingest(Event::Delete(allocation("p", a, &uid, &owner)));
                        }
                    }
                    Step::Pick => picks.extend(index.pick("p")),
                    Step::Relist => {
                        index.ingest(Event::Init);
                        for (a, (uid, owner)) in &live {
                            index.ingest(Event::InitApply(allocation("p", *a, uid, owner)));
                        }
                        index.ingest(Event::InitDone);
                    }
                }
            }
            for p in picks {
                index.unpick("p", p);
            }
            let mut reference = Allocator::new(Pool::parse(cidr, &[]).unwrap(), live.keys().map(|a| ip(*a)));
            prop_assert_eq!(index.count("p"), live.len());
            for (a, (_, owner)) in &live {
                prop_assert!(index.held_by(owner).iter().any(|h| h.ip == Some(ip(*a))));
            }
            let mut mine = Vec::new();
            let mut theirs = Vec::new();
            while let Some(a) = index.pick("p") { mine.push(a); }
            while let Some(a) = reference.pick() { theirs.push(a); }
            prop_assert_eq!(mine, theirs);
        }
    }
}
