//! One HTTP request → one admission decision.
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use tracing::{Instrument, info_span, warn};

use super::metrics::{AdmissionLabels, AdmissionMetrics};
use super::namespaces::Namespaces;
use super::{Lookup, MAX_BODY_BYTES, Members, PolicyStore};
use gatehouse_engine as engine;
use gatehouse_engine::chain::{self, Matching};
use gatehouse_engine::entry::{MUTATE_PREFIX, OWN_PREFIX, VALIDATE_POLICY_PATH, VALIDATE_PREFIX};
use gatehouse_engine::group::Group;
use gatehouse_engine::{CompiledPolicy, Namespace, Phase};

/// How long a client may take to send the whole body once the headers are in.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How many reviews involving a heavy Policy ([`CompiledPolicy::is_heavy`]) are evaluated at
/// once, on the blocking pool: half the CPUs (at least one), so that however many heavy reviews
/// arrive, the others always find a CPU. Every evaluation is bounded by the cost budget, so a
/// slot is always given back.
pub fn heavy_evaluations_in_flight() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// What the webhook server shares between requests.
pub struct WebhookState {
    pub policies: Arc<PolicyStore>,
    pub metrics: Arc<AdmissionMetrics>,
    /// Labels of the Namespaces, for the members' namespaceSelectors.
    pub namespaces: Namespaces,
    /// See [`BODY_READ_TIMEOUT`].
    pub body_read_timeout: Duration,
    /// See [`heavy_evaluations_in_flight`].
    pub heavy_evaluations: Arc<tokio::sync::Semaphore>,
}

impl WebhookState {
    pub fn new(policies: Arc<PolicyStore>, metrics: Arc<AdmissionMetrics>) -> Self {
        Self {
            policies,
            metrics,
            namespaces: Namespaces::default(),
            body_read_timeout: BODY_READ_TIMEOUT,
            heavy_evaluations: Arc::new(tokio::sync::Semaphore::new(heavy_evaluations_in_flight())),
        }
    }
}

/// One route of the webhook port, parsed from a request path.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// `/mutate/<entry>` or `/validate/<entry>`: a group id (`fail-…`), a Policy's own entry
    /// (`policy/<name>`), or a Policy name (an own entry written by an earlier version).
    Entry {
        phase: Phase,
        id: &'a str,
    },
    PolicyValidation,
}

impl<'a> Route<'a> {
    /// `None` for a path the server does not know.
    pub fn parse(path: &'a str) -> Option<Self> {
        if path == VALIDATE_POLICY_PATH {
            return Some(Route::PolicyValidation);
        }
        let (phase, id) = if let Some(id) = path.strip_prefix(MUTATE_PREFIX) {
            (Phase::Mutating, id)
        } else if let Some(id) = path.strip_prefix(VALIDATE_PREFIX) {
            (Phase::Validating, id)
        } else {
            return None;
        };
        let name = id.strip_prefix(OWN_PREFIX).unwrap_or(id);
        (!name.is_empty() && !name.contains('/')).then_some(Route::Entry { phase, id })
    }
}

/// The webhook port's [`Handler`](crate::runtime::serve::Handler): [`handle`] over `state`. `gatehouse run`,
/// the server tests and the benchmark server all serve this one.
pub fn handler(state: Arc<WebhookState>) -> crate::runtime::serve::Handler {
    Arc::new(move |req| {
        let state = state.clone();
        Box::pin(async move { handle(state, req).await })
    })
}

/// Handles one request on the webhook port.
pub async fn handle(state: Arc<WebhookState>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let Some(route) = Route::parse(&path) else {
        return error(StatusCode::NOT_FOUND, format!("no webhook at {path}"));
    };
    if req.method() != Method::POST {
        let mut resp = error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} is not allowed; webhooks take POST", req.method()),
        );
        resp.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return resp;
    }
    if let Some(wrong) = unsupported_content_type(&req) {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content type {wrong:?} is not supported; webhooks take application/json"),
        );
    }
    let body = match read_body(req, state.body_read_timeout).await {
        Ok(body) => body,
        Err(resp) => return resp,
    };
    match route {
        Route::Entry { phase, id } => review_entry(&state, phase, id, &body).await,
        Route::PolicyValidation => validate_policy_object(&body),
    }
}

