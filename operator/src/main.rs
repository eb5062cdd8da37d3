#![forbid(unsafe_code)]
//! Thin entry point: crypto provider, arguments, run.
use clap::Parser;

// Admission decodes, copies and drops a JSON tree per review; glibc malloc was about a third of
// the webhook's CPU in profiles, mimalloc roughly halves that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    // kube's client and our webhook server both use rustls; pick the provider once, up front.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = gatehouse::cli::Cli::parse();
    std::process::exit(gatehouse::cli::main(cli).await);
}
