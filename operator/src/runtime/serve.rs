//! Accept loops shared by the TLS webhook port and the plain-HTTP admin port: both stop
//! accepting on shutdown and let in-flight requests finish, up to a drain deadline.
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

/// Labels of TLS handshakes on the webhook port.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// ok, failed (the client gave up or refused the certificate, or spoke something else),
    /// timeout.
    pub result: &'static str,
}

/// Registers the webhook port's handshake counter (`gatehouse_tls_handshakes_total`) in
/// `registry`.
pub fn handshake_counter(registry: &mut Registry) -> Family<HandshakeLabels, Counter> {
    let handshakes = Family::default();
    // The API server speaks HTTP/1.1 to webhooks and keeps a bounded pool of idle connections:
    // every handshake is a new connection, so a handshake rate that grows with load is that
    // pool churning (a full handshake costs both sides far more than a review), and failures
    // are a client that does not trust the serving certificate.
    registry.sub_registry_with_prefix("tls").register(
        "handshakes",
        "TLS handshakes on the webhook port, by result (ok, failed, timeout)",
        handshakes.clone(),
    );
    handshakes
}

/// A response with `status`, `body` and its `Content-Type`: what both ports answer with.
pub fn response(
    status: http::StatusCode,
    body: impl Into<Bytes>,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// A request handler: the same shape for both ports.
pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>>
        + Send
        + Sync,
>;

/// A client gets this long to send a request's headers. hyper also counts idle keep-alive time
/// against it, so it is not short: closing an idle connection just as a client reuses it turns
/// into a failed admission call. (The API server speaks HTTP/1.1 to a webhook behind a
/// Service. Its idle connections live 90 s, so a quiet spell longer than this costs the next
/// burst new connections; a longer limit did not save any in `tests/bench/admission-load`, so
/// it stays where a slow client is cut off soonest.)
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A TLS handshake that has not finished by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `handler` over TLS until `shutdown` resolves, then drains for at most `drain`.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    handler: Handler,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let unregistered = Family::default();
    serve_tls_on(None, listener, tls, handler, shutdown, drain, &unregistered).await;
}

/// [`serve_tls`], with each accepted connection handed to the runtime of `connections` when
/// given: the accept loop can then run on a thread of its own ([`on_own_thread`]) while the
/// connections (handshakes, reviews) run on the main runtime's workers. Every handshake is
/// counted in `handshakes` by its result.
pub async fn serve_tls_on(
    connections: Option<tokio::runtime::Handle>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    handler: Handler,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
    handshakes: &Family<HandshakeLabels, Counter>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let counter = |result| handshakes.get_or_create_owned(&HandshakeLabels { result });
    let counters = [counter("ok"), counter("failed"), counter("timeout")];
    accept_loop(
        connections,
        listener,
        move |stream: TcpStream, peer: SocketAddr| {
            let acceptor = acceptor.clone();
            let [ok, failed, timed_out] = counters.clone();
            async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        ok.inc();
                        Some(tls)
                    }
                    Ok(Err(e)) => {
                        failed.inc();
                        debug!(%peer, error = %e, "TLS handshake failed");
                        None
                    }
                    Err(_) => {
                        timed_out.inc();
                        debug!(%peer, "TLS handshake timed out");
                        None
                    }
                }
            }
        },
        handler,
        shutdown,
        drain,
    )
    .await;
}

/// The two ports of the process and what answers on them.
pub struct Ports {
    /// The TLS webhook port.
    pub webhook: SocketAddr,
    pub webhook_handler: Handler,
    pub tls: Arc<rustls::ServerConfig>,
    /// How long in-flight reviews may take to finish on shutdown.
    pub drain: Duration,
    /// TLS handshakes, counted by result.
    pub handshakes: Family<HandshakeLabels, Counter>,
    /// The plain-HTTP admin port (probes, metrics).
    pub admin: SocketAddr,
    pub admin_handler: Handler,
}

