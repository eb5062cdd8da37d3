//! The webhook server over real HTTPS, in process: every response code it promises, the wire
//! form of a mutating answer, and graceful shutdown letting an in-flight review finish.
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]
mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use gatehouse::tls::{CertResolver, server_config};
use gatehouse::webhook::{self, MAX_BODY_BYTES, PolicyStore, WebhookState};
use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine::compile;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request, StatusCode};
use prometheus_client::registry::Registry;
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

struct Server {
    port: u16,
    ca: CertificateDer<'static>,
    policies: Arc<PolicyStore>,
    registry: Arc<Registry>,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

fn policy(name: &str, spec: Value) -> Policy {
    serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
        "metadata": {"name": name, "generation": 1}, "spec": spec
    }))
    .unwrap()
}

async fn start(body_read_timeout: Duration) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let resolver = CertResolver::new();
    resolver.set_pem(&cert.pem(), &key.serialize_pem()).unwrap();
    let config = Arc::new(server_config(resolver).unwrap());

    let policies = Arc::new(PolicyStore::new());
    let rules = json!({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]});
    policies.upsert(Arc::new(
        compile(&policy(
            "inject",
            json!({"match": rules, "mutate": [{"merge": {"spec": {"containers": [{"name": "proxy", "image": "proxy:1"}]}}}]}),
        ))
        .unwrap(),
    ));
    policies.upsert(Arc::new(
        compile(&policy(
            "limits",
            json!({"match": rules, "validate": [{"expression": "object.spec.containers.all(c, has(c.resources))", "message": "resources required"}]}),
        ))
        .unwrap(),
    ));
    let mut registry = gatehouse::runtime::telemetry::registry();
    let metrics = Arc::new(gatehouse::webhook::AdmissionMetrics::register(
        &mut registry,
    ));
    let handshakes = gatehouse::runtime::serve::handshake_counter(&mut registry);
    let mut state = WebhookState::new(policies.clone(), metrics);
    state.body_read_timeout = body_read_timeout;
    let state = Arc::new(state);
    let handler = webhook::handler(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn({
        async move {
            gatehouse::runtime::serve::serve_tls_on(
                None,
                listener,
                config,
                handler,
                async {
                    let _ = stopped.await;
                },
                Duration::from_secs(10),
                &handshakes,
            )
            .await;
        }
    });
    Server {
        port,
        ca: cert.der().clone(),
        policies,
        registry: Arc::new(registry),
        stop: Some(stop),
        done,
    }
}

type Sender<B> = hyper::client::conn::http1::SendRequest<B>;

/// An HTTP/1.1 connection over TLS that trusts only the test certificate.
async fn connect<B>(server: &Server) -> Sender<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    common::connect(server.port, &server.ca).await
}

