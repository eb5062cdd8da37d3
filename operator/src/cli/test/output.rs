//! What `gatehouse test` prints: a table for people, JSON for scripts, JUnit XML for CI
//! systems.
use std::fmt::Write as _;

use serde::Serialize;

use super::verdict::Checks;

/// One test file's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FileOutcome {
    /// The test file.
    pub file: String,
    pub name: String,
    #[serde(flatten)]
    pub checks: Checks,
}

/// Every test file's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Outcome {
    pub files: Vec<FileOutcome>,
    pub passed: usize,
    pub failed: usize,
}

impl Outcome {
    pub fn new(files: Vec<FileOutcome>) -> Self {
        let all = || files.iter().flat_map(|f| &f.checks.checked);
        let failed = all().filter(|c| !c.passed()).count();
        let passed = all().count() - failed;
        Outcome {
            files,
            passed,
            failed,
        }
    }
}

/// The table: one row per (Policy, resource), each failure's details, the effects listed, and
/// the totals.
pub fn table(outcome: &Outcome) -> String {
    let mut rows = vec![[
        "POLICY".to_string(),
        "RESOURCE".to_string(),
        "EXPECTED".to_string(),
        "GOT".to_string(),
        "RESULT".to_string(),
    ]];
    for file in &outcome.files {
        for c in &file.checks.checked {
            rows.push([
                c.policy.clone(),
                c.resource.clone(),
                c.expected.as_str().to_string(),
                c.got.as_str().to_string(),
                if c.passed() { "pass" } else { "FAIL" }.to_string(),
            ]);
        }
    }
    let mut widths = [0; 5];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    for file in &outcome.files {
        for c in file.checks.checked.iter().filter(|c| !c.passed()) {
            let _ = writeln!(
                out,
                "\nFAIL {} on {} ({}):",
                c.policy, c.resource, file.file
            );
            for failure in &c.failures {
                let _ = writeln!(out, "  {failure}");
            }
        }
    }
    let effects: Vec<_> = outcome
        .files
        .iter()
        .flat_map(|f| &f.checks.effects)
        .collect();
    if !effects.is_empty() {
        let _ = writeln!(
            out,
            "\neffects (what the effects loop would do; nothing is done):"
        );
        for e in effects {
            let _ = writeln!(
                out,
                "  {} on {}: {}: {}",
                e.policy, e.resource, e.effect, e.summary
            );
            if !e.detail.is_null() {
                let _ = writeln!(out, "    {}", e.detail);
            }
        }
    }
    let _ = writeln!(
        out,
        "\n{} passed, {} failed",
        outcome.passed, outcome.failed
    );
    out
}

/// JUnit XML: a suite per test file, a test case per (Policy, resource).
pub fn junit(outcome: &Outcome) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"gatehouse test\" tests=\"{}\" failures=\"{}\">",
        outcome.passed + outcome.failed,
        outcome.failed
    );
    for file in &outcome.files {
        let failed = file.checks.checked.iter().filter(|c| !c.passed()).count();
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" file=\"{}\" tests=\"{}\" failures=\"{failed}\">",
            escape(&file.name),
            escape(&file.file),
            file.checks.checked.len()
        );
        for c in &file.checks.checked {
            let name = format!("{} on {}: {}", c.policy, c.resource, c.expected.as_str());
            let _ = write!(
                out,
                "    <testcase classname=\"{}\" name=\"{}\"",
                escape(&file.name),
                escape(&name)
            );
            if c.passed() {
                out.push_str("/>\n");
                continue;
            }
            let _ = writeln!(
                out,
                ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                escape(c.failures.first().map_or("", String::as_str)),
                escape(&c.failures.join("\n"))
            );
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

/// Text as XML attribute or element content.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            '\n' => escaped.push_str("&#10;"),
            // XML 1.0 has no other control characters.
            c if (c as u32) < 0x20 && c != '\t' && c != '\r' => {}
            c => escaped.push(c),
        }
    }
    escaped
}
