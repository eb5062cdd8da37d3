//! `gatehouse test` end to end: the cases in testdata/tests (every outcome kind, failing
//! expectations, a malformed file), JUnit read back, and the samples' own tests — which must
//! fail when a sample's rule changes.
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]
use std::path::{Path, PathBuf};
use std::process::Command;

use gatehouse::cli::test::{BAD_INPUT, FAILED, PASSED, TestArgs, run};
use serde_json::Value;

mod offline;
use offline::{Run, run_command};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn cases(dir: &str) -> String {
    format!("{}/testdata/tests/{dir}", env!("CARGO_MANIFEST_DIR"))
}

fn test(args: &[&str]) -> Run {
    run_command::<TestArgs>("gatehouse-test", args, run)
}

/// The row of `policy` on `resource` (the first, when a pair is tested twice).
fn row<'a>(outcome: &'a Value, policy: &str, resource: &str) -> &'a Value {
    outcome["files"][0]["checked"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["policy"] == policy && c["resource"] == resource)
        .unwrap_or_else(|| panic!("no row for {policy} on {resource}: {outcome:#}"))
}

#[test]
fn every_outcome_kind_is_checked_and_effects_are_listed() {
    let run = test(&[&cases("passing"), "--output", "json"]);
    assert_eq!(run.code, PASSED, "{}{}", run.out, run.err);
    let outcome: Value = serde_json::from_str(&run.out).unwrap();
    assert_eq!(outcome["passed"], 9, "{outcome:#}");
    assert_eq!(outcome["failed"], 0);
    let mutated = row(&outcome, "team-label", "tenant-a/owned");
    assert_eq!(mutated["got"], "admitted");
    assert_eq!(mutated["patches"][0]["path"], "/metadata/labels");
    let denied = row(&outcome, "require-owner", "tenant-a/unowned");
    assert_eq!(denied["got"], "denied");
    assert!(
        denied["message"]
            .as_str()
            .unwrap()
            .contains("pods need an owner annotation"),
        "{denied}"
    );
    assert_eq!(
        row(&outcome, "warn-latest", "plain/latest")["got"],
        "warned"
    );
    assert_eq!(
        row(&outcome, "team-label", "plain/latest")["got"],
        "skipped"
    );
    // The admins' request (a result's own request) is not matched by require-owner.
    let rows = outcome["files"][0]["checked"].as_array().unwrap();
    let unowned: Vec<&Value> = rows
        .iter()
        .filter(|c| c["policy"] == "require-owner" && c["resource"] == "tenant-a/unowned")
        .map(|c| &c["got"])
        .collect();
    assert_eq!(unowned, ["denied", "skipped"]);

    // A Policy the chain never reached says so.
    let guard = row(&outcome, "secret-guard", "plain/token");
    assert_eq!(guard["got"], "denied");
    let unreached = row(&outcome, "secret-type", "plain/token");
    assert_eq!(unreached["got"], "skipped");
    assert!(
        unreached["message"]
            .as_str()
            .unwrap()
            .starts_with("not reached: a mutating Policy denied the request first"),
        "{unreached}"
    );

    let effects = outcome["files"][0]["effects"].as_array().unwrap();
    let companion = effects
        .iter()
        .find(|e| e["effect"] == "object")
        .expect("the companion is listed");
    assert_eq!(companion["detail"]["metadata"]["name"], "registered");
    assert_eq!(companion["detail"]["metadata"]["namespace"], "plain");
    assert_eq!(companion["detail"]["data"]["source"], "settings");
    let call = effects
        .iter()
        .find(|e| e["effect"] == "call")
        .expect("the call is listed");
    assert!(
        call["summary"]
            .as_str()
            .unwrap()
            .starts_with("POST https://inventory.example.com/hooks/gatehouse"),
        "{call}"
    );
    assert_eq!(call["detail"]["action"], "Apply");
    assert_eq!(call["detail"]["snapshot"]["data"]["level"], "debug");
}

