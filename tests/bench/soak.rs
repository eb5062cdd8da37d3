//! Sustained load (numbers for RELIABILITY.md; not a test): admission reviews sent to a running
//! `gatehouse run` over loopback TLS at a steady rate for several minutes, the way the API server
//! sends them (keep-alive connections, the entry's URL and caBundle re-read from the live
//! configuration every second), while Policies change every two seconds and the CA and serving
//! certificate rotate. Prints failed reviews (the goal is zero), latency percentiles, and
//! Gatehouse's RSS at the start and the end.
//!
//! `tests/bench/soak` runs it. Environment: RATE (reviews/s, default 200), DURATION (seconds,
//! default 300), CONNECTIONS (default 16).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use gatehouse_e2e::instance::{Gatehouse, Options};
use gatehouse_e2e::{
    Cluster, Http1 as Sender, TestNamespace, TlsClient, cluster, install_crypto_provider,
    tls_client,
};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the API server would know of the entry: its URL path and the trust of its caBundle.
struct Entry {
    path: String,
    tls: TlsClient,
    bundle: String,
}

fn policy(name: &str, ns: &str, spec: Value) -> String {
    let mut spec = spec;
    spec["match"] = json!({
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
    });
    // The soak measures the webhook path.
    spec["enforcement"] = json!("Webhook");
    json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": name}, "spec": spec})
        .to_string()
}

/// The mutating configuration's entry (there is one group here) as the API server reads it.
async fn read_entry(cluster: &Cluster) -> anyhow::Result<Option<(String, String)>> {
    let out = cluster
        .kubectl_ok(
            [
                "get",
                "mutatingwebhookconfiguration",
                "gatehouse",
                "-o",
                "json",
                "--ignore-not-found",
            ],
            None,
        )
        .await?;
    if out.trim().is_empty() {
        return Ok(None);
    }
    let cfg: Value = serde_json::from_str(&out)?;
    let Some(w) = cfg["webhooks"].as_array().and_then(|ws| ws.first()) else {
        return Ok(None);
    };
    let url = w["clientConfig"]["url"]
        .as_str()
        .context("entry without URL")?;
    let path = url
        .split_once("://")
        .and_then(|(_, r)| r.find('/').map(|i| r[i..].to_owned()));
    let bundle = w["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok(path.map(|p| (p, bundle)))
}

fn trust(bundle_b64: &str) -> anyhow::Result<TlsClient> {
    use base64::Engine;
    tls_client(base64::engine::general_purpose::STANDARD.decode(bundle_b64)?)
}

fn review(uid: &str, ns: &str) -> Bytes {
    Bytes::from(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": uid, "operation": "CREATE", "namespace": ns,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {"username": "soak"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": ns},
                       "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}]}},
        }})
        .to_string(),
    )
}

/// One review over `sender`: Ok(true) when answered 200 with the review's uid and allowed.
async fn send(sender: &mut Sender, path: &str, body: Bytes, uid: &str) -> anyhow::Result<bool> {
    sender.ready().await?;
    let req = hyper::Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(body))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(status == 200 && v["response"]["uid"] == uid && v["response"]["allowed"] == true)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let (rate, seconds, connections) = (
        env_u64("RATE", 200),
        env_u64("DURATION", 300),
        env_u64("CONNECTIONS", 16) as usize,
    );
    let cluster = cluster().await;
    let home = TestNamespace::new(cluster, "gh-soak-home").await?;
    let ns = TestNamespace::new(cluster, "gh-soak").await?;
    let gh = Gatehouse::start(
        cluster,
        home.name(),
        Options::url()
            .default_logging()
            .arg("--ca-validity", "90s")
            .arg("--cert-validity", "20s")
            .arg("--bundle-propagation", "3s"),
    )
    .await?;
    let result = run(cluster, &gh, ns.name(), rate, seconds, connections).await;
    let names = (0..4)
        .map(|i| format!("soak-validate-{i}"))
        .chain(["soak-mutate".to_owned()]);
    let mut delete = vec![
        "delete".to_owned(),
        "policy".to_owned(),
        "--ignore-not-found".to_owned(),
    ];
    delete.extend(names);
    cluster.kubectl_ok(&delete, None).await?;
    gh.shutdown().await?;
    ns.cleanup().await?;
    home.cleanup().await?;
    result
}

