//! The disk spool: where items go when their commit fails, or on purpose in maintenance mode.
//!
//! - [`SpoolActor`] appends records to the active file in `FILE_BUFFER_DIR` and answers only
//!   once they are on disk: appends arriving during a write are grouped into the next write and
//!   share one `fdatasync`.
//! - [`SpoolState`] counts, per partition, the items routed to the spool and not yet replayed.
//!   While a partition's count is above zero its actor spools new pushes behind them, so the
//!   partition's order is the order of acceptance even across an outage.
//! - [`replay::Replayer`] commits sealed files oldest-first through the normal commit path and
//!   records its progress in a watermark file only after each commit is confirmed. A record
//!   PostgreSQL refuses on its own goes to the [`quarantine`], so none holds back the others.

pub mod quarantine;
pub mod record;
pub mod replay;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::message::PartitionKey;
use record::Record;

/// File name suffix of spool files.
pub const SPOOL_SUFFIX: &str = ".qspool";
/// Suffix of a spool file's watermark (records replayed so far).
pub const DONE_SUFFIX: &str = ".done";
/// A file is sealed once it grows past this.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Why the spool could not take a record.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SpoolError {
    /// The directory is unusable.
    #[error("spool directory {dir} (FILE_BUFFER_DIR) is not usable: {reason}")]
    Directory {
        /// The directory.
        dir: String,
        /// What went wrong.
        reason: String,
    },
    /// A write or fsync failed.
    #[error("spool write failed: {0}")]
    Write(String),
    /// The spool's disk is full; new records are refused until replay or the operator frees
    /// room (records already spooled are still replayed).
    #[error("spool disk is full: {0}")]
    Full(String),
    /// The spool actor is gone.
    #[error("spool is stopped")]
    Stopped,
}

/// Shared, lock-light state of the spool: per-partition counts, depth, mode flags.
#[derive(Default)]
pub struct SpoolState {
    pending: Mutex<HashMap<PartitionKey, u64>>,
    total_records: AtomicU64,
    total_bytes: AtomicU64,
    maintenance: AtomicBool,
    replayed: AtomicU64,
    quarantined: AtomicU64,
    dir: std::sync::OnceLock<PathBuf>,
    disk_full: AtomicBool,
    db_down_since: Mutex<Option<Instant>>,
}

impl SpoolState {
    /// Reserves `n` spool places for `key` when the partition already has spooled items (or
    /// when `force`); returns whether the items must go to the spool.
    pub fn route_to_spool(&self, key: &PartitionKey, n: u64, force: bool) -> bool {
        if !force && self.total_records.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut pending = self.pending.lock().expect("spool state lock poisoned");
        match pending.get_mut(key) {
            Some(count) => *count += n,
            None if force => {
                pending.insert(key.clone(), n);
            }
            None => return false,
        }
        self.total_records.fetch_add(n, Ordering::AcqRel);
        true
    }

    /// Reserves `n` places for `key` unconditionally (a failed commit going to the spool).
    pub fn reserve(&self, key: &PartitionKey, n: u64) {
        self.route_to_spool(key, n, true);
    }

    /// Gives back `n` places of `key` (replayed, or never written).
    pub fn release(&self, key: &PartitionKey, n: u64) {
        let mut pending = self.pending.lock().expect("spool state lock poisoned");
        if let Some(count) = pending.get_mut(key) {
            let n = n.min(*count);
            *count -= n;
            if *count == 0 {
                pending.remove(key);
            }
            self.total_records.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Items in the spool (or on their way into it) not yet replayed.
    pub fn records(&self) -> u64 {
        self.total_records.load(Ordering::Acquire)
    }

    /// Bytes of spool files not yet deleted.
    pub fn bytes(&self) -> u64 {
        self.total_bytes.load(Ordering::Acquire)
    }

    /// Items replayed since start.
    pub fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Acquire)
    }

    /// Records moved to the quarantine file (kept there until an operator removes them).
    pub fn quarantined(&self) -> u64 {
        self.quarantined.load(Ordering::Acquire)
    }

    /// Counts `n` more quarantined records.
    pub fn add_quarantined(&self, n: u64) {
        self.quarantined.fetch_add(n, Ordering::AcqRel);
    }

