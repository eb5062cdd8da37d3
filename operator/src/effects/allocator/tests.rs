use super::*;
use gatehouse_cel::k8s_names::is_dns1123_subdomain;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pool(cidr: &str, exclude: &[&str]) -> Pool {
    let exclude: Vec<String> = exclude.iter().map(|s| s.to_string()).collect();
    Pool::parse(cidr, &exclude).unwrap()
}

fn error(cidr: &str, exclude: &[&str]) -> String {
    let exclude: Vec<String> = exclude.iter().map(|s| s.to_string()).collect();
    Pool::parse(cidr, &exclude).unwrap_err().to_string()
}

#[test]
fn capacity_ipv4_24_skips_network_and_broadcast() {
    let p = pool("10.20.0.0/24", &[]);
    assert_eq!(p.capacity(), 254);
    assert!(!p.is_allocatable(ip("10.20.0.0")));
    assert!(!p.is_allocatable(ip("10.20.0.255")));
    assert!(p.is_allocatable(ip("10.20.0.1")));
    assert!(p.is_allocatable(ip("10.20.0.254")));
    assert!(p.contains(ip("10.20.0.255")));
    assert!(!p.contains(ip("10.20.1.0")));
}

#[test]
fn capacity_ipv4_30_31_32() {
    assert_eq!(pool("10.20.0.0/30", &[]).capacity(), 2);
    let p31 = pool("10.20.0.0/31", &[]);
    assert_eq!(p31.capacity(), 2);
    assert!(p31.is_allocatable(ip("10.20.0.0")));
    assert!(p31.is_allocatable(ip("10.20.0.1")));
    let p32 = pool("10.20.0.7/32", &[]);
    assert_eq!(p32.capacity(), 1);
    assert!(p32.is_allocatable(ip("10.20.0.7")));
}

#[test]
fn capacity_ipv4_24_with_exclude_counts_the_union() {
    // .0 is both the network address and excluded: 256 - |{.0, .1, .2, .3, .255}|.
    let p = pool("10.20.0.0/24", &["10.20.0.0/30"]);
    assert_eq!(p.capacity(), 251);
    for a in [
        "10.20.0.0",
        "10.20.0.1",
        "10.20.0.2",
        "10.20.0.3",
        "10.20.0.255",
    ] {
        assert!(!p.is_allocatable(ip(a)), "{a}");
    }
    assert!(p.is_allocatable(ip("10.20.0.4")));
    // Overlapping and repeated excludes, and one covering the broadcast address.
    let p = pool(
        "10.20.0.0/24",
        &[
            "10.20.0.0/30",
            "10.20.0.2/31",
            "10.20.0.0/30",
            "10.20.0.252/30",
        ],
    );
    assert_eq!(p.capacity(), 256 - 4 - 4);
    // The whole pool excluded.
    assert_eq!(pool("10.20.0.0/24", &["10.20.0.0/24"]).capacity(), 0);
}

#[test]
fn capacity_ipv6_skips_only_the_anycast_address() {
    let p = pool("fd00::/120", &[]);
    assert_eq!(p.capacity(), 255);
    assert!(!p.is_allocatable(ip("fd00::")));
    assert!(p.is_allocatable(ip("fd00::ff")));
    assert_eq!(pool("fd00::/127", &[]).capacity(), 2);
    assert_eq!(pool("fd00::1/128", &[]).capacity(), 1);
    assert_eq!(pool("fd00::/120", &["fd00::f0/124"]).capacity(), 255 - 16);
}

#[test]
fn largest_pools_are_accepted() {
    assert_eq!(pool("10.0.0.0/12", &[]).capacity(), MAX_POOL_SIZE - 2);
    assert_eq!(pool("fd00::/108", &[]).capacity(), MAX_POOL_SIZE - 1);
    assert_eq!(pool("0.0.0.0/32", &[]).capacity(), 1);
    assert_eq!(pool("255.255.255.255/32", &[]).capacity(), 1);
}

#[test]
fn families_never_mix() {
    let p = pool("10.20.0.0/24", &[]);
    assert!(!p.contains(ip("::ffff:10.20.0.5")));
    let p6 = pool("::ffff:10.20.0.0/120", &[]);
    assert!(!p6.contains(ip("10.20.0.5")));
    assert!(p6.contains(ip("::ffff:10.20.0.5")));
}

