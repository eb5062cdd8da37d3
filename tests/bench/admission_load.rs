//! Load benchmark in the shape of Kyverno's published load tests, on the real API server: create
//! Pods at a fixed concurrency with no webhooks, with the floor of 2 fixed-allow webhooks (one
//! mutating, one validating: what Gatehouse's shared entries cost the API server at best), and
//! with 16, 64 and 256 matching Policies (half mutating, half validating), and compare create
//! latency. A benchmark, not a test: it prints numbers. Gatehouse runs at its default log level.
//!
//! A second floor has the fixed mutating webhook answer with the change the Policies make, as a
//! fixed patch: the API server's own cost of applying and storing a mutation, which the
//! fixed-allow floor does not pay and no webhook can save.
//!
//! The floors' webhooks are reached as Gatehouse is, through a Service: the API server speaks
//! HTTP/1.1 to a webhook behind a Service, but HTTP/2 to one at a loopback URL, which no webhook
//! of a real cluster gets (floors called by URL made the API server's CPU per create lower than
//! Gatehouse's by 0.14–0.28 s per round, a difference of transport, not of the webhooks).
//!
//! Every phase stores the same Pod: each mutating Policy sets one of eight labels (and drops a
//! capability), so from 16 Policies on the eight labels are all set and the Policies added
//! later find their change made. What grows with the number of Policies is then Gatehouse's
//! work, not the object the API server applies, validates and stores. `LABELS=distinct` gives
//! every mutating Policy a label of its own instead (the stored Pod grows by one label per
//! mutating Policy).
//!
//! The machine is shared and its pace drifts by tens of percent from one minute to the next, so
//! the phases are not run one after the other: each has a namespace of its own (Gatehouse's
//! shared entries leave out the three others, as they leave out kube-system; each floor's
//! entries select only theirs), and with each number of Policies installed the four phases take
//! turns, round by round: `ROUNDS` (default 5) rounds of `PODS` (500) creates at `CONCURRENCY`
//! (50). Figures are the median over the rounds, with each round's p99 beside it (one round's
//! p99 is its 5th-slowest create, which a single stall decides). The 256/16 ratio is given
//! raw and with each against the floor measured beside it.
//!
//! Each phase also counts the new TLS connections its webhook servers accepted (Gatehouse's
//! `gatehouse_tls_handshakes_total`): the API server speaks HTTP/1.1 to webhooks with a bounded
//! pool of idle connections, and a full handshake costs both sides more than a review.
//!
//! A first block (`SCOPED=off` leaves it out) has 16 Policies over 4 namespace scopes: each
//! scope's Policies select Namespaces by a label of their own, so each scope gets entries of its
//! own (no exact union of their selectors), and the creates are in one scope's namespace. Every
//! block reports Gatehouse's entries and the webhook calls per create.
//!
//! `PROFILE=<dir>` also takes a CPU profile of the API server in each phase of the 16-Policy
//! block (`PROFILE_POLICIES`: of the 64- or 256-Policy one), after its rounds:
//! `PROFILE_SECONDS` (default 20) of creates in a loop per phase, written to
//! `<dir>/<phase>.pprof`, with the number of creates it covers printed beside it (compare per
//! create: `go tool pprof -top -unit ms <file>`).
//!
//! Beside the 16-Policy block's phases, in the same rounds: the same 16 validating Policies with
//! `enforcement: InProcess`, in a namespace of their own, which the API server evaluates as
//! ValidatingAdmissionPolicies with no webhook call (the in-process goal: p99 within 1.05x of no
//! webhooks); and, in the same rounds, 16 mutating Policies (the benchmark's mutating ones)
//! with `enforcement: InProcess`, which the API server runs as the generated
//! MutatingAdmissionPolicy (goal: p99 within 1.10x of no webhooks: the patch itself is work the
//! API server does), and a mixed case of 12 of them in-process and 4 on the webhook after them.
//!
//! `POLICIES=16` measures only the first step (`POLICIES=16,64` the first two).
//!
//! `BLOCK=tenants` runs the tenants block instead ([`tenants`]): N tenants' namespace-scoped
//! Policies, creates in one tenant's namespace. `BLOCK=crossover` runs the crossover block
//! ([`crossover`]): k mutations in-process against the same k Policies on the webhook.
//!
//! `tests/bench/admission-load` runs it (control plane, release build, environment).

#[path = "admission_load_crossover.rs"]
mod crossover;
#[path = "admission_load_tenants.rs"]
mod tenants;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use gatehouse_e2e::cpu::{cpu_snapshot, processes};
use gatehouse_e2e::instance::{Gatehouse, Options, localhost_service};
use gatehouse_e2e::pods::delete_all;
use gatehouse_e2e::{Cluster, TestNamespace, TestWebhook, allow, await_condition, cluster};
use gatehouse_engine::entry::ENTRY_SUFFIX;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{
            "name": "app",
            "image": "example.com/app:1.0",
            "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}
        }]}
    }))?)
}

struct Stats {
    avg: Duration,
    p95: Duration,
    p99: Duration,
}

fn stats(mut latencies: Vec<Duration>) -> Stats {
    latencies.sort();
    let pick = |q: f64| {
        let idx = ((latencies.len() as f64) * q).ceil() as usize;
        latencies[idx.clamp(1, latencies.len()) - 1]
    };
    let total: Duration = latencies.iter().sum();
    Stats {
        avg: total / latencies.len() as u32,
        p95: pick(0.95),
        p99: pick(0.99),
    }
}

/// A phase measured in rounds of `count` creates: the rounds' figures and the CPU seconds each
/// process used in all of them.
#[derive(Default)]
struct Phase {
    rounds: Vec<Stats>,
    cpu: Vec<f64>,
    /// New TLS connections the webhook servers accepted, over all rounds.
    connections: f64,
    /// The API server's webhook calls, as its own metrics time them: seconds and number.
    waited: f64,
    calls: f64,
}