async fn review_entry(
    state: &Arc<WebhookState>,
    phase: Phase,
    id: &str,
    body: &[u8],
) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let lookup = state.policies.lookup(phase, id);
    let request = match engine::parse_request(body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (group, members, matched) = match lookup {
        Lookup::Group {
            group,
            members,
            matched,
        } => (group, members, matched),
        // The API server resolves this with the entry's failurePolicy: answering "allowed"
        // would silently bypass Policies that are merely not loaded yet.
        Lookup::Unknown => {
            return error(StatusCode::NOT_FOUND, format!("no webhook entry {id:?}"));
        }
    };
    let span = admission_span(&request, id, phase);
    let labels = namespace_labels(state, &request, &members, matched)
        .instrument(span.clone())
        .await;
    let heavy = members.heavy;
    let review = EntryReview {
        request,
        group,
        members,
        phase,
        matched,
        labels,
    };
    // Evaluated on this worker when every member is cheap, on the blocking pool when one is
    // heavy; never on the threads that accept connections and serve the admin port (see the
    // module documentation).
    let evaluate = {
        let state = state.clone();
        move || span.in_scope(|| answer(&state, &review))
    };
    let (allowed, body) = if heavy {
        match on_blocking_pool(state, evaluate).await {
            Ok(done) => done,
            Err(refused) => return refused,
        }
    } else {
        evaluate()
    };
    let decision = if allowed { "allowed" } else { "denied" };
    let labels = AdmissionLabels {
        entry: id.to_string(),
        phase: phase.as_str(),
        decision,
    };
    state.metrics.requests.get_or_create(&labels).inc();
    state
        .metrics
        .duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    json(StatusCode::OK, body)
}

/// The span of one review, its answer recorded in it once known.
fn admission_span(request: &engine::Request, id: &str, phase: Phase) -> tracing::Span {
    info_span!(
        "admission",
        uid = %request.uid(),
        entry = id,
        phase = phase.as_str(),
        kind = %request.kind_name(),
        namespace = %request.namespace(),
        name = %request.name(),
        operation = %request.operation(),
        allowed = tracing::field::Empty,
        patched = tracing::field::Empty,
    )
}

/// Runs a heavy Policy's `evaluate` on the blocking pool, taking turns on half the CPUs; the
/// error response when it cannot.
async fn on_blocking_pool(
    state: &WebhookState,
    evaluate: impl FnOnce() -> (bool, Vec<u8>) + Send + 'static,
) -> Result<(bool, Vec<u8>), Response<Full<Bytes>>> {
    let Ok(_slot) = state.heavy_evaluations.acquire().await else {
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down".into(),
        ));
    };
    tokio::task::spawn_blocking(evaluate).await.map_err(|e| {
        warn!(error = %e, "evaluation failed");
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("evaluating the review failed: {e}"),
        )
    })
}

/// One entry's review with everything its answer depends on.
struct EntryReview {
    request: engine::Request,
    group: Arc<Group>,
    members: Arc<Members>,
    phase: Phase,
    /// The API server matched already (a Policy's own entry).
    matched: bool,
    /// The labels of the request's Namespace, when a member's namespaceSelector needs them.
    labels: Option<Result<std::collections::BTreeMap<String, String>, String>>,
}

/// The members' answer to a review, encoded, and whether it allows: the engine's decision,
/// with what each member did counted per Policy and the decision logged.
fn answer(state: &WebhookState, review: &EntryReview) -> (bool, Vec<u8>) {
    let namespace = match &review.labels {
        None => Namespace::Assumed,
        Some(Ok(map)) => Namespace::Labels(map),
        Some(Err(reason)) => Namespace::Unknown(reason),
    };
    let matching = Matching {
        namespace,
        matched: review.matched,
    };
    let (request, phase) = (&review.request, review.phase);
    // The members pinned to other namespaces could never match: not offered the request.
    let offered = review
        .members
        .offered(request.namespace(), request.is_namespace());
    let members: Vec<&CompiledPolicy> = offered
        .iter()
        .map(|&i| review.members[i].as_ref())
        .collect();
    let outcome = match phase {
        Phase::Mutating => chain::admit_mutating(
            request,
            &members,
            review.group.reinvocation_policy,
            matching,
        ),
        Phase::Validating => chain::admit_validating(request, &members, matching),
    };
    for e in &outcome.evaluated {
        tracing::debug!(
            policy = e.policy.name(),
            decision = e.decision.as_str(),
            "member"
        );
        let member = offered.get(e.member).copied();
        if let Some(meters) = member.and_then(|i| review.members.meters.get(i)) {
            state.metrics.record_member(meters, phase, e);
        }
    }
    let response = outcome.response;
    tracing::Span::current()
        .record("allowed", response.allowed())
        .record("patched", response.patched());
    // A line per admitted request would dominate the log (and the CPU) at API-server rates;
    // denials are what operators look for. The span carries every decision.
    if response.allowed() {
        tracing::debug!("admitted");
    } else {
        tracing::info!(reason = response.message().unwrap_or_default(), "denied");
    }
    (
        response.allowed(),
        engine::encoded_review(request, &response),
    )
}