#[test]
fn display_is_the_canonical_cidr() {
    assert_eq!(pool("FD00:0:0::0/120", &[]).to_string(), "fd00::/120");
    assert_eq!(pool("10.20.0.0/24", &[]).network(), ip("10.20.0.0"));
    assert_eq!(pool("10.20.0.0/24", &[]).prefix_len(), 24);
}

#[test]
fn parse_errors() {
    let want = "expected an IPv4 or IPv6 network address, '/' and a prefix length, such as \
                10.20.0.0/24 or fd00::/120";
    assert_eq!(
        error("10.20.0.0", &[]),
        format!("cidr \"10.20.0.0\" is not a CIDR (no prefix length): {want}")
    );
    assert_eq!(
        error("10.20.0/24", &[]),
        format!(
            "cidr \"10.20.0/24\" is not a CIDR (\"10.20.0\" is not an IPv4 or IPv6 \
             address): {want}"
        )
    );
    assert_eq!(
        error("10.20.0.0/33", &[]),
        format!(
            "cidr \"10.20.0.0/33\" is not a CIDR (prefix length \"33\" is not a whole \
             number from 0 to 32): {want}"
        )
    );
    for prefix in ["", "+24", "024", "-1", " 24", "24 ", "x"] {
        let cidr = format!("10.20.0.0/{prefix}");
        assert_eq!(
            error(&cidr, &[]),
            format!(
                "cidr {cidr:?} is not a CIDR (prefix length {prefix:?} is not a whole \
                 number from 0 to 32): {want}"
            )
        );
    }
    assert_eq!(
        error("fd00::/129", &[]),
        format!(
            "cidr \"fd00::/129\" is not a CIDR (prefix length \"129\" is not a whole number \
             from 0 to 128): {want}"
        )
    );
    assert_eq!(
        error("fe80::%eth0/120", &[]),
        format!(
            "cidr \"fe80::%eth0/120\" is not a CIDR (\"fe80::%eth0\" is not an IPv4 or IPv6 \
             address): {want}"
        )
    );
    assert_eq!(
        error("10.20.0.0/24", &["10.20.0.0/30", "10.20.0.300/32"]),
        format!(
            "exclude[1] \"10.20.0.300/32\" is not a CIDR (\"10.20.0.300\" is not an IPv4 or \
             IPv6 address): {want}"
        )
    );
}

#[test]
fn host_bits_error_names_the_network() {
    assert_eq!(
        error("10.20.0.5/24", &[]),
        "cidr \"10.20.0.5/24\" has host bits set: the network is 10.20.0.0/24"
    );
    assert_eq!(
        error("fd00::5/120", &[]),
        "cidr \"fd00::5/120\" has host bits set: the network is fd00::/120"
    );
    assert_eq!(
        error("10.20.0.0/24", &["10.20.0.1/30"]),
        "exclude[0] \"10.20.0.1/30\" has host bits set: the network is 10.20.0.0/30"
    );
}

#[test]
fn too_large_error() {
    assert_eq!(
        error("10.0.0.0/11", &[]),
        "cidr \"10.0.0.0/11\" holds 2^21 addresses, more than a pool may: at most 2^20 \
         (1048576), i.e. a prefix length of at least /12 for IPv4 or /108 for IPv6"
    );
    assert_eq!(
        error("::/0", &[]),
        "cidr \"::/0\" holds 2^128 addresses, more than a pool may: at most 2^20 \
         (1048576), i.e. a prefix length of at least /12 for IPv4 or /108 for IPv6"
    );
    assert_eq!(
        Pool::parse("fd00::/107", &[]),
        Err(PoolError::TooLarge {
            value: "fd00::/107".to_string(),
            host_bits: 21
        })
    );
}

#[test]
fn exclude_family_error() {
    assert_eq!(
        error("10.20.0.0/24", &["fd00::/126"]),
        "exclude[0] \"fd00::/126\" is IPv6 but cidr 10.20.0.0/24 is IPv4"
    );
    assert_eq!(
        error("fd00::/120", &["fd00::/126", "10.20.0.0/30"]),
        "exclude[1] \"10.20.0.0/30\" is IPv4 but cidr fd00::/120 is IPv6"
    );
}

