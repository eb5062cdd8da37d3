//! What the plugin does for one invocation, decided from its environment and stdin alone: a pure
//! function, so every case is tested without a runtime (`main` only reads, runs and prints).
use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::Value;

use crate::annotation::{IPAM_ADDRESS_ANNOTATION, IPAM_POOL_ANNOTATION, IpamAddress};
use crate::protocol::{
    CniError, Environment, ErrorCode, IpConfig, IpamResult, LATEST_VERSION, NetConf,
    PodAnnotations, SUPPORTED_VERSIONS, version_info,
};

/// What to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// Print this on stdout and exit 0.
    Reply(String),
    /// Exit 0 with nothing on stdout (`DEL`, `CHECK`, `STATUS`, `GC`).
    Done,
    /// Print the error object (in `version`) and exit 1.
    Fail { error: CniError, version: String },
    /// Run the fallback IPAM plugin `plugin` with this stdin and the same environment, and
    /// answer what it answers.
    Delegate { plugin: String, stdin: Vec<u8> },
}

/// Whose the Pod's address is, by its annotations and its UID.
#[derive(Debug, PartialEq, Eq)]
enum Ownership {
    /// Gatehouse allocated this address to this very Pod.
    Allocated(IpamAddress),
    /// Gatehouse marked the Pod for an address from `pool` that is not (yet) there for it.
    Awaited { pool: String, why: String },
    /// Not Gatehouse's: the fallback decides.
    NotGatehouses,
}

/// Decides what to do for `env` and `stdin`.
pub fn plan(env: &Environment, stdin: &[u8]) -> Exit {
    let command = env.command.as_deref().unwrap_or_default();
    if command == "VERSION" {
        let requested = serde_json::from_slice::<Value>(stdin).ok();
        let requested = requested
            .as_ref()
            .and_then(|v| v.get("cniVersion"))
            .and_then(Value::as_str);
        return Exit::Reply(version_info(requested));
    }
    let conf = match parse(stdin) {
        Ok(conf) => conf,
        Err(error) => {
            return Exit::Fail {
                error,
                version: LATEST_VERSION.into(),
            };
        }
    };
    let version = if SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
        conf.cni_version.clone()
    } else {
        return Exit::Fail {
            error: CniError::new(
                ErrorCode::IncompatibleVersion,
                format!(
                    "cniVersion {:?} is not supported; gatehouse-ipam speaks {}",
                    conf.cni_version,
                    SUPPORTED_VERSIONS.join(", ")
                ),
            ),
            version: LATEST_VERSION.into(),
        };
    };
    match run(command, env, &conf, stdin) {
        Ok(decision) => decision,
        Err(error) => Exit::Fail { error, version },
    }
}

fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Err(CniError::new(
            ErrorCode::Decoding,
            "no network configuration on stdin",
        ));
    }
    let invalid = |e: serde_json::Error| {
        CniError::new(
            ErrorCode::Decoding,
            format!("the network configuration on stdin is not valid: {e}"),
        )
    };
    // serde reads a struct from a JSON array too; a network configuration is an object, and
    // delegation rewrites its "ipam" key.
    let conf: Value = serde_json::from_slice(stdin).map_err(invalid)?;
    if !conf.is_object() {
        return Err(CniError::new(
            ErrorCode::Decoding,
            "the network configuration on stdin is not valid: not a JSON object",
        ));
    }
    serde_json::from_value(conf).map_err(invalid)
}

fn run(command: &str, env: &Environment, conf: &NetConf, stdin: &[u8]) -> Result<Exit, CniError> {
    match command {
        "ADD" => {
            env.require(&["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"])?;
            match ownership(env, conf)? {
                Ownership::Allocated(address) => Ok(Exit::Reply(result(conf, address)?)),
                Ownership::Awaited { pool, why } => Err(CniError::new(
                    ErrorCode::TryAgainLater,
                    format!(
                        "the Pod waits for an address from IPPool {pool:?}, not allocated yet: \
                         try again later"
                    ),
                )
                .with_details(why)),
                Ownership::NotGatehouses => delegate(conf, stdin),
            }
        }
        "DEL" => {
            env.require(&["CNI_CONTAINERID", "CNI_IFNAME"])?;
            // Gatehouse's addresses are released by the effects loop, by UID, once the Pod is
            // gone: nothing to do here, and never a failure.
            match ownership(env, conf) {
                Ok(Ownership::Allocated(_) | Ownership::Awaited { .. }) => Ok(Exit::Done),
                Ok(Ownership::NotGatehouses) | Err(_) if conf.ipam.fallback.is_some() => {
                    delegate(conf, stdin)
                }
                Ok(Ownership::NotGatehouses) | Err(_) => Ok(Exit::Done),
            }
        }
        "CHECK" => {
            env.require(&["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"])?;
            match ownership(env, conf)? {
                Ownership::Allocated(address) => check(conf, &address),
                Ownership::Awaited { pool, why } => Err(CniError::new(
                    ErrorCode::ContainerUnknown,
                    format!("the Pod holds no address of IPPool {pool:?}"),
                )
                .with_details(why)),
                Ownership::NotGatehouses => delegate(conf, stdin),
            }
        }
        "GC" => match conf.ipam.fallback {
            Some(_) => delegate(conf, stdin),
            None => Ok(Exit::Done),
        },
        "STATUS" => Ok(Exit::Done),
        "" => Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            "CNI_COMMAND is not set",
        )),
        other => Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("CNI_COMMAND {other:?} is not one of ADD, DEL, CHECK, GC, STATUS, VERSION"),
        )),
    }
}

