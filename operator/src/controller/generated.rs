//! Writes of generated admission objects, shared by the validating ([`super::in_process`]) and
//! mutating ([`super::in_process_mutating`]) in-process writers: fenced by the leader's term,
//! applied with the controller's field manager, compared with what the caches hold.
use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::writes::apply_body;
use super::{ControllerContext, FIELD_MANAGER, WriteError};
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::fenced;

/// How long generated objects outlive the webhook write that took their Policy back: the API
/// server's webhook cache follows a configuration write within a moment.
pub const LEAVE_GRACE: Duration = Duration::from_secs(5);

/// Whether `cache` holds an object named like `desired` with everything `desired` says (the
/// API server adds defaults, which are no drift).
pub fn holds<K>(cache: &Store<K>, desired: &K) -> bool
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned,
{
    let Some(stored) = cache
        .state()
        .into_iter()
        .find(|o| o.meta().name == desired.meta().name)
    else {
        return false;
    };
    match (
        serde_json::to_value(stored.as_ref()),
        serde_json::to_value(desired),
    ) {
        (Ok(stored), Ok(desired)) => contains(&stored, &desired),
        _ => false,
    }
}

/// Whether `outer` says everything `inner` says: objects field by field, lists element by
/// element (same length), anything else equal.
fn contains(outer: &serde_json::Value, inner: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (outer, inner) {
        (Value::Object(o), Value::Object(i)) => i
            .iter()
            .all(|(k, v)| o.get(k).is_some_and(|ov| contains(ov, v))),
        (Value::Array(o), Value::Array(i)) => {
            o.len() == i.len() && o.iter().zip(i).all(|(a, b)| contains(a, b))
        }
        _ => outer == inner,
    }
}

/// Server-side applies `desired`; `Err(message)` when the API server refuses it as invalid.
pub async fn apply<K>(
    ctx: &ControllerContext,
    desired: &K,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, WriteError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&()).to_string();
    let name = desired.meta().name.clone().unwrap_or_default();
    let body = apply_body(desired, None)?;
    let api: Api<K> = Api::all(ctx.client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let written = fenced(
        leader,
        || format!("{kind}/{name}"),
        api.patch(&name, &params, &Patch::Apply(&body)),
    )
    .await?;
    match written {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(Err(e.message)),
        Err(source) => Err(WriteError::ApplyConfiguration { kind, name, source }),
    }
}

/// Deletes the generated object `name` of kind `K`; one already gone is no error.
pub async fn delete<K>(
    ctx: &ControllerContext,
    name: &str,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), WriteError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&()).to_string();
    let api: Api<K> = Api::all(ctx.client.clone());
    let deleted = fenced(
        leader,
        || format!("deletion of {kind}/{name}"),
        api.delete(name, &DeleteParams::default()),
    )
    .await?;
    match deleted {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(WriteError::ApplyConfiguration {
            kind,
            name: name.to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stored_objects_with_server_defaults_hold_what_was_applied() {
        let desired = json!({"spec": {"a": 1, "list": [{"x": 1}], "sel": {}}});
        let stored = json!({"spec": {"a": 1, "b": 2, "list": [{"x": 1, "y": 2}], "sel": {"matchLabels": {}}}, "status": {}});
        assert!(contains(&stored, &desired));
        let edited = json!({"spec": {"a": 2, "list": [{"x": 1}], "sel": {}}});
        assert!(!contains(&edited, &desired));
        let longer = json!({"spec": {"a": 1, "list": [{"x": 1}, {"x": 2}], "sel": {}}});
        assert!(!contains(&longer, &desired));
    }
}
