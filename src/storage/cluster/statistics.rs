//! The planner's statistics of the tables the broker grows: a table that grew from nothing (a
//! new database, a burst of new partitions) is analyzed by the broker as soon as it holds
//! [`MIN_ROWS`] rows, and again whenever it has doubled since, instead of waiting for
//! autovacuum.
//!
//! Why: until a table is first analyzed, PostgreSQL plans it with default selectivities. The
//! one-statement pop's write-order scan ([`crate::storage::consume::statements::READY_SQL`])
//! is then planned as a bitmap scan that sorts every partition written since the group's
//! watermark: 7.7–9.5 ms among 10 000 such partitions, against 1.3–1.5 ms for the ordered index
//! scan it gets once `queen.partitions` has statistics (docs/history/benchmarks.md, "A new
//! database's tables analyzed by the broker"). Autovacuum analyzes a new table only at its
//! first visit (77 s into that bench), and never where it is off.
//!
//! A database without autovacuum gets no statistics at all but these; the broker says at start
//! that autovacuum is off (nothing vacuums the tables either).
//!
//! Every broker checks; one at a time analyzes (a transaction-level advisory lock per table),
//! and a broker tries a table again only once it has doubled since its last try, so a role that
//! does not own the tables (PostgreSQL then skips them with a warning) costs one statement per
//! doubling.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{PgExecutor, PgPool};

use crate::storage::error::StorageError;

/// The tables whose plans depend on how many rows they hold: the pop's lists and write-order
/// scan read `queen.partitions` and `queen.partition_consumers`; its segment reads,
/// `queen.segments`.
pub const TABLES: [&str; 3] = [
    "queen.partitions",
    "queen.partition_consumers",
    "queen.segments",
];

/// Below this many rows a table is left to autovacuum: default estimates plan a small table
/// well enough.
pub const MIN_ROWS: i64 = 1_000;

/// How often a broker looks at the tables' sizes (one read of `pg_stat_user_tables`).
pub const EVERY: Duration = Duration::from_secs(2);

/// Namespace of the advisory lock that keeps two brokers from analyzing one table at once.
const ANALYZE_LOCK: i32 = 0x5153_5441; // "QSTA"

/// One table's size against what the planner knows of it.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSize {
    /// Schema-qualified name, one of [`TABLES`].
    pub table: String,
    /// Live rows as the statistics collector counts them (`n_live_tup`).
    pub rows: i64,
    /// The rows the planner assumes (`pg_class.reltuples`; 0 when never counted).
    pub planned_rows: i64,
    /// Whether the table was ever analyzed, by hand or by autovacuum.
    pub analyzed: bool,
}

impl TableSize {
    /// Whether the table is due for an `ANALYZE`, given the rows it held when this broker last
    /// tried (`None`: never tried).
    pub fn is_due(&self, last_try: Option<i64>) -> bool {
        let grown = !self.analyzed || self.rows > 2 * self.planned_rows;
        let tried_since = last_try.is_some_and(|rows| self.rows <= 2 * rows);
        self.rows >= MIN_ROWS && grown && !tried_since
    }
}

/// Reads the sizes of [`TABLES`].
///
/// # Errors
///
/// Any database error.
pub async fn read<'e>(db: impl PgExecutor<'e>) -> Result<Vec<TableSize>, StorageError> {
    let rows: Vec<(String, i64, i64, bool)> = sqlx::query_as(
        "SELECT s.schemaname || '.' || s.relname, s.n_live_tup,
                GREATEST(c.reltuples, 0)::int8,
                s.analyze_count + s.autoanalyze_count > 0
           FROM pg_stat_user_tables s
           JOIN pg_class c ON c.oid = s.relid
          WHERE s.relid = ANY ($1::text[]::regclass[])
          ORDER BY s.relid",
    )
    .bind(&TABLES[..])
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(table, rows, planned_rows, analyzed)| TableSize {
            table,
            rows,
            planned_rows,
            analyzed,
        })
        .collect())
}

/// Analyzes `table` (one of [`TABLES`]) unless another broker is analyzing it right now.
/// Returns whether this call ran the `ANALYZE`.
///
/// # Errors
///
/// Any database error; a name not in [`TABLES`] (a bug of the caller) is refused as
/// [`StorageError::Inconsistent`].
pub async fn analyze(pool: &PgPool, table: &str) -> Result<bool, StorageError> {
    let Some(index) = TABLES.iter().position(|t| *t == table) else {
        return Err(StorageError::Inconsistent(format!(
            "{table} is not a table the broker analyzes"
        )));
    };
    let mut tx = pool.begin().await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, $2)")
        .bind(ANALYZE_LOCK)
        .bind(index as i32)
        .fetch_one(&mut *tx)
        .await?;
    if locked {
        // The name is one of TABLES, never text from a request.
        sqlx::query(&format!("ANALYZE {table}"))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(locked)
}

