//! The one skeleton every kind of side effect runs on: the reconcile loop's pacing and backoff,
//! a pass only on the leader with every write fenced by its term, what a term remembers dropped
//! when the term changes, and a pass cut short by the end of the term counted as no failure.
//! Each kind (IP allocation, companion objects) is a module of its own that brings its caches,
//! its pass — fetch, decide (pure), apply keyed by UID, collect its orphans, status — and what
//! its term remembers.
use std::sync::Arc;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{Instrument, info, info_span};

use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{
    Failure, Next, NotLeading, Pacing, ReconcileMetrics, Term, run_loop,
};

/// A kind of side effect, as the skeleton runs it.
pub(crate) trait EffectKind {
    /// What one leader term remembers between passes; a new term starts from its default.
    type Memory: Default;
    /// The errors of a pass, named after the failing step.
    type Error: Failure;

    /// The loop's name, in metrics and logs.
    const NAME: &'static str;

    /// Every replica, before every pass: keeps what the kind holds besides its caches current
    /// (the address index). Returns when it wants the next look, if ever.
    fn refresh(&mut self) -> Option<Instant> {
        None
    }

    /// One pass on the leader; every write is fenced by `leader`'s term.
    async fn pass(
        &mut self,
        memory: &mut Self::Memory,
        leader: &watch::Receiver<Leadership>,
    ) -> Result<Next, Self::Error>;

    /// The end of the term, when the pass failed on it.
    fn not_leading(error: &Self::Error) -> Option<&NotLeading>;
}

/// Runs `kind` on the reconcile loop until the leader's channel closes: passes when `trigger` is
/// poked (a burst collected by `pacing`), on a change of term, when a pass asked, every resync.
pub(crate) async fn run_effect<K: EffectKind>(
    kind: &mut K,
    loops: &ReconcileMetrics,
    trigger: &Arc<Notify>,
    leader: &mut watch::Receiver<Leadership>,
    pacing: Pacing,
) {
    let leader_view = leader.clone();
    let mut memory = K::Memory::default();
    run_loop(K::NAME, loops, trigger, leader, pacing, async |term| {
        let refreshed = kind.refresh();
        if term != Term::Continuing {
            // A new term must not trust what an earlier one remembered.
            memory = K::Memory::default();
        }
        if !term.is_leading() {
            return Ok(refreshed.map_or(Next::Resync, Next::By));
        }
        let outcome = kind
            .pass(&mut memory, &leader_view)
            .instrument(info_span!("reconcile", controller = K::NAME))
            .await;
        match outcome {
            Err(e) => match K::not_leading(&e) {
                Some(ended) => {
                    info!(what = %ended.what, "leadership ended during the pass; stopped writing");
                    Ok(Next::Resync)
                }
                None => Err(e),
            },
            Ok(next) => Ok(next),
        }
    })
    .await;
}
