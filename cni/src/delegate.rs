//! Running the fallback IPAM plugin, as a main plugin runs its IPAM plugin: found in `CNI_PATH`,
//! given the same environment and the (rewritten) configuration on stdin; its stdout and exit
//! code become this plugin's.
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::protocol::{CniError, ErrorCode};

/// What the fallback answered.
#[derive(Debug)]
pub struct Answer {
    pub stdout: Vec<u8>,
    pub code: i32,
}

/// The first executable file called `plugin` in the `:`-separated `cni_path`.
pub fn find(plugin: &str, cni_path: Option<&str>) -> Result<PathBuf, CniError> {
    let cni_path = cni_path.filter(|p| !p.is_empty()).ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("CNI_PATH is not set: the fallback {plugin:?} cannot be found"),
        )
    })?;
    cni_path
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| PathBuf::from(dir).join(plugin))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            CniError::new(
                ErrorCode::InvalidConfig,
                format!("the fallback IPAM plugin {plugin:?} is not in CNI_PATH ({cni_path})"),
            )
        })
}

/// Runs `binary` with `stdin`, inheriting the environment and stderr.
pub fn run(binary: &PathBuf, stdin: &[u8]) -> Result<Answer, CniError> {
    let io = |what: &str, e: std::io::Error| {
        CniError::new(
            ErrorCode::Io,
            format!("{what} the fallback {}: {e}", binary.display()),
        )
    };
    let mut child = Command::new(binary)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| io("starting", e))?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).map_err(|e| io("writing to", e))?;
    }
    let output = child.wait_with_output().map_err(|e| io("waiting for", e))?;
    Ok(Answer {
        stdout: output.stdout,
        // Killed by a signal: no code of its own, a failure all the same.
        code: output.status.code().unwrap_or(1),
    })
}