    /// The spool directory (set when the spool is opened).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.get().map(PathBuf::as_path)
    }

    /// Whether the spool's disk was found full: new spool writes are refused until a write or
    /// a replayed file frees room.
    pub fn disk_full(&self) -> bool {
        self.disk_full.load(Ordering::Acquire)
    }

    /// Records whether the spool's disk is full.
    pub fn set_disk_full(&self, full: bool) {
        self.disk_full.store(full, Ordering::Release);
    }

    /// Whether maintenance mode is on (every push spooled, replay paused).
    pub fn maintenance(&self) -> bool {
        self.maintenance.load(Ordering::Acquire)
    }

    /// Sets maintenance mode as last known.
    pub fn set_maintenance(&self, on: bool) {
        self.maintenance.store(on, Ordering::Release);
    }

    /// Notes that a commit could not reach PostgreSQL.
    pub fn mark_db_down(&self) {
        let mut since = self
            .db_down_since
            .lock()
            .expect("spool state lock poisoned");
        since.get_or_insert_with(Instant::now);
    }

    /// Notes that a commit reached PostgreSQL.
    pub fn mark_db_up(&self) {
        *self
            .db_down_since
            .lock()
            .expect("spool state lock poisoned") = None;
    }

    /// How long commits have been failing to reach PostgreSQL, if they are.
    pub fn db_down_for(&self) -> Option<std::time::Duration> {
        self.db_down_since
            .lock()
            .expect("spool state lock poisoned")
            .map(|t| t.elapsed())
    }

    fn add_bytes(&self, n: u64) {
        self.total_bytes.fetch_add(n, Ordering::AcqRel);
    }

    fn sub_bytes(&self, n: u64) {
        let _ = self
            .total_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some(b.saturating_sub(n))
            });
    }
}

/// Append records; answered once they are durable (or with why not).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Append {
    /// Records in acceptance order.
    pub records: Vec<Record>,
    /// The outcome.
    pub reply: oneshot::Sender<Result<(), SpoolError>>,
}

/// Seal the active file (if it holds records) and list every sealed file, oldest first.
#[derive(Message)]
#[rtype(result = "Vec<PathBuf>")]
pub struct Seal;

struct ActiveFile {
    name: String,
    file: File,
    len: u64,
}

/// Owns the spool directory's writes; see the module docs.
pub struct SpoolActor {
    dir: PathBuf,
    state: std::sync::Arc<SpoolState>,
    active: Option<ActiveFile>,
    active_name: Option<String>,
    waiting: Vec<Append>,
    busy: bool,
    seal_requested: bool,
    counter: u64,
    /// The time part of the newest spool file's name: a new file's is above it whatever the
    /// wall clock says (see [`SpoolActor::new_file`]).
    last_micros: u128,
    full_at: Option<Instant>,
}

/// Whether an I/O error says the disk (or the quota) is full.
pub fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(28 | 122)) // ENOSPC, EDQUOT
}

/// How long after a full-disk failure the spool tries a write again.
const FULL_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

fn dir_error(dir: &Path, e: impl std::fmt::Display) -> SpoolError {
    SpoolError::Directory {
        dir: dir.display().to_string(),
        reason: e.to_string(),
    }
}

/// Spool files in `dir`, oldest first.
pub fn list_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(SPOOL_SUFFIX))
        .collect();
    files.sort();
    Ok(files)
}

/// The time part of a spool file's name (`spool-<micros>-<counter>.qspool`).
fn name_micros(file: &Path) -> Option<u128> {
    let name = file.file_name()?.to_str()?;
    name.strip_prefix("spool-")?.split('-').next()?.parse().ok()
}

/// The watermark path of a spool file.
pub fn done_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(DONE_SUFFIX);
    PathBuf::from(name)
}

/// Records of `file` already replayed (0 without a watermark).
pub fn read_watermark(file: &Path) -> u64 {
    std::fs::read(done_path(file))
        .ok()
        .and_then(|b| {
            b.get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        })
        .unwrap_or(0)
}

