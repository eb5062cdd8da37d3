//! Command-line interface: `gatehouse run`, `gatehouse eval`, `gatehouse test`, `gatehouse crds`.
pub mod crds;
pub mod documents;
pub mod duration;
pub mod eval;
pub mod run;
pub mod synthetic;
pub mod test;

use crate::runtime::error_chain::chain;
use clap::{Parser, Subcommand};

/// `gatehouse --version`: the crate version and the git revision it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("GATEHOUSE_REVISION"),
    ")"
);

/// Gatehouse: admission webhooks from Policy resources, with side effects done right.
#[derive(Parser, Debug)]
#[command(name = "gatehouse", version = VERSION, about)]
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
    /// Run Policy tests (gatehouse-test.yaml files) without a cluster.
    Test(test::TestArgs),
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
        Command::Test(args) => {
            let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
            test::run(&args, &mut out, &mut err)
        }
        Command::Crds(args) => match crds::run(&args, &mut std::io::stdout().lock()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("gatehouse crds: {}", chain(&e));
                1
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_version_names_the_crate_version_and_the_revision() {
        let long = Cli::command().render_version();
        assert!(
            long.starts_with(&format!("gatehouse {} (", env!("CARGO_PKG_VERSION"))),
            "{long}"
        );
        let revision = long
            .trim()
            .trim_end_matches(')')
            .rsplit('(')
            .next()
            .unwrap_or_default();
        assert!(!revision.is_empty(), "{long}");
    }

    #[test]
    fn every_run_flag_is_also_an_environment_variable_and_help_shows_it() {
        let mut cli = Cli::command();
        let run = cli.find_subcommand_mut("run").expect("run");
        let help = run.render_long_help().to_string();
        for arg in run.get_arguments() {
            if arg.is_positional() || ["help", "version"].contains(&arg.get_id().as_str()) {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{} has no environment variable", arg.get_id()));
            let env = env.to_string_lossy();
            assert!(
                help.contains(&format!("[env: {env}")),
                "help does not show {env}"
            );
        }
    }
}