#[test]
fn a_failing_expectation_is_reported_with_its_diff_and_exit_1() {
    let run = test(&[&cases("failing")]);
    assert_eq!(run.code, FAILED, "{}{}", run.out, run.err);
    let out = &run.out;
    assert!(out.contains("1 passed, 3 failed"), "{out}");
    assert!(
        out.contains(r#"{"op":"replace","path":"/metadata/labels/team","value":"unknown"}"#),
        "the stored object's diff: {out}"
    );
    assert!(out.contains("expected denied, got admitted"), "{out}");
    assert!(
        out.contains(r#"expected a message containing "use a digest""#),
        "{out}"
    );
}

#[test]
fn a_malformed_test_file_names_the_field_and_exits_2() {
    let run = test(&[&cases("malformed")]);
    assert_eq!(run.code, BAD_INPUT, "{}{}", run.out, run.err);
    assert!(run.out.is_empty(), "{}", run.out);
    assert!(
        run.err.contains(
            "malformed/gatehouse-test.yaml: results[1].result: unknown variant `allowed`"
        ),
        "{}",
        run.err
    );
    let none = test(&[&format!("{}/testdata/objects", env!("CARGO_MANIFEST_DIR"))]);
    assert_eq!(none.code, BAD_INPUT);
    assert!(
        none.err.contains("no gatehouse-test.yaml under"),
        "{}",
        none.err
    );
}

#[test]
fn junit_output_reads_back() {
    let run = test(&[&cases("failing"), "--output", "junit"]);
    assert_eq!(run.code, FAILED);
    let xml = roxmltree::Document::parse(&run.out).unwrap_or_else(|e| panic!("{e}: {}", run.out));
    let suites = xml.root_element();
    assert_eq!(suites.tag_name().name(), "testsuites");
    assert_eq!(suites.attribute("tests"), Some("4"));
    assert_eq!(suites.attribute("failures"), Some("3"));
    let cases: Vec<_> = suites
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    assert_eq!(cases.len(), 4);
    let failures: Vec<_> = suites
        .descendants()
        .filter(|n| n.has_tag_name("failure"))
        .collect();
    assert_eq!(failures.len(), 3);
    let denied = failures
        .iter()
        .find(|f| f.attribute("message") == Some("expected denied, got admitted"))
        .expect("the require-owner failure");
    assert_eq!(
        denied.parent().unwrap().attribute("name"),
        Some("require-owner on tenant-a/owned: denied")
    );
    // The text survives escaping: quotes and the diff's JSON.
    assert!(
        failures
            .iter()
            .any(|f| f.text().unwrap_or_default().contains("\"use a digest\"")),
        "{}",
        run.out
    );
}

#[test]
fn the_binary_exits_by_the_outcome() {
    let bin = env!("CARGO_BIN_EXE_gatehouse");
    let code = |dir: &str| {
        Command::new(bin)
            .args(["test", &cases(dir)])
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(code("passing"), Some(PASSED));
    assert_eq!(code("failing"), Some(FAILED));
    assert_eq!(code("malformed"), Some(BAD_INPUT));
}

#[test]
fn the_samples_tests_pass() {
    let samples = root().join("config/samples");
    let run = test(&[samples.to_str().unwrap(), "--output", "json"]);
    assert_eq!(run.code, PASSED, "{}{}", run.out, run.err);
    let outcome: Value = serde_json::from_str(&run.out).unwrap();
    assert!(outcome["passed"].as_u64().unwrap() >= 14, "{outcome:#}");
    // Every sample Policy is tested.
    let tested: Vec<&str> = outcome["files"][0]["checked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["policy"].as_str().unwrap())
        .collect();
    for policy in [
        "drop-bpf",
        "inject-proxy",
        "require-limits",
        "ipam",
        "namespace-provisioning",
    ] {
        assert!(tested.contains(&policy), "{policy} has no test");
    }
}

/// A copy of config/samples with `edit` applied to the file `name`.
fn edited_samples(tag: &str, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let copy = std::env::temp_dir().join(format!("gatehouse-samples-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&root().join("config/samples"), &copy);
    let file = copy.join(name);
    let text = std::fs::read_to_string(&file).unwrap();
    let edited = edit(text.clone());
    assert_ne!(edited, text, "the edit changed nothing in {name}");
    std::fs::write(&file, edited).unwrap();
    copy
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

#[test]
fn changing_a_sample_rule_fails_its_test() {
    // require-limits no longer looks at limits: the injected Pod is admitted.
    let loosened = edited_samples("limits", "require-limits.yaml", |t| {
        t.replace(
            "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))",
            "object.spec.containers.size() > 0",
        )
    });
    let run = test(&[loosened.to_str().unwrap()]);
    assert_eq!(run.code, FAILED, "{}", run.out);
    assert!(
        run.out.contains("FAIL require-limits on demo-injected/web")
            && run.out.contains("expected denied, got admitted"),
        "{}",
        run.out
    );
    // drop-bpf drops every capability instead: its patch changes.
    let widened = edited_samples("bpf", "drop-bpf.yaml", |t| {
        t.replace("drop: [\"BPF\"]", "drop: [\"ALL\"]")
    });
    let run = test(&[widened.to_str().unwrap()]);
    assert_eq!(run.code, FAILED, "{}", run.out);
    assert!(
        run.out.contains("FAIL drop-bpf on demo-plain/web") && run.out.contains("\"ALL\""),
        "{}",
        run.out
    );
    let _ = std::fs::remove_dir_all(loosened);
    let _ = std::fs::remove_dir_all(widened);
}
