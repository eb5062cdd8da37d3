//! Hostile input to a running `gatehouse run`, over real TLS: a corpus of bad requests, each with
//! the answer it must get (status and message), then slow and idle clients, old TLS versions and
//! plain HTTP. Afterwards a valid review is still answered correctly and the process still runs.
//! The table of cases is RELIABILITY.md's; this test is its proof.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, TlsClient, tls_client};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::fixtures::{apply_ready, decode_secret_key, get_json, label, policy};
use crate::scene::{Scene, scenario};

/// What came back: the status of the first response (None when the connection closed or the
/// handshake failed without one) and its body.
#[derive(Debug)]
struct Answer {
    status: Option<u16>,
    body: String,
}

struct Target {
    port: u16,
    tls: TlsClient,
    ca_file: PathBuf,
}

impl Target {
    async fn connect(&self) -> anyhow::Result<TlsStream<TcpStream>> {
        self.tls.connect(self.port).await
    }

    /// Writes `bytes` over a new TLS connection and reads the first response.
    async fn raw(&self, bytes: &[u8]) -> anyhow::Result<Answer> {
        let mut tls = self.connect().await?;
        tls.write_all(bytes).await?;
        tls.flush().await?;
        read_response(&mut tls, Duration::from_secs(20)).await
    }

    async fn curl(&self, args: &[&str]) -> anyhow::Result<Answer> {
        let out = tokio::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "30",
                "-w",
                "\n%{http_code}",
                "--cacert",
            ])
            .arg(&self.ca_file)
            .args(args)
            .output()
            .await
            .context("running curl")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok(Answer {
            status: code.trim().parse().ok().filter(|c| *c != 0),
            body: format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }
}

/// Reads one HTTP/1.1 response (headers, then Content-Length bytes), or what there is when the
/// peer closes.
async fn read_response(
    tls: &mut TlsStream<TcpStream>,
    timeout: Duration,
) -> anyhow::Result<Answer> {
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    break;
                }
            }
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(timeout, read).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok());
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok(Answer { status, body })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// An HTTP/1.1 POST with a correct Content-Length; the connection closes after the answer.
fn post(path: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

fn review(uid: &str, ns: &str, kind: &str, object: Value) -> Value {
    let resource = format!("{}s", kind.to_lowercase());
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": "hostile"},
            "object": object,
            "dryRun": false,
        }
    })
}

fn pod(ns: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": ns, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1",
                                 "resources": {"limits": {"cpu": "1"}}}]},
    })
}

/// The review answer inside a 200: (allowed, patch present, message).
fn verdict(answer: &Answer) -> Option<(bool, bool, String)> {
    let v: Value = serde_json::from_str(&answer.body).ok()?;
    let r = &v["response"];
    Some((
        r["allowed"].as_bool()?,
        r["patch"].is_string(),
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    ))
}

/// One case: its answer must have `status` and contain `says`.
fn expect(name: &str, answer: &Answer, status: Option<u16>, says: &str) -> anyhow::Result<()> {
    ensure!(
        answer.status == status && answer.body.contains(says),
        "{name}: expected {status:?} saying {says:?}, got {:?}: {}",
        answer.status,
        answer.body.chars().take(300).collect::<String>()
    );
    eprintln!("ok  {name}: {status:?} {says:?}");
    Ok(())
}

/// One category of the corpus against a Gatehouse of its own, with the three Policies the cases
/// aim at; afterwards a valid review is still answered correctly, the process still runs and
/// it never panicked.
async fn hostile(category: Category) {
    scenario(
        &format!("gh-hostile-{}", category.name()),
        Options::url(),
        async |scene| {
            let c = Corpus::open(scene).await?;
            match category {
                Category::Bodies => not_reviews(&c).await?,
                Category::Reviews => unusual_reviews(&c).await?,
                Category::Http => broken_http(&c).await?,
                Category::Tls => old_tls_and_plain_http(&c).await?,
                Category::SlowClients => slow_and_idle_clients(&c).await?,
            }
            still_answers(&c).await?;
            ensure!(
                scene.gh.pid().is_some(),
                "gatehouse exited during the corpus"
            );
            let log = scene.gh.log();
            ensure!(!log.contains("panicked"), "gatehouse panicked: {log}");
            Ok(())
        },
    )
    .await;
}

