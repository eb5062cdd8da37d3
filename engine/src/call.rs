//! Calls to external systems, pure: the checks of a call effect when its Policy is written, and
//! the body the effects loop POSTs to a receiver. The loop does the I/O; what is sent is decided
//! here, so it can be tested without a receiver.
use base64::Engine as _;
use serde::Serialize;
use serde_json::{Value, json};

use gatehouse_api::v1alpha1::CallEffect;
use gatehouse_cel::k8s_names::is_dns1123_subdomain;

use super::problem::{Problem, check_k8s_name};

/// What a call asks of the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Action {
    Apply,
    Release,
}

/// The object a call is for, as the receiver is told.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CalledObject {
    pub api_version: String,
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The JSON body of one call. `snapshot` is the stored object (Secret data left out), or null
/// when it is gone.
pub fn body(action: Action, key: &str, object: &CalledObject, snapshot: Option<&Value>) -> Value {
    let snapshot = snapshot.map_or(Value::Null, |stored| without_secret_data(object, stored));
    json!({"action": action, "key": key, "object": object, "snapshot": snapshot})
}

/// `stored` without what must never leave the cluster: a Secret's `data` and `stringData`, and
/// the managedFields.
fn without_secret_data(object: &CalledObject, stored: &Value) -> Value {
    let mut snapshot = stored.clone();
    if let Some(fields) = snapshot.as_object_mut() {
        let is_secret = object.kind == "Secret" && object.api_version == "v1";
        if is_secret {
            fields.remove("data");
            fields.remove("stringData");
        }
        if let Some(metadata) = fields.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.remove("managedFields");
        }
    }
    snapshot
}

/// The PEM certificates of a `caBundle` (base64 of PEM text), or why there are none.
pub fn ca_pem(bundle: &str) -> Result<Vec<u8>, String> {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(bundle.trim())
        .map_err(|e| format!("not base64: {e}"))?;
    let text = std::str::from_utf8(&pem).map_err(|_| "not PEM text".to_string())?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(pem)
}

/// Checks the call effect at `path` (`spec.effects[i].call`).
pub fn check(path: &str, call: &CallEffect, problems: &mut Vec<Problem>) {
    if let Err(why) = check_url(&call.url) {
        problems.push(Problem::new(format!("{path}.url"), why));
    }
    if let Some(bundle) = &call.ca_bundle
        && let Err(why) = ca_pem(bundle)
    {
        problems.push(Problem::new(format!("{path}.caBundle"), why));
    }
    if let Some(secret) = &call.token_secret {
        check_k8s_name(
            &format!("{path}.tokenSecret"),
            secret,
            "Secret name",
            is_dns1123_subdomain,
            problems,
        );
    }
    if !(1..=30).contains(&call.timeout_seconds) {
        problems.push(Problem::new(
            format!("{path}.timeoutSeconds"),
            "must be between 1 and 30",
        ));
    }
}

/// An `https://` URL with a host, no user info and no fragment.
fn check_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("{url:?}: only https:// receivers are called"));
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} names no host"));
    }
    if authority.contains('@') {
        return Err(format!(
            "{url:?} carries user info: use tokenSecret for credentials"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems_of(call: &CallEffect) -> Vec<String> {
        let mut problems = Vec::new();
        check("spec.effects[0].call", call, &mut problems);
        problems.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn only_https_receivers_with_a_host_are_called() {
        let call = |url: &str| CallEffect {
            url: url.into(),
            timeout_seconds: 5,
            ..CallEffect::default()
        };
        assert!(problems_of(&call("https://cmdb.example:8443/v1/hook")).is_empty());
        for bad in [
            "http://cmdb.example",
            "https://",
            "https://u:p@cmdb.example",
            "x",
        ] {
            let found = problems_of(&call(bad));
            assert!(
                found.iter().any(|p| p.contains("spec.effects[0].call.url")),
                "{bad}: {found:?}"
            );
        }
    }

    #[test]
    fn a_ca_bundle_must_be_base64_of_pem_certificates() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let encoded = base64::engine::general_purpose::STANDARD.encode(pem);
        assert_eq!(ca_pem(&encoded).expect("pem"), pem.as_bytes());
        let call = |bundle: &str| CallEffect {
            url: "https://r.example".into(),
            ca_bundle: Some(bundle.into()),
            timeout_seconds: 5,
            ..CallEffect::default()
        };
        let garbage = base64::engine::general_purpose::STANDARD.encode("hello");
        for bad in ["%%%", garbage.as_str()] {
            let found = problems_of(&call(bad));
            assert!(
                found.iter().any(|p| p.contains("call.caBundle")),
                "{bad}: {found:?}"
            );
        }
    }

    #[test]
    fn a_secret_snapshot_carries_no_data() {
        let object = CalledObject {
            api_version: "v1".into(),
            kind: "Secret".into(),
            namespace: "a".into(),
            name: "s".into(),
            uid: "u".into(),
        };
        let stored = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "managedFields": [{}]},
            "data": {"k": "c2VjcmV0"}, "stringData": {"k": "secret"}
        });
        let sent = body(Action::Apply, "u/p/0", &object, Some(&stored));
        assert_eq!(sent["action"], "Apply");
        assert_eq!(sent["key"], "u/p/0");
        assert_eq!(sent["object"]["uid"], "u");
        assert!(sent["snapshot"].get("data").is_none());
        assert!(sent["snapshot"].get("stringData").is_none());
        assert!(sent["snapshot"]["metadata"].get("managedFields").is_none());
        let gone = body(Action::Release, "u/p/0", &object, None);
        assert_eq!(gone["snapshot"], Value::Null);
        assert_eq!(gone["action"], "Release");
    }
}
