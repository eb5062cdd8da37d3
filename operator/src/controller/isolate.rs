//! Finding the Policies the API server refuses, so that one of them can never block the
//! configuration write every other Policy, every deletion and every caBundle update depends on.
//!
//! `validate()` applies the API server's rules to everything that ends up in an entry, but the
//! API server is the judge (it may know what we cannot: an admission policy of the cluster's
//! own on webhook configurations, for one). When a write
//! is refused as invalid, the controller bisects with server-side dry runs: groups that the
//! server accepts together with everything accepted so far are kept whole, refused groups are
//! split, and a refused single Policy is the culprit. k culprits among n Policies cost about
//! 2k·log2(n) dry runs, and only when a write was refused.
use std::future::Future;

/// What the API server says of a configuration, asked with a dry run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DryRun {
    Accepted,
    /// Refused as invalid, with the API server's message.
    Refused(String),
}

/// A candidate the API server refuses, and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Culprit<T> {
    pub candidate: T,
    pub reason: String,
}

/// The candidates split by the search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split<T> {
    /// Accepted together, in candidate order.
    pub accepted: Vec<T>,
    pub refused: Vec<Culprit<T>>,
}

/// Why the search blamed nobody.
#[derive(Debug, PartialEq, Eq)]
pub enum SearchError<E> {
    /// Even the configuration without any candidate is refused, with this message.
    RefusedWithoutCandidates(String),
    /// A dry run could not tell.
    DryRun(E),
}

/// Splits `candidates` into the ones the API server accepts together and the ones it refuses.
/// `dry_run(set)` asks about a configuration holding exactly `set`; an error stops the search.
pub async fn refused<T, F, Fut, E>(
    candidates: Vec<T>,
    mut dry_run: F,
) -> Result<Split<T>, SearchError<E>>
where
    T: Clone,
    F: FnMut(Vec<T>) -> Fut,
    Fut: Future<Output = Result<DryRun, E>>,
{
    if let DryRun::Refused(reason) = dry_run(Vec::new()).await.map_err(SearchError::DryRun)? {
        return Err(SearchError::RefusedWithoutCandidates(reason));
    }
    let mut split = Split {
        accepted: Vec::new(),
        refused: Vec::new(),
    };
    // Depth-first, left before right, so culprits are found in candidate order.
    let mut stack: Vec<Vec<T>> = vec![candidates];
    while let Some(mut group) = stack.pop() {
        if group.is_empty() {
            continue;
        }
        let mut trial = split.accepted.clone();
        trial.extend(group.iter().cloned());
        match dry_run(trial).await.map_err(SearchError::DryRun)? {
            DryRun::Accepted => split.accepted.append(&mut group),
            DryRun::Refused(reason) if group.len() == 1 => {
                split
                    .refused
                    .extend(group.pop().map(|candidate| Culprit { candidate, reason }));
            }
            DryRun::Refused(_) => {
                let right = group.split_off(group.len() / 2);
                stack.push(right);
                stack.push(group);
            }
        }
    }
    Ok(split)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    type Found = Split<u32>;

    /// Runs `refused` over 0..n with an oracle that refuses any set containing a member of
    /// `culprits`, naming the first one; returns the result and the number of dry runs.
    fn run(n: u32, culprits: &[u32]) -> (Found, usize) {
        let calls = Cell::new(0);
        let result = futures::executor::block_on(refused((0..n).collect(), |set: Vec<u32>| {
            calls.set(calls.get() + 1);
            let found = set.iter().find(|x| culprits.contains(x)).copied();
            async move {
                Ok::<_, ()>(match found {
                    Some(x) => DryRun::Refused(format!("entry of {x} is invalid")),
                    None => DryRun::Accepted,
                })
            }
        }));
        (
            result.unwrap_or_else(|_| panic!("search failed")),
            calls.get(),
        )
    }

    #[test]
    fn no_culprit_costs_two_dry_runs() {
        let (split, calls) = run(200, &[]);
        assert_eq!(split.accepted.len(), 200);
        assert!(split.refused.is_empty());
        assert_eq!(calls, 2);
    }

    #[test]
    fn culprits_are_found_with_the_servers_reason_and_the_rest_kept_in_order() {
        let (split, calls) = run(200, &[7, 150]);
        let culprit = |candidate: u32| Culprit {
            candidate,
            reason: format!("entry of {candidate} is invalid"),
        };
        assert_eq!(split.refused, vec![culprit(7), culprit(150)]);
        let want: Vec<u32> = (0..200).filter(|x| *x != 7 && *x != 150).collect();
        assert_eq!(split.accepted, want);
        // Logarithmic, not one dry run per Policy.
        assert!(calls <= 2 + 2 * 2 * 8, "{calls} dry runs");
    }

    #[test]
    fn every_member_refused_is_every_member_blamed() {
        let (split, _) = run(5, &[0, 1, 2, 3, 4]);
        assert!(split.accepted.is_empty());
        assert_eq!(split.refused.len(), 5);
    }

    #[test]
    fn a_refused_empty_set_blames_nobody_and_errors_stop_the_search() {
        let r = futures::executor::block_on(refused(vec![1, 2], |_set: Vec<u32>| async {
            Ok::<_, ()>(DryRun::Refused("the self entry is invalid".to_string()))
        }));
        assert_eq!(
            r,
            Err(SearchError::RefusedWithoutCandidates(
                "the self entry is invalid".to_string()
            ))
        );
        let r = futures::executor::block_on(refused(vec![1, 2], |_set: Vec<u32>| async {
            Err::<DryRun, _>("connection refused")
        }));
        assert_eq!(r, Err(SearchError::DryRun("connection refused")));
    }
}
