//! What a pool hands a Pod besides its address: the gateway, routes and DNS of `IPPool.spec`,
//! checked, and written with the address into the annotation the node's CNI plugin reads
//! (`gatehouse.dev/ipam-address`, see [`gatehouse_ipam::annotation`]).
use std::net::IpAddr;

use gatehouse_ipam::annotation::{Dns, IpamAddress, Route};

use super::allocator::{Pool, parse_prefix};
use gatehouse_api::v1alpha1::IPPoolSpec;

/// Why a pool's gateway, routes or DNS are refused; `field` is the path under `spec`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    #[error("{field} {value:?} is not an IPv4 or IPv6 address")]
    NotAnAddress { field: String, value: String },
    #[error(
        "gateway {value:?} is not inside cidr {cidr}: Pods reach their gateway on the pool's network"
    )]
    GatewayOutside { value: String, cidr: String },
    #[error(
        "{field} {value:?} is not a CIDR of the pool's family, such as 0.0.0.0/0 or 10.96.0.0/12"
    )]
    RouteDestination { field: String, value: String },
    #[error("{field} {value:?} is not of the pool's IP family")]
    Family { field: String, value: String },
}

/// A pool's network settings, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolNetwork {
    gateway: Option<IpAddr>,
    routes: Vec<Route>,
    dns: Option<Dns>,
}

impl PoolNetwork {
    /// Checks `spec`'s gateway, routes and DNS against `pool`, and reserves the gateway in it so
    /// it is never handed out.
    pub fn parse(spec: &IPPoolSpec, pool: &mut Pool) -> Result<PoolNetwork, NetworkError> {
        let v4 = pool.network().is_ipv4();
        let address = |field: &str, value: &str| -> Result<IpAddr, NetworkError> {
            let ip: IpAddr = value.parse().map_err(|_| NetworkError::NotAnAddress {
                field: field.to_string(),
                value: value.to_string(),
            })?;
            if ip.is_ipv4() != v4 {
                return Err(NetworkError::Family {
                    field: field.to_string(),
                    value: value.to_string(),
                });
            }
            Ok(ip)
        };
        let gateway = match &spec.gateway {
            Some(value) => {
                let ip = address("gateway", value)?;
                if !pool.reserve(ip) {
                    return Err(NetworkError::GatewayOutside {
                        value: value.clone(),
                        cidr: spec.cidr.clone(),
                    });
                }
                Some(ip)
            }
            None => None,
        };
        let mut routes = Vec::with_capacity(spec.routes.len());
        for (i, route) in spec.routes.iter().enumerate() {
            let field = format!("routes[{i}].dst");
            let dst_ok = parse_prefix(&route.dst).is_ok_and(|(ip, _)| ip.is_ipv4() == v4);
            if !dst_ok {
                return Err(NetworkError::RouteDestination {
                    field,
                    value: route.dst.clone(),
                });
            }
            if let Some(gw) = &route.gw {
                address(&format!("routes[{i}].gw"), gw)?;
            }
            routes.push(route.clone());
        }
        let dns = match &spec.dns {
            Some(dns) => {
                for (i, server) in dns.nameservers.iter().enumerate() {
                    let field = format!("dns.nameservers[{i}]");
                    server
                        .parse::<IpAddr>()
                        .map_err(|_| NetworkError::NotAnAddress {
                            field,
                            value: server.clone(),
                        })?;
                }
                Some(dns.clone())
            }
            None => None,
        };
        Ok(PoolNetwork {
            gateway,
            routes,
            dns,
        })
    }

    /// The annotation value giving `address` of pool `pool` (prefix length `prefix`) to the
    /// Pod of UID `owner_uid`.
    pub fn annotation(&self, pool: &str, address: IpAddr, prefix: u8, owner_uid: &str) -> String {
        let value = IpamAddress {
            pool: pool.to_string(),
            address: format!("{address}/{prefix}"),
            gateway: self.gateway.map(|g| g.to_string()),
            routes: self.routes.clone(),
            dns: self.dns.clone(),
            owner_uid: owner_uid.to_string(),
        };
        // A struct of strings always serializes.
        serde_json::to_string(&value).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cidr: &str) -> IPPoolSpec {
        IPPoolSpec {
            cidr: cidr.into(),
            namespaces: vec![],
            exclude: vec![],
            gateway: None,
            routes: vec![],
            dns: None,
        }
    }

