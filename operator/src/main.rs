#![forbid(unsafe_code)]
//! Thin entry point: crypto provider, arguments, run.
use clap::Parser;

#[tokio::main]
async fn main() {
    // kube's client and our webhook server both use rustls; pick the provider once, up front.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = gatehouse::cli::Cli::parse();
    std::process::exit(gatehouse::cli::main(cli).await);
}