impl Phase {
    /// Adds the rounds of `other` (the same phase, measured later).
    fn extend(&mut self, other: Phase) {
        self.cpu.resize(other.cpu.len(), 0.0);
        for (sum, c) in self.cpu.iter_mut().zip(&other.cpu) {
            *sum += c;
        }
        self.rounds.extend(other.rounds);
        self.connections += other.connections;
        self.waited += other.waited;
        self.calls += other.calls;
    }

    /// The mean webhook call, as the API server timed it, in milliseconds.
    fn mean_call_ms(&self) -> f64 {
        1000.0 * self.waited / self.calls.max(1.0)
    }

    /// New TLS connections per round, on average.
    fn connections_per_round(&self) -> f64 {
        self.connections / self.rounds.len().max(1) as f64
    }

    /// CPU seconds of process `i` in one round, on average.
    fn cpu_per_round(&self, i: usize) -> f64 {
        self.cpu.get(i).copied().unwrap_or_default() / self.rounds.len().max(1) as f64
    }

    /// The median of the rounds' values: one round's p99 of 500 creates is its 5th-slowest
    /// create, which a single stall of this shared 2-core machine decides.
    fn median(&self, of: impl Fn(&Stats) -> Duration) -> Duration {
        let mut values: Vec<Duration> = self.rounds.iter().map(of).collect();
        values.sort();
        // A phase not measured (a mode the run left out) has no figure.
        values.get(values.len() / 2).copied().unwrap_or_default()
    }

    fn p99(&self) -> Duration {
        self.median(|s| s.p99)
    }

    /// Each round's p99, in the order they ran.
    fn p99s(&self) -> String {
        self.rounds
            .iter()
            .map(|s| format!("{:.0}", s.p99.as_secs_f64() * 1000.0))
            .collect::<Vec<_>>()
            .join(" / ")
    }
}

/// The webhook servers a phase's creates call, for the connections they accept: the API server
/// speaks HTTP/1.1 to webhooks and keeps a bounded pool of idle connections, so every new one
/// (a full TLS handshake on both sides) is churn that the load itself causes.
#[derive(Clone, Copy)]
enum Servers<'a> {
    None,
    Hooks(&'a TestWebhook, &'a TestWebhook),
    Gatehouse(&'a Gatehouse),
}

impl Servers<'_> {
    /// TLS connections accepted so far.
    async fn connections(&self) -> anyhow::Result<f64> {
        Ok(match self {
            Servers::None => 0.0,
            Servers::Hooks(a, b) => (a.connections() + b.connections()) as f64,
            Servers::Gatehouse(gh) => {
                gh.metric_sum("gatehouse_tls_handshakes_total", "result=\"ok\"")
                    .await?
            }
        })
    }
}

/// What every phase does: `count` creates at `concurrency`, watching the CPU of `procs`.
struct Load<'a> {
    api: &'a Api<Pod>,
    client: &'a kube::Client,
    procs: &'a [(String, u32)],
    servers: Servers<'a>,
    /// How the names of the entries its creates call end (none without webhooks).
    entries: Option<&'a str>,
    count: usize,
    concurrency: usize,
}

