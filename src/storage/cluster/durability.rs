//! What the database promises about a commit the broker answers `queued`: read once at start
//! and logged, so an operator learns from the broker's own log when PostgreSQL's settings cannot
//! give the guarantee docs/reliability.md states (a crash or a failover that loses nothing
//! answered `queued`).
//!
//! The settings are read through the broker's own session, so a `synchronous_commit` set on
//! the role or the database counts. Standbys are counted in `pg_stat_replication`; their
//! `sync_state` is only visible to a role with `pg_read_all_stats` (else NULL), which is then
//! read as "not known to be synchronous".

use sqlx::PgExecutor;

use crate::storage::error::StorageError;

/// The durability settings of the primary the broker writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// `fsync`.
    pub fsync: bool,
    /// `synchronous_commit` as the broker's sessions see it.
    pub synchronous_commit: String,
    /// `synchronous_standby_names` (empty: replication is asynchronous).
    pub synchronous_standby_names: String,
    /// Standbys streaming from this primary.
    pub standbys: i64,
    /// Of those, the ones PostgreSQL reports as synchronous (`sync` or `quorum`).
    pub sync_standbys: i64,
}

/// How serious a finding is: a warning means a guarantee of docs/reliability.md does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Worth knowing; nothing promised is at risk.
    Info,
    /// An accepted message can be lost in the case named.
    Warn,
}

/// Reads the settings.
///
/// # Errors
///
/// Any database error.
pub async fn read<'e>(db: impl PgExecutor<'e>) -> Result<Durability, StorageError> {
    let row: (bool, String, String, i64, i64) = sqlx::query_as(
        "SELECT current_setting('fsync') = 'on',
                current_setting('synchronous_commit'),
                current_setting('synchronous_standby_names'),
                (SELECT count(*) FROM pg_stat_replication),
                (SELECT count(*) FROM pg_stat_replication
                  WHERE sync_state IN ('sync', 'quorum'))",
    )
    .fetch_one(db)
    .await?;
    Ok(Durability {
        fsync: row.0,
        synchronous_commit: row.1,
        synchronous_standby_names: row.2,
        standbys: row.3,
        sync_standbys: row.4,
    })
}

impl Durability {
    /// Whether a commit waits for a standby (given one is named and connected).
    fn waits_for_standby(&self) -> bool {
        !self.synchronous_standby_names.trim().is_empty()
            && matches!(
                self.synchronous_commit.as_str(),
                "on" | "remote_write" | "remote_apply"
            )
    }

    /// What an operator should know, most serious first.
    pub fn findings(&self) -> Vec<(Level, String)> {
        let mut found = Vec::new();
        if !self.fsync {
            found.push((
                Level::Warn,
                "fsync is off: a PostgreSQL crash or power loss can lose messages answered \
                 `queued`"
                    .to_string(),
            ));
        }
        if self.synchronous_commit == "off" {
            found.push((
                Level::Warn,
                "synchronous_commit is off for the broker's sessions: a PostgreSQL crash can lose \
                 the last commits answered `queued`"
                    .to_string(),
            ));
        }
        if self.standbys > 0 && !self.waits_for_standby() {
            found.push((
                Level::Warn,
                format!(
                    "{} standby(s) replicate asynchronously (synchronous_standby_names = {:?}, \
                     synchronous_commit = {}): a failover to one can lose commits answered \
                     `queued` that it had not received",
                    self.standbys, self.synchronous_standby_names, self.synchronous_commit
                ),
            ));
        }
        if self.waits_for_standby() && self.standbys == 0 {
            found.push((
                Level::Warn,
                format!(
                    "synchronous_standby_names = {:?} but no standby is connected: every commit \
                     waits for one (pushes are spooled after QUEEN_COMMIT_TIMEOUT_MS)",
                    self.synchronous_standby_names
                ),
            ));
        }
        if self.standbys == 0 && self.synchronous_standby_names.trim().is_empty() {
            found.push((
                Level::Info,
                "no standby streams from this database: a failover is not covered".to_string(),
            ));
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn durable() -> Durability {
        Durability {
            fsync: true,
            synchronous_commit: "on".into(),
            synchronous_standby_names: "*".into(),
            standbys: 1,
            sync_standbys: 1,
        }
    }

    fn warnings(d: &Durability) -> Vec<String> {
        d.findings()
            .into_iter()
            .filter(|(level, _)| *level == Level::Warn)
            .map(|(_, text)| text)
            .collect()
    }

    #[test]
    fn a_synchronous_standby_with_fsync_on_gives_no_warning() {
        assert!(durable().findings().is_empty());
        let remote_apply = Durability {
            synchronous_commit: "remote_apply".into(),
            ..durable()
        };
        assert!(remote_apply.findings().is_empty());
    }

    #[test]
    fn each_setting_that_breaks_a_guarantee_is_named() {
        let no_fsync = Durability {
            fsync: false,
            ..durable()
        };
        assert!(warnings(&no_fsync)[0].starts_with("fsync is off"));

        let async_commit = Durability {
            synchronous_commit: "off".into(),
            ..durable()
        };
        let found = warnings(&async_commit);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("synchronous_commit is off"));
        assert!(found[1].contains("replicate asynchronously"));

        let local = Durability {
            synchronous_commit: "local".into(),
            ..durable()
        };
        assert!(warnings(&local)[0].contains("replicate asynchronously"));

        let unnamed = Durability {
            synchronous_standby_names: String::new(),
            sync_standbys: 0,
            standbys: 2,
            ..durable()
        };
        assert!(warnings(&unnamed)[0].starts_with("2 standby(s) replicate asynchronously"));

        let waiting = Durability {
            standbys: 0,
            sync_standbys: 0,
            ..durable()
        };
        assert!(warnings(&waiting)[0].contains("no standby is connected"));
    }

    #[test]
    fn a_single_durable_server_is_only_told_that_failover_is_not_covered() {
        let single = Durability {
            synchronous_standby_names: String::new(),
            standbys: 0,
            sync_standbys: 0,
            ..durable()
        };
        assert!(warnings(&single).is_empty());
        assert_eq!(single.findings().len(), 1);
        assert_eq!(single.findings()[0].0, Level::Info);
    }
}
