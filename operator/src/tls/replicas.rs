//! Which CA each live replica serves a certificate of, so the previous CA leaves the bundle only
//! once nobody presents a certificate it signed.
//!
//! Every replica keeps a `coordination.k8s.io/v1` Lease of its own (like the API server's
//! identity leases), renewed every third of the TTL and annotated with the CA of the certificate
//! it serves. A record is live while this replica has seen it change within the TTL, on its own
//! monotonic clock (first sight counts as a change, so a stale record delays a drop by one TTL
//! at most instead of being trusted or ignored by a skewed wall clock). Records found dead are
//! deleted, with a resourceVersion precondition so a just-renewed one survives.
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use tokio::time::Instant;
use tracing::debug;

/// Label on every record, to list them.
pub const RECORD_LABEL: (&str, &str) = ("gatehouse.dev/record", "serving");
/// Annotation naming the CA (its public key, base64url) of the certificate a replica serves.
pub const SERVING_CA_ANNOTATION: &str = "gatehouse.dev/serving-ca";
const FIELD_MANAGER: &str = "gatehouse";

/// A replica's record as listed: its name, resourceVersion and the CA it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub resource_version: String,
    pub serving_ca: Option<String>,
}

/// When this replica last saw each record change.
#[derive(Default, Debug)]
pub struct Sightings {
    seen: HashMap<String, (String, Instant)>,
}

impl Sightings {
    /// Pure: takes in a listing at `now` and splits it into live and dead records.
    pub fn live_and_dead(
        &mut self,
        listed: Vec<Record>,
        now: Instant,
        ttl: Duration,
    ) -> (Vec<Record>, Vec<Record>) {
        let mut fresh = HashMap::new();
        let (mut live, mut dead) = (Vec::new(), Vec::new());
        for record in listed {
            let at = match self.seen.get(&record.name) {
                Some((rv, at)) if *rv == record.resource_version => *at,
                _ => now,
            };
            fresh.insert(record.name.clone(), (record.resource_version.clone(), at));
            if now.saturating_duration_since(at) < ttl {
                live.push(record);
            } else {
                dead.push(record);
            }
        }
        self.seen = fresh;
        (live, dead)
    }
}

/// The record's name for `identity`: a DNS subdomain whatever the identity holds.
pub fn record_name(identity: &str) -> String {
    let mut name: String = identity
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(200)
        .collect();
    name = name.trim_matches(|c| c == '-' || c == '.').to_string();
    format!("gatehouse-serving-{name}")
}

/// This replica's handle on the records in its namespace.
pub struct ReplicaRecords {
    api: Api<Lease>,
    identity: String,
    ttl: Duration,
    sightings: Sightings,
}

impl ReplicaRecords {
    pub fn new(api: Api<Lease>, identity: String, ttl: Duration) -> Self {
        Self {
            api,
            identity,
            ttl,
            sightings: Sightings::default(),
        }
    }

    /// How often a live replica renews its record.
    pub fn renew_every(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(200))
    }

    /// Writes (creates or renews) this replica's record saying it serves `serving_ca`.
    pub async fn publish(&self, serving_ca: &str) -> Result<(), kube::Error> {
        let name = record_name(&self.identity);
        let body = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "labels": BTreeMap::from([RECORD_LABEL, ("app.kubernetes.io/managed-by", "gatehouse")]),
                "annotations": {SERVING_CA_ANNOTATION: serving_ca},
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.ttl.as_secs().max(1),
                "renewTime": MicroTime(Timestamp::now()),
            },
        });
        self.api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        Ok(())
    }

    /// The live records; dead ones are deleted on the way (best effort).
    pub async fn live(&mut self) -> Result<Vec<Record>, kube::Error> {
        let selector = format!("{}={}", RECORD_LABEL.0, RECORD_LABEL.1);
        let listed = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let records = listed
            .items
            .into_iter()
            .filter_map(|lease| {
                Some(Record {
                    name: lease.metadata.name?,
                    resource_version: lease.metadata.resource_version?,
                    serving_ca: lease
                        .metadata
                        .annotations
                        .and_then(|mut a| a.remove(SERVING_CA_ANNOTATION)),
                })
            })
            .collect();
        let (live, dead) = self
            .sightings
            .live_and_dead(records, Instant::now(), self.ttl);
        for record in dead {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(record.resource_version.clone()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            if let Err(error) = self.api.delete(&record.name, &params).await {
                debug!(record = %record.name, %error, "deleting a dead replica record failed");
            }
        }
        Ok(live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, rv: &str) -> Record {
        Record {
            name: name.into(),
            resource_version: rv.into(),
            serving_ca: Some("ca".into()),
        }
    }

    #[test]
    fn records_live_while_they_change_and_die_when_they_stop() {
        let ttl = Duration::from_secs(15);
        let t0 = Instant::now();
        let mut s = Sightings::default();
        let names = |v: &[Record]| v.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        // First sight counts as a change, whatever the record's own timestamps say.
        let (live, dead) = s.live_and_dead(vec![rec("a", "1"), rec("b", "1")], t0, ttl);
        assert_eq!(
            (names(&live), names(&dead)),
            (vec!["a".into(), "b".into()], vec![])
        );
        // a renews, b does not.
        let later = t0 + Duration::from_secs(10);
        s.live_and_dead(vec![rec("a", "2"), rec("b", "1")], later, ttl);
        let (live, dead) = s.live_and_dead(
            vec![rec("a", "2"), rec("b", "1")],
            t0 + Duration::from_secs(16),
            ttl,
        );
        assert_eq!(names(&live), ["a"]);
        assert_eq!(names(&dead), ["b"]);
        // A record that disappears is forgotten; one that comes back is new again.
        s.live_and_dead(vec![rec("a", "2")], t0 + Duration::from_secs(17), ttl);
        let (live, _) = s.live_and_dead(
            vec![rec("a", "2"), rec("b", "1")],
            t0 + Duration::from_secs(18),
            ttl,
        );
        assert_eq!(names(&live), ["a", "b"]);
    }

    #[test]
    fn record_names_are_dns_subdomains() {
        assert_eq!(
            record_name("gatehouse-7d9f-x2"),
            "gatehouse-serving-gatehouse-7d9f-x2"
        );
        assert_eq!(
            record_name("Host_Name:1234"),
            "gatehouse-serving-host-name-1234"
        );
        assert!(record_name(&"x".repeat(400)).len() <= 253);
    }
}
