//! The controller Lease from the outside: a foreign holder, and what a replica says of its term.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use crate::Cluster;
use crate::instance::Gatehouse;

/// Holds the Lease `gatehouse-controller` in `namespace` for a foreign identity, renewing it,
/// until dropped: a leader nobody can reach, as far as Gatehouse can tell.
pub struct Impostor {
    task: tokio::task::JoinHandle<()>,
}

impl Impostor {
    pub async fn start(cluster: &Cluster, namespace: &str) -> anyhow::Result<Self> {
        let api: Api<Lease> = Api::namespaced(cluster.client().await?, namespace);
        let task = tokio::spawn(async move {
            loop {
                let _ = hold(&api).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Ok(Self { task })
    }
}

async fn hold(api: &Api<Lease>) -> Result<(), kube::Error> {
    let spec = LeaseSpec {
        holder_identity: Some("impostor".into()),
        lease_duration_seconds: Some(4),
        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        ..LeaseSpec::default()
    };
    match api.get_opt("gatehouse-controller").await? {
        Some(mut lease) => {
            lease.spec = Some(spec);
            api.replace("gatehouse-controller", &PostParams::default(), &lease)
                .await?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some("gatehouse-controller".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn leader_gauge(gh: &Gatehouse) -> anyhow::Result<f64> {
    gh.metric_sum("gatehouse_reconcile_leader", "").await
}
