//! IP pools and the in-memory index of the addresses allocated from each.
//!
//! Pure: no I/O, no clock. The controller parses each IPPool with [`Pool::parse`], marks invalid a
//! pool that [`overlaps`] an earlier one ([`check_disjoint`] words the error), keeps one
//! [`Allocator`] per pool built from the allocation objects it has observed, and names each new
//! allocation object with [`allocation_name`].
//!
//! # Which addresses a pool hands out
//!
//! Every address of `cidr`, except:
//!
//! * IPv4 with a prefix shorter than /31: the network address (host bits all 0) and the broadcast
//!   address (host bits all 1). A /31 is a point-to-point link (RFC 3021) and a /32 a single host,
//!   so neither has addresses to spare and both hand out every address.
//! * IPv6 with a prefix shorter than /127: the subnet-router anycast address (host bits all 0,
//!   RFC 4291 §2.6.1). IPv6 has no broadcast. A /127 (RFC 6164) or /128 hands out every address.
//! * every address inside one of the `exclude` CIDRs.
//!
//! The capacity is the size of the CIDR minus the size of the *union* of those sets: an exclude
//! that covers the network address, or overlaps another exclude, takes nothing away twice. So
//! `10.20.0.0/24` excluding `10.20.0.0/30` hands out 256 − |{.0, .1, .2, .3, .255}| = 251
//! addresses.
//!
//! Families never mix: an IPv4-mapped IPv6 address (`::ffff:10.20.0.5`) is not in an IPv4 pool,
//! so that one address never has two spellings, and so two allocation names.
//!
//! A pool holds at most [`MAX_POOL_SIZE`] (2^20) addresses, a prefix of at least /12 for IPv4 or
//! /108 for IPv6: every address handed out becomes an object in the API server, and a bounded
//! pool also keeps offsets in a `u32`.
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::engine::k8s_names::DNS1123_SUBDOMAIN_MAX_LENGTH;

/// Host bits of the largest pool.
pub const MAX_POOL_HOST_BITS: u8 = 20;
/// Addresses in the largest pool (2^20 = 1,048,576).
pub const MAX_POOL_SIZE: u64 = 1 << MAX_POOL_HOST_BITS;
/// Longest pool name for which [`allocation_name`] is always a valid object name: the name gets
/// `-` and at most 39 characters of address (a full IPv6 address).
pub const MAX_POOL_NAME_LEN: usize = DNS1123_SUBDOMAIN_MAX_LENGTH - 1 - 39;

/// Why a pool's spec is refused. Each variant names the step that failed; `field` is `cidr` or
/// `exclude[i]`, and `value` the text as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// A CIDR does not parse.
    #[error(
        "{field} {value:?} is not a CIDR ({reason}): expected an IPv4 or IPv6 network address, \
         '/' and a prefix length, such as 10.20.0.0/24 or fd00::/120"
    )]
    Parse {
        field: String,
        value: String,
        reason: String,
    },
    /// A CIDR has bits set past its prefix length; `network` is what was probably meant.
    #[error("{field} {value:?} has host bits set: the network is {network}")]
    HostBits {
        field: String,
        value: String,
        network: String,
    },
    /// The pool's CIDR holds more than [`MAX_POOL_SIZE`] addresses.
    #[error(
        "cidr {value:?} holds 2^{host_bits} addresses, more than a pool may: at most 2^20 \
         (1048576), i.e. a prefix length of at least /12 for IPv4 or /108 for IPv6"
    )]
    TooLarge { value: String, host_bits: u8 },
    /// An exclude is of the other IP family than the pool.
    #[error("{field} {value:?} is {family} but cidr {cidr} is {pool_family}")]
    ExcludeFamily {
        field: String,
        value: String,
        family: &'static str,
        cidr: String,
        pool_family: &'static str,
    },
    /// An exclude is not entirely inside the pool.
    #[error(
        "{field} {value:?} is not inside cidr {cidr}: an exclude may only remove addresses of \
         the pool"
    )]
    ExcludeOutside {
        field: String,
        value: String,
        cidr: String,
    },
    /// The pool shares addresses with another, earlier pool.
    #[error(
        "cidr {cidr} overlaps cidr {other_cidr} of IPPool {other_pool:?}: pools must not share \
         addresses"
    )]
    Overlap {
        cidr: String,
        other_pool: String,
        other_cidr: String,
    },
}

