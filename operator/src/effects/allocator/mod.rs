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

use gatehouse_cel::k8s_names::DNS1123_SUBDOMAIN_MAX_LENGTH;

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

/// `<address>/<prefix>` as Go's `net.ParseCIDR` (and so anything else reading the same spec)
/// reads it: an IPv4 or IPv6 address and a prefix length in plain decimal, at most the address's
/// width; host bits may be set. The error is the reason.
pub fn parse_prefix(value: &str) -> Result<(IpAddr, u8), String> {
    let Some((addr, prefix)) = value.split_once('/') else {
        return Err("no prefix length".to_string());
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))?;
    let width = width(addr);
    // `u8::from_str` would also take "+24" and "024".
    let canonical =
        prefix.bytes().all(|b| b.is_ascii_digit()) && (prefix == "0" || !prefix.starts_with('0'));
    let length = prefix
        .parse::<u8>()
        .ok()
        .filter(|&p| canonical && p <= width)
        .ok_or_else(|| {
            format!("prefix length {prefix:?} is not a whole number from 0 to {width}")
        })?;
    Ok((addr, length))
}

/// A network address and prefix length, host bits clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Prefix {
    network: IpAddr,
    prefix: u8,
}

impl Prefix {
    fn parse(field: &str, value: &str) -> Result<Prefix, PoolError> {
        let (addr, prefix) = parse_prefix(value).map_err(|reason| PoolError::Parse {
            field: field.to_string(),
            value: value.to_string(),
            reason,
        })?;
        let network = mask(addr, prefix);
        if network != addr {
            return Err(PoolError::HostBits {
                field: field.to_string(),
                value: value.to_string(),
                network: Prefix { network, prefix }.to_string(),
            });
        }
        Ok(Prefix { network, prefix })
    }

    fn host_bits(self) -> u8 {
        width(self.network) - self.prefix
    }

    fn contains(self, other: Prefix) -> bool {
        other.prefix >= self.prefix
            && width(other.network) == width(self.network)
            && mask(other.network, self.prefix) == self.network
    }
}

impl fmt::Display for Prefix {
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
    cidr: Prefix,
    size: u32,
    /// Offsets never handed out, as inclusive ranges: sorted, disjoint and never adjacent.
    reserved: Vec<(u32, u32)>,
    capacity: u64,
}

impl Pool {
    /// Parses and checks a pool's `cidr` and `exclude` (see the [module](self) for the rules).
    /// The first problem found is returned.
    pub fn parse(cidr: &str, exclude: &[String]) -> Result<Pool, PoolError> {
        let block = Prefix::parse("cidr", cidr)?;
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
            let ex = Prefix::parse(&field, value)?;
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
mod tests;