async fn run(
    cluster: &'static Cluster,
    gh: &Gatehouse,
    ns: &str,
    rate: u64,
    seconds: u64,
    connections: usize,
) -> anyhow::Result<()> {
    let mutate = |value: u64| {
        policy(
            "soak-mutate",
            ns,
            json!({"mutate": [{"merge": {"metadata": {"labels": {"soak": value.to_string()}}}}]}),
        )
    };
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&mutate(0)))
        .await?;
    let (path, bundle) = loop {
        if let Some(found) = read_entry(cluster).await? {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let entry = Arc::new(Mutex::new(Entry {
        path,
        tls: trust(&bundle)?,
        bundle,
    }));
    let rss_start = gh.rss_kib().context("no RSS")?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let latencies = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let rotations = Arc::new(AtomicUsize::new(0));
    // RSS every 30 s: flat means it stops growing once caches and allocator pools are warm.
    let rss_series = {
        let pid = gh.pid().context("gatehouse is not running")?;
        tokio::spawn(async move {
            let mut series = Vec::new();
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_secs(30)).await;
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let kib = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .unwrap_or(0);
                series.push(format!("{:.1}", kib as f64 / 1024.0));
            }
            series
        })
    };

    // The API server's view of the configuration, refreshed every second.
    let watcher = {
        let (entry, rotations) = (entry.clone(), rotations.clone());
        tokio::spawn(async move {
            while Instant::now() < deadline {
                if let Ok(Some((path, bundle))) = read_entry(cluster).await {
                    let mut e = entry.lock().expect("entry lock");
                    if bundle != e.bundle
                        && let Ok(tls) = trust(&bundle)
                    {
                        e.tls = tls;
                        e.bundle = bundle;
                        rotations.fetch_add(1, Ordering::Relaxed);
                    }
                    e.path = path;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    // Policy churn: the mutating Policy's label changes, validating Policies come and go.
    let churn = {
        let ns = ns.to_owned();
        tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let doc = if i.is_multiple_of(2) {
                    policy(
                        "soak-mutate",
                        &ns,
                        json!({"mutate": [{"merge": {"metadata": {"labels": {"soak": i.to_string()}}}}]}),
                    )
                } else {
                    let name = format!("soak-validate-{}", i % 4);
                    policy(
                        &name,
                        &ns,
                        json!({"failurePolicy": "Ignore", "validate": [{"expression": format!("object.metadata.name.size() < {}", 100 + i), "message": "short names"}]}),
                    )
                };
                let _ = cluster.kubectl_ok(["apply", "-f", "-"], Some(&doc)).await;
                if i.is_multiple_of(7) {
                    let name = format!("soak-validate-{}", i % 4);
                    let _ = cluster
                        .kubectl_ok(
                            [
                                "delete",
                                "policy",
                                &name,
                                "--ignore-not-found",
                                "--wait=false",
                            ],
                            None,
                        )
                        .await;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            i
        })
    };

    // The load: a steady rate, spread over keep-alive connections that reconnect every 5 s (so
    // new handshakes meet rotated certificates) or after an error.
    let per_connection = Duration::from_secs_f64(connections as f64 / rate as f64);
    let mut workers = Vec::new();
    for w in 0..connections {
        let (entry, sent, failed, latencies, ns) = (
            entry.clone(),
            sent.clone(),
            failed.clone(),
            latencies.clone(),
            ns.to_owned(),
        );
        let port = gh.port;
        workers.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(per_connection);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut conn: Option<(Sender, Instant)> = None;
            let mut n = 0u64;
            while Instant::now() < deadline {
                ticker.tick().await;
                n += 1;
                let (path, tls) = {
                    let e = entry.lock().expect("entry lock");
                    (e.path.clone(), e.tls.clone())
                };
                if conn
                    .as_ref()
                    .is_none_or(|(_, since)| since.elapsed() > Duration::from_secs(5))
                {
                    conn = tls.http1(port).await.ok().map(|s| (s, Instant::now()));
                }
                let uid = format!("soak-{w}-{n}");
                let started = Instant::now();
                let ok = match conn.as_mut() {
                    Some((sender, _)) => send(sender, &path, review(&uid, &ns), &uid)
                        .await
                        .unwrap_or(false),
                    None => false,
                };
                sent.fetch_add(1, Ordering::Relaxed);
                if ok {
                    latencies
                        .lock()
                        .expect("latency lock")
                        .push(started.elapsed());
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                    eprintln!("review {uid} failed");
                    conn = None;
                }
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let churned = churn.await?;
    watcher.await?;
    let rss_end = gh.rss_kib().context("no RSS")?;
    let series = rss_series.await?;
    let mut l = latencies.lock().expect("latency lock").clone();
    if l.is_empty() {
        bail!("no review succeeded");
    }
    l.sort();
    let q = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)];
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("| soak | value |");
    println!("|---|---|");
    println!(
        "| duration, target rate | {seconds} s at {rate} reviews/s over {connections} keep-alive connections |"
    );
    println!("| reviews sent / failed | {sent} / {failed} |");
    println!(
        "| Policy changes / CA bundle changes seen | {churned} / {} |",
        rotations.load(Ordering::Relaxed)
    );
    println!(
        "| latency p50 / p99 / max | {:?} / {:?} / {:?} |",
        q(0.50),
        q(0.99),
        l[l.len() - 1]
    );
    println!(
        "| Gatehouse RSS start / end | {:.1} MiB / {:.1} MiB |",
        rss_start as f64 / 1024.0,
        rss_end as f64 / 1024.0
    );
    println!("| RSS every 30 s (MiB) | {} |", series.join(", "));
    if failed > 0 {
        bail!("{failed} of {sent} reviews failed");
    }
    Ok(())
}
