//! Command-line interface: `gatehouse run`, `gatehouse eval`, `gatehouse crds`.
pub mod crds;
pub mod duration;
pub mod eval;
pub mod run;

use clap::{Parser, Subcommand};

/// Gatehouse: admission webhooks from Policy resources, with side effects done right.
#[derive(Parser, Debug)]
#[command(name = "gatehouse", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the operator: Policy controller, TLS manager, webhook server and admin server.
    Run(Box<run::RunArgs>),
    /// Evaluate Policies against an object or AdmissionReview offline, as the API server would.
    Eval(eval::EvalArgs),
    /// Print (or write) the CRD YAML generated from the Rust types.
    Crds(crds::CrdsArgs),
}

/// Runs the parsed command and returns the process exit status.
pub async fn main(cli: Cli) -> i32 {
    match cli.command {
        Command::Run(args) => match run::run(*args).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("gatehouse run: {e:#}");
                1
            }
        },
        Command::Eval(args) => {
            let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
            eval::run(&args, &mut out, &mut err)
        }
        Command::Crds(args) => match crds::run(&args, &mut std::io::stdout().lock()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("gatehouse crds: {e}");
                1
            }
        },
    }
}