/// The corpus's categories, one test each.
#[derive(Clone, Copy)]
enum Category {
    Bodies,
    Reviews,
    Http,
    Tls,
    SlowClients,
}

impl Category {
    fn name(self) -> &'static str {
        match self {
            Category::Bodies => "bodies",
            Category::Reviews => "reviews",
            Category::Http => "http",
            Category::Tls => "tls",
            Category::SlowClients => "slow",
        }
    }
}

#[tokio::test]
async fn bodies_that_are_not_reviews_get_400_saying_what_is_wrong() {
    hostile(Category::Bodies).await;
}

#[tokio::test]
async fn unusual_but_valid_reviews_are_answered() {
    hostile(Category::Reviews).await;
}

#[tokio::test]
async fn broken_http_gets_the_status_that_says_why() {
    hostile(Category::Http).await;
}

#[tokio::test]
async fn old_tls_and_plain_http_are_refused() {
    hostile(Category::Tls).await;
}

#[tokio::test]
async fn slow_and_idle_clients_are_cut_off_while_others_are_served() {
    hostile(Category::SlowClients).await;
}

const JSON: &str = "application/json";

/// A running Gatehouse with the corpus's Policies, and what the cases send.
struct Corpus<'s> {
    scene: &'s Scene,
    t: Target,
    /// The paths of the entries holding the mutating and the validating Policies.
    mutate: String,
    validate: String,
    /// A valid review of a Pod both entries answer.
    good: String,
}

