//! The parts of the CNI specification (1.0, 1.1) the plugin speaks: the environment it is run
//! with, the network configuration on stdin, the error object and the IPAM result.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::annotation::{Dns, POD_ANNOTATIONS_CAPABILITY, Route};

/// The spec versions this plugin speaks, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0", "1.1.0"];
/// The version of the plugin's own answers when the request names none it speaks.
pub const LATEST_VERSION: &str = "1.1.0";

/// The CNI error codes the plugin returns (the spec's well-known ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// 1: the configuration's `cniVersion` is not one the plugin speaks.
    IncompatibleVersion = 1,
    /// 3: the container is not (or no longer) what the request says.
    ContainerUnknown = 3,
    /// 4: a required environment variable is missing or invalid (`CNI_COMMAND`, `CNI_ARGS`, …).
    InvalidEnvironment = 4,
    /// 5: reading stdin or running the fallback failed.
    Io = 5,
    /// 6: stdin is not the JSON the command needs.
    Decoding = 6,
    /// 7: the network configuration is not one the plugin can work with.
    InvalidConfig = 7,
    /// 11: not yet: the kubelet retries.
    TryAgainLater = 11,
}

/// A CNI error object, printed on stdout with a non-zero exit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CNI error {}: {msg}", *code as u32)]
pub struct CniError {
    pub code: ErrorCode,
    pub msg: String,
    pub details: Option<String>,
}

impl CniError {
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }

    /// The error object, in the given spec version.
    pub fn to_json(&self, version: &str) -> String {
        let mut object = Map::new();
        object.insert("cniVersion".into(), Value::from(version));
        object.insert("code".into(), Value::from(self.code as u32));
        object.insert("msg".into(), Value::from(self.msg.as_str()));
        if let Some(details) = &self.details {
            object.insert("details".into(), Value::from(details.as_str()));
        }
        Value::Object(object).to_string()
    }
}

/// What the runtime sets in the plugin's environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    pub command: Option<String>,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    /// `CNI_ARGS`: `K=V` pairs separated by `;`.
    pub args: Option<String>,
    /// `CNI_PATH`: where plugins (the fallback) are looked up, `:`-separated.
    pub path: Option<String>,
}

impl Environment {
    /// Reads the `CNI_*` variables from `lookup` (the process environment in `main`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        Environment {
            command: lookup("CNI_COMMAND"),
            container_id: lookup("CNI_CONTAINERID"),
            netns: lookup("CNI_NETNS"),
            ifname: lookup("CNI_IFNAME"),
            args: lookup("CNI_ARGS"),
            path: lookup("CNI_PATH"),
        }
    }

    /// The value of `key` in `CNI_ARGS`.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args
            .as_deref()?
            .split(';')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    /// Fails with code 4 unless each of `names` is set and non-empty.
    pub fn require(&self, names: &[&str]) -> Result<(), CniError> {
        for name in names {
            let value = match *name {
                "CNI_CONTAINERID" => &self.container_id,
                "CNI_NETNS" => &self.netns,
                "CNI_IFNAME" => &self.ifname,
                "CNI_ARGS" => &self.args,
                "CNI_PATH" => &self.path,
                _ => &self.command,
            };
            if value.as_deref().is_none_or(str::is_empty) {
                return Err(CniError::new(
                    ErrorCode::InvalidEnvironment,
                    format!("{name} is not set"),
                ));
            }
        }
        Ok(())
    }
}

/// The network configuration on stdin, as far as this plugin reads it; everything else is kept
/// for the fallback.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    pub ipam: IpamConf,
    #[serde(default)]
    pub runtime_config: Option<Map<String, Value>>,
    #[serde(default)]
    pub prev_result: Option<Value>,
}

/// The `ipam` section: `{"type": "gatehouse-ipam", "fallback": {"type": "host-local", …}}`.
#[derive(Deserialize, Debug)]
pub struct IpamConf {
    #[serde(rename = "type")]
    pub plugin: String,
    /// The IPAM configuration used for Pods that are not Gatehouse's.
    #[serde(default)]
    pub fallback: Option<Value>,
}

/// What the runtime says of the Pod's annotations.
#[derive(Debug, PartialEq, Eq)]
pub enum PodAnnotations {
    /// The configuration does not declare the capability, so the runtime passed nothing.
    NotPassed,
    Passed(BTreeMap<String, String>),
}

impl NetConf {
    /// The Pod annotations containerd passed in `runtimeConfig`.
    pub fn pod_annotations(&self) -> PodAnnotations {
        let Some(value) = self
            .runtime_config
            .as_ref()
            .and_then(|config| config.get(POD_ANNOTATIONS_CAPABILITY))
        else {
            return PodAnnotations::NotPassed;
        };
        let annotations = value
            .as_object()
            .map(|object| {
                object
                    .iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        PodAnnotations::Passed(annotations)
    }
}

/// An IPAM plugin's result: addresses, routes and DNS (no interfaces: the main plugin adds them).
#[derive(Serialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IpamResult {
    pub cni_version: String,
    pub ips: Vec<IpConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    pub dns: Dns,
}

/// One address of a result.
#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct IpConfig {
    /// The address with its prefix length.
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// The answer to `VERSION`.
pub fn version_info(requested: Option<&str>) -> String {
    let version = requested
        .filter(|v| SUPPORTED_VERSIONS.contains(v))
        .unwrap_or(LATEST_VERSION);
    serde_json::json!({"cniVersion": version, "supportedVersions": SUPPORTED_VERSIONS}).to_string()
}