    #[test]
    fn the_gateway_is_inside_the_pool_and_never_handed_out() {
        let mut s = spec("10.244.0.0/24");
        s.gateway = Some("10.244.0.1".into());
        s.routes = vec![Route {
            dst: "0.0.0.0/0".into(),
            gw: None,
        }];
        s.dns = Some(Dns {
            nameservers: vec!["10.0.0.10".into()],
            ..Dns::default()
        });
        let mut pool = Pool::parse(&s.cidr, &s.exclude).unwrap();
        assert_eq!(pool.capacity(), 254);
        let network = PoolNetwork::parse(&s, &mut pool).unwrap();
        assert_eq!(pool.capacity(), 253);
        assert!(!pool.is_allocatable("10.244.0.1".parse().unwrap()));
        let annotation: IpamAddress = serde_json::from_str(&network.annotation(
            "pods-v4",
            "10.244.0.7".parse().unwrap(),
            24,
            "uid-1",
        ))
        .unwrap();
        assert_eq!(
            annotation,
            IpamAddress {
                pool: "pods-v4".into(),
                address: "10.244.0.7/24".into(),
                gateway: Some("10.244.0.1".into()),
                routes: vec![Route {
                    dst: "0.0.0.0/0".into(),
                    gw: None
                }],
                dns: Some(Dns {
                    nameservers: vec!["10.0.0.10".into()],
                    ..Dns::default()
                }),
                owner_uid: "uid-1".into(),
            }
        );
        // An excluded gateway costs nothing twice.
        let mut s = spec("10.244.0.0/24");
        s.exclude = vec!["10.244.0.0/28".into()];
        s.gateway = Some("10.244.0.1".into());
        let mut pool = Pool::parse(&s.cidr, &s.exclude).unwrap();
        let before = pool.capacity();
        PoolNetwork::parse(&s, &mut pool).unwrap();
        assert_eq!(pool.capacity(), before);
    }

    #[test]
    fn bad_settings_are_refused_with_their_field() {
        for (gateway, routes, nameserver, says) in [
            (
                Some("10.245.0.1"),
                vec![],
                None,
                "gateway \"10.245.0.1\" is not inside cidr",
            ),
            (
                Some("gw"),
                vec![],
                None,
                "gateway \"gw\" is not an IPv4 or IPv6 address",
            ),
            (
                Some("fd00::1"),
                vec![],
                None,
                "gateway \"fd00::1\" is not of the pool's IP family",
            ),
            (
                None,
                vec![("default", None)],
                None,
                "routes[0].dst \"default\" is not a CIDR",
            ),
            (
                None,
                vec![("::/0", None)],
                None,
                "routes[0].dst \"::/0\" is not a CIDR",
            ),
            (
                None,
                vec![("0.0.0.0/0", Some("x"))],
                None,
                "routes[0].gw \"x\" is not an IPv4",
            ),
            (
                None,
                vec![],
                Some("dns.example"),
                "dns.nameservers[0] \"dns.example\"",
            ),
        ] {
            let mut s = spec("10.244.0.0/24");
            s.gateway = gateway.map(str::to_string);
            s.routes = routes
                .into_iter()
                .map(|(dst, gw)| Route {
                    dst: dst.into(),
                    gw: gw.map(str::to_string),
                })
                .collect();
            s.dns = nameserver.map(|n| Dns {
                nameservers: vec![n.to_string()],
                ..Dns::default()
            });
            let mut pool = Pool::parse(&s.cidr, &s.exclude).unwrap();
            let error = PoolNetwork::parse(&s, &mut pool).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        }
    }
}