impl<'s> Corpus<'s> {
    async fn open(scene: &'s Scene) -> anyhow::Result<Corpus<'s>> {
        let [inject, limits, heavy] = [
            scene.policy("inject"),
            scene.policy("limits"),
            scene.policy("heavy"),
        ];
        let (inject, limits, heavy) = (&inject, &limits, &heavy);
        let (cluster, gh, home, ns) = (scene.cluster, &scene.gh, scene.home(), scene.ns());
        let validates = |expression: &str, message: &str| json!({"priority": 10, "validate": [{"expression": expression, "message": message}]});
        apply_ready(cluster, &policy(inject, ns, label(10, "injected", "yes"))).await?;
        apply_ready(
            cluster,
            &policy(
                limits,
                ns,
                validates(
                    "object.spec.containers.all(c, has(c.resources.limits))",
                    "every container must declare limits",
                ),
            ),
        )
        .await?;
        // Cheap for the write-time estimate's 100 annotations, far over budget for 3,000.
        apply_ready(
        cluster,
        &policy(heavy, ns, validates("object.metadata.annotations.all(a, object.metadata.annotations.all(b, a == b || object.metadata.annotations[a] != object.metadata.annotations[b] || true))", "never false")),
    )
    .await?;
        let (mutate, validate) = entry_paths(cluster, inject, limits).await?;

        let secret = get_json(cluster, &["secret", "gatehouse-tls", "-n", home])
            .await?
            .context("no TLS Secret")?;
        let ca = decode_secret_key(&secret, "ca.crt")?;
        let ca_file = cluster
            .state_dir()
            .join(format!("hostile-ca-{}.pem", std::process::id()));
        std::fs::write(&ca_file, &ca)?;
        let tls = tls_client(&ca)?;
        let t = Target {
            port: gh.port,
            tls,
            ca_file,
        };
        let good = review("good", ns, "Pod", pod(ns, json!({}))).to_string();
        Ok(Corpus {
            scene,
            t,
            mutate,
            validate,
            good,
        })
    }
}

/// Bodies that are not an AdmissionReview: 400, saying what is wrong.
async fn not_reviews(c: &Corpus<'_>) -> anyhow::Result<()> {
    let Corpus {
        scene,
        t,
        mutate,
        good,
        ..
    } = c;
    let ns = scene.ns();
    let json_type = JSON;
    // Bodies that are not an AdmissionReview.
    let not_reviews: Vec<(&str, Vec<u8>, &str)> = vec![
        ("malformed JSON", b"{\"apiVersion\": ".to_vec(), "not JSON"),
        ("truncated review", good.as_bytes()[..good.len() / 2].to_vec(), "not JSON"),
        ("empty body", Vec::new(), "not JSON"),
        ("binary garbage", vec![0xff, 0x00, 0x13, 0x37, 0x80], "not JSON"),
        ("invalid UTF-8 inside a string", [b"{\"apiVersion\": \"".as_slice(), &[0xc3, 0x28], b"\"}"].concat(), "not JSON"),
        ("a UTF-8 byte-order mark", [&[0xef, 0xbb, 0xbf][..], good.as_bytes()].concat(), "not JSON"),
        ("a number too large for JSON", b"{\"apiVersion\": 1e400}".to_vec(), "not JSON"),
        ("a JSON array", b"[]".to_vec(), "not a JSON object"),
        ("a JSON string", b"\"AdmissionReview\"".to_vec(), "not a JSON object"),
        ("JSON null", b"null".to_vec(), "not a JSON object"),
        ("a Pod instead of a review", pod(ns, json!({})).to_string().into_bytes(), "apiVersion \\\"v1\\\""),
        ("apiVersion v1beta1", good.replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1").into_bytes(), "unsupported AdmissionReview apiVersion"),
        ("kind AdmissionResponse", good.replace("\"AdmissionReview\"", "\"AdmissionResponse\"").into_bytes(), "unsupported kind"),
        ("no request", json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string().into_bytes(), "missing \\\"request\\\""),
        ("request is a string", json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": "x"}).to_string().into_bytes(), "missing \\\"request\\\""),
        ("no uid", good.replace("\"uid\":\"good\",", "").into_bytes(), "request.uid"),
        ("empty uid", good.replace("\"uid\":\"good\"", "\"uid\":\"\"").into_bytes(), "request.uid"),
        ("uid is a number", good.replace("\"uid\":\"good\"", "\"uid\":7").into_bytes(), "request.uid"),
        ("operation *", good.replace("\"CREATE\"", "\"*\"").into_bytes(), "is not an operation"),
        ("an unknown operation", good.replace("\"CREATE\"", "\"EXPLODE\"").into_bytes(), "request:"),
        ("10,000-deep nesting", format!("{{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{{\"uid\":\"deep\",\"object\":{}{}}}}}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes(), "recursion limit"),
    ];
    ensure!(
        good.contains("\"uid\":\"good\",") && good.contains("\"CREATE\""),
        "the corpus edits no longer apply to {good}"
    );
    for (name, body, says) in not_reviews {
        expect(
            name,
            &t.raw(&post(mutate, json_type, &body)).await?,
            Some(400),
            says,
        )?;
    }
    Ok(())
}

/// Valid reviews of things the Policies do not expect, and unusual but valid JSON.
async fn unusual_reviews(c: &Corpus<'_>) -> anyhow::Result<()> {
    let Corpus {
        scene,
        t,
        mutate,
        validate,
        good,
        ..
    } = c;
    let ns = scene.ns();
    let json_type = JSON;
    // Valid reviews of things the Policies do not expect, and unusual but valid JSON.
    let configmap = review(
        "cm",
        ns,
        "ConfigMap",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}}),
    );
    let answer = t
        .raw(&post(mutate, json_type, configmap.to_string().as_bytes()))
        .await?;
    expect(
        "a ConfigMap to a Pod Policy",
        &answer,
        Some(200),
        "\"allowed\":true",
    )?;
    ensure!(
        verdict(&answer).is_some_and(|(_, patch, _)| !patch),
        "a ConfigMap was patched: {}",
        answer.body
    );
    let duplicated = good.replacen("\"uid\":\"good\"", "\"uid\":\"first\",\"uid\":\"good\"", 1);
    expect(
        "a repeated key (the last wins)",
        &t.raw(&post(mutate, json_type, duplicated.as_bytes()))
            .await?,
        Some(200),
        "\"uid\":\"good\"",
    )?;
    let many: Vec<Value> = (0..400_000).map(|i| json!(i)).collect();
    let mut huge = pod(ns, json!({}));
    huge["spec"]["extra"] = Value::Array(many);
    let answer = t
        .raw(&post(
            mutate,
            json_type,
            review("huge", ns, "Pod", huge).to_string().as_bytes(),
        ))
        .await?;
    expect(
        "a 400,000-element array",
        &answer,
        Some(200),
        "\"allowed\":true",
    )?;
    let annotations: serde_json::Map<String, Value> =
        (0..3000).map(|i| (format!("a{i}"), json!("v"))).collect();
    let answer = t
        .raw(&post(
            validate,
            json_type,
            review("heavy", ns, "Pod", pod(ns, Value::Object(annotations)))
                .to_string()
                .as_bytes(),
        ))
        .await?;
    expect(
        "CEL over its cost budget at run time",
        &answer,
        Some(200),
        "cost budget",
    )?;
    ensure!(
        verdict(&answer).is_some_and(|(allowed, _, _)| !allowed),
        "an over-budget Fail Policy admitted: {}",
        answer.body
    );
    Ok(())
}

/// HTTP itself, as raw bytes and from curl: each case its status and message.
async fn broken_http(c: &Corpus<'_>) -> anyhow::Result<()> {
    let Corpus {
        scene,
        t,
        mutate,
        good,
        ..
    } = c;
    let cluster = scene.cluster;
    let json_type = JSON;
    // HTTP itself, as raw bytes: (case, request, status, message).
    let head = |method: &str, version: &str, headers: &str| {
        format!("{method} {mutate} HTTP/{version}\r\nHost: x\r\n{headers}")
    };
    let json_headers = "Content-Type: application/json\r\n";
    let many: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let http: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "text/plain",
            post(mutate, "text/plain", good.as_bytes()),
            415,
            "application/json",
        ),
        (
            "GET",
            format!("{}Connection: close\r\n\r\n", head("GET", "1.1", "")).into_bytes(),
            405,
            "webhooks take POST",
        ),
        (
            "PUT",
            String::from_utf8(post(mutate, json_type, good.as_bytes()))?
                .replacen("POST", "PUT", 1)
                .into_bytes(),
            405,
            "webhooks take POST",
        ),
        (
            "the root path",
            post("/", json_type, good.as_bytes()),
            404,
            "no webhook at /",
        ),
        (
            "an empty entry",
            post("/mutate/", json_type, good.as_bytes()),
            404,
            "no webhook at",
        ),
        (
            "an unknown entry",
            post("/mutate/nobody", json_type, good.as_bytes()),
            404,
            "no webhook entry",
        ),
        (
            "a path with ..",
            post("/mutate/../validate/x", json_type, good.as_bytes()),
            404,
            "no webhook",
        ),
        (
            "a 1 MiB header",
            format!(
                "{}X-Big: {}\r\nContent-Length: 2\r\n\r\n{{}}",
                head("POST", "1.1", ""),
                "a".repeat(1 << 20)
            )
            .into_bytes(),
            431,
            "",
        ),
        (
            "200 headers",
            format!(
                "{}Content-Length: 2\r\n\r\n{{}}",
                head("POST", "1.1", &many)
            )
            .into_bytes(),
            431,
            "",
        ),
        (
            "Content-Length and chunked together",
            format!(
                "{}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                head("POST", "1.1", "")
            )
            .into_bytes(),
            400,
            "",
        ),
        (
            "an invalid chunk size",
            format!(
                "{}Transfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n",
                head("POST", "1.1", json_headers)
            )
            .into_bytes(),
            400,
            "",
        ),
        (
            "a declared length shorter than the body",
            format!(
                "{}Content-Length: 10\r\n\r\n{good}",
                head("POST", "1.1", json_headers)
            )
            .into_bytes(),
            400,
            "not JSON",
        ),
        (
            "a declared length longer than the body",
            format!(
                "{}Content-Length: 1000\r\n\r\n{{\"a\": 1}}",
                head("POST", "1.1", json_headers)
            )
            .into_bytes(),
            408,
            "not received within",
        ),
        (
            "9 MiB declared, nothing sent",
            format!(
                "{}Content-Length: {}\r\n\r\n",
                head("POST", "1.1", json_headers),
                9 << 20
            )
            .into_bytes(),
            413,
            "exceeds",
        ),
        (
            "HTTP/1.0",
            format!(
                "{}Content-Length: {}\r\n\r\n{good}",
                head("POST", "1.0", json_headers),
                good.len()
            )
            .into_bytes(),
            200,
            "\"allowed\":true",
        ),
    ];
    for (name, request, status, says) in http {
        expect(name, &t.raw(&request).await?, Some(status), says)?;
    }
    let dir = cluster
        .state_dir()
        .join(format!("hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let big = dir.join("9MiB.json");
    std::fs::write(&big, vec![b' '; 9 << 20])?;
    let big_arg = format!("@{}", big.display());
    expect(
        "9 MiB streamed by curl",
        &t.curl(&[
            "-H",
            "content-type: application/json",
            "--data-binary",
            &big_arg,
            &t.url(mutate),
        ])
        .await?,
        Some(413),
        "exceeds",
    )?;
    expect(
        "9 MiB streamed chunked by curl",
        &t.curl(&[
            "-H",
            "content-type: application/json",
            "-H",
            "transfer-encoding: chunked",
            "--data-binary",
            &big_arg,
            &t.url(mutate),
        ])
        .await?,
        Some(413),
        "exceeds",
    )?;
    std::fs::remove_dir_all(&dir).ok();
    for (name, flag) in [
        ("HTTP/1.1 (curl)", "--http1.1"),
        ("HTTP/2 (curl)", "--http2"),
    ] {
        let answer = t
            .curl(&[
                flag,
                "-H",
                "content-type: application/json",
                "--data-binary",
                good,
                &t.url(mutate),
            ])
            .await?;
        expect(name, &answer, Some(200), "\"allowed\":true")?;
        ensure!(
            verdict(&answer).is_some_and(|(allowed, patch, _)| allowed && patch),
            "{name}: no patch: {}",
            answer.body
        );
    }
    Ok(())
}

/// TLS versions before 1.2 are refused by the server, plain HTTP gets no HTTP answer.
async fn old_tls_and_plain_http(c: &Corpus<'_>) -> anyhow::Result<()> {
    let Corpus {
        t, mutate, good, ..
    } = c;
    let json_type = JSON;
    // TLS: versions before 1.2 are refused, plain HTTP gets no answer.
    for (name, flag) in [("TLS 1.0", "-tls1"), ("TLS 1.1", "-tls1_1")] {
        let out = tokio::process::Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &format!("127.0.0.1:{}", t.port),
                flag,
                "-cipher",
                "DEFAULT@SECLEVEL=0",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The server's alert (rustls answers a hello without TLS 1.2 or 1.3 with
        // handshake_failure), not a client that refused to try.
        ensure!(
            !out.status.success()
                && text.contains("alert handshake failure")
                && text.contains("written"),
            "{name} was not refused by the server: {text}"
        );
        eprintln!("ok  {name}: refused by the server (alert handshake failure)");
    }
    let mut plain = TcpStream::connect(("127.0.0.1", t.port)).await?;
    plain
        .write_all(&post(mutate, json_type, good.as_bytes()))
        .await?;
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut reply)).await;
    ensure!(
        !String::from_utf8_lossy(&reply).contains("HTTP/1.1 200"),
        "plain HTTP was answered"
    );
    eprintln!(
        "ok  plain HTTP to the TLS port: no HTTP answer ({} bytes of TLS alert)",
        reply.len()
    );
    Ok(())
}