impl Load<'_> {
    /// `rounds` rounds of creates, each with the CPU seconds around it and its Pods deleted
    /// after it.
    async fn measure(&self, prefix: &str, rounds: usize) -> anyhow::Result<Phase> {
        let mut phase = Phase {
            rounds: Vec::new(),
            cpu: vec![0.0; self.procs.len()],
            ..Phase::default()
        };
        for round in 0..rounds {
            let waits = self.webhook_waits().await?;
            let connected = self.servers.connections().await?;
            let before = cpu_snapshot(self.procs);
            let name = format!("{prefix}-{round}");
            let stats = create_pods(self.api, &name, self.count, self.concurrency).await?;
            let after = cpu_snapshot(self.procs);
            phase.connections += self.servers.connections().await? - connected;
            let (waited, calls) = self.webhook_waits().await?;
            phase.waited += waited - waits.0;
            phase.calls += calls - waits.1;
            for (sum, (a, b)) in phase.cpu.iter_mut().zip(before.iter().zip(&after)) {
                *sum += b - a;
            }
            phase.rounds.push(stats);
            delete_all(self.api).await?;
        }
        Ok(phase)
    }

    /// Seconds the API server has spent in calls to this phase's entries so far, and their
    /// number.
    async fn webhook_waits(&self) -> anyhow::Result<(f64, f64)> {
        let Some(suffix) = self.entries else {
            return Ok((0.0, 0.0));
        };
        let durations = webhook_durations(self.client, suffix).await?;
        Ok((durations.seconds, durations.calls))
    }

    /// A few creates so that the phase does not pay first-use costs.
    async fn warm(&self, prefix: &str) -> anyhow::Result<()> {
        create_pods(self.api, prefix, 20, self.concurrency).await?;
        delete_all(self.api).await
    }

    /// The API server's CPU profile over `seconds` of this phase's creates, written to `path`;
    /// returns the number of creates it covers (the cut-off round's by the Pods it left).
    async fn profile(
        &self,
        cluster: &Cluster,
        prefix: &str,
        seconds: u64,
        path: &std::path::Path,
    ) -> anyhow::Result<usize> {
        let url = format!("/debug/pprof/profile?seconds={seconds}");
        let fetch = cluster.kubectl_output(["get", "--raw", url.as_str()], None);
        tokio::pin!(fetch);
        let mut creates = 0;
        let output = loop {
            let name = format!("{prefix}-{creates}");
            tokio::select! {
                output = &mut fetch => break output?,
                stats = create_pods(self.api, &name, self.count, self.concurrency) => {
                    stats?;
                    creates += self.count;
                    delete_all(self.api).await?;
                }
            }
        };
        if !output.status.success() {
            bail!(
                "fetching the API server's profile: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::fs::write(path, &output.stdout)
            .with_context(|| format!("writing {}", path.display()))?;
        creates += self.api.list(&Default::default()).await?.items.len();
        delete_all(self.api).await?;
        Ok(creates)
    }
}

async fn create_pods(
    api: &Api<Pod>,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<Stats> {
    let results: Vec<anyhow::Result<Duration>> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let name = format!("{prefix}-{i}");
            async move {
                let pod = pod(&name)?;
                let t = Instant::now();
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                Ok(t.elapsed())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let latencies = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok(stats(latencies))
}

/// The API server's `apiserver_admission_webhook_admission_duration_seconds` for the entries
/// whose names end with a suffix, summed over those entries.
#[derive(Default)]
struct WebhookDurations {
    /// Cumulative buckets: upper bound (seconds) → count.
    buckets: BTreeMap<String, f64>,
    /// Seconds spent in the calls, and their number.
    seconds: f64,
    calls: f64,
}

/// [`WebhookDurations`] of the entries named `*<suffix>`, as the API server's `/metrics` has
/// them now.
async fn webhook_durations(
    client: &kube::Client,
    suffix: &str,
) -> anyhow::Result<WebhookDurations> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut out = WebhookDurations::default();
    for line in text.lines() {
        let Some(rest) =
            line.strip_prefix("apiserver_admission_webhook_admission_duration_seconds_")
        else {
            continue;
        };
        let label = |key: &str| rest.split(key).nth(1).and_then(|r| r.split('"').next());
        if !label("name=\"").is_some_and(|n| n.ends_with(suffix)) {
            continue;
        }
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        match (rest.split('{').next(), label("le=\"")) {
            (Some("bucket"), Some(le)) => {
                *out.buckets.entry(le.to_string()).or_insert(0.0) += value
            }
            (Some("sum"), _) => out.seconds += value,
            (Some("count"), _) => out.calls += value,
            _ => {}
        }
    }
    Ok(out)
}

/// p99 upper bound from the difference of two cumulative bucket snapshots.
fn bucket_p99(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Option<String> {
    let mut rows: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, v)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            (bound, v - before.get(le).copied().unwrap_or(0.0))
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = rows.last()?.1;
    if total <= 0.0 {
        return None;
    }
    rows.iter()
        .find(|(_, c)| *c >= total * 0.99)
        .map(|(b, _)| format!("<= {b}s (of {total} calls)"))
}

fn policy(name: &str, ns: &str, body: Value) -> Value {
    let mut spec = json!({
        "match": {
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
        }
    });
    if let (Some(spec), Some(body)) = (spec.as_object_mut(), body.as_object()) {
        spec.extend(body.clone());
        // The webhook phases measure the webhook path.
        spec.entry("enforcement")
            .or_insert_with(|| json!("Webhook"));
    }
    json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": name}, "spec": spec})
}

/// Names of the webhook configurations of the floors.
const FLOORS: [&str; 2] = ["bench-floor", "bench-patching-floor"];
/// Their entries are `<mutate|validate>.<configuration><FLOOR_SUFFIX>`.
const FLOOR_SUFFIX: &str = ".gatehouse.test";

/// A fixed webhook of the floors, reached as Gatehouse is: through a Service. The API server
/// speaks HTTP/1.1 to a webhook behind a Service (one request per connection at a time, a
/// bounded pool of idle ones), but HTTP/2 to a loopback URL; a floor called by URL would be a
/// cheaper transport than any webhook of a real cluster gets.
struct FixedHook {
    server: TestWebhook,
    service: &'static str,
    namespace: String,
}

impl FixedHook {
    async fn start<R>(
        cluster: &Cluster,
        service: &'static str,
        namespace: &str,
        responder: R,
    ) -> anyhow::Result<Self>
    where
        R: Fn(&Value) -> Value + Send + Sync + 'static,
    {
        let server = TestWebhook::start(&[&format!("{service}.{namespace}.svc")], responder)?;
        cluster
            .kubectl_ok(
                ["apply", "-f", "-"],
                Some(&localhost_service(service, namespace, server.port())),
            )
            .await?;
        Ok(Self {
            server,
            service,
            namespace: namespace.to_owned(),
        })
    }

    /// The entry's `clientConfig` for `path`.
    fn client_config(&self, path: &str) -> Value {
        json!({
            "service": {"name": self.service, "namespace": self.namespace, "port": self.server.port(), "path": path},
            "caBundle": self.server.ca_bundle(),
        })
    }
}

/// One mutating and one validating entry, shaped like Gatehouse's shared ones (same rules,
/// failurePolicy and sideEffects, only a namespace selector), that call `mutating` and
/// `validating`.
fn floor_configurations(
    name: &str,
    mutating: &FixedHook,
    validating: &FixedHook,
    ns: &str,
) -> String {
    let entry = |kind: &str| -> Value {
        let hook = if kind == "mutate" {
            mutating
        } else {
            validating
        };
        json!({
            "name": format!("{kind}.{name}{FLOOR_SUFFIX}"),
            "clientConfig": hook.client_config(&format!("/{kind}")),
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10
        })
    };
    let config = |kind: &str, webhooks: Vec<Value>| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": name},
            "webhooks": webhooks,
        })
    };
    format!(
        "---\n{}\n---\n{}\n",
        config("MutatingWebhookConfiguration", vec![entry("mutate")]),
        config("ValidatingWebhookConfiguration", vec![entry("validate")])
    )
}

/// A mutating answer that makes, with a fixed patch, the change the 16 Policies make to the
/// benchmark's Pod (eight labels, the capability dropped): what the API server pays for
/// applying a mutation, with no webhook work behind it.
fn fixed_patch() -> impl Fn(&Value) -> Value + Send + Sync + 'static {
    use base64::Engine as _;
    let labels: serde_json::Map<String, Value> =
        (0..8).map(|i| (label_of(i, false), json!("yes"))).collect();
    let patch = json!([
        {"op": "add", "path": "/metadata/labels", "value": labels},
        {"op": "add", "path": "/spec/containers/0/securityContext", "value": {"capabilities": {"drop": ["BPF"]}}},
    ]);
    let encoded = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
    move |_| json!({"allowed": true, "patchType": "JSONPatch", "patch": encoded})
}