/// A network address and prefix length, host bits clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn parse(field: &str, value: &str) -> Result<Cidr, PoolError> {
        let parse_error = |reason: String| PoolError::Parse {
            field: field.to_string(),
            value: value.to_string(),
            reason,
        };
        let Some((addr, prefix)) = value.split_once('/') else {
            return Err(parse_error("no prefix length".to_string()));
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| parse_error(format!("{addr:?} is not an IPv4 or IPv6 address")))?;
        let width = width(addr);
        // `u8::from_str` would also take "+24" and "024", which Go's net.ParseCIDR (and so
        // anything else reading the same spec) refuses.
        let canonical = prefix.bytes().all(|b| b.is_ascii_digit())
            && (prefix == "0" || !prefix.starts_with('0'));
        let prefix = prefix
            .parse::<u8>()
            .ok()
            .filter(|&p| canonical && p <= width)
            .ok_or_else(|| {
                parse_error(format!(
                    "prefix length {prefix:?} is not a whole number from 0 to {width}"
                ))
            })?;
        let network = mask(addr, prefix);
        if network != addr {
            return Err(PoolError::HostBits {
                field: field.to_string(),
                value: value.to_string(),
                network: Cidr { network, prefix }.to_string(),
            });
        }
        Ok(Cidr { network, prefix })
    }

    fn host_bits(self) -> u8 {
        width(self.network) - self.prefix
    }

    fn contains(self, other: Cidr) -> bool {
        other.prefix >= self.prefix
            && width(other.network) == width(self.network)
            && mask(other.network, self.prefix) == self.network
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn width(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn family(addr: IpAddr) -> &'static str {
    match addr {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    }
}

/// `addr` with every bit past `prefix` cleared; `prefix` is at most the family's width.
fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    let prefix = u32::from(prefix);
    // A shift by the full width (prefix 0) overflows; the mask is then empty.
    match addr {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from_bits(
            a.to_bits() & u32::MAX.checked_shl(32 - prefix).unwrap_or(0),
        )),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from_bits(
            a.to_bits() & u128::MAX.checked_shl(128 - prefix).unwrap_or(0),
        )),
    }
}

/// A parsed IPPool: its CIDR and the addresses in it that are never handed out.
///
/// Addresses are handled as offsets from the network address, which fit in a `u32` because of
/// [`MAX_POOL_SIZE`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    cidr: Cidr,
    size: u32,
    /// Offsets never handed out, as inclusive ranges: sorted, disjoint and never adjacent.
    reserved: Vec<(u32, u32)>,
    capacity: u64,
}

impl Pool {
    /// Parses and checks a pool's `cidr` and `exclude` (see the [module](self) for the rules).
    /// The first problem found is returned.
    pub fn parse(cidr: &str, exclude: &[String]) -> Result<Pool, PoolError> {
        let block = Cidr::parse("cidr", cidr)?;
        let host_bits = block.host_bits();
        if host_bits > MAX_POOL_HOST_BITS {
            return Err(PoolError::TooLarge {
                value: cidr.to_string(),
                host_bits,
            });
        }
        let size = 1u32 << host_bits;
        let mut reserved = Vec::with_capacity(exclude.len() + 2);
        match block.network {
            IpAddr::V4(_) if block.prefix < 31 => reserved.extend([(0, 0), (size - 1, size - 1)]),
            IpAddr::V6(_) if block.prefix < 127 => reserved.push((0, 0)),
            _ => {}
        }
        let mut pool = Pool {
            cidr: block,
            size,
            reserved: Vec::new(),
            capacity: 0,
        };
        for (i, value) in exclude.iter().enumerate() {
            let field = format!("exclude[{i}]");
            let ex = Cidr::parse(&field, value)?;
            if width(ex.network) != width(block.network) {
                return Err(PoolError::ExcludeFamily {
                    field,
                    value: value.clone(),
                    family: family(ex.network),
                    cidr: block.to_string(),
                    pool_family: family(block.network),
                });
            }
            let start = pool.offset(ex.network).filter(|_| block.contains(ex));
            let Some(start) = start else {
                return Err(PoolError::ExcludeOutside {
                    field,
                    value: value.clone(),
                    cidr: block.to_string(),
                });
            };
            reserved.push((start, start + ((1u32 << ex.host_bits()) - 1)));
        }
        reserved.sort_unstable();
        for (start, end) in reserved {
            match pool.reserved.last_mut() {
                Some(last) if start <= last.1 + 1 => last.1 = last.1.max(end),
                _ => pool.reserved.push((start, end)),
            }
        }
        let reserved_count: u64 = pool
            .reserved
            .iter()
            .map(|&(s, e)| u64::from(e - s) + 1)
            .sum();
        pool.capacity = u64::from(size) - reserved_count;
        Ok(pool)
    }

