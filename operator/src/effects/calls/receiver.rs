//! The receivers a call goes to: one HTTPS client each (its roots, its connection pool), at
//! most `--calls-per-receiver` calls in flight, and a receiver that keeps failing rests: while
//! it is down, one call now and then finds out whether it is back, so a receiver that is down
//! costs a few calls a minute, however many calls wait for it.
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The most of an answer read: a receiver answering more is a failed call, not a full heap.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Failures in a row after which a receiver rests.
const FAILURES_TO_REST: u32 = 5;

/// The longest a receiver rests, and the longest a call waits for its next attempt.
pub const BACKOFF_CEILING: Duration = Duration::from_secs(30);

/// Where a call goes and how it is trusted: calls with the same receiver share a client.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReceiverId {
    /// `scheme://authority` of the URL.
    pub origin: String,
    /// The PEM roots, or `None` for the system's.
    pub ca_pem: Option<Vec<u8>>,
}

/// The outcome of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: done; the `result` string of a JSON answer, if any, else why there is none (a body
    /// that is not JSON, or a `result` that is not a string).
    Done {
        result: Option<String>,
        unreadable: Option<String>,
    },
    /// 408, 429, 5xx, no answer in time, no connection: tried again later.
    Retry(String),
    /// Another 4xx: never tried again in a loop.
    Refused(String),
    /// Not sent: the receiver started resting while the call waited for a slot. Its record
    /// stays as it was.
    Skipped,
}

/// The receiver's client, shared by the calls of a pass.
type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One receiver.
struct Receiver {
    client: HttpsClient,
    slots: Arc<Semaphore>,
    health: Arc<Mutex<Health>>,
}

/// How a receiver has been answering: failures in a row, and until when it rests.
#[derive(Debug, Default)]
struct Health {
    failures: u32,
    resting_until: Option<Instant>,
}

impl Health {
    fn resting(&self, now: Instant) -> bool {
        self.failures >= FAILURES_TO_REST && self.resting_until.is_some_and(|until| until > now)
    }

    /// Counts `answer`; a failure that makes the receiver rest (or keeps it resting) sets when
    /// it may be tried again.
    fn count(&mut self, answer: &Answer, salt: &str, now: Instant) {
        match answer {
            Answer::Retry(_) => {
                self.failures += 1;
                if self.failures >= FAILURES_TO_REST {
                    let rest = backoff(self.failures - FAILURES_TO_REST, salt);
                    self.resting_until = Some(now + rest);
                }
            }
            Answer::Done { .. } | Answer::Refused(_) => {
                self.failures = 0;
                self.resting_until = None;
            }
            Answer::Skipped => {}
        }
    }
}

/// Why a receiver's client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    #[error("caBundle: {0}")]
    Roots(String),
    #[error("TLS settings: {0}")]
    Tls(#[from] rustls::Error),
}

/// The receivers of one leader term.
pub struct Receivers {
    by_id: HashMap<ReceiverId, Receiver>,
    per_receiver: usize,
}

/// One call, ready to send.
pub struct Outgoing {
    pub url: String,
    pub token: Option<String>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

impl Receivers {
    pub fn new(per_receiver: usize) -> Self {
        Receivers {
            by_id: HashMap::new(),
            per_receiver: per_receiver.max(1),
        }
    }

    /// Makes `id`'s client if it has none yet.
    pub fn prepare(&mut self, id: &ReceiverId) -> Result<(), ReceiverError> {
        if self.by_id.contains_key(id) {
            return Ok(());
        }
        let client = client_for(id.ca_pem.as_deref())?;
        self.by_id.insert(
            id.clone(),
            Receiver {
                client,
                slots: Arc::new(Semaphore::new(self.per_receiver)),
                health: Arc::default(),
            },
        );
        Ok(())
    }

