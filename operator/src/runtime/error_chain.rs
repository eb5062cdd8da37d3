//! Printing an error with its causes, each once.
//!
//! Gatehouse's errors name the step that failed and keep what went wrong underneath as their
//! `source`, without repeating it in their own message: whoever prints an error prints the chain,
//! once, here or with `{:#}` on an `anyhow::Error` at the CLI's edge. Logs and messages that end
//! up in API responses use [`chain`].
use std::error::Error;
use std::fmt;

/// `error` and its causes as one line: `step: cause: cause of the cause`.
pub fn chain<'e>(error: &'e (dyn Error + 'static)) -> Chain<'e> {
    Chain(error)
}

/// The [`Display`](fmt::Display) of an error chain, made by [`chain`].
#[derive(Clone, Copy)]
pub struct Chain<'e>(&'e (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut message = self.0.to_string();
        f.write_str(&message)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            // Errors of other crates often repeat their cause in their own message: printing it
            // again would say the same thing twice.
            if !message.contains(&text) {
                write!(f, ": {text}")?;
            }
            message = text;
            cause = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TlsError;

    fn server_config_error() -> TlsError {
        TlsError::BuildServerConfig {
            source: rustls::Error::General("no usable key".into()),
        }
    }

    #[test]
    fn the_cause_is_printed_once() {
        let printed = [
            chain(&server_config_error()).to_string(),
            // What the CLI prints for `gatehouse run`.
            format!("{:#}", anyhow::Error::new(server_config_error())),
        ];
        for line in printed {
            assert!(
                line.starts_with("building the rustls server config: "),
                "{line}"
            );
            assert_eq!(line.matches("no usable key").count(), 1, "{line}");
        }
    }

    #[test]
    fn a_cause_repeated_by_its_parent_is_not_printed_again() {
        #[derive(Debug, thiserror::Error)]
        #[error("reading the config")]
        struct Outer(#[source] Repeats);
        /// As some crates write theirs: the cause in the message and as the source.
        #[derive(Debug, thiserror::Error)]
        #[error("api error: {0}")]
        struct Repeats(#[source] std::io::Error);
        let error = Outer(Repeats(std::io::Error::other("connection reset")));
        assert_eq!(
            chain(&error).to_string(),
            "reading the config: api error: connection reset"
        );
    }
}