/// Why a port could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding {port} server to {addr}")]
    Bind {
        port: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Binds both ports and serves each from an accept loop on a thread of its own, so probes and
/// new connections never wait for a busy worker; the webhook's connections are served on the
/// main runtime's workers. The returned future ends once both have stopped after `shutdown`
/// (`shutdown` makes a future per port).
pub fn spawn<S, Fut>(
    ports: Ports,
    shutdown: S,
) -> Result<impl Future<Output = ()> + Send + use<S, Fut>, ServeError>
where
    S: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let bind = |port: &'static str, addr: SocketAddr| {
        std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| ServeError::Bind { port, addr, source })
    };
    let webhook_listener = bind("the webhook", ports.webhook)?;
    let admin_listener = bind("the admin", ports.admin)?;
    let workers = tokio::runtime::Handle::current();
    let (webhook_stopped, admin_stopped) = (shutdown(), shutdown());
    let Ports {
        webhook_handler,
        tls,
        drain,
        handshakes,
        admin_handler,
        ..
    } = ports;
    let webhook = on_own_thread("gatehouse-accept", move || async move {
        match TcpListener::from_std(webhook_listener) {
            Ok(listener) => {
                serve_tls_on(
                    Some(workers),
                    listener,
                    tls,
                    webhook_handler,
                    webhook_stopped,
                    drain,
                    &handshakes,
                )
                .await;
            }
            Err(e) => warn!(error = %e, "the webhook server cannot use its socket"),
        }
    });
    let admin = on_own_thread("gatehouse-admin", move || async move {
        match TcpListener::from_std(admin_listener) {
            Ok(listener) => {
                serve_http(
                    listener,
                    admin_handler,
                    admin_stopped,
                    Duration::from_secs(1),
                )
                .await;
            }
            Err(e) => warn!(error = %e, "the admin server cannot use its socket"),
        }
    });
    Ok(async move {
        tokio::join!(webhook, admin);
    })
}

/// Runs the future `make` builds on a thread of its own, with a single-threaded runtime of its
/// own (sockets must be registered inside it: build them in `make`), so that nothing the main
/// runtime's workers do can delay it. Resolves when it ends.
pub fn on_own_thread<F, Fut>(name: &str, make: F) -> impl Future<Output = ()> + Send + use<F, Fut>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (done, ended) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(make()),
                Err(e) => warn!(error = %e, "building a runtime failed"),
            }
            let _ = done.send(());
        });
    if let Err(e) = &spawned {
        warn!(error = %e, "starting a thread failed");
    }
    async move {
        let _ = ended.await;
    }
}

/// Serves `handler` over plain HTTP (the admin port) until `shutdown`, then drains.
pub async fn serve_http(
    listener: TcpListener,
    handler: Handler,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    accept_loop(
        None,
        listener,
        |stream: TcpStream, _peer: SocketAddr| async move { Some(stream) },
        handler,
        shutdown,
        drain,
    )
    .await;
}

/// An accepted socket, still registered where it was accepted or ready to move.
enum Moved {
    Tokio(TcpStream),
    Std(std::net::TcpStream),
}

/// HTTP/1 connections with a deadline for a request's headers.
fn connection_builder() -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
}

/// The accepted `stream` with the runtime to serve it on: `connections`' if given (the socket
/// must then leave this runtime's reactor for that one's), else this one.
fn hand_over(
    connections: Option<&tokio::runtime::Handle>,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<(Moved, tokio::runtime::Handle)> {
    match connections {
        Some(handle) => match stream.into_std() {
            Ok(std) => Some((Moved::Std(std), handle.clone())),
            Err(e) => {
                debug!(%peer, error = %e, "handing the connection over failed");
                None
            }
        },
        None => Some((Moved::Tokio(stream), tokio::runtime::Handle::current())),
    }
}

impl Moved {
    /// The connection, registered with the reactor of the runtime this runs on.
    fn take_over(self, peer: SocketAddr) -> Option<TcpStream> {
        match self {
            Moved::Tokio(stream) => Some(stream),
            Moved::Std(std) => match TcpStream::from_std(std) {
                Ok(stream) => Some(stream),
                Err(e) => {
                    debug!(%peer, error = %e, "taking the connection over failed");
                    None
                }
            },
        }
    }
}

async fn accept_loop<IO, Fut>(
    connections: Option<tokio::runtime::Handle>,
    listener: TcpListener,
    wrap: impl Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
    handler: Handler,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    Fut: Future<Output = Option<IO>> + Send + 'static,
{
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let graceful = GracefulShutdown::new();
    let builder = Arc::new(connection_builder());
    let wrap = Arc::new(wrap);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                // Accept errors concern one connection (or a passing fd shortage): the
                // listener stays usable, so back off briefly instead of dying.
                Err(e) => {
                    warn!(%addr, error = %e, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let handler = handler.clone();
        let builder = builder.clone();
        let wrap = wrap.clone();
        let Some((stream, runtime)) = hand_over(connections.as_ref(), stream, peer) else {
            continue;
        };
        runtime.spawn(async move {
            let Some(stream) = stream.take_over(peer) else {
                return;
            };
            let Some(io) = wrap(stream, peer).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, std::convert::Infallible>(handler(req).await) }
            });
            let conn = builder.serve_connection(TokioIo::new(io), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    info!(%addr, "stopped accepting; draining in-flight requests");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(%addr, "drain deadline passed with requests still in flight");
    }
}