/// Slow and idle clients are cut off, and others are served meanwhile.
async fn slow_and_idle_clients(c: &Corpus<'_>) -> anyhow::Result<()> {
    let Corpus {
        t, mutate, good, ..
    } = c;
    let json_type = JSON;
    // Slow and idle clients: cut off, and others are served meanwhile.
    let mut slow = t.connect().await?;
    slow.write_all(format!("POST {mutate} HTTP/1.1\r\nHost: x\r\n").as_bytes())
        .await?;
    let slowloris = tokio::spawn(async move {
        for _ in 0..60 {
            if slow.write_all(b"X-Slow: 1\r\n").await.is_err() || slow.flush().await.is_err() {
                return true; // cut off
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        false
    });
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect(("127.0.0.1", t.port)).await?);
    }
    let answer = t.raw(&post(mutate, json_type, good.as_bytes())).await?;
    expect(
        "a review beside 1,000 idle connections and a slowloris",
        &answer,
        Some(200),
        "\"allowed\":true",
    )?;
    ensure!(slowloris.await?, "the slowloris client was never cut off");
    eprintln!("ok  slowloris: cut off");
    drop(idle);
    Ok(())
}

/// After a category: a valid review is still answered correctly, a patch and a denial alike.
async fn still_answers(c: &Corpus<'_>) -> anyhow::Result<()> {
    let Corpus {
        scene,
        t,
        mutate,
        validate,
        good,
        ..
    } = c;
    let ns = scene.ns();
    let json_type = JSON;
    // Afterwards: a valid review is answered correctly.
    let answer = t.raw(&post(mutate, json_type, good.as_bytes())).await?;
    let Some((true, true, _)) = verdict(&answer) else {
        bail!("the valid review after the corpus: {answer:?}");
    };
    let stored_denial = t.raw(&post(validate, json_type, review("nolimits", ns, "Pod", json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns, "annotations": {}}, "spec": {"containers": [{"name": "c", "image": "i", "resources": {}}]}})).to_string().as_bytes())).await?;
    expect(
        "a valid denial after the corpus",
        &stored_denial,
        Some(200),
        "every container must declare limits",
    )?;
    Ok(())
}