#[test]
fn exclude_outside_error() {
    let msg = |ex: &str| {
        format!(
            "exclude[0] {ex:?} is not inside cidr 10.20.0.0/24: an exclude may only remove \
             addresses of the pool"
        )
    };
    // Disjoint, and larger than the pool though containing it.
    for ex in ["10.20.1.0/30", "10.20.0.0/23", "0.0.0.0/0"] {
        assert_eq!(error("10.20.0.0/24", &[ex]), msg(ex));
    }
}

#[test]
fn overlap() {
    let a = pool("10.20.0.0/24", &[]);
    let inner = pool("10.20.0.128/25", &[]);
    let next = pool("10.20.1.0/24", &[]);
    let v6 = pool("::ffff:10.20.0.0/120", &[]);
    assert!(overlaps(&a, &inner));
    assert!(overlaps(&inner, &a));
    assert!(overlaps(&a, &a));
    assert!(!overlaps(&a, &next));
    assert!(!overlaps(&a, &v6));
    // Excludes do not make room for another pool.
    let carved = pool("10.20.0.0/24", &["10.20.0.128/25"]);
    assert!(overlaps(&carved, &inner));
    assert_eq!(check_disjoint(&next, "pods-v4", &a), Ok(()));
    assert_eq!(
        check_disjoint(&inner, "pods-v4", &a)
            .unwrap_err()
            .to_string(),
        "cidr 10.20.0.128/25 overlaps cidr 10.20.0.0/24 of IPPool \"pods-v4\": pools must \
         not share addresses"
    );
}

