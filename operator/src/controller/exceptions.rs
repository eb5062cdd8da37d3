//! The `Honoured` condition of each PolicyException: whether Gatehouse applies it and, if not,
//! why. Whether it applies is decided where the Policies are read ([`PolicyStores::state`]);
//! this only tells the exception's author.
use std::sync::Arc;

use gatehouse_api::v1alpha1::{HONOURED_CONDITION, PolicyException};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use super::{ControllerContext, WriteError};
use crate::effects::condition::{Said, replaced};
use crate::policies::PolicyStores;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::fenced;

/// What the `Honoured` condition of `exception` says.
pub(super) fn honoured(exception: &PolicyException, namespaces: &[String], honours: bool) -> Said {
    if honours {
        Said {
            type_: HONOURED_CONDITION,
            status: "True",
            reason: "Honoured",
            message: format!(
                "requests it matches are exempted from: {}",
                exception.spec.policies.join(", ")
            ),
        }
    } else {
        Said {
            type_: HONOURED_CONDITION,
            status: "False",
            reason: "NamespaceNotAllowed",
            message: format!(
                "ignored: PolicyExceptions are honoured only in the namespaces {} (the \
                 operator's --exception-namespaces), not in {:?}",
                namespaces.join(", "),
                exception.namespace().unwrap_or_default()
            ),
        }
    }
}

/// Writes the `Honoured` condition of every exception whose condition does not say so yet.
pub(super) async fn write_exception_statuses(
    ctx: &ControllerContext,
    stores: &PolicyStores,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), WriteError> {
    let now = Time(Timestamp::now());
    for exception in stores.exceptions() {
        let said = honoured(
            &exception,
            stores.exception_namespaces(),
            stores.honours(&exception),
        );
        let conditions = exception
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let generation = exception.metadata.generation;
        let observed = exception
            .status
            .as_ref()
            .and_then(|s| s.observed_generation);
        let Some(conditions) = replaced(
            conditions,
            said,
            generation,
            observed == generation,
            now.clone(),
        ) else {
            continue;
        };
        write_one(ctx, &exception, conditions, leader).await?;
    }
    Ok(())
}

async fn write_one(
    ctx: &ControllerContext,
    exception: &Arc<PolicyException>,
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), WriteError> {
    let (namespace, name) = (
        exception.namespace().unwrap_or_default(),
        exception.name_any(),
    );
    let api: Api<PolicyException> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = json!({
        "metadata": {"resourceVersion": exception.resource_version()},
        "status": {"observedGeneration": exception.metadata.generation, "conditions": conditions},
    });
    let written = fenced(
        leader,
        || format!("status of PolicyException {namespace}/{name}"),
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    match written {
        Ok(_) => Ok(()),
        // Changed or gone meanwhile: its watch event brings the next pass.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(WriteError::WriteExceptionStatus {
            name: format!("{namespace}/{name}"),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::PolicyExceptionSpec;

    fn exception(namespace: &str) -> PolicyException {
        let mut e = PolicyException::new(
            "legacy",
            PolicyExceptionSpec {
                policies: vec!["team".into(), "limits".into()],
                rules: vec![],
                match_: Default::default(),
            },
        );
        e.metadata.namespace = Some(namespace.into());
        e
    }

    #[test]
    fn an_exception_elsewhere_says_it_changes_nothing_and_where_it_would() {
        let namespaces = ["gatehouse".to_string()];
        let said = honoured(&exception("team-a"), &namespaces, false);
        assert_eq!((said.status, said.reason), ("False", "NamespaceNotAllowed"));
        assert!(
            said.message.contains("gatehouse") && said.message.contains("team-a"),
            "{}",
            said.message
        );
        let said = honoured(&exception("gatehouse"), &namespaces, true);
        assert_eq!((said.status, said.reason), ("True", "Honoured"));
        assert!(said.message.ends_with("team, limits"), "{}", said.message);
    }
}
