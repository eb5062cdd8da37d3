//! Kubernetes' IP and CIDR libraries (`k8s.io/apiserver/pkg/cel/library/ip.go`, `cidr.go`).
//!
//! * `ip(s)`, `isIP(s)`, `ip.isCanonical(s)`; on an IP `family()`, `isUnspecified()`,
//!   `isLoopback()`, `isLinkLocalMulticast()`, `isLinkLocalUnicast()`, `isGlobalUnicast()`;
//! * `cidr(s)`, `isCIDR(s)`; on a CIDR `containsIP(ip or string)`, `containsCIDR(cidr or
//!   string)`, `ip()`, `prefixLength()`, `masked()`;
//! * `string(ip)`, `string(cidr)`, `type(…) == net.IP` / `net.CIDR`.
//!
//! As in Kubernetes, an address with a zone or an IPv4-mapped IPv6 address is refused.
use std::net::IpAddr;
use std::str::FromStr;

use ::cel::common::types::{CelBool, CelInt, CelString, Kind, STRING_TYPE, Type};
use ::cel::common::value::{CowVal, Val};
use ::cel::{DeclarationError, Env, ExecutionError};
use ipnet::IpNet;

use super::lists::take;
use super::opaque::opaque_val;

const IP_TYPE_NAME: &str = "net.IP";
const CIDR_TYPE_NAME: &str = "net.CIDR";
static IP_TYPE: Type = ip_type();
static CIDR_TYPE: Type = cidr_type();

/// `Type` is not `Clone`: each registration takes its own.
const fn ip_type() -> Type {
    Type::simple_type(Kind::Opaque, IP_TYPE_NAME)
}

const fn cidr_type() -> Type {
    Type::simple_type(Kind::Opaque, CIDR_TYPE_NAME)
}

/// An IP address, as `ip()` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ip(IpAddr);

/// A prefix, as `cidr()` returns it: the address as written, and its length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cidr(IpNet);

impl Ip {
    pub fn parse(text: &str) -> Result<Ip, String> {
        let addr = IpAddr::from_str(text).map_err(|e| {
            format!("IP Address {text:?} parse error during conversion from string: {e}")
        })?;
        if let IpAddr::V6(v6) = addr
            && v6.to_ipv4_mapped().is_some()
        {
            return Err(format!("IPv4-mapped IPv6 address {text:?} is not allowed"));
        }
        Ok(Ip(addr))
    }

    /// Go's `netip.Addr.IsGlobalUnicast`: neither unspecified, loopback, multicast, link-local
    /// unicast nor the IPv4 broadcast address (private ranges included).
    fn is_global_unicast(&self) -> bool {
        let broadcast = matches!(self.0, IpAddr::V4(v4) if v4.is_broadcast());
        !(self.0.is_unspecified()
            || self.0.is_loopback()
            || self.0.is_multicast()
            || self.is_link_local_unicast()
            || broadcast)
    }

    fn is_link_local_unicast(&self) -> bool {
        match self.0 {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
        }
    }

    fn is_link_local_multicast(&self) -> bool {
        match self.0 {
            IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
            IpAddr::V6(v6) => v6.segments()[0] & 0xff0f == 0xff02,
        }
    }
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let net = IpNet::from_str(text).map_err(|e| {
            format!("network address parse error during conversion from string: {text:?}: {e}")
        })?;
        if let IpNet::V6(v6) = net
            && v6.addr().to_ipv4_mapped().is_some()
        {
            return Err(format!("IPv4-mapped IPv6 address {text:?} is not allowed"));
        }
        Ok(Cidr(net))
    }

    /// Go's `netip.Prefix.Contains`: the same family, inside the prefix.
    fn contains_ip(&self, ip: &Ip) -> bool {
        self.0.contains(&ip.0)
    }

    fn contains_cidr(&self, other: &Cidr) -> bool {
        self.0.contains(&other.0.addr()) && self.0.prefix_len() <= other.0.prefix_len()
    }
}

opaque_val!(Ip, IP_TYPE, |a, b| a == b);
opaque_val!(Cidr, CIDR_TYPE, |a, b| a == b);

