//! Records the git revision the binary is built from, for `gatehouse --version`.
//! `GATEHOUSE_REVISION` overrides it (a container build has no `.git`).
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=GATEHOUSE_REVISION");
    // A new commit or checkout moves HEAD (or the ref it points to).
    // (A path that does not exist would make cargo run this script, and rebuild, every time.)
    for path in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let revision = std::env::var("GATEHOUSE_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=GATEHOUSE_REVISION={revision}");
}