/// The label the `i`-th mutating Policy sets: one of eight, or its own with `distinct`.
fn label_of(i: usize, distinct: bool) -> String {
    format!("bench-{}", if distinct { i } else { i % 8 })
}

/// The `i`-th mutating and validating benchmark Policies, as YAML documents, and their names.
fn bench_policies(i: usize, ns: &str, distinct: bool) -> anyhow::Result<(String, [String; 2])> {
    let m = format!("bench-mutate-{i}");
    let v = format!("bench-validate-{i}");
    let mut docs = format!(
        "---\n{}\n",
        serde_json::to_string(&policy(
            &m,
            ns,
            json!({
                "mutate": [
                    {"merge": {"metadata": {"labels": {label_of(i, distinct): "yes"}}}},
                    {"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}
                ]
            })
        ))?
    );
    docs.push_str(&format!("---\n{}\n", serde_json::to_string(&policy(&v, ns, json!({
        "validate": [{"expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))", "message": "limits required"}]
    })))?));
    Ok((docs, [m, v]))
}

/// How many reviews `hook` receives for one server-dry-run Pod create.
async fn reviews_per_create(api: &Api<Pod>, hook: &TestWebhook) -> anyhow::Result<usize> {
    let before = hook.reviews().len();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&dry_run, &pod("probe-floor")?).await?;
    Ok(hook.reviews().len() - before)
}

/// Installs a mutating and a validating entry named `name` for the Pods of `load`'s namespace
/// `ns` that call `mutating` and `validating`, and waits until the API server calls them.
async fn install_floor(
    cluster: &'static Cluster,
    name: &str,
    load: &Load<'_>,
    ns: &str,
    (mutating, validating): (&FixedHook, &FixedHook),
) -> anyhow::Result<()> {
    cluster
        .kubectl_ok(
            ["apply", "-f", "-"],
            Some(&floor_configurations(name, mutating, validating, ns)),
        )
        .await?;
    let calls = || async {
        anyhow::Ok(
            reviews_per_create(load.api, &mutating.server).await?
                + reviews_per_create(load.api, &validating.server).await?,
        )
    };
    // Two dry-run creates per probe: each hook sees its entry's call (one hook may serve both).
    let expected = if std::ptr::eq(mutating, validating) {
        4
    } else {
        2
    };
    await_condition(
        &format!("the entries of {name} in effect"),
        Duration::from_secs(60),
        || async { Ok((calls().await? == expected).then_some(())) },
    )
    .await
}

/// One step of Policies, and the phases measured in turn with it, round by round.
struct Block {
    /// What the block measures, as its table's heading.
    label: String,
    policies: usize,
    /// Gatehouse's mutating and validating entries (the self entry left out).
    entries: (usize, usize),
    none: Phase,
    floor: Phase,
    patching: Phase,
    with: Phase,
    /// Phases measured beside the others in the same rounds (the 16-Policy block only): the
    /// validating Policies in-process, the mutating ones in-process, and the mixed case.
    beside: Vec<(&'static str, Phase)>,
    /// The API server's p99 bucket for Gatehouse's entries.
    bucket: Option<String>,
    /// Gatehouse's RSS (KiB) after the block.
    rss: Option<u64>,
}

/// The phases measured beside the 16-Policy block's, by label.
const BESIDE: [&str; 4] = [
    "16 validating Policies in-process",
    "16 mutating Policies in-process",
    "12 mutating Policies in-process + 4 on the webhook",
    "1 mutating Policy in-process",
];

/// Number of namespace scopes of the scoped block.
const SCOPES: usize = 4;

/// The label a scope's Namespaces carry.
fn scope_key(scope: usize) -> String {
    format!("bench-scope-{scope}")
}

/// The label the `j`-th mutating Policy of `scope` sets.
fn scoped_label(scope: usize, j: usize) -> String {
    format!("bench-s{scope}-{j}")
}

/// The `j`-th mutating and validating Policies of `scope` (named after it, so a team's Policies
/// sort together), as YAML documents, and their names.
fn scoped_policies(scope: usize, j: usize) -> anyhow::Result<(String, [String; 2])> {
    let m = format!("bench-scope{scope}-mutate-{j}");
    let v = format!("bench-scope{scope}-validate-{j}");
    let selector = json!({"matchLabels": {scope_key(scope): "yes"}});
    let with_scope = |name: &str, body: Value| -> Value {
        let mut p = policy(name, "", body);
        p["spec"]["match"]["namespaceSelector"] = selector.clone();
        p
    };
    let docs = format!(
        "---\n{}\n---\n{}\n",
        serde_json::to_string(&with_scope(
            &m,
            json!({"mutate": [
                {"merge": {"metadata": {"labels": {scoped_label(scope, j): "yes"}}}},
                {"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}
            ]})
        ))?,
        serde_json::to_string(&with_scope(
            &v,
            json!({"validate": [{"expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))", "message": "limits required"}]})
        ))?
    );
    Ok((docs, [m, v]))
}

/// Gatehouse alone for a block of its own: its home namespace, the no-webhooks phase's namespace
/// (which it leaves out), and the processes whose CPU the phases count.
struct Alone {
    home: TestNamespace,
    quiet: TestNamespace,
    gh: Gatehouse,
    procs: Vec<(String, u32)>,
}

impl Alone {
    async fn start(cluster: &'static Cluster) -> anyhow::Result<Self> {
        let home = TestNamespace::new(cluster, "bench-home").await?;
        let quiet = TestNamespace::new(cluster, "bench-none").await?;
        let excluded = format!("kube-system,kube-node-lease,{}", quiet.name());
        let gh = Gatehouse::start(
            cluster,
            home.name(),
            Options::service()
                .default_logging()
                .arg("--exclude-namespaces", &excluded),
        )
        .await?;
        let procs = processes(cluster.state_dir(), gh.pid());
        Ok(Self {
            home,
            quiet,
            gh,
            procs,
        })
    }
}

/// Waits until every `(name, enforcement)` of `want` is listed: the Policy reports it.
async fn await_enforced(
    cluster: &Cluster,
    what: &str,
    want: &[(String, &str)],
    timeout: Duration,
) -> anyhow::Result<()> {
    let listing = "jsonpath={range .items[*]}{.metadata.name}={.status.enforcement}{\"\\n\"}{end}";
    await_condition(what, timeout, || async {
        let mut out = cluster
            .kubectl_ok(["get", "policies", "-o", listing], None)
            .await?;
        // NamespacedPolicies by name too (the tenants block names each uniquely).
        let namespaced = ["get", "namespacedpolicies", "-A", "-o", listing];
        out.push_str(&cluster.kubectl_ok(namespaced, None).await?);
        let listed: std::collections::HashSet<&str> = out.lines().collect();
        let all = want
            .iter()
            .all(|(name, enforcement)| listed.contains(format!("{name}={enforcement}").as_str()));
        Ok(all.then_some(()))
    })
    .await
}

/// Applies `count` validating Policies (the benchmark's validating ones) enforced in-process for
/// the Pods of `ns`, and waits until every one reports it.
async fn install_in_process(
    cluster: &'static Cluster,
    ns: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = (0..count)
        .map(|i| format!("bench-inproc-validate-{i}"))
        .collect();
    let mut docs = String::new();
    for name in &names {
        let p = policy(
            name,
            ns,
            json!({
                "enforcement": "InProcess",
                "validate": [{"expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))", "message": "limits required"}],
            }),
        );
        docs.push_str(&format!("---\n{}\n", serde_json::to_string(&p)?));
    }
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&docs))
        .await?;
    let want: Vec<(String, &str)> = names.iter().map(|n| (n.clone(), "InProcess")).collect();
    await_enforced(
        cluster,
        "the in-process Policies enforced",
        &want,
        Duration::from_secs(120),
    )
    .await?;
    Ok(names)
}