fn downcast<'a, T: 'static>(val: &'a dyn Val, function: &str) -> Result<&'a T, ExecutionError> {
    val.as_any()
        .and_then(|a| a.downcast_ref::<T>())
        .ok_or_else(|| ExecutionError::function_error(function, "unexpected argument type"))
}

fn text<'a>(val: &'a dyn Val, function: &str) -> Result<&'a str, ExecutionError> {
    <&str>::try_from(val).map_err(|_| ExecutionError::function_error(function, "not a string"))
}

fn boolean<'b, 'v>(value: bool) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(CelBool::from(value)))
}

/// Registers both libraries on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(ip_type())?;
    env.add_type(cidr_type())?;
    env.add_overload("ip", "string_to_ip", vec![STRING_TYPE], ip)?;
    env.add_overload("isIP", "is_ip", vec![STRING_TYPE], is_ip)?;
    env.add_overload(
        "ip.isCanonical",
        "ip_is_canonical",
        vec![STRING_TYPE],
        is_canonical,
    )?;
    env.add_overload("string", "ip_to_string", vec![ip_type()], to_string)?;
    env.add_overload("cidr", "string_to_cidr", vec![STRING_TYPE], cidr)?;
    env.add_overload("isCIDR", "is_cidr", vec![STRING_TYPE], is_cidr)?;
    env.add_overload("string", "cidr_to_string", vec![cidr_type()], to_string)?;
    for (name, op) in [
        ("family", family as ::cel::common::functions::Function),
        ("isUnspecified", is_unspecified),
        ("isLoopback", is_loopback),
        ("isLinkLocalMulticast", is_link_local_multicast),
        ("isLinkLocalUnicast", is_link_local_unicast),
        ("isGlobalUnicast", is_global_unicast),
    ] {
        env.add_member_overload(name, &format!("ip.{name}()"), ip_type(), vec![], op)?;
    }
    for (name, id, args, op) in [
        (
            "containsIP",
            "cidr_contains_ip_string",
            vec![STRING_TYPE],
            contains_ip as ::cel::common::functions::Function,
        ),
        (
            "containsIP",
            "cidr_contains_ip_ip",
            vec![ip_type()],
            contains_ip,
        ),
        (
            "containsCIDR",
            "cidr_contains_cidr_string",
            vec![STRING_TYPE],
            contains_cidr,
        ),
        (
            "containsCIDR",
            "cidr_contains_cidr",
            vec![cidr_type()],
            contains_cidr,
        ),
        ("ip", "cidr_ip", vec![], cidr_ip),
        ("prefixLength", "cidr_prefix_length", vec![], prefix_length),
        ("masked", "cidr_masked", vec![], masked),
    ] {
        env.add_member_overload(name, id, cidr_type(), args, op)?;
    }
    Ok(())
}

fn ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s] = take(args)?;
    let parsed =
        Ip::parse(text(s.as_ref(), "ip")?).map_err(|e| ExecutionError::function_error("ip", e))?;
    Ok(CowVal::owned(parsed))
}

fn is_ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s] = take(args)?;
    boolean(Ip::parse(text(s.as_ref(), "isIP")?).is_ok())
}

fn is_canonical<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s] = take(args)?;
    let written = text(s.as_ref(), "ip.isCanonical")?;
    let parsed =
        Ip::parse(written).map_err(|e| ExecutionError::function_error("ip.isCanonical", e))?;
    boolean(parsed.0.to_string() == written)
}

fn to_string<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [v] = take(args)?;
    let any = v.as_any();
    let shown = if let Some(ip) = any.and_then(|a| a.downcast_ref::<Ip>()) {
        ip.0.to_string()
    } else if let Some(cidr) = any.and_then(|a| a.downcast_ref::<Cidr>()) {
        cidr.0.to_string()
    } else {
        return Err(ExecutionError::function_error(
            "string",
            "unexpected argument type",
        ));
    };
    Ok(CowVal::owned(CelString::from(shown)))
}

fn ip_member<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    f: impl Fn(&Ip) -> bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    boolean(f(downcast::<Ip>(this.as_ref(), function)?))
}

fn family<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    let family = match downcast::<Ip>(this.as_ref(), "family")?.0 {
        IpAddr::V4(_) => 4,
        IpAddr::V6(_) => 6,
    };
    Ok(CowVal::owned(CelInt::from(family)))
}

