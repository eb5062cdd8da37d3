//! A receiver of Gatehouse's calls, as a team would write one: HTTPS on 127.0.0.1 with a CA of
//! its own, recording every call it answers by key. Tests make it fail at random, answer one
//! status, stall, answer garbage or a huge body, or go away and come back on the same port.
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::install_crypto_provider;

/// How the receiver answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Behaviour {
    /// 200 with `{"result": "r-<key>"}`.
    Accept,
    /// As [`Behaviour::Accept`], after this long (a receiver's own work).
    AcceptAfter(Duration),
    /// A 503 for this share of calls (0.0–1.0), picked at random; 200 for the others.
    FailShare(f64),
    /// This status for every call (e.g. 403: refused for good).
    Status(u16),
    /// No answer, ever.
    Stall,
    /// 200 with a body that is not JSON.
    Garbage,
    /// 200 with this many bytes of body.
    Huge(usize),
}

/// One call the receiver answered (or failed on purpose).
#[derive(Clone, Debug)]
pub struct Call {
    pub action: String,
    pub key: String,
    pub body: Value,
    pub authorization: Option<String>,
    /// Whether it was answered 2xx.
    pub accepted: bool,
    pub at: Instant,
}

struct Shared {
    behaviour: Mutex<Behaviour>,
    calls: Mutex<Vec<Call>>,
}

/// The receiver; it stops when dropped.
pub struct Receiver {
    pub port: u16,
    /// The CA its certificate chains to, as a `caBundle` (base64 of PEM).
    pub ca_bundle: String,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Starts a receiver on a free port of 127.0.0.1.
    pub async fn start() -> anyhow::Result<Self> {
        install_crypto_provider();
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = params.signed_by(&key, &issuer)?;
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
                    .map_err(|e| anyhow::anyhow!("key: {e}"))?,
            )?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            behaviour: Mutex::new(Behaviour::Accept),
            calls: Mutex::new(Vec::new()),
        });
        let mut receiver = Receiver {
            port,
            ca_bundle: base64::engine::general_purpose::STANDARD.encode(ca_cert.pem()),
            acceptor,
            shared,
            task: None,
        };
        receiver.task = Some(receiver.serve(listener));
        Ok(receiver)
    }

    /// The URL calls go to.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}/hook", self.port)
    }

    pub fn behave(&self, behaviour: Behaviour) {
        *self
            .shared
            .behaviour
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = behaviour;
    }

    /// Every call so far, in the order they came.
    pub fn calls(&self) -> Vec<Call> {
        self.shared
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops listening: connections are refused until [`Receiver::come_back`].
    pub fn go_away(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn come_back(&mut self) -> anyhow::Result<()> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], self.port))).await?;
        self.task = Some(self.serve(listener));
        Ok(())
    }

    fn serve(&self, listener: TcpListener) -> JoinHandle<()> {
        let acceptor = self.acceptor.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, shared) = (acceptor.clone(), shared.clone());
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |req| answer(shared.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.go_away();
    }
}

/// A number in [0, 1), different each call.
fn random_share() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    (hasher.finish() % 10_000) as f64 / 10_000.0
}

async fn answer(
    shared: Arc<Shared>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    let authorization = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let behaviour = shared
        .behaviour
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let key = body["key"].as_str().unwrap_or_default().to_string();
    let (status, text) = match behaviour {
        Behaviour::Accept => (200, json!({"result": format!("r-{key}")}).to_string()),
        Behaviour::AcceptAfter(work) => {
            tokio::time::sleep(work).await;
            (200, json!({"result": format!("r-{key}")}).to_string())
        }
        Behaviour::FailShare(share) if random_share() < share => (503, "busy".to_string()),
        Behaviour::FailShare(_) => (200, json!({"result": format!("r-{key}")}).to_string()),
        Behaviour::Status(status) => (status, "no".to_string()),
        Behaviour::Stall => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            (200, String::new())
        }
        Behaviour::Garbage => (200, "\u{0}not json at all".to_string()),
        Behaviour::Huge(bytes) => (200, "x".repeat(bytes)),
    };
    shared
        .calls
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Call {
            action: body["action"].as_str().unwrap_or_default().to_string(),
            key,
            body: body.clone(),
            authorization,
            accepted: (200..300).contains(&status),
            at: Instant::now(),
        });
    let mut response = hyper::Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    Ok(response)
}
