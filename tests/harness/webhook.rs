//! An in-process HTTPS admission webhook for tests.
//!
//! The server runs on its own thread and runtime, so it keeps answering while a test blocks (for
//! example on a synchronous kubectl call) and it does not depend on the test's runtime.

use std::convert::Infallible;
use std::net::TcpListener as StdTcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use anyhow::Context;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

/// Computes an AdmissionReview `response` (without `uid`, which the server fills in) from the
/// review's `request`.
pub type Responder = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

/// Installs rustls' ring crypto provider as the process default (once; later calls do nothing).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A responder that allows every request.
pub fn allow() -> impl Fn(&Value) -> Value + Send + Sync + 'static {
    |_| json!({ "allowed": true })
}

/// A responder that denies every request with `message` (HTTP code 403).
pub fn deny(message: &str) -> impl Fn(&Value) -> Value + Send + Sync + 'static {
    let message = message.to_owned();
    move |_| json!({ "allowed": false, "status": { "code": 403, "message": message } })
}

/// A running test webhook; stops when dropped or on [`TestWebhook::shutdown`].
pub struct TestWebhook {
    ca_pem: String,
    port: u16,
    reviews: Arc<Mutex<Vec<Value>>>,
    connections: Arc<AtomicUsize>,
    tid: Arc<OnceLock<u32>>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TestWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestWebhook")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl TestWebhook {
    /// Starts an HTTPS server on `127.0.0.1:<random port>` whose certificate (from a fresh CA)
    /// carries `sans` (IP addresses or DNS names). Every request body is recorded as an
    /// AdmissionReview and answered with `responder`'s response, on any path.
    pub fn start<R>(sans: &[&str], responder: R) -> anyhow::Result<Self>
    where
        R: Fn(&Value) -> Value + Send + Sync + 'static,
    {
        install_crypto_provider();
        let (ca_pem, cert_der, key_der) = issue_certificates(sans)?;
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key_der)
        .context("TLS server certificate")?;
        let mut tls = tls;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));

        let listener = StdTcpListener::bind("127.0.0.1:0").context("binding the test webhook")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let reviews = Arc::new(Mutex::new(Vec::new()));
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the test webhook's runtime")?;
        let connections = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(Handler {
            reviews: reviews.clone(),
            connections: connections.clone(),
            responder: Arc::new(responder),
        });
        let tid = Arc::new(OnceLock::new());
        let tid_here = tid.clone();
        let thread = std::thread::Builder::new()
            .name(format!("test-webhook-{port}"))
            .spawn(move || {
                if let Some(id) = own_thread_id() {
                    let _ = tid_here.set(id);
                }
                runtime.block_on(serve(listener, acceptor, state, shutdown_rx))
            })
            .context("starting the test webhook thread")?;
        Ok(Self {
            ca_pem,
            port,
            reviews,
            connections,
            tid,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        })
    }

    /// PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA PEM base64-encoded, as `clientConfig.caBundle` wants it in JSON/YAML.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes())
    }

    /// The local port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// Every AdmissionReview received so far, oldest first.
    pub fn reviews(&self) -> Vec<Value> {
        self.reviews
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// TLS connections accepted so far (a completed handshake each).
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// The OS thread id of the server's thread (it does all the server's work), for its CPU time
    /// ([`crate::cpu::cpu_seconds`]); `None` off Linux or before the thread has started.
    pub fn thread_id(&self) -> Option<u32> {
        self.tid.get().copied()
    }

    /// Stops the server and waits for its thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TestWebhook {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Handler {
    reviews: Arc<Mutex<Vec<Value>>>,
    connections: Arc<AtomicUsize>,
    responder: Responder,
}

impl Handler {
    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let body = match req.into_body().collect().await {
            Ok(body) => body.to_bytes(),
            Err(err) => return plain(StatusCode::BAD_REQUEST, format!("reading body: {err}")),
        };
        let review: Value = match serde_json::from_slice(&body) {
            Ok(review) => review,
            Err(err) => return plain(StatusCode::BAD_REQUEST, format!("not JSON: {err}")),
        };
        self.reviews
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(review.clone());
        let request = review.get("request").cloned().unwrap_or(Value::Null);
        let mut response = (self.responder)(&request);
        if let Some(obj) = response.as_object_mut() {
            obj.insert(
                "uid".to_owned(),
                request.get("uid").cloned().unwrap_or(Value::Null),
            );
        }
        let api_version = review
            .get("apiVersion")
            .cloned()
            .unwrap_or_else(|| json!("admission.k8s.io/v1"));
        let answer = json!({
            "apiVersion": api_version,
            "kind": "AdmissionReview",
            "response": response,
        });
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(answer.to_string())))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
    }
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response
}

async fn serve(
    listener: StdTcpListener,
    acceptor: TlsAcceptor,
    handler: Arc<Handler>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("test webhook: cannot listen: {err}");
            return;
        }
    };
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    eprintln!("test webhook: accept: {err}");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => {
                    handler.connections.fetch_add(1, Ordering::Relaxed);
                    tls
                }
                Err(err) => {
                    eprintln!("test webhook: TLS handshake: {err}");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler.handle(req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// A fresh CA and a serving certificate for `sans`, signed by it: (CA PEM, cert DER, key DER).
fn issue_certificates(
    sans: &[&str],
) -> anyhow::Result<(String, CertificateDer<'static>, PrivateKeyDer<'static>)> {
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "gatehouse e2e webhook CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("self-signing the CA")?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().context("generating the serving key")?;
    let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
    let mut params = CertificateParams::new(sans.clone())
        .with_context(|| format!("certificate SANs {sans:?}"))?;
    params.distinguished_name.push(
        DnType::CommonName,
        sans.first()
            .cloned()
            .unwrap_or_else(|| "test-webhook".to_owned()),
    );
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .signed_by(&key, &issuer)
        .context("signing the serving certificate")?;
    Ok((
        ca_cert.pem(),
        cert.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    ))
}

/// The calling thread's OS id, from the `/proc/thread-self` link (`<pid>/task/<tid>`).
fn own_thread_id() -> Option<u32> {
    std::fs::read_link("/proc/thread-self")
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}
