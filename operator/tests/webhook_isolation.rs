//! One Policy's CEL never stalls admission: over real HTTPS, in process, on a two-worker runtime
//! like `gatehouse run` on these machines, a cheap review and a probe are answered while slow
//! reviews sent before them are still running. Its own test binary, so no other test competes
//! for the CPU.
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]
mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gatehouse::runtime::admin::Readiness;
use gatehouse::runtime::admin::{self, AdminState};
use gatehouse::tls::{CertResolver, server_config};
use gatehouse::webhook::{self, PolicyStore, WebhookState};
use gatehouse_api::v1alpha1::Policy;
use gatehouse_cel as cel;
use gatehouse_cel::cost::{COST_BUDGET, estimate};
use gatehouse_engine::compile;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// Within budget at this many containers, but slow: a comparison of every pair.
const SLOW_CONTAINERS: usize = 200;
/// Over budget at run time at this many: never evaluated.
const HUGE_CONTAINERS: usize = 1_000;
const PAIRS: &str = "object.spec.containers.all(a, object.spec.containers.all(b, a.name == b.name || a.image != '' || b.image != ''))";

fn policy(name: &str, spec: Value) -> Policy {
    serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
        "metadata": {"name": name, "generation": 1}, "spec": spec
    }))
    .unwrap()
}

fn review(containers: usize) -> Vec<u8> {
    let containers: Vec<Value> = (0..containers)
        .map(|i| json!({"name": format!("c{i}"), "image": "app:1"}))
        .collect();
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "1234", "operation": "CREATE", "namespace": "shop", "name": "web",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": containers}}
        }
    })
    .to_string()
    .into_bytes()
}

struct Servers {
    webhook: u16,
    admin: u16,
    ca: rustls::pki_types::CertificateDer<'static>,
    registry: Arc<Registry>,
}

async fn start() -> Servers {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let resolver = CertResolver::new();
    resolver.set_pem(&cert.pem(), &key.serialize_pem()).unwrap();
    let rules = json!({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]});
    let policies = Arc::new(PolicyStore::new());
    for (name, failure_policy, expression) in [
        ("pairs-fail", "Fail", PAIRS),
        ("pairs-ignore", "Ignore", PAIRS),
        ("cheap", "Fail", "object.metadata.name != ''"),
    ] {
        let p = policy(
            name,
            json!({"match": rules, "failurePolicy": failure_policy, "validate": [{"expression": expression, "message": "no"}]}),
        );
        policies.upsert(Arc::new(compile(&p).unwrap()));
    }
    let mut registry = gatehouse::runtime::telemetry::registry();
    let metrics = Arc::new(gatehouse::webhook::AdmissionMetrics::register(
        &mut registry,
    ));
    let registry = Arc::new(registry);
    let state = Arc::new(WebhookState::new(policies, metrics));
    let handler = webhook::handler(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook_port = listener.local_addr().unwrap().port();
    tokio::spawn(gatehouse::runtime::serve::serve_tls(
        listener,
        Arc::new(server_config(resolver).unwrap()),
        handler,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    let readiness = Arc::new(Readiness::default());
    readiness.policies_loaded.store(true, Ordering::Release);
    readiness.certificate_loaded.store(true, Ordering::Release);
    let admin_state = Arc::new(AdminState {
        readiness,
        registry: registry.clone(),
    });
    let admin_handler = admin::handler(admin_state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_port = listener.local_addr().unwrap().port();
    tokio::spawn(gatehouse::runtime::serve::serve_http(
        listener,
        admin_handler,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    Servers {
        webhook: webhook_port,
        admin: admin_port,
        ca: cert.der().clone(),
        registry,
    }
}

type Tls = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect_tls(servers: &Servers) -> Tls {
    common::connect(servers.webhook, &servers.ca).await
}

async fn post(sender: &mut Tls, path: &str, body: Vec<u8>) -> Value {
    let req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_over_budget_reviews_delay_neither_a_cheap_one_nor_readyz() {
    let pairs = cel::compile(PAIRS).unwrap();
    assert!(estimate(&pairs, SLOW_CONTAINERS as u64) <= COST_BUDGET);
    assert!(estimate(&pairs, HUGE_CONTAINERS as u64) > COST_BUDGET);
    let servers = start().await;
    // Connections first: what is measured is answering, not handshakes.
    let mut cheap = connect_tls(&servers).await;
    let admin_tcp = TcpStream::connect(("127.0.0.1", servers.admin))
        .await
        .unwrap();
    let (mut admin, conn) = hyper::client::conn::http1::handshake(TokioIo::new(admin_tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut busy = Vec::new();
    for _ in 0..8 {
        busy.push(connect_tls(&servers).await);
    }
    let mut over = Vec::new();
    for _ in 0..8 {
        over.push(connect_tls(&servers).await);
    }

    // 8 slow reviews (within budget) and 8 over budget at run time, all in flight.
    let started = Instant::now();
    let slow: Vec<_> = busy
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                post(
                    &mut s,
                    "/validate/policy/pairs-fail",
                    review(SLOW_CONTAINERS),
                )
                .await
            })
        })
        .collect();
    let huge: Vec<_> = over
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            let path = if i % 2 == 0 {
                "/validate/policy/pairs-fail"
            } else {
                "/validate/policy/pairs-ignore"
            };
            tokio::spawn(async move { (path, post(&mut s, path, review(HUGE_CONTAINERS)).await) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let t = Instant::now();
    let answer = post(&mut cheap, "/validate/policy/cheap", review(1)).await;
    let cheap_took = t.elapsed();
    assert_eq!(answer["response"]["allowed"], true);
    let t = Instant::now();
    let ready = admin
        .send_request(
            Request::builder()
                .uri("/readyz")
                .header("host", "127.0.0.1")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let readyz_took = t.elapsed();
    assert_eq!(ready.status(), StatusCode::OK);
    // The order is the claim: both were answered while slow reviews, sent first, still ran.
    let still_busy = slow.iter().filter(|h| !h.is_finished()).count();
    eprintln!(
        "cheap review {cheap_took:?}, /readyz {readyz_took:?}, {still_busy} of 8 slow reviews still running"
    );
    assert!(
        still_busy > 0,
        "the cheap review and /readyz were answered only after every slow review"
    );

    // Over budget: never evaluated, answered by the failurePolicy with the reason.
    for h in huge {
        let (path, body) = h.await.unwrap();
        let resp = &body["response"];
        if path.ends_with("fail") {
            assert_eq!(resp["allowed"], false, "{body}");
            assert_eq!(resp["status"]["code"], 500);
            let message = resp["status"]["message"].as_str().unwrap();
            assert!(message.contains("cost budget exceeded"), "{message}");
        } else {
            assert_eq!(resp["allowed"], true, "{body}");
            let warnings = resp["warnings"].to_string();
            assert!(warnings.contains("cost budget exceeded"), "{warnings}");
        }
    }
    for h in slow {
        let body = h.await.unwrap();
        assert_eq!(body["response"]["allowed"], true, "{body}");
    }
    eprintln!("all answered after {:?}", started.elapsed());
    let text = gatehouse::runtime::telemetry::encode(&servers.registry).unwrap();
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with("gatehouse_policy_over_budget_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, 8.0, "{text}");
}