async fn send(server: &Server, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let mut sender = connect::<Full<Bytes>>(server).await;
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn pod_review(containers: Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "1234", "operation": "CREATE", "namespace": "shop", "name": "web",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": containers}}
        }
    })
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn mutating_answer_carries_a_base64_json_patch() {
    let server = start(Duration::from_secs(5)).await;
    let (status, body) = send(
        &server,
        Method::POST,
        "/mutate/policy/inject",
        pod_review(json!([{"name": "app", "image": "app:1"}])),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    let resp = &body["response"];
    assert_eq!(resp["uid"], "1234");
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch");
    let patch = BASE64
        .decode(resp["patch"].as_str().expect("patch is a string"))
        .unwrap();
    let ops: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(
        ops,
        json!([{"op": "add", "path": "/spec/containers/1", "value": {"name": "proxy", "image": "proxy:1"}}])
    );
}

#[tokio::test]
async fn validating_denial_is_forbidden_with_the_policy_named() {
    let server = start(Duration::from_secs(5)).await;
    let (status, body) = send(
        &server,
        Method::POST,
        "/validate/policy/limits",
        pod_review(json!([{"name": "app", "image": "app:1"}])),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let resp = &body["response"];
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 403);
    assert_eq!(resp["status"]["reason"], "Forbidden");
    let message = resp["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("limits") && message.contains("resources required"),
        "{message}"
    );
    assert!(resp.get("patch").is_none());
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let server = start(Duration::from_secs(5)).await;
    let (status, body) = send(
        &server,
        Method::POST,
        "/validate/policy/limits",
        b"{not json".to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().len() > 5, "{body}");

    let no_request =
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string();
    let (status, body) = send(
        &server,
        Method::POST,
        "/validate/policy/limits",
        no_request.into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"].as_str().unwrap().contains("request"),
        "{body}"
    );

    let (status, body) = send(
        &server,
        Method::POST,
        "/validate/nope",
        pod_review(json!([])),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].as_str().unwrap().contains("nope"));

    let (status, _) = send(&server, Method::POST, "/elsewhere", pod_review(json!([]))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, body) = send(&server, Method::GET, "/validate/policy/limits", Vec::new()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(body["error"].as_str().unwrap().contains("POST"));
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let server = start(Duration::from_secs(5)).await;
    let huge = vec![b' '; MAX_BODY_BYTES + 1];
    let (status, body) = send(&server, Method::POST, "/validate/policy/limits", huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body["error"].as_str().unwrap().contains("exceeds"));

    // Without a Content-Length (chunked), the limit is enforced while reading.
    let mut sender = connect::<StreamBody<tokio_stream_like::Chunks>>(&server).await;
    let chunks = tokio_stream_like::Chunks::new(vec![Bytes::from(vec![b' '; 1 << 20]); 9]);
    let req = Request::post("/validate/policy/limits")
        .header("host", "127.0.0.1")
        .body(StreamBody::new(chunks))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

/// A real client streaming a file larger than the limit (with `Expect: 100-continue` and a
/// Content-Length, as curl sends it) receives the 413 instead of a reset connection.
#[tokio::test]
async fn a_client_streaming_an_oversized_file_reads_the_413() {
    let server = start(Duration::from_secs(10)).await;
    let dir = std::env::temp_dir().join(format!("gatehouse-413-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("9MiB.json");
    std::fs::write(&file, vec![b' '; 9 << 20]).unwrap();
    let url = format!("https://127.0.0.1:{}/validate/limits", server.port);
    for chunked in [false, true] {
        let mut curl = tokio::process::Command::new("curl");
        curl.args(["-sS", "-k", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["-H", "content-type: application/json"])
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .arg(&url);
        if chunked {
            curl.args(["-H", "transfer-encoding: chunked"]);
        }
        let out = curl.output().await.expect("curl runs");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "413",
            "chunked={chunked}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn a_body_that_never_arrives_times_out() {
    let server = start(Duration::from_millis(300)).await;
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
    let mut sender = connect::<StreamBody<tokio_stream_like::Receiver>>(&server).await;
    let req = Request::post("/validate/policy/limits")
        .header("host", "127.0.0.1")
        .body(StreamBody::new(tokio_stream_like::Receiver(rx)))
        .unwrap();
    tx.send(Ok(Frame::data(Bytes::from_static(b"{"))))
        .await
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("the server answers instead of hanging")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    drop(tx);
}

#[tokio::test]
async fn shutdown_lets_in_flight_reviews_finish() {
    let mut server = start(Duration::from_secs(5)).await;
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
    let mut sender = connect::<StreamBody<tokio_stream_like::Receiver>>(&server).await;
    let req = Request::post("/mutate/policy/inject")
        .header("host", "127.0.0.1")
        .body(StreamBody::new(tokio_stream_like::Receiver(rx)))
        .unwrap();
    let body = pod_review(json!([{"name": "app", "image": "app:1"}]));
    let (head, tail) = body.split_at(10);
    tx.send(Ok(Frame::data(Bytes::copy_from_slice(head))))
        .await
        .unwrap();
    let in_flight = tokio::spawn(async move { sender.send_request(req).await });
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Shutdown while the review is half-received: no new connections...
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        TcpStream::connect(("127.0.0.1", server.port))
            .await
            .is_err(),
        "still accepting after shutdown"
    );
    // ...but the in-flight review completes.
    tx.send(Ok(Frame::data(Bytes::copy_from_slice(tail))))
        .await
        .unwrap();
    drop(tx);
    let resp = in_flight.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    tokio::time::timeout(Duration::from_secs(5), server.done)
        .await
        .expect("server stops after draining")
        .unwrap();
}

#[tokio::test]
async fn a_just_retired_policy_admits_unchanged() {
    let server = start(Duration::from_secs(5)).await;
    server.policies.retire("inject");
    let (status, body) = send(
        &server,
        Method::POST,
        "/mutate/policy/inject",
        pod_review(json!([{"name": "app", "image": "app:1"}])),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["response"]["allowed"], true);
    assert!(body["response"].get("patch").is_none());
}

/// Minimal `Stream`s for request bodies, without pulling in another crate.
mod tokio_stream_like {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use hyper::body::Frame;

    pub struct Chunks(std::vec::IntoIter<Bytes>);

    impl Chunks {
        pub fn new(chunks: Vec<Bytes>) -> Self {
            Self(chunks.into_iter())
        }
    }

    impl futures::Stream for Chunks {
        type Item = Result<Frame<Bytes>, std::convert::Infallible>;
        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Ready(self.0.next().map(|b| Ok(Frame::data(b))))
        }
    }

    pub struct Receiver(
        pub tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::convert::Infallible>>,
    );

    impl futures::Stream for Receiver {
        type Item = Result<Frame<Bytes>, std::convert::Infallible>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.0.poll_recv(cx)
        }
    }
}

/// The handshake counter's value for `result`, read from the exposition as a scraper would.
fn handshakes(server: &Server, result: &str) -> u64 {
    let text = gatehouse::runtime::telemetry::encode(&server.registry).unwrap();
    let series = format!("gatehouse_tls_handshakes_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |value| value.trim().parse().unwrap())
}

#[tokio::test]
async fn handshakes_are_counted_by_result() {
    let server = start(Duration::from_secs(5)).await;
    assert_eq!(handshakes(&server, "ok"), 0);
    // A kept-alive connection shakes hands once, however many reviews it carries.
    let mut sender = connect::<Full<Bytes>>(&server).await;
    for _ in 0..3 {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/mutate/policy/inject")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(pod_review(
                json!([{"name": "app", "image": "app:1"}]),
            ))))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    assert_eq!(handshakes(&server, "ok"), 1);
    assert_eq!(handshakes(&server, "failed"), 0);

    // A client that does not trust the serving certificate (a stale caBundle) refuses it.
    let other = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(other.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    let refused = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await;
    assert!(refused.is_err());
    // The server learns of the refusal from the client's alert, a moment later.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while handshakes(&server, "failed") == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(handshakes(&server, "failed"), 1);
    assert_eq!(handshakes(&server, "ok"), 1);
}