fn is_unspecified<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_member(args, "isUnspecified", |ip| ip.0.is_unspecified())
}

fn is_loopback<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_member(args, "isLoopback", |ip| ip.0.is_loopback())
}

fn is_link_local_multicast<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_member(args, "isLinkLocalMulticast", Ip::is_link_local_multicast)
}

fn is_link_local_unicast<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_member(args, "isLinkLocalUnicast", Ip::is_link_local_unicast)
}

fn is_global_unicast<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    ip_member(args, "isGlobalUnicast", Ip::is_global_unicast)
}

fn cidr<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s] = take(args)?;
    let parsed = Cidr::parse(text(s.as_ref(), "cidr")?)
        .map_err(|e| ExecutionError::function_error("cidr", e))?;
    Ok(CowVal::owned(parsed))
}

fn is_cidr<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s] = take(args)?;
    boolean(Cidr::parse(text(s.as_ref(), "isCIDR")?).is_ok())
}

fn contains_ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this, other] = take(args)?;
    let net = downcast::<Cidr>(this.as_ref(), "containsIP")?;
    let ip = match other.as_any().and_then(|a| a.downcast_ref::<Ip>()) {
        Some(ip) => ip.clone(),
        None => Ip::parse(text(other.as_ref(), "containsIP")?)
            .map_err(|e| ExecutionError::function_error("containsIP", e))?,
    };
    boolean(net.contains_ip(&ip))
}

fn contains_cidr<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this, other] = take(args)?;
    let net = downcast::<Cidr>(this.as_ref(), "containsCIDR")?;
    let inner = match other.as_any().and_then(|a| a.downcast_ref::<Cidr>()) {
        Some(cidr) => cidr.clone(),
        None => Cidr::parse(text(other.as_ref(), "containsCIDR")?)
            .map_err(|e| ExecutionError::function_error("containsCIDR", e))?,
    };
    boolean(net.contains_cidr(&inner))
}

fn cidr_ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    Ok(CowVal::owned(Ip(downcast::<Cidr>(this.as_ref(), "ip")?
        .0
        .addr())))
}

fn prefix_length<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    let length = downcast::<Cidr>(this.as_ref(), "prefixLength")?
        .0
        .prefix_len();
    Ok(CowVal::owned(CelInt::from(i64::from(length))))
}

