//! The commands the README and docs/ show, for the tests that run them: a test takes its command
//! from the document, so the text a reader copies is the one that was run, and a test fails when
//! the document no longer shows it.
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The commands of `markdown`'s `sh` blocks, a `\` continuation joined to its line, without
/// trailing comments and comment lines.
pub fn shell_commands(markdown: &str) -> Vec<String> {
    let mut in_shell = false;
    let mut commands = Vec::new();
    let mut continued = String::new();
    for line in markdown.lines() {
        if let Some(fence) = line.strip_prefix("```") {
            in_shell = !in_shell && fence.trim() == "sh";
            continue;
        }
        if !in_shell {
            continue;
        }
        let text = line.split(" #").next().unwrap_or_default().trim();
        if text.starts_with('#') || (text.is_empty() && continued.is_empty()) {
            continue;
        }
        match text.strip_suffix('\\') {
            Some(head) => {
                continued.push_str(head.trim_end());
                continued.push(' ');
            }
            None => {
                continued.push_str(text);
                commands.push(std::mem::take(&mut continued));
            }
        }
    }
    commands
}

/// The words of the command `command` as `doc` (a path from the repository's root) shows it;
/// an error when the document does not show it.
pub fn documented(doc: &str, command: &str) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(repo_root().join(doc)).with_context(|| format!("reading {doc}"))?;
    let shown = shell_commands(&text);
    if !shown.iter().any(|c| c == command) {
        bail!("{doc} no longer shows `{command}`; it shows: {shown:#?}");
    }
    Ok(command.split_whitespace().map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuations_join_and_comments_go() {
        let doc = "text\n```sh\n# a comment\nhelm install x \\\n  --set a=b --wait\nkubectl get pods   # trailing\n```\n```yaml\nkubectl not: shell\n```\n";
        assert_eq!(
            shell_commands(doc),
            ["helm install x --set a=b --wait", "kubectl get pods"]
        );
    }
}
