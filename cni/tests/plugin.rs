//! The plugin binary as containerd runs it: recorded environments and stdin in, the spec's
//! results and error objects out. The fallback is a recording stand-in in a `CNI_PATH` of the
//! test's own (the node e2e runs the real `host-local`).
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

const PLUGIN: &str = env!("CARGO_BIN_EXE_gatehouse-ipam");
const UID: &str = "6a1f4c2e-0000-4000-8000-000000000001";
const OTHER_UID: &str = "6a1f4c2e-0000-4000-8000-000000000002";

/// A scratch directory holding a recording fallback plugin `fake-ipam`: it saves its stdin and
/// its `CNI_*` environment, and answers a fixed result.
struct Node {
    dir: PathBuf,
}

impl Node {
    fn new() -> Node {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "cni-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("fake-ipam");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\ncat > {dir}/fallback.stdin\nenv | grep '^CNI_' | sort > {dir}/fallback.env\n\
                 echo '{{\"cniVersion\":\"1.0.0\",\"ips\":[{{\"address\":\"10.244.0.9/24\"}}]}}'\n",
                dir = dir.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        Node { dir }
    }

    fn run(&self, command: &str, args: Option<&str>, stdin: &str) -> Output {
        let mut child = Command::new(PLUGIN)
            .env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", "c0ffee")
            .env("CNI_NETNS", "/var/run/netns/cni-1")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", format!("/nonexistent:{}", self.dir.display()))
            .envs(args.map(|a| ("CNI_ARGS", a.to_string())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    fn fallback_stdin(&self) -> Option<Value> {
        std::fs::read(self.dir.join("fallback.stdin"))
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn fallback_env(&self) -> String {
        std::fs::read_to_string(self.dir.join("fallback.env")).unwrap_or_default()
    }
}

fn k8s_args(uid: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID={uid}"
    )
}

fn address(owner: &str) -> String {
    json!({
        "pool": "pods-v4", "address": "10.244.0.130/24", "gateway": "10.244.0.1",
        "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.0.0.10"]},
        "ownerUID": owner,
    })
    .to_string()
}

/// A bridge configuration as containerd passes it to the IPAM plugin, with these annotations.
fn conf(annotations: Option<Value>) -> Value {
    let mut conf = json!({
        "cniVersion": "1.0.0", "name": "gatehouse-test", "type": "bridge", "bridge": "gatehouse0",
        "ipam": {"type": "gatehouse-ipam", "fallback": {"type": "fake-ipam", "ranges": [[{"subnet": "10.244.0.0/25"}]]}},
    });
    if let Some(annotations) = annotations {
        conf["runtimeConfig"] = json!({"io.kubernetes.cri.pod-annotations": annotations});
    }
    conf
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The error object on stdout, with a non-zero exit: (code, msg).
fn error_of(out: &Output) -> (u64, String) {
    assert!(!out.status.success(), "expected a failure: {out:?}");
    let error = stdout_json(out);
    assert!(error["cniVersion"].is_string(), "{error}");
    (
        error["code"].as_u64().unwrap(),
        error["msg"].as_str().unwrap().to_string(),
    )
}

#[test]
fn version_lists_the_spec_versions() {
    let node = Node::new();
    let out = node.run("VERSION", None, r#"{"cniVersion": "1.0.0"}"#);
    assert!(out.status.success());
    let version = stdout_json(&out);
    assert_eq!(version["cniVersion"], "1.0.0");
    assert_eq!(version["supportedVersions"], json!(["1.0.0", "1.1.0"]));
    let out = node.run("VERSION", None, "");
    assert_eq!(stdout_json(&out)["cniVersion"], "1.1.0");
}

#[test]
fn add_answers_the_pods_own_address() {
    let node = Node::new();
    let annotations = json!({
        "gatehouse.dev/ipam-pool": "pods-v4",
        "gatehouse.dev/ipam-address": address(UID),
        "kubernetes.io/config.source": "api",
    });
    let out = node.run(
        "ADD",
        Some(&k8s_args(UID)),
        &conf(Some(annotations)).to_string(),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout_json(&out),
        json!({
            "cniVersion": "1.0.0",
            "ips": [{"address": "10.244.0.130/24", "gateway": "10.244.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {"nameservers": ["10.0.0.10"]},
        })
    );
    assert_eq!(node.fallback_stdin(), None, "the fallback is not run");
}

#[test]
fn a_copied_address_is_never_handed_out() {
    let node = Node::new();
    // Marked: the Pod waits for its own address.
    let marked = json!({
        "gatehouse.dev/ipam-pool": "pods-v4",
        "gatehouse.dev/ipam-address": address(OTHER_UID),
    });
    let out = node.run("ADD", Some(&k8s_args(UID)), &conf(Some(marked)).to_string());
    let (code, msg) = error_of(&out);
    assert_eq!(code, 11);
    assert!(
        msg.contains("\"pods-v4\"") && msg.contains("try again later"),
        "{msg}"
    );
    assert!(
        stdout_json(&out)["details"]
            .as_str()
            .unwrap()
            .contains(OTHER_UID)
    );
    // Not marked: the fallback gives it an address, never the copied one.
    let copied = json!({"gatehouse.dev/ipam-address": address(OTHER_UID)});
    let out = node.run("ADD", Some(&k8s_args(UID)), &conf(Some(copied)).to_string());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout_json(&out)["ips"][0]["address"], "10.244.0.9/24");
}

#[test]
fn a_marked_pod_without_its_address_is_told_to_try_again() {
    let node = Node::new();
    let marked = json!({"gatehouse.dev/ipam-pool": "pods-v4"});
    let out = node.run("ADD", Some(&k8s_args(UID)), &conf(Some(marked)).to_string());
    let (code, msg) = error_of(&out);
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("IPPool \"pods-v4\""), "{msg}");
    // A malformed address annotation is no address either.
    let broken = json!({"gatehouse.dev/ipam-pool": "pods-v4", "gatehouse.dev/ipam-address": "{"});
    let out = node.run("ADD", Some(&k8s_args(UID)), &conf(Some(broken)).to_string());
    assert_eq!(error_of(&out).0, 11);
    let bad_prefix = json!({
        "gatehouse.dev/ipam-pool": "pods-v4",
        "gatehouse.dev/ipam-address": address(UID).replace("/24", "/40"),
    });
    let out = node.run(
        "ADD",
        Some(&k8s_args(UID)),
        &conf(Some(bad_prefix)).to_string(),
    );
    assert_eq!(error_of(&out).0, 11);
}

#[test]
fn other_pods_are_delegated_to_the_fallback_with_the_same_environment() {
    let node = Node::new();
    let plain = json!({"kubernetes.io/config.source": "api"});
    let sent = conf(Some(plain));
    let out = node.run("ADD", Some(&k8s_args(UID)), &sent.to_string());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout_json(&out)["ips"][0]["address"], "10.244.0.9/24");
    let mut expected = sent.clone();
    expected["ipam"] = sent["ipam"]["fallback"].clone();
    assert_eq!(node.fallback_stdin(), Some(expected));
    let env = node.fallback_env();
    for line in [
        "CNI_COMMAND=ADD",
        "CNI_CONTAINERID=c0ffee",
        "CNI_IFNAME=eth0",
        "CNI_NETNS=/var/run/netns/cni-1",
        &format!("CNI_ARGS={}", k8s_args(UID)),
    ] {
        assert!(env.lines().any(|l| l == line), "{line} not in {env}");
    }
    // No fallback configured: the Pod is refused with the reason.
    let mut bare = conf(Some(json!({})));
    bare["ipam"] = json!({"type": "gatehouse-ipam"});
    let (code, msg) = error_of(&node.run("ADD", Some(&k8s_args(UID)), &bare.to_string()));
    assert_eq!(code, 7);
    assert!(msg.contains("no fallback"), "{msg}");
    // A fallback that is not installed.
    let mut missing = conf(Some(json!({})));
    missing["ipam"]["fallback"]["type"] = json!("no-such-ipam");
    let (code, msg) = error_of(&node.run("ADD", Some(&k8s_args(UID)), &missing.to_string()));
    assert_eq!(code, 7);
    assert!(msg.contains("\"no-such-ipam\" is not in CNI_PATH"), "{msg}");
}

#[test]
fn del_never_fails_for_gatehouse_addresses_and_delegates_the_rest() {
    let node = Node::new();
    let own =
        json!({"gatehouse.dev/ipam-pool": "pods-v4", "gatehouse.dev/ipam-address": address(UID)});
    let out = node.run(
        "DEL",
        Some(&k8s_args(UID)),
        &conf(Some(own.clone())).to_string(),
    );
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    // Twice: DEL is idempotent.
    let out = node.run("DEL", Some(&k8s_args(UID)), &conf(Some(own)).to_string());
    assert!(out.status.success());
    let marked = json!({"gatehouse.dev/ipam-pool": "pods-v4"});
    let out = node.run("DEL", Some(&k8s_args(UID)), &conf(Some(marked)).to_string());
    assert!(out.status.success());
    assert_eq!(node.fallback_stdin(), None);
    let out = node.run(
        "DEL",
        Some(&k8s_args(UID)),
        &conf(Some(json!({}))).to_string(),
    );
    assert!(out.status.success());
    assert!(node.fallback_env().contains("CNI_COMMAND=DEL"));
}

#[test]
fn check_verifies_the_address_is_still_the_pods() {
    let node = Node::new();
    let own =
        json!({"gatehouse.dev/ipam-pool": "pods-v4", "gatehouse.dev/ipam-address": address(UID)});
    let mut holding = conf(Some(own.clone()));
    holding["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.130/24"}]});
    let out = node.run("CHECK", Some(&k8s_args(UID)), &holding.to_string());
    assert!(out.status.success(), "{out:?}");
    let mut other = conf(Some(own));
    other["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.131/24"}]});
    let (code, msg) = error_of(&node.run("CHECK", Some(&k8s_args(UID)), &other.to_string()));
    assert_eq!(code, 3);
    assert!(msg.contains("10.244.0.130/24"), "{msg}");
    // The annotation now names another Pod.
    let moved = json!({"gatehouse.dev/ipam-pool": "pods-v4", "gatehouse.dev/ipam-address": address(OTHER_UID)});
    let (code, _) = error_of(&node.run(
        "CHECK",
        Some(&k8s_args(UID)),
        &conf(Some(moved)).to_string(),
    ));
    assert_eq!(code, 3);
    // A Pod that is not Gatehouse's is the fallback's to check.
    let mut fallbacks = conf(Some(json!({})));
    fallbacks["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.9/24"}]});
    let out = node.run("CHECK", Some(&k8s_args(UID)), &fallbacks.to_string());
    assert!(out.status.success(), "{out:?}");
    assert!(node.fallback_env().contains("CNI_COMMAND=CHECK"));
    assert_eq!(
        node.fallback_stdin().unwrap()["prevResult"]["ips"][0]["address"],
        "10.244.0.9/24"
    );
}