    /// How many calls `id` takes this pass: none while it rests, one to find out whether it is
    /// back, otherwise `wanted`.
    pub fn admits(&self, id: &ReceiverId, wanted: usize, now: Instant) -> usize {
        let Some(receiver) = self.by_id.get(id) else {
            return 0;
        };
        let health = lock(&receiver.health);
        if health.failures < FAILURES_TO_REST {
            wanted
        } else if health.resting(now) {
            0
        } else {
            wanted.min(1)
        }
    }

    /// When the first resting receiver may be tried again.
    pub fn next_wake(&self) -> Option<Instant> {
        self.by_id
            .values()
            .filter_map(|r| {
                let health = lock(&r.health);
                (health.failures >= FAILURES_TO_REST)
                    .then_some(health.resting_until)
                    .flatten()
            })
            .min()
    }

    /// What sending needs of `id`: its client, its slots, its health.
    pub fn sender(&self, id: &ReceiverId) -> Option<Sender> {
        self.by_id.get(id).map(|r| Sender {
            client: r.client.clone(),
            slots: r.slots.clone(),
            health: r.health.clone(),
            origin: id.origin.clone(),
        })
    }

    /// Forgets the receivers no Policy names any more.
    pub fn keep(&mut self, named: &std::collections::BTreeSet<ReceiverId>) {
        self.by_id.retain(|id, _| named.contains(id));
    }
}

/// A receiver's client, slots and health, to send from a task of its own.
#[derive(Clone)]
pub struct Sender {
    client: HttpsClient,
    slots: Arc<Semaphore>,
    health: Arc<Mutex<Health>>,
    origin: String,
}

impl Sender {
    /// Sends one call once a slot is free, unless the receiver started resting meanwhile;
    /// counts the answer against the receiver's health.
    pub async fn send(&self, call: Outgoing) -> Answer {
        let Ok(_slot) = self.slots.acquire().await else {
            return Answer::Skipped;
        };
        if lock(&self.health).resting(Instant::now()) {
            return Answer::Skipped;
        }
        let answer = self.exchange(call).await;
        lock(&self.health).count(&answer, &self.origin, Instant::now());
        answer
    }

    async fn exchange(&self, call: Outgoing) -> Answer {
        let mut request = http::Request::post(call.url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::USER_AGENT, "gatehouse");
        if let Some(token) = &call.token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = match request.body(Full::new(Bytes::from(call.body))) {
            Ok(request) => request,
            Err(e) => return Answer::Refused(format!("the request cannot be built: {e}")),
        };
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                let chain = crate::runtime::error_chain::chain(&e);
                format!("no answer: {chain}")
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| format!("HTTP {status}, reading the answer: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        match tokio::time::timeout(call.timeout, exchange).await {
            Err(_) => Answer::Retry(format!("no answer in {}s", call.timeout.as_secs())),
            Ok(Err(why)) => Answer::Retry(why),
            Ok(Ok((status, body))) => classify(status, &body),
        }
    }
}

/// The health behind `mutex`, even if a holder panicked.
fn lock(mutex: &Mutex<Health>) -> std::sync::MutexGuard<'_, Health> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What an HTTP answer means.
pub fn classify(status: http::StatusCode, body: &[u8]) -> Answer {
    if status.is_success() {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Answer::Done {
                result: None,
                unreadable: None,
            };
        }
        return match serde_json::from_slice::<Value>(body) {
            Err(e) => Answer::Done {
                result: None,
                unreadable: Some(format!(
                    "HTTP {}, the answer is not JSON: {e}",
                    status.as_u16()
                )),
            },
            Ok(answer) => match answer.get("result") {
                None | Some(Value::Null) => Answer::Done {
                    result: None,
                    unreadable: None,
                },
                Some(Value::String(result)) => Answer::Done {
                    result: Some(result.clone()),
                    unreadable: None,
                },
                Some(other) => Answer::Done {
                    result: None,
                    unreadable: Some(format!("the answer's `result` is not a string: {other}")),
                },
            },
        };
    }
    let said = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    let why = format!("HTTP {}: {}", status.as_u16(), said.trim());
    let retried = status == http::StatusCode::REQUEST_TIMEOUT
        || status == http::StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error();
    if retried {
        Answer::Retry(why)
    } else {
        Answer::Refused(why)
    }
}

