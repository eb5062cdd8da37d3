//! Running an offline command (`gatehouse eval`, `gatehouse test`) in-process, as its `run`
//! function with the arguments clap parsed: its exit status and what it printed.
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]

use clap::{Args, Parser};

/// What a command did.
pub struct Run {
    pub code: i32,
    pub out: String,
    pub err: String,
}

#[derive(Parser)]
struct Cli<A: Args> {
    #[command(flatten)]
    args: A,
}

/// Parses `args` as the command `name` takes them and runs `command` with them.
pub fn run_command<A: Args>(
    name: &str,
    args: &[&str],
    command: impl Fn(&A, &mut Vec<u8>, &mut Vec<u8>) -> i32,
) -> Run {
    let argv = std::iter::once(name).chain(args.iter().copied());
    let cli = Cli::<A>::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = command(&cli.args, &mut out, &mut err);
    Run {
        code,
        out: String::from_utf8(out).unwrap(),
        err: String::from_utf8(err).unwrap(),
    }
}
