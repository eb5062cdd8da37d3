//! The commands the README and docs/ show: the `gatehouse` ones run here as written from the
//! repository's root (a reader who copies one gets what the text says, not an error), and every
//! other one is run by a test or a phase of `tests/run`, which this file checks it still is.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

// The parser the e2e and node tests look their commands up with: one reading of the documents
// (its lookup, `documented`, is theirs).
#[allow(dead_code)]
#[path = "../../tests/harness/documented.rs"]
mod documented;

use documented::{repo_root, shell_commands};

/// Every Markdown file of the README and docs/.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    found
}

/// Every documented command, with the document showing it.
fn all_commands(root: &Path) -> Vec<(PathBuf, String)> {
    documents(root)
        .into_iter()
        .flat_map(|doc| {
            let text = std::fs::read_to_string(&doc).unwrap();
            shell_commands(&text)
                .into_iter()
                .map(move |c| (doc.clone(), c))
        })
        .collect()
}

/// The `gatehouse <sub> …` commands, for `prefix` = `gatehouse <sub> `.
fn gatehouse_commands(root: &Path, prefix: &str) -> Vec<(PathBuf, String)> {
    all_commands(root)
        .into_iter()
        .filter(|(_, c)| c.starts_with(prefix))
        .collect()
}

/// Runs the documented `gatehouse …` `command` (shown by `doc`) in `dir`, failing with its
/// stderr unless it succeeds.
fn run_gatehouse(doc: &Path, command: &str, dir: &Path) {
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(&args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: `{command}` exited {}: {}",
        doc.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_documented_eval_command_runs_as_written() {
    let root = repo_root();
    let mut ran = 0;
    for (doc, command) in gatehouse_commands(&root, "gatehouse eval ") {
        run_gatehouse(&doc, &command, &root);
        ran += 1;
    }
    // The README's two and the reference's one at least: a parser that finds none proves nothing.
    assert!(ran >= 3, "only {ran} documented eval commands found");
}

/// `gatehouse test …` as documented passes: the README's on the samples, the reference's on
/// the test cases of every outcome kind.
#[test]
fn every_documented_test_command_runs_as_written() {
    let root = repo_root();
    let commands = gatehouse_commands(&root, "gatehouse test ");
    assert!(
        commands.len() >= 2,
        "documented test commands: {commands:?}"
    );
    for (doc, command) in commands {
        run_gatehouse(&doc, &command, &root);
    }
}

/// Every file under `dir`, by its path relative to `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                found.push(path.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    found.sort();
    found
}

/// `gatehouse crds …` as documented, run in an empty directory: it writes exactly the files the
/// repository holds there, so the committed CRDs are what the types generate.
#[test]
fn every_documented_crds_command_writes_what_is_committed() {
    let root = repo_root();
    let crds: Vec<(PathBuf, String)> = all_commands(&root)
        .into_iter()
        .filter(|(_, c)| c.starts_with("gatehouse crds "))
        .collect();
    assert!(crds.len() >= 2, "documented crds commands: {crds:?}");
    for (doc, command) in crds {
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        let target = args
            .iter()
            .position(|a| *a == "--dir")
            .and_then(|i| args.get(i + 1))
            .unwrap();
        let scratch = std::env::temp_dir().join(format!(
            "gatehouse-documented-crds-{}-{}",
            std::process::id(),
            target.replace('/', "-")
        ));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(scratch.join(target)).unwrap();
        run_gatehouse(&doc, &command, &scratch);
        let written = files_under(&scratch.join(target));
        assert!(!written.is_empty(), "`{command}` wrote nothing");
        for file in &written {
            let generated = std::fs::read_to_string(scratch.join(target).join(file)).unwrap();
            let committed =
                std::fs::read_to_string(root.join(target).join(file)).unwrap_or_else(|e| {
                    panic!(
                        "`{command}` writes {target}/{}, not committed: {e}",
                        file.display()
                    )
                });
            assert_eq!(
                generated,
                committed,
                "{target}/{} is not what `{command}` generates: run it",
                file.display()
            );
        }
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}

/// Where the commands that need a cluster, a node or a container tool are run, by the file that
/// runs them: that file must still name the command exactly as documented (it takes it from the
/// document, see `tests/harness/documented.rs`, or runs the script).
const RUN_ELSEWHERE: [(&str, &str); 15] = [
    ("kubectl get externalcalls", "tests/e2e/calls.rs"),
    ("kubectl apply -k config/default", "tests/node/main.rs"),
    (
        "kubectl apply -f config/default/namespace.yaml",
        "tests/node/main.rs",
    ),
    (
        "kubectl apply -k config/default --dry-run=server",
        "tests/node/main.rs",
    ),
    (
        "kubectl -n gatehouse-system rollout status deployment/gatehouse",
        "tests/node/main.rs",
    ),
    ("kubectl apply -k config/samples", "tests/node/main.rs"),
    (
        "helm install gatehouse charts/gatehouse -n gatehouse-system --create-namespace --set image.repository=registry.example/gatehouse --set image.tag=0.1.0 --wait",
        "tests/node/helm.rs",
    ),
    (
        "kubectl label namespace gatehouse-system pod-security.kubernetes.io/enforce=restricted",
        "tests/node/helm.rs",
    ),
    (
        "helm upgrade gatehouse charts/gatehouse -n gatehouse-system --reuse-values --set logFormat=json",
        "tests/node/helm.rs",
    ),
    ("kubectl delete ippools --all", "tests/node/helm.rs"),
    (
        "helm uninstall gatehouse -n gatehouse-system",
        "tests/node/helm.rs",
    ),
    ("./tests/run", ".ci/run"),
    ("./tests/demo", "tests/run"),
    ("./tests/demo --in-cluster", "tests/run"),
    (
        "gatehouse run --namespace gatehouse-system --listen 127.0.0.1:9443 --admin-listen 127.0.0.1:9080 --webhook-url https://127.0.0.1:9443",
        "tests/demo",
    ),
];

/// Documented commands no test can run on the test machines, and why: the test must say so
/// here, where a reviewer sees it.
const NOT_RUN: [(&str, &str); 1] = [(
    "docker build -t gatehouse:dev .",
    "its base images need a registry, which the test machines cannot reach; tests/cluster/image \
     runs the Dockerfile's own build line and assembles the same runtime stage by hand",
)];

/// The benchmarks: run by hand (their figures are in operator/benches/README.md), never in CI;
/// here they must at least name a script or bench target that exists.
fn benchmark_exists(root: &Path, command: &str) -> Option<bool> {
    if let Some(bench) = command.strip_prefix("cargo bench -p gatehouse-engine --bench ") {
        return Some(
            root.join("engine/benches")
                .join(format!("{bench}.rs"))
                .is_file(),
        );
    }
    let program = command.split_whitespace().find(|w| !w.contains('='))?;
    let is_bench = program.starts_with("tests/bench/") || program.starts_with("operator/benches/");
    is_bench.then(|| root.join(program).is_file())
}

#[test]
fn every_documented_command_is_run_by_a_test() {
    let root = repo_root();
    let mut unaccounted = Vec::new();
    for (doc, command) in all_commands(&root) {
        let doc = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        let run_here = ["gatehouse eval ", "gatehouse crds ", "gatehouse test "];
        if run_here.iter().any(|p| command.starts_with(p)) {
            continue;
        }
        if let Some(exists) = benchmark_exists(&root, &command) {
            assert!(exists, "{doc}: `{command}`: no such benchmark");
            continue;
        }
        if NOT_RUN.iter().any(|(c, _)| *c == command) {
            continue;
        }
        match RUN_ELSEWHERE.iter().find(|(c, _)| *c == command) {
            Some((_, runner)) => {
                let source = std::fs::read_to_string(root.join(runner)).unwrap();
                let named = source.contains(&command) || shown_as_script(&source, &command);
                assert!(named, "{doc}: `{command}` is no longer run by {runner}");
            }
            None => unaccounted.push(format!("{doc}: `{command}`")),
        }
    }
    assert!(
        unaccounted.is_empty(),
        "documented commands no test runs (run each in a test and list it in RUN_ELSEWHERE): {unaccounted:#?}"
    );
}

/// Whether `source` (a shell script) runs the script `command` names, as `tests/x` for `./tests/x`
/// and with its arguments.
fn shown_as_script(source: &str, command: &str) -> bool {
    let bare = command.trim_start_matches("./");
    source.contains(bare)
}

/// A command said to run elsewhere that no document shows any more is a stale entry.
#[test]
fn every_command_run_elsewhere_is_still_documented() {
    let shown: Vec<String> = all_commands(&repo_root())
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    for (command, runner) in RUN_ELSEWHERE {
        assert!(
            shown.iter().any(|c| c == command),
            "`{command}` ({runner}) is no longer documented"
        );
    }
}