fn masked<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    Ok(CowVal::owned(Cidr(
        downcast::<Cidr>(this.as_ref(), "masked")?.0.trunc(),
    )))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Activation, CelError, compile, eval_bool};

    fn eval(source: &str) -> Result<bool, CelError> {
        let object = json!({"spec": {"podIP": "10.244.0.7"}});
        let request = json!({"operation": "CREATE"});
        eval_bool(
            &compile(source)?,
            &Activation::new(Some(&object), None, &request),
        )
    }

    /// k8s.io/apiserver v0.37.2 `pkg/cel/library/ip_test.go` and `cidr_test.go`, as boolean
    /// expressions.
    #[test]
    fn answers_as_kubernetes_does() {
        for source in [
            "ip('192.168.0.1') == ip('192.168.0.1')",
            "isIP('192.168.0.1')",
            "!isIP('192.168.0.1.0')",
            "ip.isCanonical('127.0.0.1')",
            "ip('192.168.0.1').family() == 4",
            "ip('0.0.0.0').isUnspecified()",
            "!ip('127.0.0.1').isUnspecified()",
            "ip('127.0.0.1').isLoopback()",
            "!ip('1.2.3.4').isLoopback()",
            "ip('224.0.0.1').isLinkLocalMulticast()",
            "!ip('224.0.1.1').isLinkLocalMulticast()",
            "ip('169.254.169.254').isLinkLocalUnicast()",
            "!ip('192.168.0.1').isLinkLocalUnicast()",
            "ip('192.168.0.1').isGlobalUnicast()",
            "!ip('255.255.255.255').isGlobalUnicast()",
            "isIP('2001:db8::68')",
            "!isIP('2001:db8:::68')",
            "ip.isCanonical('2001:db8::68')",
            "!ip.isCanonical('2001:DB8::68')",
            "ip('2001:db8::68').family() == 6",
            "ip('::').isUnspecified()",
            "!ip('::1').isUnspecified()",
            "ip('::1').isLoopback()",
            "!ip('2001:db8::abcd').isLoopback()",
            "ip('ff02::1').isLinkLocalMulticast()",
            "!ip('fd00::1').isLinkLocalMulticast()",
            "ip('fe80::1').isLinkLocalUnicast()",
            "!ip('fd80::1').isLinkLocalUnicast()",
            "ip('2001:db8::abcd').isGlobalUnicast()",
            "!ip('ff00::1').isGlobalUnicast()",
            "string(ip('192.168.0.1')) == '192.168.0.1'",
            "type(ip('192.168.0.1')) == net.IP",
            "!isIP('::ffff:1.2.3.4') && !isIP('fe80::1%eth0')",
            "cidr('192.168.0.0/24') == cidr('192.168.0.0/24')",
            "cidr('192.168.0.0/24').containsIP(ip('192.168.0.1'))",
            "!cidr('192.168.0.0/24').containsIP(ip('192.168.1.1'))",
            "cidr('192.168.0.0/24').containsIP('192.168.0.1')",
            "!cidr('192.168.0.0/24').containsIP('192.168.1.1')",
            "cidr('192.168.0.0/24').containsCIDR(cidr('192.168.0.0/25'))",
            "cidr('192.168.0.0/24').containsCIDR(cidr('192.168.0.1/32'))",
            "!cidr('192.168.0.0/24').containsCIDR(cidr('192.168.0.0/23'))",
            "!cidr('192.168.0.0/24').containsCIDR(cidr('192.169.0.1/32'))",
            "cidr('192.168.0.0/24').containsCIDR('192.168.0.0/25')",
            "!cidr('192.168.0.0/24').containsCIDR('192.168.0.0/23')",
            "cidr('192.168.0.0/24').ip() == ip('192.168.0.0')",
            "cidr('192.168.0.0/24').masked() == cidr('192.168.0.0/24')",
            "cidr('192.168.0.1/24').masked() == cidr('192.168.0.0/24')",
            "cidr('192.168.0.0/24').prefixLength() == 24",
            "cidr('2001:db8::/32').containsIP(ip('2001:db8::1'))",
            "!cidr('2001:db8::/32').containsIP(ip('2001:dc8::1'))",
            "cidr('2001:db8::/32').containsIP('2001:db8::1')",
            "!cidr('2001:db8::/32').containsIP('2001:dc8::1')",
            "cidr('2001:db8::/32').containsCIDR(cidr('2001:db8::/33'))",
            "!cidr('2001:db8::/32').containsCIDR(cidr('2001:db8::/31'))",
            "cidr('2001:db8::/32').containsCIDR('2001:db8::/33')",
            "!cidr('2001:db8::/32').containsCIDR('2001:db8::/31')",
            "cidr('2001:db8::/32').ip() == ip('2001:db8::')",
            "cidr('2001:db8:1::/32').masked() == cidr('2001:db8::/32')",
            "cidr('2001:db8::/32').prefixLength() == 32",
            "string(cidr('192.168.0.0/24')) == '192.168.0.0/24'",
            "type(cidr('192.168.0.0/24')) == net.CIDR",
            // A Pod's address against its pool, from the request.
            "cidr('10.244.0.0/24').containsIP(object.spec.podIP)",
        ] {
            assert_eq!(eval(source), Ok(true), "{source}");
        }
    }

    #[test]
    fn refuses_what_kubernetes_refuses() {
        for (source, reason) in [
            ("ip('192.168.0.1.0') == ip('1.1.1.1')", "parse error"),
            ("ip.isCanonical('127.0.0.1.0')", "parse error"),
            ("ip('2001:db8:::68') == ip('::1')", "parse error"),
            (
                "ip('::ffff:1.2.3.4') == ip('1.2.3.4')",
                "IPv4-mapped IPv6 address",
            ),
            ("cidr('192.168.0.0/') == cidr('1.1.1.0/24')", "parse error"),
            ("cidr('2001:db8::/') == cidr('::/0')", "parse error"),
        ] {
            match eval(source) {
                Err(CelError::Execute(message)) => {
                    assert!(message.contains(reason), "{source}: {message}")
                }
                other => panic!("{source}: {other:?}"),
            }
        }
    }
}