/// Applies the benchmark's mutating Policies for the Pods of `ns`, `count` of them, the first
/// `in_process` with `enforcement: InProcess` (priority 10, so that they precede every Policy
/// on the webhook) and the rest on the webhook after them (priority 50), and waits until each
/// is enforced where it should be.
async fn install_mutating(
    cluster: &'static Cluster,
    ns: &str,
    prefix: &str,
    count: usize,
    in_process: usize,
) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i:02}")).collect();
    let mut docs = String::new();
    for (i, name) in names.iter().enumerate() {
        let (enforcement, priority) = if i < in_process {
            ("InProcess", 10)
        } else {
            ("Webhook", 50)
        };
        let p = policy(
            name,
            ns,
            json!({
                "enforcement": enforcement,
                "priority": priority,
                "mutate": [
                    {"merge": {"metadata": {"labels": {label_of(i, false): "yes"}}}},
                    {"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}
                ],
            }),
        );
        docs.push_str(&format!("---\n{}\n", serde_json::to_string(&p)?));
    }
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&docs))
        .await?;
    let want: Vec<(String, &str)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.clone(),
                if i < in_process {
                    "InProcess"
                } else {
                    "Webhook"
                },
            )
        })
        .collect();
    await_enforced(
        cluster,
        &format!("the {prefix} Policies enforced"),
        &want,
        Duration::from_secs(180),
    )
    .await?;
    Ok(names)
}

/// What every block shares: the Policy-free phases and how many rounds they take turns for.
struct Bench<'a> {
    cluster: &'static Cluster,
    client: &'a kube::Client,
    gh: &'a Gatehouse,
    /// No webhooks, the fixed-allow floor, the patching floor.
    phases: [&'a Load<'a>; 3],
    rounds: usize,
}

impl Bench<'_> {
    /// Waits until `names` are in effect for `with`'s creates (a server dry run reaches each
    /// of them and shows every one of `labels`), then measures the phases and `with` in turns;
    /// with `profile`, also the API server's CPU profile of each phase, into that directory.
    #[allow(clippy::too_many_arguments)]
    async fn block(
        &self,
        label: &str,
        policies: usize,
        with: &Load<'_>,
        names: &[String],
        labels: Vec<String>,
        profile: Option<String>,
        beside: &[(&'static str, &Load<'_>)],
    ) -> anyhow::Result<Block> {
        let probe = pod("probe")?;
        await_condition(
            &format!("{label} in effect"),
            Duration::from_secs(300),
            || async {
                let dry_run = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                let p = with.api.create(&dry_run, &probe).await?;
                let set = p.metadata.labels.unwrap_or_default();
                let metrics = self.gh.metrics().await?;
                let decided = |name: &str| {
                    let of = format!("policy=\"{name}\"");
                    metrics.lines().any(|l| {
                        l.starts_with("gatehouse_policy_decisions_total{")
                            && l.contains(&of)
                            && !l.contains("decision=\"skipped\"")
                    })
                };
                Ok(
                    (labels.iter().all(|l| set.contains_key(l))
                        && names.iter().all(|n| decided(n)))
                    .then_some(()),
                )
            },
        )
        .await?;
        let [none, floor, patching] = self.phases;
        for load in [none, floor, patching, with]
            .into_iter()
            .chain(beside.iter().map(|(_, l)| *l))
        {
            load.warm("warm").await?;
        }
        let mut block = Block {
            label: label.to_string(),
            policies,
            entries: entry_counts(self.cluster).await?,
            none: Phase::default(),
            floor: Phase::default(),
            patching: Phase::default(),
            with: Phase::default(),
            beside: beside
                .iter()
                .map(|(label, _)| (*label, Phase::default()))
                .collect(),
            bucket: None,
            rss: None,
        };
        let before = webhook_durations(self.client, ENTRY_SUFFIX).await?.buckets;
        for round in 0..self.rounds {
            eprintln!("==> {label}: round {}/{}", round + 1, self.rounds);
            block.none.extend(none.measure("none", 1).await?);
            block.floor.extend(floor.measure("floor", 1).await?);
            block.patching.extend(patching.measure("patch", 1).await?);
            block.with.extend(with.measure("pol", 1).await?);
            for ((_, load), (_, phase)) in beside.iter().zip(block.beside.iter_mut()) {
                phase.extend(load.measure("beside", 1).await?);
            }
        }
        let after = webhook_durations(self.client, ENTRY_SUFFIX).await?.buckets;
        if let Some(dir) = profile {
            let seconds = env_usize("PROFILE_SECONDS", 20) as u64;
            std::fs::create_dir_all(&dir)?;
            for (phase, load) in [
                ("none", none),
                ("floor", floor),
                ("patching", patching),
                ("policies", with),
            ] {
                let path = std::path::Path::new(&dir).join(format!("{phase}.pprof"));
                let creates = load.profile(self.cluster, "prof", seconds, &path).await?;
                eprintln!("==> profile {}: {creates} creates", path.display());
            }
        }
        block.bucket = bucket_p99(&before, &after);
        block.rss = self.gh.rss_kib();
        Ok(block)
    }
}

