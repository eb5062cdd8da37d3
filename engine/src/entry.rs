//! What names a webhook entry and where the API server sends its requests: one place, read by
//! the wiring that writes the configurations, the server that routes requests and the checks
//! that hold a Policy's name to what an entry name allows. A group's own name and path are
//! [`crate::group::Group::entry_name`] and [`crate::group::Group::path`].

/// Suffix of every entry name: `<policy>.gatehouse.dev` for a Policy's own entry,
/// `<group>.mutate.gatehouse.dev` / `<group>.validate.gatehouse.dev` for a shared one.
pub const ENTRY_SUFFIX: &str = ".gatehouse.dev";
/// Prefix of the id of a Policy's own entry: `policy/<name>`, path `/mutate/policy/<name>`.
/// Group ids never contain `/`, so the two never collide.
pub const OWN_PREFIX: &str = "policy/";
/// Path prefix of a mutating entry.
pub const MUTATE_PREFIX: &str = "/mutate/";
/// Path prefix of a validating entry.
pub const VALIDATE_PREFIX: &str = "/validate/";
/// Path of Gatehouse's own validation of Policy objects.
pub const VALIDATE_POLICY_PATH: &str = "/policy-validation";

/// Entry name of a Policy's own entry: `<policy>.gatehouse.dev`.
pub fn entry_name(policy: &str) -> String {
    format!("{policy}{ENTRY_SUFFIX}")
}
