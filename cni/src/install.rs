//! What the `config/cni` DaemonSet runs (the image has no shell, so the plugin installs itself):
//! `gatehouse-ipam install --dir DIR` copies this very binary into the node's CNI binary
//! directory, atomically (a runtime never runs a half-written plugin), as an init container, so
//! a Ready Pod means an installed plugin; `gatehouse-ipam sleep` then keeps the Pod Running.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Why the installation failed, named after the failing step.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(
        "usage: gatehouse-ipam install --dir DIR, or gatehouse-ipam sleep (as a CNI plugin it takes no arguments)"
    )]
    Usage,
    #[error("locating this executable")]
    Locate(#[source] std::io::Error),
    #[error("copying {from} to {to}")]
    Copy {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    #[error("making {path} executable")]
    Permissions {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("moving {from} into place as {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
}

/// The name the plugin is installed under: the `type` in the network configuration.
pub const PLUGIN_NAME: &str = "gatehouse-ipam";

/// Runs `gatehouse-ipam <command> <args>`.
pub fn main(command: &str, args: &[String]) -> ExitCode {
    let result = match (command, args) {
        ("install", [flag, dir]) if flag == "--dir" => install_into(Path::new(dir)),
        ("sleep", []) => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        _ => Err(InstallError::Usage),
    };
    match result {
        Ok(installed) => {
            eprintln!("gatehouse-ipam: installed {}", installed.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("gatehouse-ipam: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Copies the running executable to `dir/gatehouse-ipam` through a temporary file and a rename.
pub fn install_into(dir: &Path) -> Result<PathBuf, InstallError> {
    let from = std::env::current_exe().map_err(InstallError::Locate)?;
    let to = dir.join(PLUGIN_NAME);
    let temporary = dir.join(format!(".{PLUGIN_NAME}.installing"));
    std::fs::copy(&from, &temporary).map_err(|source| InstallError::Copy {
        from: from.clone(),
        to: temporary.clone(),
        source,
    })?;
    set_executable(&temporary)?;
    std::fs::rename(&temporary, &to).map_err(|source| InstallError::Rename {
        from: temporary,
        to: to.clone(),
        source,
    })?;
    Ok(to)
}

fn set_executable(path: &Path) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(|source| {
        InstallError::Permissions {
            path: path.to_path_buf(),
            source,
        }
    })
}