/// The number of Gatehouse's mutating and validating entries (its self entry left out).
async fn entry_counts(cluster: &Cluster) -> anyhow::Result<(usize, usize)> {
    let mut counts = [0, 0];
    for (count, kind) in counts.iter_mut().zip([
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
    ]) {
        let out = cluster
            .kubectl_ok(["get", kind, "gatehouse", "-o", "json"], None)
            .await?;
        let cfg: Value = serde_json::from_str(&out)?;
        *count = cfg["webhooks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| {
                w["name"].as_str().is_some_and(|n| {
                    n.ends_with(".mutate.gatehouse.dev") || n.ends_with(".validate.gatehouse.dev")
                })
            })
            .count();
    }
    Ok((counts[0], counts[1]))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count = env_usize("PODS", 500);
    let rounds = env_usize("ROUNDS", 5).max(1);
    let distinct = std::env::var("LABELS").is_ok_and(|v| v == "distinct");
    let concurrency = env_usize("CONCURRENCY", 50);
    match std::env::var("BLOCK").as_deref() {
        Ok("tenants") => return tenants::run(count, rounds, concurrency).await,
        Ok("crossover") => return crossover::run(count, rounds, concurrency).await,
        _ => {}
    }
    let cluster = cluster().await;
    let client = cluster.client().await?;
    let home = TestNamespace::new(cluster, "bench-home").await?;
    // One namespace per phase, so that the phases can take turns round by round: the Policies
    // select `ns`; the floors' entries select their own; Gatehouse's shared entries leave out
    // all three others, as they leave out kube-system.
    let ns = TestNamespace::new(cluster, "bench-load").await?;
    let scoped_ns = TestNamespace::new(cluster, "bench-scoped").await?;
    let quiet = TestNamespace::new(cluster, "bench-none").await?;
    let allow_ns = TestNamespace::new(cluster, "bench-floor").await?;
    let patch_ns = TestNamespace::new(cluster, "bench-patch").await?;
    // The in-process phase's namespace: selected by the in-process Policies only (not excluded,
    // or their generated policies would leave it out too).
    let inproc_ns = TestNamespace::new(cluster, "bench-inproc").await?;
    // The in-process mutating phases' namespaces: 16 mutating Policies in-process; 12 of them
    // in-process and 4 on the webhook.
    let inmut_ns = TestNamespace::new(cluster, "bench-inmut").await?;
    let mixed_ns = TestNamespace::new(cluster, "bench-mixed").await?;
    // One mutating Policy in-process: what one mutation of the generated policy costs.
    let one_ns = TestNamespace::new(cluster, "bench-inone").await?;
    let excluded = format!(
        "kube-system,kube-node-lease,{},{},{}",
        quiet.name(),
        allow_ns.name(),
        patch_ns.name()
    );
    let gh = Gatehouse::start(
        cluster,
        home.name(),
        Options::service()
            .default_logging()
            .arg("--exclude-namespaces", &excluded),
    )
    .await?;
    let mut procs = processes(cluster.state_dir(), gh.pid());
    let api = |ns: &TestNamespace| Api::<Pod>::namespaced(client.clone(), ns.name());
    let (api_policies, api_none, api_floor, api_patch) =
        (api(&ns), api(&quiet), api(&allow_ns), api(&patch_ns));
    let api_scoped = api(&scoped_ns);
    let api_inproc = api(&inproc_ns);
    let (api_inmut, api_mixed, api_one) = (api(&inmut_ns), api(&mixed_ns), api(&one_ns));
    // The floor: as many entries as Gatehouse's shared ones, answered by a server that does no
    // work (a fixed allow, no patch). What they add is the API server's own cost of calling 2
    // webhooks per create on this machine, which no webhook implementation can get under.
    let allowing = FixedHook::start(cluster, "bench-allowing", home.name(), allow()).await?;
    // The same, with the mutating entry answering the Policies' change as a fixed patch: the
    // floor for a mutating workload, since applying a patch (and storing the larger object)
    // costs the API server what no webhook can save it.
    let patcher = FixedHook::start(cluster, "bench-patcher", home.name(), fixed_patch()).await?;
    // The fixed webhooks' CPU: each runs on a thread of its own in this process.
    for (name, hook) in [("fixed allow", &allowing), ("fixed patch", &patcher)] {
        if let Some(tid) = hook.server.thread_id() {
            procs.push((name.into(), tid));
        }
    }
    let load = |api, servers, entries| Load {
        api,
        client: &client,
        procs: &procs,
        servers,
        entries,
        count,
        concurrency,
    };
    let hooks = Servers::Hooks(&allowing.server, &patcher.server);
    let suffixes = FLOORS.map(|f| format!(".{f}{FLOOR_SUFFIX}"));
    let (policies, none, floor, patching) = (
        load(&api_policies, Servers::Gatehouse(&gh), Some(ENTRY_SUFFIX)),
        load(&api_none, Servers::None, None),
        load(&api_floor, hooks, Some(&suffixes[0])),
        load(&api_patch, hooks, Some(&suffixes[1])),
    );
    let in_process = load(&api_inproc, Servers::None, None);
    let inproc_names = install_in_process(cluster, inproc_ns.name(), 16).await?;
    let mutating_in_process = load(&api_inmut, Servers::None, None);
    let mixed = load(&api_mixed, Servers::Gatehouse(&gh), Some(ENTRY_SUFFIX));
    // `IN_PROCESS_MUTATING=one` installs only the one-Policy phase: the generated policy then
    // holds that Policy's mutation alone, what one in-process Policy costs the API server.
    let only_one = std::env::var("IN_PROCESS_MUTATING").is_ok_and(|v| v == "one");
    let mut inmut_names = Vec::new();
    if !only_one {
        inmut_names
            .extend(install_mutating(cluster, inmut_ns.name(), "bench-inmut", 16, 16).await?);
        inmut_names
            .extend(install_mutating(cluster, mixed_ns.name(), "bench-mixed", 16, 12).await?);
    }
    let one_in_process = load(&api_one, Servers::None, None);
    inmut_names.extend(install_mutating(cluster, one_ns.name(), "bench-inone", 1, 1).await?);

    install_floor(
        cluster,
        FLOORS[0],
        &floor,
        allow_ns.name(),
        (&allowing, &allowing),
    )
    .await?;
    install_floor(
        cluster,
        FLOORS[1],
        &patching,
        patch_ns.name(),
        (&patcher, &allowing),
    )
    .await?;

    let bench = Bench {
        cluster,
        client: &client,
        gh: &gh,
        phases: [&none, &floor, &patching],
        rounds,
    };
    let mut blocks: Vec<Block> = Vec::new();

    // 16 Policies over 4 namespace scopes (SCOPED=off leaves it out): each team's Policies select
    // Namespaces by a label of their own, so no union of their selectors is exact and each scope
    // gets entries of its own; the creates are in one team's namespace.
    if std::env::var("SCOPED").map_or(true, |v| v != "off") {
        cluster
            .kubectl_ok(
                [
                    "label",
                    "namespace",
                    scoped_ns.name(),
                    &format!("{}=yes", scope_key(0)),
                ],
                None,
            )
            .await?;
        let scoped = load(&api_scoped, Servers::Gatehouse(&gh), Some(ENTRY_SUFFIX));
        let mut docs = String::new();
        let mut scoped_names = Vec::new();
        for scope in 0..SCOPES {
            for j in 0..16 / SCOPES / 2 {
                let (d, pair) = scoped_policies(scope, j)?;
                docs.push_str(&d);
                scoped_names.extend(pair);
            }
        }
        cluster
            .kubectl_ok(["apply", "-f", "-"], Some(&docs))
            .await?;
        let applying: Vec<String> = scoped_names
            .iter()
            .filter(|n| n.starts_with("bench-scope0-"))
            .cloned()
            .collect();
        let labels = (0..16 / SCOPES / 2).map(|j| scoped_label(0, j)).collect();
        let label = format!("16 Policies over {SCOPES} namespace scopes (creates in one scope)");
        blocks.push(
            bench
                .block(&label, 16, &scoped, &applying, labels, None, &[])
                .await?,
        );
        let mut delete = vec!["delete", "policies", "--wait=false"];
        delete.extend(scoped_names.iter().map(String::as_str));
        cluster.kubectl_ok(delete, None).await?;
        await_condition(
            "the scoped entries gone",
            Duration::from_secs(60),
            || async { Ok((entry_counts(cluster).await? == (0, 0)).then_some(())) },
        )
        .await?;
    }

    // Policies, in steps of 16, 64 and 256 (half mutating, half validating); with each step
    // the four phases take turns, round by round, so that a slow stretch of this shared
    // machine falls on all of them.
    let mut names: Vec<String> = Vec::new();
    // `POLICIES` (comma-separated, default 16,64,256) chooses the steps.
    let steps: Vec<usize> = std::env::var("POLICIES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![16, 64, 256]);
    for total in steps {
        let mut docs = String::new();
        for i in names.len() / 2..total / 2 {
            let (d, pair) = bench_policies(i, ns.name(), distinct)?;
            docs.push_str(&d);
            names.extend(pair);
        }
        cluster
            .kubectl_ok(["apply", "-f", "-"], Some(&docs))
            .await?;
        let labels = (0..total / 2).map(|i| label_of(i, distinct)).collect();
        let profiled = env_usize("PROFILE_POLICIES", 16);
        let profile = std::env::var("PROFILE").ok().filter(|_| total == profiled);
        let label = format!("{total} Policies");
        let beside: Vec<(&'static str, &Load<'_>)> = if total == 16 && only_one {
            vec![(BESIDE[0], &in_process), (BESIDE[3], &one_in_process)]
        } else if total == 16 {
            vec![
                (BESIDE[0], &in_process),
                (BESIDE[1], &mutating_in_process),
                (BESIDE[2], &mixed),
                (BESIDE[3], &one_in_process),
            ]
        } else {
            Vec::new()
        };
        blocks.push(
            bench
                .block(&label, total, &policies, &names, labels, profile, &beside)
                .await?,
        );
    }
    allowing.server.shutdown();
    patcher.server.shutdown();

    report(&blocks, &procs, count, concurrency, rounds, distinct);

    let mut delete = vec!["delete", "policies", "--wait=false"];
    delete.extend(
        names
            .iter()
            .chain(&inproc_names)
            .chain(&inmut_names)
            .map(String::as_str),
    );
    cluster.kubectl_ok(delete, None).await?;
    for name in FLOORS {
        cluster
            .kubectl_ok(
                [
                    "delete",
                    "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                    name,
                ],
                None,
            )
            .await?;
    }
    gh.shutdown().await?;
    for namespace in [
        ns, scoped_ns, quiet, allow_ns, patch_ns, inproc_ns, inmut_ns, mixed_ns, one_ns, home,
    ] {
        namespace.cleanup().await?;
    }
    if blocks.iter().any(|b| b.with.p99().is_zero()) {
        bail!("no samples");
    }
    Ok(())
}