/// The labels of the request's Namespace, when a member's namespaceSelector needs them: `None`
/// when none does (or the API server matched already), an error when they cannot be read.
async fn namespace_labels(
    state: &WebhookState,
    request: &engine::Request,
    members: &Members,
    matched: bool,
) -> Option<Result<std::collections::BTreeMap<String, String>, String>> {
    // A Namespace is judged by its own labels and other cluster-scoped objects always match:
    // only a namespaced object needs its Namespace's.
    let needed = !(matched || request.namespace().is_empty() || request.is_namespace())
        && members.namespace_selectors;
    if !needed {
        return None;
    }
    Some(state.namespaces.labels(request.namespace()).await)
}

/// Gatehouse's own webhook for Policy objects: `kubectl apply` of an invalid Policy fails with
/// every problem the controller would otherwise report in status.
fn validate_policy_object(body: &[u8]) -> Response<Full<Bytes>> {
    let request = match engine::parse_request(body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let response = engine::admit_policy_object(&request);
    json(StatusCode::OK, engine::encoded_review(&request, &response))
}

/// The request's content type when it names something other than JSON (the API server always
/// sends `application/json`; a request without one is read as JSON).
fn unsupported_content_type(req: &Request<Incoming>) -> Option<String> {
    let value = req.headers().get(header::CONTENT_TYPE)?;
    let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
    let essence = text.split(';').next().unwrap_or_default().trim();
    (!essence.eq_ignore_ascii_case("application/json")).then_some(text)
}

/// How much of an oversized body is read and thrown away before the 413 goes out. Closing a
/// connection with unread data makes the kernel reset it, and a client still sending (`curl
/// --data-binary @9MB`) then loses the answer; past this much the client is not worth it.
const OVERSIZED_DISCARD_BYTES: usize = 4 * MAX_BODY_BYTES;
/// How long the rest of an oversized body is waited for.
const OVERSIZED_DISCARD_TIME: Duration = Duration::from_secs(3);

async fn read_body(
    req: Request<Incoming>,
    timeout: Duration,
) -> Result<Bytes, Response<Full<Bytes>>> {
    let mut body = req.into_body();
    let read = async {
        // hyper knows a declared Content-Length: an oversized body is refused before any of it
        // is buffered.
        if body.size_hint().lower() > MAX_BODY_BYTES as u64 {
            return Err(too_large(&mut body).await);
        }
        let collected = Limited::new(&mut body, MAX_BODY_BYTES).collect().await;
        match collected {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<LengthLimitError>() => Err(too_large(&mut body).await),
            Err(e) => Err(error(
                StatusCode::BAD_REQUEST,
                format!("reading the body: {e}"),
            )),
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result,
        Err(_) => {
            warn!("client did not send the body in time");
            Err(error(
                StatusCode::REQUEST_TIMEOUT,
                format!("body not received within {timeout:?}"),
            ))
        }
    }
}

/// The 413 answer, once the rest of the body (up to [`OVERSIZED_DISCARD_BYTES`]) has been read
/// and dropped, so that the client receives it.
async fn too_large(body: &mut Incoming) -> Response<Full<Bytes>> {
    let discard = async {
        let mut discarded = 0usize;
        while discarded < OVERSIZED_DISCARD_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => discarded += frame.data_ref().map_or(0, Bytes::len),
                Some(Err(_)) | None => break,
            }
        }
    };
    // A client that declared a huge body and sends none still gets its 413.
    let _ = tokio::time::timeout(OVERSIZED_DISCARD_TIME, discard).await;
    let mut resp = error(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("body exceeds {MAX_BODY_BYTES} bytes"),
    );
    // The connection cannot carry another request after a body that was not read whole.
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    resp
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    crate::runtime::serve::response(status, body, "application/json")
}

/// Errors are JSON too, so that the API server's log shows the reason verbatim.
fn error(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": message, "code": status.as_u16() });
    json(status, body.to_string().into_bytes())
}
