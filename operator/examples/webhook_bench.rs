//! Benchmark server for `benches/webhook-https.sh`: the webhook port as `gatehouse run` assembles
//! it (same accept loop, hyper and rustls stack), without a cluster.
//!
//! * `--mode gatehouse`: the real [`webhook::handle`] over the Policies of `--policy`.
//! * `--mode baseline`: reads the body, parses it as JSON and answers a fixed allow echoing the
//!   uid; the floor any AdmissionReview handler on this stack pays.
//!
//! Serves a self-signed certificate for 127.0.0.1, prints `ready` once listening and exits on
//! SIGTERM or SIGINT.
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use gatehouse::cli::eval::load_policies;

// The same allocator as the `gatehouse` binary, for both modes, so the comparison is fair.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use gatehouse::runtime::serve::{Handler, serve_tls};
use gatehouse::runtime::telemetry;
use gatehouse::tls::{self, CertResolver};
use gatehouse::webhook::{self, PolicyStore, WebhookState};
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

/// How long in-flight requests may take to finish after a signal.
const DRAIN: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Gatehouse,
    Baseline,
}

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, value_enum)]
    mode: Mode,
    /// Port on 127.0.0.1.
    #[arg(long)]
    port: u16,
    /// Policy YAML files (multi-document allowed); required in gatehouse mode.
    #[arg(long)]
    policy: Vec<PathBuf>,
    /// Log every decision to stderr as `gatehouse run` does (info level).
    #[arg(long)]
    log: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.log {
        telemetry::init_logging(false);
    }
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider is already installed"))?;

    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
        .context("generating the self-signed certificate")?;
    let resolver = CertResolver::new();
    resolver
        .set_pem(&cert.cert.pem(), &cert.signing_key.serialize_pem())
        .context("loading the certificate")?;
    let server_config = Arc::new(tls::server_config(resolver)?);

    let handler: Handler = match args.mode {
        Mode::Gatehouse => {
            anyhow::ensure!(!args.policy.is_empty(), "--mode gatehouse needs --policy");
            let policies = Arc::new(PolicyStore::new());
            let loaded = load_policies(&args.policy)?;
            // The script addresses shared entries by their paths, which depend on membership.
            for g in gatehouse_engine::group::groups(&loaded).iter() {
                println!("entry {}", g.path());
            }
            for policy in loaded {
                policies.upsert(Arc::new(policy));
            }
            let metrics = webhook::AdmissionMetrics::register(&mut telemetry::registry());
            webhook::handler(Arc::new(WebhookState::new(policies, Arc::new(metrics))))
        }
        Mode::Baseline => Arc::new(|req| Box::pin(baseline(req))),
    };

    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.port));
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let stopped = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    println!("ready");
    serve_tls(listener, server_config, handler, stopped, DRAIN).await;
    Ok(())
}

/// Parses the review and allows it, echoing the uid: no policy, no patch.
async fn baseline(req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, body) = match req.into_body().collect().await {
        Err(e) => (StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
        Ok(body) => match serde_json::from_slice::<Value>(&body.to_bytes()) {
            Err(e) => (StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
            Ok(review) => {
                let uid = review.pointer("/request/uid").cloned().unwrap_or_default();
                let allow = json!({
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": { "uid": uid, "allowed": true },
                });
                (StatusCode::OK, allow)
            }
        },
    };
    gatehouse::runtime::serve::response(status, body.to_string(), "application/json")
}