/// Prints the tables and the goals.
fn report(
    blocks: &[Block],
    procs: &[(String, u32)],
    count: usize,
    concurrency: usize,
    rounds: usize,
    distinct: bool,
) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    let ratio = |a: &Phase, b: &Phase| a.p99().as_secs_f64() / b.p99().as_secs_f64();
    println!(
        "{count} Pod creates at concurrency {concurrency}; with each number of Policies the four phases take turns for {rounds} rounds; figures: the median over the rounds; {}",
        if distinct {
            "each mutating Policy sets a label of its own"
        } else {
            "the mutating Policies set 8 labels among them (the same stored Pod in every phase)"
        }
    );
    for b in blocks {
        println!();
        println!("{}", b.label);
        println!(
            "| phase | avg | p95 | p99 | p99 of each round (ms) | p99 / none | p99 / 2-webhook floor | p99 / patching floor |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
        let row = |label: &str, p: &Phase| {
            println!(
                "| {label} | {} | {} | {} | {} | {:.2}x | {:.2}x | {:.2}x |",
                ms(p.median(|s| s.avg)),
                ms(p.median(|s| s.p95)),
                ms(p.p99()),
                p.p99s(),
                ratio(p, &b.none),
                ratio(p, &b.floor),
                ratio(p, &b.patching),
            )
        };
        row("no webhooks", &b.none);
        row("2 fixed-allow webhooks (floor)", &b.floor);
        row(
            "2 fixed webhooks, the mutating one patching as 16 Policies do",
            &b.patching,
        );
        row(&b.label, &b.with);
        for (label, p) in &b.beside {
            row(label, p);
        }
        let per_create = |p: &Phase| p.calls / (p.rounds.len() * count).max(1) as f64;
        println!(
            "Gatehouse entries: {} mutating, {} validating; webhook calls per create: floor {:.2}, patching floor {:.2}, Policies {:.2}",
            b.entries.0,
            b.entries.1,
            per_create(&b.floor),
            per_create(&b.patching),
            per_create(&b.with),
        );
        println!(
            "API server apiserver_admission_webhook_admission_duration_seconds p99 for Gatehouse entries: {}",
            b.bucket.clone().unwrap_or_else(|| "no samples".into())
        );
        println!("CPU seconds per round of {count} creates (2-core machine, everything on it):");
        for (i, (name, _)) in procs.iter().enumerate() {
            let in_process: String = b
                .beside
                .iter()
                .map(|(label, p)| format!(", {label} {:.2} s", p.cpu_per_round(i)))
                .collect();
            println!(
                "  {:<16} none {:.2} s, floor {:.2} s, patching floor {:.2} s, {} Policies {:.2} s{in_process}",
                name,
                b.none.cpu_per_round(i),
                b.floor.cpu_per_round(i),
                b.patching.cpu_per_round(i),
                b.policies,
                b.with.cpu_per_round(i),
            );
        }
        println!(
            "Mean webhook call as the API server timed it: floor {:.2} ms, patching floor {:.2} ms, {} Policies {:.2} ms",
            b.floor.mean_call_ms(),
            b.patching.mean_call_ms(),
            b.policies,
            b.with.mean_call_ms(),
        );
        println!(
            "New TLS connections to the webhook servers per round: floor {:.0}, patching floor {:.0}, {} Policies {:.0}",
            b.floor.connections_per_round(),
            b.patching.connections_per_round(),
            b.policies,
            b.with.connections_per_round(),
        );
        println!(
            "Gatehouse RSS after the {}-Policy block: {} KiB",
            b.policies,
            b.rss.map(|r| r.to_string()).unwrap_or("?".into())
        );
    }
    let of = |n: usize| blocks.iter().find(|b| b.label == format!("{n} Policies"));
    if let (Some(b16), Some(b256)) = (of(16), of(256)) {
        println!();
        println!(
            "goals: p99(16) / floor = {:.2}x (<= 1.10), p99(16) / none = {:.2}x (<= 1.15), p99(256) / p99(16) = {:.2}x (<= 1.15; {:.2}x with each against the floor measured beside it); p99(16) / patching floor = {:.2}x",
            ratio(&b16.with, &b16.floor),
            ratio(&b16.with, &b16.none),
            ratio(&b256.with, &b16.with),
            ratio(&b256.with, &b256.floor) / ratio(&b16.with, &b16.floor),
            ratio(&b16.with, &b16.patching),
        );
        let beside = |label: &str| b16.beside.iter().find(|(l, _)| *l == label).map(|(_, p)| p);
        if let Some(p) = beside(BESIDE[0]) {
            println!(
                "in-process goal: p99(16 validating Policies in-process) / none = {:.2}x (<= 1.05)",
                ratio(p, &b16.none)
            );
        }
        if let Some(p) = beside(BESIDE[1]) {
            println!(
                "in-process mutation goal: p99(16 mutating Policies in-process) / none = {:.2}x (<= 1.10); / patching floor = {:.2}x",
                ratio(p, &b16.none),
                ratio(p, &b16.patching)
            );
        }
        if let Some(p) = beside(BESIDE[3]) {
            println!(
                "one mutating Policy in-process (one mutation of the generated policy): p99 / none = {:.2}x",
                ratio(p, &b16.none)
            );
        }
        if let Some(p) = beside(BESIDE[2]) {
            println!(
                "mixed (12 mutating Policies in-process, 4 on the webhook): p99 / none = {:.2}x, / patching floor = {:.2}x",
                ratio(p, &b16.none),
                ratio(p, &b16.patching)
            );
        }
    }
}