#[test]
fn names() {
    assert_eq!(
        allocation_name("pods-v4", ip("10.20.0.5")),
        "pods-v4-10-20-0-5"
    );
    assert_eq!(allocation_name("pods-v6", ip("fd00::5")), "pods-v6-fd00--5");
    assert_eq!(
        allocation_name("pods-v6", ip("FD00:0:0:0:0:0:0:AB")),
        "pods-v6-fd00--ab"
    );
    assert_eq!(allocation_name("pods-v6", ip("fd00::")), "pods-v6-fd00--0");
    assert_eq!(allocation_name("pods-v6", ip("::")), "pods-v6---0");
    assert_eq!(allocation_name("pods-v6", ip("::5")), "pods-v6---5");
    assert_eq!(
        allocation_name("pods-v6", ip("::ffff:10.20.0.5")),
        "pods-v6---ffff-10-20-0-5"
    );
    let longest_pool = "p".repeat(MAX_POOL_NAME_LEN);
    for a in [
        "10.20.0.5",
        "255.255.255.255",
        "fd00::5",
        "fd00::",
        "::",
        "::5",
        "::ffff:255.255.255.255",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "ffff:ffff:ffff:ffff:ffff:ffff::",
        "abcd:ef01:2345:6789:abcd:ef01:2345:6789",
    ] {
        for pool in ["pods", "a.b", longest_pool.as_str()] {
            let name = allocation_name(pool, ip(a));
            assert_eq!(is_dns1123_subdomain(&name), Ok(()), "{name}");
        }
    }
    assert_eq!(
        allocation_name(&longest_pool, ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")).len(),
        DNS1123_SUBDOMAIN_MAX_LENGTH
    );
}

#[test]
fn pick_until_exhausted_then_release() {
    let mut a = Allocator::new(pool("10.20.0.0/29", &["10.20.0.4/31"]), []);
    assert_eq!(a.free_count(), 4);
    let picked: Vec<IpAddr> = std::iter::from_fn(|| a.pick()).collect();
    assert_eq!(
        picked,
        ["10.20.0.1", "10.20.0.2", "10.20.0.3", "10.20.0.6"].map(ip)
    );
    assert_eq!(a.pick(), None);
    assert_eq!((a.free_count(), a.allocated_count()), (0, 4));
    a.release(ip("10.20.0.3"));
    assert_eq!((a.free_count(), a.allocated_count()), (1, 3));
    assert_eq!(a.pick(), Some(ip("10.20.0.3")));
    assert_eq!(a.pick(), None);
}

#[test]
fn release_is_idempotent_and_ignores_what_the_pool_never_hands_out() {
    let mut a = Allocator::new(pool("10.20.0.0/29", &["10.20.0.4/31"]), []);
    assert_eq!(a.pick(), Some(ip("10.20.0.1")));
    assert_eq!(a.pick(), Some(ip("10.20.0.2")));
    a.release(ip("10.20.0.1"));
    a.release(ip("10.20.0.1"));
    assert_eq!(a.free_count(), 3);
    for never in [
        "10.20.0.0",
        "10.20.0.4",
        "10.20.0.7",
        "10.20.1.1",
        "fd00::1",
    ] {
        a.release(ip(never));
    }
    assert_eq!(a.free_count(), 3);
    assert_eq!(a.pick(), Some(ip("10.20.0.1")));
    assert_eq!(a.pick(), Some(ip("10.20.0.3")));
    assert_eq!(a.pick(), Some(ip("10.20.0.6")));
    assert_eq!(a.pick(), None);
}

#[test]
fn take() {
    let mut a = Allocator::new(pool("10.20.0.0/29", &[]), []);
    assert!(a.take(ip("10.20.0.1")));
    assert!(!a.take(ip("10.20.0.1")));
    assert!(a.take(ip("10.20.0.3")));
    for never in ["10.20.0.0", "10.20.0.7", "10.20.0.8", "fd00::1"] {
        assert!(!a.take(ip(never)), "{never}");
    }
    assert_eq!((a.free_count(), a.allocated_count()), (4, 2));
    assert_eq!(a.pick(), Some(ip("10.20.0.2")));
    assert_eq!(a.pick(), Some(ip("10.20.0.4")));
}

#[test]
fn new_takes_the_allocated_and_reports_the_rest() {
    let a = Allocator::new(
        pool("10.20.0.0/24", &["10.20.0.0/30"]),
        [
            "10.20.0.9",
            "10.20.1.9",
            "10.20.0.2",
            "10.20.0.9",
            "fd00::9",
            "10.20.0.4",
        ]
        .map(ip),
    );
    assert_eq!((a.free_count(), a.allocated_count()), (249, 2));
    assert_eq!(
        a.skipped(),
        [
            Skipped {
                addr: ip("10.20.1.9"),
                reason: SkipReason::OutsidePool
            },
            Skipped {
                addr: ip("10.20.0.2"),
                reason: SkipReason::NotAllocatable
            },
            Skipped {
                addr: ip("10.20.0.9"),
                reason: SkipReason::Duplicate
            },
            Skipped {
                addr: ip("fd00::9"),
                reason: SkipReason::OutsidePool
            },
        ]
    );
    assert_eq!(
        a.skipped()[2].to_string(),
        "10.20.0.9: allocated more than once"
    );
    let mut a = a;
    assert_eq!(a.pick(), Some(ip("10.20.0.5")));
}

#[test]
fn largest_pool_fills_up() {
    let p = pool("10.0.0.0/12", &[]);
    let below_broadcast = (1..u32::try_from(MAX_POOL_SIZE).unwrap() - 2)
        .map(|o| IpAddr::V4(Ipv4Addr::from_bits(0x0a00_0000 + o)));
    let mut a = Allocator::new(p, below_broadcast);
    assert_eq!(a.free_count(), 1);
    assert_eq!(a.pick(), Some(ip("10.15.255.254")));
    assert_eq!(a.pick(), None);
}

mod props {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The obvious implementation: a set of taken offsets, scanned from the start, and the
    /// reserved addresses worked out from the rules without [`Pool`].
    struct Reference {
        size: u32,
        reserved: Vec<bool>,
        taken: BTreeSet<u32>,
    }

    impl Reference {
        fn new(v4: bool, prefix: u8, excludes: &[(u8, u32)]) -> Reference {
            let width = if v4 { 32 } else { 128 };
            let size = 1u32 << (width - prefix);
            let keeps_zero = prefix >= width - 1;
            let reserved = (0..size)
                .map(|o| {
                    (!keeps_zero && (o == 0 || (v4 && o == size - 1)))
                        || excludes.iter().any(|&(ex_prefix, start)| {
                            o >> (width - ex_prefix) == start >> (width - ex_prefix)
                        })
                })
                .collect();
            Reference {
                size,
                reserved,
                taken: BTreeSet::new(),
            }
        }

        fn allocatable(&self, o: u32) -> bool {
            o < self.size && !self.reserved[o as usize]
        }

        fn pick(&mut self) -> Option<u32> {
            let o = (0..self.size).find(|&o| self.allocatable(o) && !self.taken.contains(&o))?;
            self.taken.insert(o);
            Some(o)
        }

        fn take(&mut self, o: u32) -> bool {
            self.allocatable(o) && self.taken.insert(o)
        }

        fn release(&mut self, o: u32) {
            self.taken.remove(&o);
        }

        fn free(&self) -> u64 {
            let allocatable = (0..self.size).filter(|&o| self.allocatable(o)).count();
            (allocatable - self.taken.len()) as u64
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Pick,
        Take(u32),
        Release(u32),
        /// Of the other family: never in the pool.
        TakeOther(u32),
        ReleaseOther(u32),
    }

    #[derive(Clone, Debug)]
    struct Case {
        v4: bool,
        network: u128,
        prefix: u8,
        /// (prefix, offset of its network within the pool)
        excludes: Vec<(u8, u32)>,
        allocated: Vec<u32>,
        ops: Vec<Op>,
    }

    fn case() -> impl Strategy<Value = Case> {
        let family = prop_oneof![
            6 => (26u8..=32).prop_map(|p| (true, p)),
            3 => Just((false, 122u8)),
            1 => (127u8..=128).prop_map(|p| (false, p)),
        ];
        (family, any::<u128>()).prop_flat_map(|((v4, prefix), bits)| {
            let width: u8 = if v4 { 32 } else { 128 };
            let host_bits = width - prefix;
            let size = 1u32 << host_bits;
            let network = if v4 {
                u128::from(u32::try_from(bits >> 96).unwrap()) & !((1u128 << host_bits) - 1)
            } else {
                bits & !((1u128 << host_bits) - 1)
            };
            let exclude = (prefix..=width, 0..size).prop_map(move |(p, o)| {
                // Align the offset to the exclude's own prefix.
                (p, o & !((1u32 << (width - p)) - 1))
            });
            // Offsets past the end are outside the pool.
            let offset = 0..size + 3;
            let op = prop_oneof![
                4 => Just(Op::Pick),
                2 => offset.clone().prop_map(Op::Take),
                3 => offset.clone().prop_map(Op::Release),
                1 => offset.clone().prop_map(Op::TakeOther),
                1 => offset.clone().prop_map(Op::ReleaseOther),
            ];
            (
                prop::collection::vec(exclude, 0..4),
                prop::collection::vec(offset, 0..12),
                prop::collection::vec(op, 0..150),
            )
                .prop_map(move |(excludes, allocated, ops)| Case {
                    v4,
                    network,
                    prefix,
                    excludes,
                    allocated,
                    ops,
                })
        })
    }

    /// Whether the free ranges are disjoint, never adjacent (the O(r) memory bound rests on
    /// it) and add up to the free count.
    fn compact(a: &Allocator) -> bool {
        let ranges: Vec<(u32, u32)> = a.free.iter().map(|(&s, &e)| (s, e)).collect();
        ranges.iter().all(|&(s, e)| s <= e)
            && ranges.windows(2).all(|w| w[0].1 + 1 < w[1].0)
            && ranges
                .iter()
                .map(|&(s, e)| u64::from(e - s) + 1)
                .sum::<u64>()
                == a.free_count()
    }

    /// The address at `offset` from `network`, wrapping past the top of the family so that
    /// offsets past the end stay outside the pool.
    fn at(v4: bool, network: u128, offset: u32) -> IpAddr {
        if v4 {
            let n = u32::try_from(network).unwrap();
            IpAddr::V4(Ipv4Addr::from_bits(n.wrapping_add(offset)))
        } else {
            IpAddr::V6(Ipv6Addr::from_bits(
                network.wrapping_add(u128::from(offset)),
            ))
        }
    }

    fn other(v4: bool, network: u128, offset: u32) -> IpAddr {
        match at(v4, network, offset) {
            IpAddr::V4(a) => IpAddr::V6(a.to_ipv6_mapped()),
            IpAddr::V6(a) => IpAddr::V4(Ipv4Addr::from_bits(a.to_bits() as u32)),
        }
    }

    /// The offset of `addr` in the pool, if it is in it.
    fn offset_of(c: &Case, size: u32, addr: IpAddr) -> Option<u32> {
        (0..size).find(|&o| at(c.v4, c.network, o) == addr)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn allocator_matches_reference(c in case()) {
            let cidr = format!("{}/{}", at(c.v4, c.network, 0), c.prefix);
            let exclude: Vec<String> = c
                .excludes
                .iter()
                .map(|&(p, o)| format!("{}/{p}", at(c.v4, c.network, o)))
                .collect();
            let pool = Pool::parse(&cidr, &exclude).unwrap();
            let mut reference = Reference::new(c.v4, c.prefix, &c.excludes);
            let size = reference.size;
            prop_assert_eq!(pool.capacity(), reference.free());
            for o in 0..size + 3 {
                let addr = at(c.v4, c.network, o);
                prop_assert_eq!(pool.is_allocatable(addr), reference.allocatable(o));
                prop_assert_eq!(pool.contains(addr), o < size);
                prop_assert!(!pool.contains(other(c.v4, c.network, o)));
            }

            let mut want_skipped = Vec::new();
            for &o in &c.allocated {
                let addr = at(c.v4, c.network, o);
                if o >= size {
                    want_skipped.push(Skipped { addr, reason: SkipReason::OutsidePool });
                } else if !reference.allocatable(o) {
                    want_skipped.push(Skipped { addr, reason: SkipReason::NotAllocatable });
                } else if !reference.take(o) {
                    want_skipped.push(Skipped { addr, reason: SkipReason::Duplicate });
                }
            }
            let mut fast = Allocator::new(
                pool.clone(),
                c.allocated.iter().map(|&o| at(c.v4, c.network, o)),
            );
            prop_assert_eq!(fast.skipped(), want_skipped.as_slice());

            let check = |fast: &Allocator, reference: &Reference| -> Result<(), TestCaseError> {
                prop_assert_eq!(fast.free_count(), reference.free());
                prop_assert_eq!(fast.allocated_count(), reference.taken.len() as u64);
                prop_assert_eq!(fast.free_count() + fast.allocated_count(), pool.capacity());
                prop_assert!(compact(fast), "free ranges {:?}", fast.free);
                Ok(())
            };
            check(&fast, &reference)?;
            let ops = c.ops.iter().cloned().chain(
                // Then drain, so that every run ends with the pool full.
                std::iter::repeat_n(Op::Pick, size as usize + 1),
            );
            for op in ops {
                match op {
                    Op::Pick => {
                        let before = reference.taken.clone();
                        let got = fast.pick();
                        let want = reference.pick();
                        prop_assert_eq!(got, want.map(|o| at(c.v4, c.network, o)));
                        if let Some(addr) = got {
                            let o = offset_of(&c, size, addr).unwrap();
                            prop_assert!(!before.contains(&o), "{} picked twice", addr);
                            prop_assert!(pool.is_allocatable(addr));
                            let keeps_zero = if c.v4 { c.prefix >= 31 } else { c.prefix >= 127 };
                            if !keeps_zero {
                                prop_assert_ne!(o, 0, "network address picked");
                                if c.v4 {
                                    prop_assert_ne!(o, size - 1, "broadcast address picked");
                                }
                            }
                            for &(p, start) in &c.excludes {
                                let width = if c.v4 { 32 } else { 128 };
                                prop_assert_ne!(
                                    o >> (width - p),
                                    start >> (width - p),
                                    "excluded address picked"
                                );
                            }
                        }
                    }
                    Op::Take(o) => {
                        let addr = at(c.v4, c.network, o);
                        prop_assert_eq!(fast.take(addr), reference.take(o));
                    }
                    Op::Release(o) => {
                        fast.release(at(c.v4, c.network, o));
                        reference.release(o);
                    }
                    Op::TakeOther(o) => {
                        prop_assert!(!fast.take(other(c.v4, c.network, o)));
                    }
                    Op::ReleaseOther(o) => fast.release(other(c.v4, c.network, o)),
                }
                check(&fast, &reference)?;
            }
            prop_assert_eq!(fast.free_count(), 0);
            prop_assert_eq!(fast.pick(), None);
        }
    }
}