fn ownership(env: &Environment, conf: &NetConf) -> Result<Ownership, CniError> {
    if env.args.is_none() {
        return Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            "CNI_ARGS is not set: gatehouse-ipam needs K8S_POD_UID to tell whose address it is",
        ));
    }
    let Some(uid) = env.arg("K8S_POD_UID").filter(|uid| !uid.is_empty()) else {
        return Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            "CNI_ARGS has no K8S_POD_UID: gatehouse-ipam needs it to tell whose address it is",
        ));
    };
    let annotations = match conf.pod_annotations() {
        PodAnnotations::Passed(annotations) => annotations,
        PodAnnotations::NotPassed => {
            return Err(CniError::new(
                ErrorCode::InvalidConfig,
                "the runtime passed no Pod annotations: the main plugin's configuration must \
                 declare the capability {\"io.kubernetes.cri.pod-annotations\": true}",
            ));
        }
    };
    Ok(owner(&annotations, uid))
}

/// Whose the address in `annotations` is, for the Pod of `uid`.
fn owner(annotations: &BTreeMap<String, String>, uid: &str) -> Ownership {
    let pool = annotations.get(IPAM_POOL_ANNOTATION);
    let why = match annotations.get(IPAM_ADDRESS_ANNOTATION) {
        None => format!("no {IPAM_ADDRESS_ANNOTATION} annotation"),
        Some(text) => match serde_json::from_str::<IpamAddress>(text) {
            Err(e) => format!("the {IPAM_ADDRESS_ANNOTATION} annotation is not valid: {e}"),
            Ok(address) if address.owner_uid != uid => format!(
                "the {IPAM_ADDRESS_ANNOTATION} annotation names another Pod (UID {}): a copy, \
                 never this Pod's address",
                address.owner_uid
            ),
            Ok(address) => match valid(&address) {
                Ok(()) => return Ownership::Allocated(address),
                Err(e) => format!("the {IPAM_ADDRESS_ANNOTATION} annotation is not valid: {e}"),
            },
        },
    };
    match pool {
        Some(pool) => Ownership::Awaited {
            pool: pool.clone(),
            why,
        },
        None => Ownership::NotGatehouses,
    }
}

/// The address is `<ip>/<prefix>` and the gateway an address of the same family.
fn valid(address: &IpamAddress) -> Result<(), String> {
    let (ip, prefix) = address
        .address
        .split_once('/')
        .ok_or_else(|| format!("address {:?} has no prefix length", address.address))?;
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("address {:?} is not an IP address", address.address))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix.parse::<u8>().ok().is_none_or(|p| p > max) {
        return Err(format!(
            "address {:?} has an invalid prefix length",
            address.address
        ));
    }
    if let Some(gateway) = &address.gateway {
        let gateway: IpAddr = gateway
            .parse()
            .map_err(|_| format!("gateway {gateway:?} is not an IP address"))?;
        if gateway.is_ipv4() != ip.is_ipv4() {
            return Err(format!("gateway {gateway} is not of the address's family"));
        }
    }
    Ok(())
}

fn result(conf: &NetConf, address: IpamAddress) -> Result<String, CniError> {
    let result = IpamResult {
        cni_version: conf.cni_version.clone(),
        ips: vec![IpConfig {
            address: address.address,
            gateway: address.gateway,
        }],
        routes: address.routes,
        dns: address.dns.unwrap_or_default(),
    };
    serde_json::to_string(&result)
        .map_err(|e| CniError::new(ErrorCode::Io, format!("writing the result: {e}")))
}

/// `CHECK`: the previous result still carries the Pod's own address.
fn check(conf: &NetConf, address: &IpamAddress) -> Result<Exit, CniError> {
    let held = conf
        .prev_result
        .as_ref()
        .and_then(|r| r.get("ips"))
        .and_then(Value::as_array)
        .is_some_and(|ips| {
            ips.iter()
                .any(|ip| ip.get("address").and_then(Value::as_str) == Some(&address.address))
        });
    if held {
        Ok(Exit::Done)
    } else {
        Err(CniError::new(
            ErrorCode::ContainerUnknown,
            format!(
                "the previous result does not hold the Pod's address {}",
                address.address
            ),
        ))
    }
}

/// The fallback plugin and its stdin: the configuration with `ipam` replaced by the fallback's.
fn delegate(conf: &NetConf, stdin: &[u8]) -> Result<Exit, CniError> {
    let Some(fallback) = &conf.ipam.fallback else {
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            format!(
                "the Pod is not Gatehouse's (no {IPAM_POOL_ANNOTATION} annotation) and ipam has \
                 no fallback to give it an address"
            ),
        ));
    };
    let plugin = fallback
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty() && !t.contains('/'))
        .ok_or_else(|| {
            CniError::new(
                ErrorCode::InvalidConfig,
                "ipam.fallback needs a \"type\", the name of an IPAM plugin",
            )
        })?
        .to_string();
    let mut whole: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            ErrorCode::Decoding,
            format!("the network configuration on stdin is not valid: {e}"),
        )
    })?;
    whole["ipam"] = fallback.clone();
    Ok(Exit::Delegate {
        plugin,
        stdin: whole.to_string().into_bytes(),
    })
}
