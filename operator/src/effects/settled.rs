//! How the companions and calls loops count a write: done, settled by the API server's answer,
//! or the reason it failed, for the Policy's condition.
use crate::runtime::error_chain::chain;

/// A write's outcome: done (or settled by one of `settled_by`: the object gone, or changed so
/// that the write no longer applies), or the reason it failed.
pub fn settled<T>(written: Result<T, kube::Error>, settled_by: &[u16]) -> Result<(), String> {
    match written {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if settled_by.contains(&e.code) => Ok(()),
        Err(e) => Err(reason(&e)),
    }
}

/// The API server's message, or the error's chain.
pub fn reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.reason),
        other => chain(other).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("the object changed", "Conflict")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_listed_code_settles_and_others_give_the_reason() {
        assert_eq!(settled(Ok::<(), _>(()), &[]), Ok(()));
        assert_eq!(settled::<()>(Err(status(409)), &[404, 409]), Ok(()));
        assert_eq!(
            settled::<()>(Err(status(409)), &[404]),
            Err("the object changed (Conflict)".to_string())
        );
    }
}
