//! The `gatehouse eval` commands the README and docs/ show, run as written from the repository's
//! root: a reader who copies one gets what the text says, not an error.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

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

/// The `gatehouse eval …` lines of a document's shell blocks, without trailing comments.
fn eval_commands(text: &str) -> Vec<String> {
    let mut in_shell = false;
    let mut commands = Vec::new();
    for line in text.lines() {
        if let Some(fence) = line.strip_prefix("```") {
            in_shell = !in_shell && fence.trim() == "sh";
            continue;
        }
        let command = line.split(" #").next().unwrap_or_default().trim();
        if in_shell && command.starts_with("gatehouse eval ") {
            commands.push(command.to_string());
        }
    }
    commands
}

#[test]
fn every_documented_eval_command_runs_as_written() {
    let root = repo_root();
    let mut ran = 0;
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).unwrap();
        for command in eval_commands(&text) {
            let args: Vec<&str> = command.split_whitespace().skip(1).collect();
            let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
                .args(&args)
                .current_dir(&root)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: `{command}` exited {}: {}",
                doc.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            ran += 1;
        }
    }
    // The README's two and the reference's one at least: a parser that finds none proves nothing.
    assert!(ran >= 3, "only {ran} documented eval commands found");
}
