//! The plugin as the runtime runs it: environment and stdin in, a result or an error object out.
use std::io::{Read, Write};
use std::process::ExitCode;

use gatehouse_ipam::plugin::{Exit, plan};
use gatehouse_ipam::protocol::{CniError, Environment, ErrorCode, LATEST_VERSION};
use gatehouse_ipam::{delegate, install};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(first) = args.first() {
        return install::main(first, &args[1..]);
    }
    let env = Environment::from_lookup(|name| std::env::var(name).ok());
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let error = CniError::new(ErrorCode::Io, format!("reading stdin: {e}"));
        return fail(&error, LATEST_VERSION);
    }
    match plan(&env, &stdin) {
        Exit::Reply(result) => print(result.as_bytes(), 0),
        Exit::Done => ExitCode::SUCCESS,
        Exit::Fail { error, version } => fail(&error, &version),
        Exit::Delegate { plugin, stdin } => {
            match delegate::find(&plugin, env.path.as_deref())
                .and_then(|binary| delegate::run(&binary, &stdin))
            {
                Ok(answer) => print(&answer.stdout, answer.code),
                Err(error) => fail(&error, LATEST_VERSION),
            }
        }
    }
}

fn print(bytes: &[u8], code: i32) -> ExitCode {
    let mut out = std::io::stdout().lock();
    if out.write_all(bytes).and_then(|()| out.flush()).is_err() {
        return ExitCode::FAILURE;
    }
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn fail(error: &CniError, version: &str) -> ExitCode {
    let _ = print(error.to_json(version).as_bytes(), 1);
    ExitCode::FAILURE
}
