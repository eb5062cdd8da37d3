//! What this leader wrote of the records and its watch has not shown yet: a record made or
//! updated a moment ago, or deleted, would otherwise look unchanged to the next pass, which
//! would call again. The pass reads the records through it.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::records::Record;

/// How long a write waits for the watch before the watch is believed again.
const TRUSTED_FOR: Duration = Duration::from_secs(60);

/// A write the watch has not shown yet.
#[derive(Clone, Debug)]
pub enum Change {
    /// The record as written.
    Wrote(Arc<Record>),
    /// The record of this key deleted.
    Deleted(String),
}

/// The writes of one leader term, by key.
#[derive(Debug, Default)]
pub struct Written {
    wrote: HashMap<String, (Instant, Arc<Record>)>,
    deleted: HashMap<String, Instant>,
}

impl Written {
    pub fn note(&mut self, change: Change, now: Instant) {
        match change {
            Change::Wrote(record) => {
                self.deleted.remove(&record.key);
                self.wrote.insert(record.key.clone(), (now, record));
            }
            Change::Deleted(key) => {
                self.wrote.remove(&key);
                self.deleted.insert(key, now);
            }
        }
    }

    /// The records as the watch has them, with this term's newer writes in their place; a write
    /// the watch has caught up with (or one older than [`TRUSTED_FOR`]) is forgotten.
    pub fn overlay(&mut self, watched: Vec<Arc<Record>>, now: Instant) -> Vec<Arc<Record>> {
        let fresh = |at: &Instant| now.duration_since(*at) < TRUSTED_FOR;
        self.wrote.retain(|_, (at, _)| fresh(at));
        self.deleted.retain(|_, at| fresh(at));
        let mut seen = HashMap::new();
        let mut records = Vec::with_capacity(watched.len());
        for record in watched {
            seen.insert(record.key.clone(), ());
            if self.deleted.contains_key(&record.key) {
                continue;
            }
            match self.wrote.get(&record.key) {
                Some((_, mine)) if !caught_up(&record, mine) => records.push(mine.clone()),
                Some(_) => {
                    self.wrote.remove(&record.key);
                    records.push(record);
                }
                None => records.push(record),
            }
        }
        // Gone from the watch: the delete is seen.
        self.deleted.retain(|key, _| seen.contains_key(key));
        for (key, (_, mine)) in &self.wrote {
            if !seen.contains_key(key) {
                records.push(mine.clone());
            }
        }
        records
    }
}

/// Whether the watched record shows what this term wrote (attempts only grow while a record
/// lives).
fn caught_up(watched: &Record, mine: &Record) -> bool {
    watched.state == mine.state && watched.attempts >= mine.attempts
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::{CallState, Owner};

    fn record(key: &str, state: CallState, attempts: i64) -> Record {
        Record {
            name: key.replace('/', "."),
            uid: String::new(),
            key: key.into(),
            policy: "p".into(),
            policy_uid: "p-uid".into(),
            effect: 0,
            url: "https://r.example".into(),
            object: Owner::default(),
            state,
            attempts,
            next_attempt: None,
            failed_generation: None,
            result: None,
            last_error: None,
        }
    }

    #[test]
    fn a_write_stands_until_the_watch_shows_it_and_a_delete_until_it_is_gone() {
        let now = Instant::now();
        let mut written = Written::default();
        written.note(
            Change::Wrote(Arc::new(record("a", CallState::Applied, 1))),
            now,
        );
        written.note(Change::Deleted("b".into()), now);
        written.note(
            Change::Wrote(Arc::new(record("c", CallState::Pending, 1))),
            now,
        );
        let watched = vec![
            Arc::new(record("a", CallState::Pending, 0)),
            Arc::new(record("b", CallState::Applied, 1)),
        ];
        let view = written.overlay(watched, now);
        let states: Vec<(&str, CallState)> =
            view.iter().map(|r| (r.key.as_str(), r.state)).collect();
        assert_eq!(
            states,
            [("a", CallState::Applied), ("c", CallState::Pending)],
            "a: mine; b: deleted; c: made, not watched yet"
        );
        // The watch caught up: its records are believed again.
        let watched = vec![
            Arc::new(record("a", CallState::Applied, 1)),
            Arc::new(record("c", CallState::Pending, 1)),
        ];
        written.overlay(watched, now);
        assert!(written.wrote.is_empty() && written.deleted.is_empty());
        // A write the watch never shows is forgotten after a while.
        written.note(
            Change::Wrote(Arc::new(record("d", CallState::Applied, 1))),
            now,
        );
        let later = now + TRUSTED_FOR + Duration::from_secs(1);
        assert!(written.overlay(Vec::new(), later).is_empty());
    }
}