/// Whether autovacuum runs on the broker's database: the `autovacuum` setting, and
/// `track_counts`, without which it has nothing to go by (and neither has [`analyze_grown`]).
///
/// # Errors
///
/// Any database error.
pub async fn autovacuum_on<'e>(db: impl PgExecutor<'e>) -> Result<bool, StorageError> {
    Ok(sqlx::query_scalar(
        "SELECT current_setting('autovacuum') = 'on' AND current_setting('track_counts') = 'on'",
    )
    .fetch_one(db)
    .await?)
}

/// The rows each table held when this broker last tried to analyze it.
#[derive(Debug, Default)]
pub struct Tries {
    rows: HashMap<String, i64>,
}

/// One look: analyzes every table of [`TABLES`] that is due ([`TableSize::is_due`]) and
/// returns the sizes of those this call analyzed.
///
/// # Errors
///
/// Any database error (the tables analyzed before it stay analyzed).
pub async fn analyze_grown(
    pool: &PgPool,
    tries: &mut Tries,
) -> Result<Vec<TableSize>, StorageError> {
    let mut analyzed = Vec::new();
    for size in read(pool).await? {
        if !size.is_due(tries.rows.get(&size.table).copied()) {
            continue;
        }
        // Counted as tried once the statement ran (or another broker held the table): a failed
        // one is tried again at the next look, not only once the table has doubled.
        let ran = analyze(pool, &size.table).await?;
        tries.rows.insert(size.table.clone(), size.rows);
        if ran {
            analyzed.push(size);
        }
    }
    Ok(analyzed)
}

/// The background task: says once whether autovacuum is off, then an [`analyze_grown`] every
/// [`EVERY`].
pub async fn keep_loop(pool: PgPool) {
    match autovacuum_on(&pool).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "autovacuum (or track_counts) is off on this database: the broker analyzes the \
             tables it grows, but nothing vacuums them, so the dead row versions every write \
             leaves in queen.partitions pile up and slow every pop; turn autovacuum on"
        ),
        Err(e) => tracing::debug!(error = %e, "whether autovacuum runs could not be read"),
    }
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tries = Tries::default();
    loop {
        tick.tick().await;
        match analyze_grown(&pool, &mut tries).await {
            Ok(analyzed) => {
                for size in analyzed {
                    tracing::info!(
                        table = %size.table,
                        rows = size.rows,
                        planned_rows = size.planned_rows,
                        analyzed_before = size.analyzed,
                        "analyzed a table that grew past what the planner knew of it"
                    );
                }
            }
            // While PostgreSQL is away the spool and the health checks say so; not every tick.
            Err(e) if e.is_unreachable() => {
                tracing::debug!(error = %e, "the look at grown tables failed: the database is away");
            }
            Err(e) => {
                tracing::warn!(error = %e, "the look at grown tables failed; retrying at the next interval");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(rows: i64, planned_rows: i64, analyzed: bool) -> TableSize {
        TableSize {
            table: "queen.partitions".into(),
            rows,
            planned_rows,
            analyzed,
        }
    }

    #[test]
    fn a_small_table_is_left_to_autovacuum() {
        assert!(!size(MIN_ROWS - 1, 0, false).is_due(None));
        assert!(size(MIN_ROWS, 0, false).is_due(None));
    }

    #[test]
    fn an_analyzed_table_is_due_once_it_doubled() {
        assert!(!size(20_000, 10_000, true).is_due(None));
        assert!(size(20_001, 10_000, true).is_due(None));
        // Vacuumed but never analyzed: the planner counts its rows but has no column statistics.
        assert!(size(10_000, 10_000, false).is_due(None));
    }

    #[test]
    fn a_table_tried_is_tried_again_only_once_it_doubled_since() {
        // A role that does not own the table: the ANALYZE was skipped, the sizes did not move.
        assert!(!size(1_500, 0, false).is_due(Some(1_500)));
        assert!(!size(3_000, 0, false).is_due(Some(1_500)));
        assert!(size(3_001, 0, false).is_due(Some(1_500)));
    }
}
