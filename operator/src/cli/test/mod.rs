//! `gatehouse test`: Policy tests without a cluster (like `kyverno test` or `gator verify`).
//! Each `gatehouse-test.yaml` under the folders given names Policies, resources, the
//! Namespaces' labels and the request, and what each Policy should make of each resource;
//! the resources go through the engine's admission chain, as `gatehouse eval` and the webhook
//! run it, and every expectation is checked. Effects are listed, never performed.
pub mod file;
pub mod listed;
pub mod output;
pub mod suite;
pub mod verdict;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::runtime::error_chain::chain;
use output::{FileOutcome, Outcome};

/// Exit status when every expectation holds.
pub const PASSED: i32 = 0;
/// Exit status when an expectation does not hold.
pub const FAILED: i32 = 1;
/// Exit status for a malformed or unreadable test file, an invalid Policy, or no test file.
pub const BAD_INPUT: i32 = 2;

/// Arguments of `gatehouse test`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct TestArgs {
    /// Folders searched (with their subfolders) for `gatehouse-test.yaml` files, or test files
    /// themselves.
    #[arg(value_name = "DIR", default_value = ".")]
    pub dirs: Vec<PathBuf>,

    /// What to print.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// `--output`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// A row per (Policy, resource), each failure's details, the effects, the totals.
    #[default]
    Table,
    /// Everything, as JSON.
    Json,
    /// JUnit XML, for CI systems.
    Junit,
}

/// Why the tests could not run.
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error("{}: {source}", .path.display())]
    Search {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no gatehouse-test.yaml under {0}")]
    NoTests(String),
    #[error(transparent)]
    Suite(#[from] suite::SuiteError),
    #[error("writing the output: {0}")]
    Write(String),
}

/// Runs `gatehouse test`, printing to `out` and diagnostics to `err`; returns the exit status.
pub fn run(args: &TestArgs, out: &mut impl Write, err: &mut impl Write) -> i32 {
    match outcome(args).and_then(|o| print(args.output, &o, out).map(|()| o)) {
        Ok(outcome) if outcome.failed == 0 => PASSED,
        Ok(_) => FAILED,
        Err(e) => {
            // Nothing useful is left to do if stderr itself fails.
            let _ = writeln!(err, "gatehouse test: {}", chain(&e));
            BAD_INPUT
        }
    }
}

/// Every test file under `args.dirs`, read and checked.
pub fn outcome(args: &TestArgs) -> Result<Outcome, TestError> {
    let mut found = Vec::new();
    for dir in &args.dirs {
        find(dir, &mut found)?;
    }
    if found.is_empty() {
        let dirs: Vec<String> = args.dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(TestError::NoTests(dirs.join(", ")));
    }
    let mut files = Vec::new();
    for path in found {
        let suite = suite::load(&path)?;
        files.push(FileOutcome {
            file: path.display().to_string(),
            name: suite.name.clone(),
            checks: verdict::check(&suite),
        });
    }
    Ok(Outcome::new(files))
}

/// The test files at or under `path`, in name order; hidden folders and `target` are passed
/// over.
fn find(path: &Path, found: &mut Vec<PathBuf>) -> Result<(), TestError> {
    if !path.is_dir() {
        found.push(path.to_path_buf());
        return Ok(());
    }
    let search = |source| TestError::Search {
        path: path.to_path_buf(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(search)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(search)?;
    entries.sort();
    for entry in entries {
        let name = entry.file_name().unwrap_or_default().to_string_lossy();
        // Not followed through a symbolic link: a link to a parent would never end.
        let is_dir = std::fs::symlink_metadata(&entry).is_ok_and(|m| m.is_dir());
        if is_dir {
            if !name.starts_with('.') && name != "target" {
                find(&entry, found)?;
            }
        } else if name == file::FILE_NAME {
            found.push(entry);
        }
    }
    Ok(())
}

fn print(format: Format, outcome: &Outcome, out: &mut impl Write) -> Result<(), TestError> {
    let text = match format {
        Format::Table => output::table(outcome),
        Format::Json => serde_json::to_string_pretty(outcome)
            .map(|s| s + "\n")
            .map_err(|e| TestError::Write(e.to_string()))?,
        Format::Junit => output::junit(outcome),
    };
    out.write_all(text.as_bytes())
        .map_err(|e| TestError::Write(e.to_string()))
}