/// The wait before the try after `failures` failures: doubling from 1 s to
/// [`BACKOFF_CEILING`], each between half and all of it (jitter, so that calls that failed
/// together do not come back together). `salt` varies the jitter per call.
pub fn backoff(failures: u32, salt: &str) -> Duration {
    let full = Duration::from_secs(1u64 << failures.min(5)).min(BACKOFF_CEILING);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write(salt.as_bytes());
    hasher.write_u32(failures);
    let fraction = (hasher.finish() % 1000) as f64 / 1000.0;
    full.mul_f64(0.5 + fraction / 2.0)
}

/// An HTTPS-only client trusting `ca_pem`'s certificates, or the system's roots.
fn client_for(ca_pem: Option<&[u8]>) -> Result<HttpsClient, ReceiverError> {
    let mut roots = RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| ReceiverError::Roots(e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| ReceiverError::Roots(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(ReceiverError::Roots("no certificate".into()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_done_retried_or_refused_by_status() {
        let ok = classify(http::StatusCode::OK, br#"{"result": "ticket-7"}"#);
        assert_eq!(
            ok,
            Answer::Done {
                result: Some("ticket-7".into()),
                unreadable: None
            }
        );
        let empty = classify(http::StatusCode::NO_CONTENT, b"");
        assert_eq!(
            empty,
            Answer::Done {
                result: None,
                unreadable: None
            }
        );
        let garbage = classify(http::StatusCode::CREATED, b"\x00\xffnot json");
        assert!(
            matches!(&garbage, Answer::Done { result: None, unreadable: Some(why) } if why.contains("not JSON")),
            "{garbage:?}"
        );
        let number = classify(http::StatusCode::OK, br#"{"result": 7}"#);
        assert!(
            matches!(&number, Answer::Done { result: None, unreadable: Some(why) } if why.contains("not a string")),
            "{number:?}"
        );
        for retried in [408, 429, 500, 503] {
            let status = http::StatusCode::from_u16(retried).expect("status");
            assert!(
                matches!(classify(status, b""), Answer::Retry(_)),
                "{retried}"
            );
        }
        for refused in [400, 403, 404, 422] {
            let status = http::StatusCode::from_u16(refused).expect("status");
            assert!(
                matches!(classify(status, b"no"), Answer::Refused(_)),
                "{refused}"
            );
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_ceiling_with_jitter() {
        for failures in 0..10 {
            let wait = backoff(failures, "k");
            let full = Duration::from_secs(1u64 << failures.min(5)).min(BACKOFF_CEILING);
            assert!(wait >= full / 2 && wait <= full, "{failures}: {wait:?}");
        }
    }

    #[test]
    fn a_receiver_that_keeps_failing_rests_then_takes_one_call() {
        let mut receivers = Receivers::new(8);
        let id = ReceiverId {
            origin: "https://r.example".into(),
            ca_pem: None,
        };
        receivers.prepare(&id).expect("client");
        let now = Instant::now();
        assert_eq!(receivers.admits(&id, 100, now), 100);
        let health = receivers.by_id[&id].health.clone();
        for _ in 0..FAILURES_TO_REST {
            lock(&health).count(&Answer::Retry("down".into()), "r", now);
        }
        assert_eq!(receivers.admits(&id, 100, now), 0, "resting");
        assert!(lock(&health).resting(now));
        let wake = receivers.next_wake().expect("a wake");
        assert_eq!(receivers.admits(&id, 100, wake), 1, "one probe");
        lock(&health).count(
            &Answer::Done {
                result: None,
                unreadable: None,
            },
            "r",
            wake,
        );
        assert_eq!(receivers.admits(&id, 100, wake), 100, "back");
    }
}
