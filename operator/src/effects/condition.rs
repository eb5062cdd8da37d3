//! A loop's own condition in a Policy's conditions, a list it shares with the controller and
//! the other loops: replaced in place, its transition time moved only when its status flips,
//! and no write at all when nothing changed.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// What a loop says in its condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Said {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// `conditions` with `said` in place of its type's entry (last), or `None` when the entry says
/// so already for `generation` (and `unchanged_rest` holds: the loop's other status fields are
/// as written).
pub fn replaced(
    conditions: &[Condition],
    said: Said,
    generation: Option<i64>,
    unchanged_rest: bool,
    now: Time,
) -> Option<Vec<Condition>> {
    let previous = conditions.iter().find(|c| c.type_ == said.type_);
    let same = previous.is_some_and(|c| {
        c.status == said.status && c.message == said.message && c.observed_generation == generation
    });
    if same && unchanged_rest {
        return None;
    }
    let mut next: Vec<Condition> = conditions
        .iter()
        .filter(|c| c.type_ != said.type_)
        .cloned()
        .collect();
    next.push(Condition {
        type_: said.type_.to_string(),
        status: said.status.to_string(),
        reason: said.reason.to_string(),
        message: said.message,
        observed_generation: generation,
        last_transition_time: match previous {
            Some(p) if p.status == said.status => p.last_transition_time.clone(),
            _ => now,
        },
    });
    Some(next)
}

/// Up to five of `problems` joined, and how many more there are.
pub fn first_five(problems: &[String]) -> String {
    let shown = problems.iter().take(5).cloned();
    let more = problems.len().saturating_sub(5);
    let tail = (more > 0).then(|| format!("and {more} more"));
    shown.chain(tail).collect::<Vec<_>>().join("; ")
}