impl SpoolActor {
    /// Opens the spool in `dir`: creates it, proves it writable, and counts the records left by
    /// an earlier run (so their partitions keep spooling behind them until replayed). A full
    /// disk does not stop the start: replay is what frees it, so the spool opens with new
    /// writes refused ([`SpoolState::disk_full`]) until there is room again. Empty spool files
    /// (left by an append that failed) are removed.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Directory`] naming the directory when it cannot be created, read or written
    /// (for a reason other than being full).
    pub fn open(dir: &Path, state: std::sync::Arc<SpoolState>) -> Result<Self, SpoolError> {
        std::fs::create_dir_all(dir).map_err(|e| dir_error(dir, e))?;
        let probe = dir.join(".write-probe");
        match std::fs::write(&probe, b"ok").and_then(|()| std::fs::remove_file(&probe)) {
            Ok(()) => {}
            Err(e) if is_disk_full(&e) => {
                let _ = std::fs::remove_file(&probe);
                tracing::warn!(dir = %dir.display(), error = %e,
                    "spool disk is full: starting anyway; replay frees it, new spool writes are refused until then");
                state.set_disk_full(true);
            }
            Err(e) => return Err(dir_error(dir, e)),
        }
        let _ = state.dir.set(dir.to_path_buf());
        state.add_quarantined(quarantine::count(dir));
        let mut last_micros = 0;
        for file in list_files(dir).map_err(|e| dir_error(dir, e))? {
            last_micros = last_micros.max(name_micros(&file).unwrap_or(0));
            let bytes = std::fs::read(&file).map_err(|e| dir_error(dir, e))?;
            if bytes.is_empty() {
                // An append that failed on a fresh file leaves it empty: nothing to replay.
                let _ = std::fs::remove_file(&file);
                let _ = std::fs::remove_file(done_path(&file));
                continue;
            }
            let (records, damage) = record::decode_all(&bytes);
            for d in &damage {
                tracing::error!(file = %file.display(), at = d.at, skipped = d.skipped, reason = d.reason,
                    "damaged spool data skipped (torn or corrupt record)");
            }
            let done = read_watermark(&file) as usize;
            for r in records.iter().skip(done) {
                state.reserve(&r.key, 1);
            }
            state.add_bytes(bytes.len() as u64);
            if records.len() > done {
                tracing::info!(file = %file.display(), records = records.len() - done, "spooled records left to replay");
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            state,
            active: None,
            active_name: None,
            waiting: Vec::new(),
            busy: false,
            seal_requested: false,
            counter: 0,
            last_micros,
            full_at: None,
        })
    }

    /// A new spool file. Files replay in name order, so a name must sort after every file
    /// before it: its time part is the wall clock's, but never at or below the newest file's
    /// (this run's or an earlier one's). A wall clock stepped back (NTP, an operator) would
    /// otherwise name the new file before the older ones, and replay a partition's later
    /// records before its earlier ones.
    fn new_file(&mut self) -> Result<ActiveFile, SpoolError> {
        self.counter += 1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let micros = now.max(self.last_micros + 1);
        self.last_micros = micros;
        let name = format!("spool-{micros:020}-{:06}{SPOOL_SUFFIX}", self.counter);
        let path = self.dir.join(&name);
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| {
                if is_disk_full(&e) {
                    SpoolError::Full(format!("{}: {e}", path.display()))
                } else {
                    SpoolError::Write(format!("{}: {e}", path.display()))
                }
            })?;
        // Make the new directory entry durable too.
        if let Ok(dir) = File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        Ok(ActiveFile { name, file, len: 0 })
    }

    fn start_write(&mut self, ctx: &mut Context<Self>) {
        if self.busy || self.waiting.is_empty() {
            return;
        }
        if self.state.disk_full() && self.full_at.is_some_and(|at| at.elapsed() < FULL_RETRY) {
            let e = SpoolError::Full("new records are refused until there is room".into());
            for append in self.waiting.drain(..) {
                let _ = append.reply.send(Err(e.clone()));
            }
            return;
        }
        let active = match self.active.take() {
            Some(active) => active,
            None => match self.new_file() {
                Ok(active) => active,
                Err(e) => {
                    if matches!(e, SpoolError::Full(_)) {
                        self.state.set_disk_full(true);
                        self.full_at = Some(Instant::now());
                    }
                    tracing::error!(error = %e, "cannot open a spool file");
                    for append in self.waiting.drain(..) {
                        let _ = append.reply.send(Err(e.clone()));
                    }
                    return;
                }
            },
        };
        self.active_name = Some(active.name.clone());
        let batch: Vec<Append> = std::mem::take(&mut self.waiting);
        let mut buf = Vec::new();
        for append in &batch {
            for r in &append.records {
                record::encode(&r.key, &r.item, &mut buf);
            }
        }
        self.busy = true;
        let dir = self.dir.clone();
        let write = tokio::task::spawn_blocking(move || {
            let mut active = active;
            let result = active
                .file
                .write_all(&buf)
                .and_then(|()| active.file.sync_data());
            match result {
                Ok(()) => {
                    active.len += buf.len() as u64;
                    (Some(active), Ok(buf.len() as u64))
                }
                Err(e) => {
                    // Cut back to the last durable record, so a half-written batch (answered
                    // `failed`) is never replayed; a file left empty is removed.
                    let _ = active.file.set_len(active.len);
                    if active.len == 0 {
                        let _ = std::fs::remove_file(dir.join(&active.name));
                    }
                    let text = format!("{}: {e}", active.name);
                    let error = if is_disk_full(&e) {
                        SpoolError::Full(text)
                    } else {
                        SpoolError::Write(text)
                    };
                    (None, Err(error))
                }
            }
        });
        ctx.spawn(write.into_actor(self).map(move |joined, act, ctx| {
            act.busy = false;
            let (active, result) =
                joined.unwrap_or_else(|e| (None, Err(SpoolError::Write(e.to_string()))));
            match &result {
                Ok(bytes) => {
                    act.state.add_bytes(*bytes);
                    if act.state.disk_full() {
                        tracing::info!("spool disk has room again");
                        act.state.set_disk_full(false);
                    }
                }
                Err(e) => {
                    if matches!(e, SpoolError::Full(_)) {
                        act.state.set_disk_full(true);
                        act.full_at = Some(Instant::now());
                    }
                    tracing::error!(error = %e, "spool append failed; items answered failed")
                }
            }
            act.active = active;
            if act.active.as_ref().is_some_and(|a| a.len >= MAX_FILE_BYTES) || act.seal_requested {
                act.seal_active();
            }
            if act.active.is_none() {
                act.active_name = None;
            }
            for append in batch {
                let _ = append.reply.send(result.clone().map(|_| ()));
            }
            act.start_write(ctx);
        }));
    }

    fn seal_active(&mut self) {
        self.seal_requested = false;
        if self.active.as_ref().is_some_and(|a| a.len > 0) {
            self.active = None;
            self.active_name = None;
        }
    }
}

