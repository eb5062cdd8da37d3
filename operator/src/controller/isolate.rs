//! Finding the Policies the API server refuses, so that one of them can never block the
//! configuration write every other Policy, every deletion and every caBundle update depends on.
//!
//! `validate()` applies the API server's rules to everything that ends up in an entry, but the
//! API server is the judge (its CEL type checker, for one, is stricter than ours). When a write
//! is refused as invalid, the controller bisects with server-side dry runs: groups that the
//! server accepts together with everything accepted so far are kept whole, refused groups are
//! split, and a refused single Policy is the culprit. k culprits among n Policies cost about
//! 2k·log2(n) dry runs, and only when a write was refused.
use std::future::Future;

/// Splits `candidates` into the ones `accepted` keeps (in order) and the refused ones with the
/// reason. `accepted(set)` asks whether a configuration holding exactly `set` is accepted:
/// `Ok(Ok(()))` yes, `Ok(Err(reason))` refused as invalid, `Err(e)` could not tell (then the
/// search stops with that error). Fails with `Err(Ok(reason))` when even the empty set is
/// refused: then no Policy is to blame.
pub async fn refused<T, F, Fut, E>(
    candidates: Vec<T>,
    mut accepted: F,
) -> Result<(Vec<T>, Vec<(T, String)>), Result<String, E>>
where
    T: Clone,
    F: FnMut(Vec<T>) -> Fut,
    Fut: Future<Output = Result<Result<(), String>, E>>,
{
    if let Err(reason) = accepted(Vec::new()).await.map_err(Err)? {
        return Err(Ok(reason));
    }
    let mut good: Vec<T> = Vec::new();
    let mut bad: Vec<(T, String)> = Vec::new();
    // Depth-first, left before right, so culprits are found in candidate order.
    let mut stack: Vec<Vec<T>> = vec![candidates];
    while let Some(mut group) = stack.pop() {
        if group.is_empty() {
            continue;
        }
        let mut trial = good.clone();
        trial.extend(group.iter().cloned());
        match accepted(trial).await.map_err(Err)? {
            Ok(()) => good.append(&mut group),
            Err(reason) if group.len() == 1 => bad.extend(group.pop().map(|t| (t, reason))),
            Err(_) => {
                let right = group.split_off(group.len() / 2);
                stack.push(right);
                stack.push(group);
            }
        }
    }
    Ok((good, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    type Found = (Vec<u32>, Vec<(u32, String)>);

    /// Runs `refused` over 0..n with an oracle that refuses any set containing a member of
    /// `culprits`, naming the first one; returns the result and the number of dry runs.
    fn run(n: u32, culprits: &[u32]) -> (Found, usize) {
        let calls = Cell::new(0);
        let result = futures::executor::block_on(refused((0..n).collect(), |set: Vec<u32>| {
            calls.set(calls.get() + 1);
            let found = set.iter().find(|x| culprits.contains(x)).copied();
            async move {
                Ok::<_, ()>(match found {
                    Some(x) => Err(format!("entry of {x} is invalid")),
                    None => Ok(()),
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
        let ((good, bad), calls) = run(200, &[]);
        assert_eq!(good.len(), 200);
        assert!(bad.is_empty());
        assert_eq!(calls, 2);
    }

    #[test]
    fn culprits_are_found_with_the_servers_reason_and_the_rest_kept_in_order() {
        let ((good, bad), calls) = run(200, &[7, 150]);
        assert_eq!(
            bad,
            vec![
                (7, "entry of 7 is invalid".to_string()),
                (150, "entry of 150 is invalid".to_string())
            ]
        );
        let want: Vec<u32> = (0..200).filter(|x| *x != 7 && *x != 150).collect();
        assert_eq!(good, want);
        // Logarithmic, not one dry run per Policy.
        assert!(calls <= 2 + 2 * 2 * 8, "{calls} dry runs");
    }

    #[test]
    fn every_member_refused_is_every_member_blamed() {
        let ((good, bad), _) = run(5, &[0, 1, 2, 3, 4]);
        assert!(good.is_empty());
        assert_eq!(bad.len(), 5);
    }

    #[test]
    fn a_refused_empty_set_blames_nobody_and_errors_stop_the_search() {
        let r = futures::executor::block_on(refused(vec![1, 2], |_set: Vec<u32>| async {
            Ok::<_, ()>(Err("the self entry is invalid".to_string()))
        }));
        assert!(matches!(r, Err(Ok(reason)) if reason == "the self entry is invalid"));
        let r = futures::executor::block_on(refused(vec![1, 2], |_set: Vec<u32>| async {
            Err::<Result<(), String>, _>("connection refused")
        }));
        assert!(matches!(r, Err(Err("connection refused"))));
    }
}