#[test]
fn status_answers_and_gc_goes_to_the_fallback() {
    let node = Node::new();
    let out = node.run("STATUS", None, &conf(None).to_string());
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    let mut gc = conf(None);
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "c0ffee", "ifname": "eth0"}]);
    let out = node.run("GC", None, &gc.to_string());
    assert!(out.status.success(), "{out:?}");
    assert!(node.fallback_env().contains("CNI_COMMAND=GC"));
    assert_eq!(
        node.fallback_stdin().unwrap()["cni.dev/valid-attachments"][0]["containerID"],
        "c0ffee"
    );
    // Without a fallback there is nothing to collect: Gatehouse's own addresses are released by
    // the effects loop.
    let mut alone = gc.clone();
    alone["ipam"] = json!({"type": "gatehouse-ipam"});
    let lone = Node::new();
    let out = lone.run("GC", None, &alone.to_string());
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert_eq!(lone.fallback_stdin(), None);
}

#[test]
fn bad_input_gets_an_error_object_with_the_right_code() {
    let node = Node::new();
    let own = json!({"gatehouse.dev/ipam-address": address(UID)});
    let good = conf(Some(own)).to_string();
    for (command, args, stdin, code, says) in [
        ("ADD", None, good.as_str(), 4, "CNI_ARGS is not set"),
        (
            "ADD",
            Some("K8S_POD_NAME=web-0".to_string()),
            good.as_str(),
            4,
            "no K8S_POD_UID",
        ),
        ("ADD", Some(k8s_args(UID)), "{not json", 6, "not valid"),
        (
            "GC",
            Some(k8s_args(UID)),
            r#"["1.1.0", "n", {"type": "gatehouse-ipam", "fallback": {"type": "host-local"}}]"#,
            6,
            "not a JSON object",
        ),
        (
            "ADD",
            Some(k8s_args(UID)),
            "",
            6,
            "no network configuration",
        ),
        (
            "ADD",
            Some(k8s_args(UID)),
            r#"{"cniVersion": "1.0.0"}"#,
            6,
            "ipam",
        ),
        (
            "EXPLODE",
            Some(k8s_args(UID)),
            good.as_str(),
            4,
            "\"EXPLODE\" is not one of",
        ),
        (
            "",
            Some(k8s_args(UID)),
            good.as_str(),
            4,
            "CNI_COMMAND is not set",
        ),
    ] {
        let out = node.run(command, args.as_deref(), stdin);
        let (got, msg) = error_of(&out);
        assert_eq!(got, code, "{command} {stdin}: {msg}");
        assert!(msg.contains(says), "{command}: {msg}");
    }
    let old = good.replace("\"1.0.0\"", "\"0.3.1\"");
    let (code, msg) = error_of(&node.run("ADD", Some(&k8s_args(UID)), &old));
    assert_eq!(code, 1);
    assert!(msg.contains("\"0.3.1\" is not supported"), "{msg}");
    // The capability is not declared: the runtime passed no annotations at all.
    let (code, msg) = error_of(&node.run("ADD", Some(&k8s_args(UID)), &conf(None).to_string()));
    assert_eq!(code, 7);
    assert!(msg.contains("io.kubernetes.cri.pod-annotations"), "{msg}");
    // The other commands refuse an unsupported version the same way.
    for command in ["DEL", "CHECK"] {
        let (code, msg) = error_of(&node.run(command, Some(&k8s_args(UID)), &old));
        assert_eq!(code, 1, "{command}: {msg}");
    }
    // No stdin at all.
    let out = Command::new(PLUGIN)
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_ARGS", k8s_args(UID))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(error_of(&out).0, 6);
    // A good configuration, but the runtime left out one of the container's variables.
    for (command, missing) in [
        ("ADD", "CNI_CONTAINERID"),
        ("ADD", "CNI_NETNS"),
        ("ADD", "CNI_IFNAME"),
        ("CHECK", "CNI_NETNS"),
        ("DEL", "CNI_IFNAME"),
    ] {
        let mut child = Command::new(PLUGIN)
            .env_clear()
            .envs([
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", "c0ffee"),
                ("CNI_NETNS", "/var/run/netns/cni-1"),
                ("CNI_IFNAME", "eth0"),
            ])
            .env_remove(missing)
            .env("CNI_ARGS", k8s_args(UID))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(good.as_bytes())
            .unwrap();
        let (code, msg) = error_of(&child.wait_with_output().unwrap());
        assert_eq!(code, 4, "{command} without {missing}: {msg}");
        assert!(msg.contains(&format!("{missing} is not set")), "{msg}");
    }
}

#[test]
fn install_copies_the_plugin_into_a_directory() {
    let node = Node::new();
    let target = node.dir.join("bin");
    std::fs::create_dir_all(&target).unwrap();
    let out = Command::new(PLUGIN)
        .args(["install", "--dir"])
        .arg(&target)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let installed = target.join("gatehouse-ipam");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(PLUGIN).unwrap()
    );
    let out = Command::new(&installed)
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = Command::new(PLUGIN).args(["install"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage"));
}