impl Actor for SpoolActor {
    type Context = Context<Self>;
}

impl Handler<Append> for SpoolActor {
    type Result = ();

    fn handle(&mut self, append: Append, ctx: &mut Context<Self>) {
        self.waiting.push(append);
        self.start_write(ctx);
    }
}

impl Handler<Seal> for SpoolActor {
    type Result = MessageResult<Seal>;

    fn handle(&mut self, _: Seal, _: &mut Context<Self>) -> Self::Result {
        if self.busy {
            self.seal_requested = true;
        } else {
            self.seal_active();
        }
        let files = list_files(&self.dir).unwrap_or_default();
        let active = self.active_name.clone();
        MessageResult(
            files
                .into_iter()
                .filter(|f| active.as_deref() != f.file_name().and_then(|n| n.to_str()))
                .collect(),
        )
    }
}

/// What partition actors need to spool: the actor's address and the shared state.
#[derive(Clone)]
pub struct SpoolHandle {
    /// The spool actor.
    pub actor: Addr<SpoolActor>,
    /// Shared counts and flags.
    pub state: std::sync::Arc<SpoolState>,
}

impl SpoolHandle {
    /// Appends records (places already reserved) and waits until they are durable.
    ///
    /// # Errors
    ///
    /// [`SpoolError`] when they could not be written; the reservation is then given back.
    pub async fn append(&self, records: Vec<Record>) -> Result<(), SpoolError> {
        let counts: Vec<(PartitionKey, u64)> = count_by_key(&records);
        let (reply, done) = oneshot::channel();
        self.actor.do_send(Append { records, reply });
        let result = done.await.unwrap_or(Err(SpoolError::Stopped));
        if result.is_err() {
            for (key, n) in counts {
                self.state.release(&key, n);
            }
        }
        result
    }
}

fn count_by_key(records: &[Record]) -> Vec<(PartitionKey, u64)> {
    let mut counts: Vec<(PartitionKey, u64)> = Vec::new();
    for r in records {
        match counts.iter_mut().find(|(k, _)| *k == r.key) {
            Some((_, n)) => *n += 1,
            None => counts.push((r.key.clone(), 1)),
        }
    }
    counts
}
