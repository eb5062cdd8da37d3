//! The plain-HTTP admin port: `/livez`, `/readyz`, `/metrics`. Kept off the TLS webhook port so
//! probes and scrapes never depend on the certificate the operator is rotating.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use hyper::{Request, Response};

use prometheus_client::registry::Registry;

/// Readiness of the whole process, as `/readyz` reports it.
#[derive(Default)]
pub struct Readiness {
    /// Every cache listed once and every valid Policy compiled into the server's store, so a
    /// new replica never answers 404 for a Policy the API server already calls.
    pub policies_loaded: AtomicBool,
    pub certificate_loaded: AtomicBool,
    /// Set on SIGTERM: the replica reports not ready so that its Service endpoint is withdrawn
    /// while it still serves (`--shutdown-delay`).
    pub shutting_down: AtomicBool,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.policies_loaded.load(Ordering::Acquire)
            && self.certificate_loaded.load(Ordering::Acquire)
            && !self.shutting_down.load(Ordering::Acquire)
    }
}

/// What the admin handler reads.
pub struct AdminState {
    pub readiness: Arc<Readiness>,
    /// Every subsystem's metrics.
    pub registry: Arc<Registry>,
}

/// The admin port's [`Handler`](crate::runtime::serve::Handler): [`handle`] over `state`.
pub fn handler(state: Arc<AdminState>) -> crate::runtime::serve::Handler {
    Arc::new(move |req| {
        let resp = handle(&state, &req);
        Box::pin(async move { resp })
    })
}

/// Handles one admin request.
pub fn handle<B>(state: &AdminState, req: &Request<B>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/livez" | "/healthz" => text(StatusCode::OK, "ok\n".into(), "text/plain"),
        "/readyz" => {
            if state.readiness.is_ready() {
                text(StatusCode::OK, "ok\n".into(), "text/plain")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: Policies not loaded yet or no certificate loaded\n".into(),
                    "text/plain",
                )
            }
        }
        "/metrics" => match crate::runtime::telemetry::encode(&state.registry) {
            Ok(body) => text(
                StatusCode::OK,
                body,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding metrics: {e}\n"),
                "text/plain",
            ),
        },
        other => text(
            StatusCode::NOT_FOUND,
            format!("no such path {other}\n"),
            "text/plain",
        ),
    }
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    crate::runtime::serve::response(status, body, content_type)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// The status of the answer to a GET of `path`.
    fn status_of(state: &AdminState, path: &str) -> StatusCode {
        handle(state, &Request::get(path).body(()).unwrap()).status()
    }

    #[test]
    fn readyz_follows_caches_and_certificate() {
        let state = AdminState {
            readiness: Arc::new(Readiness::default()),
            registry: Arc::new(crate::runtime::telemetry::registry()),
        };
        assert_eq!(status_of(&state, "/livez"), StatusCode::OK);
        let readyz = || status_of(&state, "/readyz");
        assert_eq!(readyz(), StatusCode::SERVICE_UNAVAILABLE);
        let readiness = &state.readiness;
        readiness.policies_loaded.store(true, Ordering::Release);
        assert_eq!(readyz(), StatusCode::SERVICE_UNAVAILABLE);
        readiness.certificate_loaded.store(true, Ordering::Release);
        assert_eq!(readyz(), StatusCode::OK);
        assert_eq!(status_of(&state, "/metrics"), StatusCode::OK);
        assert_eq!(status_of(&state, "/nope"), StatusCode::NOT_FOUND);
    }
}