/// The paths of the mutating entry holding `mutating` and the validating entry holding
/// `validating`, as the configurations give them to the API server.
async fn entry_paths(
    cluster: &Cluster,
    mutating: &str,
    validating: &str,
) -> anyhow::Result<(String, String)> {
    use gatehouse_engine::Phase;
    let mut paths = Vec::new();
    for (kind, policy, phase) in [
        ("mutatingwebhookconfiguration", mutating, Phase::Mutating),
        (
            "validatingwebhookconfiguration",
            validating,
            Phase::Validating,
        ),
    ] {
        let entry = crate::fixtures::entry_of(cluster, policy, phase)
            .await?
            .with_context(|| format!("{policy} is not wired"))?;
        let cfg = get_json(cluster, &[kind, "gatehouse"])
            .await?
            .context("no configuration")?;
        let url = cfg["webhooks"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["name"] == entry.as_str()))
            .and_then(|w| w["clientConfig"]["url"].as_str())
            .with_context(|| format!("no URL for entry {entry}"))?;
        let path = url
            .split_once("://")
            .and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_owned()));
        paths.push(path.with_context(|| format!("no path in {url}"))?);
    }
    let validate = paths.pop().context("validating path")?;
    let mutate = paths.pop().context("mutating path")?;
    Ok((mutate, validate))
}
