//! What is wrong with a Policy, each at the field path a user has to edit: shared by the
//! Policy checks and the companion checks.
use std::fmt;

/// One thing wrong with a Policy, at a field path such as `spec.validate[0].expression`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl Problem {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// One problem at `path` for each message the Kubernetes validator `validate` gives `value`,
/// saying which kind of name (`what`) it is not.
pub(crate) fn check_k8s_name(
    path: &str,
    value: &str,
    what: &str,
    validate: fn(&str) -> Result<(), Vec<String>>,
    problems: &mut Vec<Problem>,
) {
    if let Err(messages) = validate(value) {
        for message in messages {
            problems.push(Problem::new(
                path,
                format!("{value:?} is not a valid {what}: {message}"),
            ));
        }
    }
}