    /// Never hands out `addr` (the pool's gateway), as an exclude of one address would; false
    /// when `addr` is not in the pool's CIDR.
    pub fn reserve(&mut self, addr: IpAddr) -> bool {
        let Some(offset) = self.offset(addr) else {
            return false;
        };
        if self.is_reserved(offset) {
            return true;
        }
        let at = self.reserved.partition_point(|&(start, _)| start < offset);
        self.reserved.insert(at, (offset, offset));
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.reserved.len());
        for &(start, end) in &self.reserved {
            match merged.last_mut() {
                Some(last) if start <= last.1 + 1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        self.reserved = merged;
        self.capacity -= 1;
        true
    }

    /// How many addresses the pool hands out.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether `addr` is inside the pool's CIDR, whether or not it is handed out.
    pub fn contains(&self, addr: IpAddr) -> bool {
        self.offset(addr).is_some()
    }

    /// Whether the pool hands out `addr`: inside the CIDR, and not reserved or excluded.
    pub fn is_allocatable(&self, addr: IpAddr) -> bool {
        self.offset(addr).is_some_and(|o| !self.is_reserved(o))
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.cidr.network
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.cidr.prefix
    }

    fn offset(&self, addr: IpAddr) -> Option<u32> {
        let offset = match (self.cidr.network, addr) {
            (IpAddr::V4(n), IpAddr::V4(a)) => u128::from(a.to_bits().checked_sub(n.to_bits())?),
            (IpAddr::V6(n), IpAddr::V6(a)) => a.to_bits().checked_sub(n.to_bits())?,
            _ => return None,
        };
        u32::try_from(offset).ok().filter(|&o| o < self.size)
    }

    /// The address at `offset`, which is below `size`, so that the sum stays in range.
    fn addr(&self, offset: u32) -> IpAddr {
        match self.cidr.network {
            IpAddr::V4(n) => IpAddr::V4(Ipv4Addr::from_bits(n.to_bits() + offset)),
            IpAddr::V6(n) => IpAddr::V6(Ipv6Addr::from_bits(n.to_bits() + u128::from(offset))),
        }
    }

    fn is_reserved(&self, offset: u32) -> bool {
        let after = self.reserved.partition_point(|&(s, _)| s <= offset);
        after
            .checked_sub(1)
            .and_then(|i| self.reserved.get(i))
            .is_some_and(|&(_, e)| e >= offset)
    }
}

/// The canonical CIDR, e.g. `fd00::/120`.
impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.cidr.fmt(f)
    }
}

/// Whether the two pools' CIDRs share an address. Excludes are not considered: pools that
/// carve one range between them with excludes are still refused, because moving an exclude
/// would then silently let both hand out the same address.
pub fn overlaps(a: &Pool, b: &Pool) -> bool {
    a.cidr.contains(b.cidr) || b.cidr.contains(a.cidr)
}

/// [`PoolError::Overlap`] if `pool` [`overlaps`] `other`, the pool named `other_name` that came
/// first and keeps its addresses.
pub fn check_disjoint(pool: &Pool, other_name: &str, other: &Pool) -> Result<(), PoolError> {
    if overlaps(pool, other) {
        return Err(PoolError::Overlap {
            cidr: pool.to_string(),
            other_pool: other_name.to_string(),
            other_cidr: other.to_string(),
        });
    }
    Ok(())
}

/// The name of the allocation object of `addr` in the pool named `pool`:
/// `<pool>-<address with '.' and ':' replaced by '-'>`, e.g. `pods-v4-10-20-0-5`, or
/// `pods-v6-fd00--5` for `fd00::5`.
///
/// IPv6 is spelled in its canonical (RFC 5952) form, lowercase and compressed, so that the
/// address has one name. A name may not end in `-`, so an address ending in `::` gets a `0`
/// (`fd00::` is `fd00--0`); no canonical spelling ends in `::0`, so this names no other
/// address. The result is a valid object name when `pool` is one of at most
/// [`MAX_POOL_NAME_LEN`] characters.
///
/// Within one pool the name identifies the address. Across pools it need not: `5.6.7.8` in an
/// IPv4 pool `p-1-2-3-4` and `1:2:3:4:5:6:7:8` in an IPv6 pool `p` are both
/// `p-1-2-3-4-5-6-7-8`. So the allocation object must record its pool and address, and an
/// existing object be checked, not trusted by its name.
pub fn allocation_name(pool: &str, addr: IpAddr) -> String {
    let mut spelled = addr.to_string().replace(['.', ':'], "-");
    if spelled.ends_with('-') {
        spelled.push('0');
    }
    format!("{pool}-{spelled}")
}

