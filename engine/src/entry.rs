//! What names a webhook entry and where the API server sends its requests: one place, read by
//! the wiring that writes the configurations, the server that routes requests and the checks
//! that hold a Policy's name to what an entry name allows.
use super::Phase;
use super::group::Group;

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

/// Entry name of a group: its own Policy's entry name, or `<id>.mutate.gatehouse.dev` /
/// `<id>.validate.gatehouse.dev`.
pub fn group_entry_name(g: &Group) -> String {
    match g.id.strip_prefix(OWN_PREFIX) {
        Some(policy) => entry_name(policy),
        None => {
            let phase = match g.phase {
                Phase::Mutating => "mutate",
                Phase::Validating => "validate",
            };
            format!("{}.{phase}{ENTRY_SUFFIX}", g.id)
        }
    }
}

/// The path of a group's entry: `/mutate/<id>` or `/validate/<id>`.
pub fn group_path(g: &Group) -> String {
    let prefix = match g.phase {
        Phase::Mutating => MUTATE_PREFIX,
        Phase::Validating => VALIDATE_PREFIX,
    };
    format!("{prefix}{}", g.id)
}