/// Why [`Allocator::new`] did not count an address as allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Not in the pool's CIDR (or of the other family).
    OutsidePool,
    /// In the CIDR but never handed out: network, broadcast, subnet-router anycast or excluded.
    NotAllocatable,
    /// Already allocated by an earlier entry.
    Duplicate,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::OutsidePool => "outside the pool",
            SkipReason::NotAllocatable => "not allocatable in the pool",
            SkipReason::Duplicate => "allocated more than once",
        })
    }
}

/// An address [`Allocator::new`] did not count, for the caller to log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub addr: IpAddr,
    pub reason: SkipReason,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.addr, self.reason)
    }
}

/// The free addresses of one pool, lowest first.
///
/// Free allocatable offsets are kept as inclusive ranges in a `BTreeMap` keyed by start, never
/// adjacent, so the lowest free address is the first key. With `r` ranges (at most the number
/// of allocated addresses plus the number of reserved ranges, plus one), [`pick`](Self::pick),
/// [`take`](Self::take) and [`release`](Self::release) are O(log r) and memory is O(r): a pool
/// filled from the bottom, the usual case, is a single range. [`new`](Self::new) is
/// O(e + k log r) for `e` excludes and `k` allocated addresses.
#[derive(Clone, Debug)]
pub struct Allocator {
    pool: Pool,
    free: BTreeMap<u32, u32>,
    free_count: u64,
    skipped: Vec<Skipped>,
}

impl Allocator {
    /// The index of `pool` with `allocated` taken. Addresses outside the pool, not allocatable,
    /// or repeated are left out and listed by [`skipped`](Self::skipped).
    pub fn new(pool: Pool, allocated: impl IntoIterator<Item = IpAddr>) -> Allocator {
        let mut free = BTreeMap::new();
        let mut next = 0;
        for &(start, end) in &pool.reserved {
            if next < start {
                free.insert(next, start - 1);
            }
            next = end + 1;
        }
        if next < pool.size {
            free.insert(next, pool.size - 1);
        }
        let mut allocator = Allocator {
            free_count: pool.capacity,
            pool,
            free,
            skipped: Vec::new(),
        };
        for addr in allocated {
            let reason = if !allocator.pool.contains(addr) {
                SkipReason::OutsidePool
            } else if !allocator.pool.is_allocatable(addr) {
                SkipReason::NotAllocatable
            } else if allocator.take(addr) {
                continue;
            } else {
                SkipReason::Duplicate
            };
            allocator.skipped.push(Skipped { addr, reason });
        }
        allocator
    }

    /// The lowest free address, now taken; `None` when the pool is full.
    pub fn pick(&mut self) -> Option<IpAddr> {
        let (start, end) = self.free.pop_first()?;
        if start < end {
            self.free.insert(start + 1, end);
        }
        self.free_count -= 1;
        Some(self.pool.addr(start))
    }

    /// Marks `addr` taken; true if it was free. False (and nothing changes) if it was already
    /// taken or is not allocatable in this pool.
    pub fn take(&mut self, addr: IpAddr) -> bool {
        let Some(offset) = self.pool.offset(addr) else {
            return false;
        };
        let Some((&start, &end)) = self.free.range(..=offset).next_back() else {
            return false;
        };
        if end < offset {
            return false;
        }
        if start < offset {
            self.free.insert(start, offset - 1);
        } else {
            self.free.remove(&start);
        }
        if offset < end {
            self.free.insert(offset + 1, end);
        }
        self.free_count -= 1;
        true
    }

    /// Makes `addr` free again. Releasing a free address, or one the pool never hands out
    /// (outside it, reserved or excluded), does nothing.
    pub fn release(&mut self, addr: IpAddr) {
        let Some(offset) = self.pool.offset(addr) else {
            return;
        };
        if self.pool.is_reserved(offset) {
            return;
        }
        let mut start = offset;
        if let Some((&s, &e)) = self.free.range(..=offset).next_back() {
            if e >= offset {
                return;
            }
            if e + 1 == offset {
                start = s;
            }
        }
        let end = self.free.remove(&(offset + 1)).unwrap_or(offset);
        self.free.insert(start, end);
        self.free_count += 1;
    }

    /// How many addresses are free.
    pub fn free_count(&self) -> u64 {
        self.free_count
    }

    /// How many addresses are taken.
    pub fn allocated_count(&self) -> u64 {
        self.pool.capacity - self.free_count
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The addresses [`new`](Self::new) left out, in the order given.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::k8s_names::is_dns1123_subdomain;

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
                let o =
                    (0..self.size).find(|&o| self.allocatable(o) && !self.taken.contains(&o))?;
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
}
