//! Several PostgreSQL hosts, one primary: the multi-host URL and the switchover.
//!
//! sqlx 0.8 takes one host per connection URL (its parser hands `h1:p1,h2:p2` to the `url`
//! crate, which refuses the port, and it ignores `target_session_attrs`), so the host
//! selection that libpq does for `postgres://h1:p1,h2:p2/db?target_session_attrs=read-write`
//! is done here, in the connection layer:
//!
//! - [`split_url`] takes libpq's multi-host form apart: the hosts (each with its port, or the
//!   URL's `port` parameter, else 5432) and a URL of the first host that sqlx parses as usual.
//!   `PG_HOST=h1,h2` in the settings becomes the same URL.
//! - [`Primary`] knows the hosts and which one the broker writes to. Every pool the broker
//!   builds ([`crate::storage::pool`] and friends) is registered with it, and so is every
//!   committer's store (`storage::push::commit::PgStore`).
//! - [`Primary::watch`] (one task per broker, only with more than one host) checks every
//!   `QUEEN_PRIMARY_CHECK_MS` through the shared pool that the current host still accepts
//!   writes, and at once when a commit failed as unreachable ([`Primary::suspect`]: a refused
//!   connection, a broken session, or SQLSTATE 25006 `read_only_sql_transaction`, which
//!   `storage::error` counts as unreachable). It then connects to each host, current one
//!   first, and asks `pg_is_in_recovery()` and `transaction_read_only`; the first host that
//!   is neither becomes the primary. Switching sets every registered pool's connect options
//!   to the new host, and every pooled connection opened before the switch is dropped when it
//!   is next acquired; committers reconnect before their next commit. While no host accepts
//!   writes it keeps looking (every 100 ms, slowing to 500 ms); commits fail as unreachable
//!   meanwhile, so their pushes are spooled (`buffered`) and replayed once the new primary
//!   answers, and pops answer 503 until then.
//!
//! - [`Primary::watch_split_brain`] (a second task, only with more than one host) looks every
//!   `QUEEN_PRIMARY_CHECK_MS` for the case the first cannot see: the current host still
//!   accepts writes, but another host does too, on a newer timeline (a standby promoted while
//!   the old primary was not fenced). It switches to the newer timeline and says so at error
//!   level: what the broker committed on the old primary since the promotion is on a timeline
//!   that the new primary does not have. The window is this check's period, where without it
//!   the broker would write to the old primary until something stopped it.
//!
//! The broker always looks for a host that accepts writes (it writes on every path), so
//! `target_session_attrs` may be `read-write`, `primary` or `any` (or absent); `read-only`,
//! `standby` and `prefer-standby` are refused at start with a clear message.
//!
//! Never here: which SQL the broker runs, or anything about the spool (the actors spool on
//! their own when a commit fails).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::storage::error::StorageError;

/// One host of a database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Host name or address (an IPv6 address without its brackets).
    pub name: String,
    /// TCP port (a host written without one gets the URL's `port` parameter, else 5432).
    pub port: u16,
}

/// A database URL taken apart by [`split_url`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitUrl {
    /// Every host, in the URL's order.
    pub hosts: Vec<Host>,
    /// The URL with only the first host and without `target_session_attrs`: what sqlx parses.
    pub first: String,
}

fn config_error(message: String) -> StorageError {
    StorageError::Database(sqlx::Error::Configuration(message.into()))
}

/// Takes a (possibly multi-host) PostgreSQL URL apart, as libpq reads it: `scheme://[userinfo@]
/// host[:port][,host[:port]...][/database][?parameters]`. A URL of one host comes back as it
/// was (but for `target_session_attrs`).
///
/// # Errors
///
/// [`StorageError::Database`] (a configuration error) for an empty host in the list, a port
/// that is not a number, or a `target_session_attrs` that asks for a read-only host.
pub fn split_url(url: &str) -> Result<SplitUrl, StorageError> {
    let Some(scheme_end) = url.find("://") else {
        // Not a URL sqlx reads either: let its parser say so.
        return Ok(SplitUrl {
            hosts: Vec::new(),
            first: url.to_string(),
        });
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, host_list) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let pairs: Vec<&str> = query.into_iter().flat_map(|q| q.split('&')).collect();
    let default_port = match pairs.iter().find_map(|p| p.strip_prefix("port=")) {
        Some(port) => port
            .parse()
            .map_err(|_| config_error(format!("database URL: port={port} is not a port")))?,
        None => 5432,
    };
    let mut hosts = Vec::new();
    let mut written = Vec::new();
    if !host_list.is_empty() {
        for entry in host_list.split(',') {
            let (name, port) = split_host(entry).ok_or_else(|| {
                config_error(format!(
                    "database URL: host `{entry}` in `{host_list}` is not `host[:port]`"
                ))
            })?;
            hosts.push(Host {
                name: name.trim_start_matches('[').trim_end_matches(']').into(),
                port: port.unwrap_or(default_port),
            });
            written.push(entry);
        }
    }
    let mut kept = Vec::new();
    for pair in pairs {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => match value {
                "read-write" | "primary" | "any" => {}
                other => {
                    return Err(config_error(format!(
                        "database URL: target_session_attrs={other} is not supported: the broker \
                         writes, so it always connects to the host that accepts writes \
                         (use read-write, primary or any)"
                    )))
                }
            },
            _ => kept.push(pair),
        }
    }
    let mut first = format!("{scheme}{userinfo}{}{path}", written.first().unwrap_or(&""));
    if !kept.is_empty() {
        first.push('?');
        first.push_str(&kept.join("&"));
    }
    Ok(SplitUrl { hosts, first })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `None` when empty or the port is no number.
fn split_host(entry: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = if entry.starts_with('[') {
        let end = entry.find(']')?;
        let (name, after) = entry.split_at(end + 1);
        match after.strip_prefix(':') {
            Some(port) => (name, Some(port)),
            None if after.is_empty() => (name, None),
            None => return None,
        }
    } else {
        match entry.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (entry, None),
        }
    };
    if name.is_empty() || name == "[]" {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    Some((name, port))
}

/// A callback run with the new host's options after a switch.
type OnSwitch = Box<dyn Fn(PgConnectOptions) + Send + Sync>;

/// When the last switch happened: what a pool's `before_acquire` hook needs to drop the
/// connections opened before it. Kept apart from [`Primary`] so that a pool's hook does not
/// hold the `Primary`, which holds the pool (a cycle that would keep every pool, and its
/// connections, alive after the broker is gone).
pub struct SwitchMark {
    epoch: Instant,
    /// Milliseconds after `epoch` of the last switch (0: never switched).
    at_ms: AtomicU64,
}

impl SwitchMark {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            at_ms: AtomicU64::new(0),
        }
    }

    fn mark(&self) {
        let ms = (self.epoch.elapsed().as_millis() as u64).max(1);
        self.at_ms.store(ms, Ordering::Release);
    }

    /// Whether a pooled connection `age` old was opened before the last switch (and so may be
    /// on the old host): the pools drop such connections instead of handing them out.
    pub fn opened_before_switch(&self, age: Duration) -> bool {
        let at = self.at_ms.load(Ordering::Acquire);
        if at == 0 {
            return false;
        }
        let since = self
            .epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(at));
        age > since
    }
}

/// The broker's database hosts and which of them it writes to; see the module docs.
pub struct Primary {
    /// Connect options of each host (same user, database and session options).
    hosts: Vec<PgConnectOptions>,
    current: AtomicUsize,
    generation: AtomicU64,
    mark: Arc<SwitchMark>,
    suspect: tokio::sync::Notify,
    pools: Mutex<Vec<PgPool>>,
    on_switch: Mutex<Vec<OnSwitch>>,
    stopped: AtomicBool,
    connect_timeout: Duration,
}

impl Primary {
    /// The hosts of `split` with the session options of `options` (the options of the first
    /// host, as [`crate::storage::connect_options`] made them).
    pub fn new(split: &SplitUrl, options: PgConnectOptions, connect_timeout: Duration) -> Self {
        let mut hosts: Vec<PgConnectOptions> = split
            .hosts
            .iter()
            .map(|h| options.clone().host(&h.name).port(h.port))
            .collect();
        if hosts.len() <= 1 {
            // One host (or a socket path): exactly what sqlx parsed.
            hosts = vec![options];
        }
        Self {
            hosts,
            current: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            mark: Arc::new(SwitchMark::new()),
            suspect: tokio::sync::Notify::new(),
            pools: Mutex::new(Vec::new()),
            on_switch: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            connect_timeout,
        }
    }

    /// Whether there is more than one host to choose from.
    pub fn several(&self) -> bool {
        self.hosts.len() > 1
    }

    /// The connect options of the host the broker writes to now.
    pub fn options(&self) -> PgConnectOptions {
        self.hosts[self.current.load(Ordering::Acquire)].clone()
    }

    /// `host:port` of the host the broker writes to now.
    pub fn current_host(&self) -> String {
        let o = &self.hosts[self.current.load(Ordering::Acquire)];
        format!("{}:{}", o.get_host(), o.get_port())
    }

    /// `host:port` of every host, in the configured order.
    pub fn host_list(&self) -> Vec<String> {
        self.hosts
            .iter()
            .map(|o| format!("{}:{}", o.get_host(), o.get_port()))
            .collect()
    }

    /// Bumped at every switch: a connection made at an older generation is on the old host.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// How many times the broker switched hosts since it started.
    pub fn switches(&self) -> u64 {
        self.generation()
    }

    /// Asks the watcher to check the hosts now (a commit failed as unreachable). Cheap; any
    /// number of calls before the watcher runs make one check.
    pub fn suspect(&self) {
        if self.several() {
            self.suspect.notify_one();
        }
    }

    /// When the last switch happened, for the pools' `before_acquire` hooks.
    pub fn switch_mark(&self) -> Arc<SwitchMark> {
        self.mark.clone()
    }

    /// Registers a pool whose connect options follow the switches.
    pub fn track(&self, pool: &PgPool) {
        self.pools
            .lock()
            .expect("primary pools lock")
            .push(pool.clone());
    }

    /// Runs `f` with the new host's options after every switch (the LISTEN connection is
    /// re-made this way).
    pub fn on_switch(&self, f: impl Fn(PgConnectOptions) + Send + Sync + 'static) {
        self.on_switch
            .lock()
            .expect("primary callbacks lock")
            .push(Box::new(f));
    }

    /// Ends [`Primary::watch`] and lets go of the pools and callbacks (broker shutdown).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.suspect.notify_one();
        self.pools.lock().expect("primary pools lock").clear();
        self.on_switch
            .lock()
            .expect("primary callbacks lock")
            .clear();
    }

    /// Whether host `index` accepts writes now: a fresh connection (never a pooled one, which
    /// may be on the old host) asking `pg_is_in_recovery()` and `transaction_read_only`.
    ///
    /// # Errors
    ///
    /// When the host cannot be reached or does not answer within the connect timeout.
    pub async fn accepts_writes(&self, index: usize) -> Result<bool, StorageError> {
        Ok(self.probe(index).await?.writable)
    }

    /// What host `index` says about itself, through a fresh connection.
    async fn probe(&self, index: usize) -> Result<HostState, StorageError> {
        let options = &self.hosts[index];
        let probe = async {
            let mut conn = PgConnection::connect_with(options).await?;
            let state = host_state(&mut conn).await;
            let _ = conn.close().await;
            state
        };
        match tokio::time::timeout(self.connect_timeout.max(Duration::from_millis(200)), probe)
            .await
        {
            Ok(result) => result,
            Err(_) => Err(StorageError::Database(sqlx::Error::PoolTimedOut)),
        }
    }

    /// Another host that accepts writes on a newer timeline than the current host, which
    /// still accepts writes too: `(index, current timeline, its timeline)`. `None` when the
    /// current host does not accept writes (that is [`Primary::watch`]'s case) or no other
    /// host is newer. The current host is asked through `pool`, each other one through a
    /// fresh connection.
    pub async fn newer_primary(&self, pool: &PgPool) -> Option<(usize, i64, i64)> {
        let current = self.current.load(Ordering::Acquire);
        let here = self.pool_state(pool).await?;
        let here_timeline = here.timeline.filter(|_| here.writable)?;
        for index in (0..self.hosts.len()).filter(|&i| i != current) {
            if let Ok(HostState {
                writable: true,
                timeline: Some(timeline),
            }) = self.probe(index).await
            {
                if timeline > here_timeline {
                    return Some((index, here_timeline, timeline));
                }
            }
        }
        None
    }

    /// Every `every`, [`Primary::newer_primary`] (the current host asked through `pool`);
    /// switches to it when found (see the module docs). Returns at once with a single host,
    /// and after [`Primary::stop`].
    pub async fn watch_split_brain(self: Arc<Self>, pool: PgPool, every: Duration) {
        if !self.several() {
            return;
        }
        loop {
            tokio::time::sleep(every).await;
            if self.stopped.load(Ordering::Acquire) {
                return;
            }
            let from = self.current.load(Ordering::Acquire);
            let Some((index, old_timeline, new_timeline)) = self.newer_primary(&pool).await else {
                continue;
            };
            if self.current.load(Ordering::Acquire) != from || self.stopped.load(Ordering::Acquire)
            {
                continue;
            }
            tracing::error!(
                old = %self.current_host(),
                old_timeline,
                new = %self.host_list()[index],
                new_timeline,
                "two database hosts accept writes (a standby was promoted and the old primary \
                 was not fenced); switching to the newer timeline. What was committed on the \
                 old primary since the promotion is not on the new one: fence the old primary"
            );
            self.switch_to(index);
            tokio::time::sleep(self.connect_timeout).await;
            self.mark_switch();
        }
    }

    /// The first host that accepts writes, the current one first; `None` when none does.
    pub async fn find(&self) -> Option<usize> {
        let current = self.current.load(Ordering::Acquire);
        let order = std::iter::once(current).chain((0..self.hosts.len()).filter(|&i| i != current));
        for index in order {
            match self.accepts_writes(index).await {
                Ok(true) => return Some(index),
                Ok(false) => {
                    tracing::debug!(host = %self.host_list()[index], "host is read-only or a standby")
                }
                Err(e) => {
                    tracing::debug!(host = %self.host_list()[index], error = %e, "host unreachable")
                }
            }
        }
        None
    }

    fn mark_switch(&self) {
        self.mark.mark();
    }

    /// Makes host `index` the one the broker writes to: every registered pool connects there
    /// from now on (its older connections are dropped when next acquired), committers
    /// reconnect, and the `on_switch` callbacks run.
    pub fn switch_to(&self, index: usize) {
        let from = self.current_host();
        self.current.store(index, Ordering::Release);
        let target = &self.hosts[index];
        for pool in self.pools.lock().expect("primary pools lock").iter() {
            // Keep each pool's own session options (the lease pool's asynchronous commit,
            // the admin pool's statement timeout); only the host changes.
            let options = (*pool.connect_options())
                .clone()
                .host(target.get_host())
                .port(target.get_port());
            pool.set_connect_options(options);
        }
        self.mark_switch();
        self.generation.fetch_add(1, Ordering::AcqRel);
        for f in self
            .on_switch
            .lock()
            .expect("primary callbacks lock")
            .iter()
        {
            f(target.clone());
        }
        tracing::warn!(from = %from, to = %self.current_host(), "switched to the host that accepts writes (PostgreSQL primary switchover)");
    }

    /// Follows the primary: checks the current host every `every` through `pool` (and at once
    /// after [`Primary::suspect`]) and switches when another host accepts writes instead.
    /// Returns at once with a single host, and after [`Primary::stop`].
    pub async fn watch(self: Arc<Self>, pool: PgPool, every: Duration) {
        if !self.several() {
            return;
        }
        tracing::info!(hosts = ?self.host_list(), current = %self.current_host(), "following the PostgreSQL primary among several hosts");
        let mut searching_since: Option<Instant> = None;
        let mut warned_at: Option<Instant> = None;
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return;
            }
            if searching_since.is_none() {
                tokio::select! {
                    () = self.suspect.notified() => {}
                    () = tokio::time::sleep(every) => {
                        if self.pool_says_writable(&pool).await {
                            continue;
                        }
                    }
                }
                if self.stopped.load(Ordering::Acquire) {
                    return;
                }
            }
            let started = *searching_since.get_or_insert_with(Instant::now);
            match self.find().await {
                Some(index) => {
                    searching_since = None;
                    warned_at = None;
                    if index != self.current.load(Ordering::Acquire) {
                        self.switch_to(index);
                        tracing::info!(
                            searched_ms = started.elapsed().as_millis() as u64,
                            "primary found"
                        );
                        // A pooled connection still being opened to the old host during the
                        // switch is younger than the switch: mark once more after it must have
                        // finished, so it is dropped too.
                        tokio::time::sleep(self.connect_timeout).await;
                        self.mark_switch();
                    }
                }
                None => {
                    let waited = started.elapsed();
                    // Said when the search starts, then every 10 s while it lasts.
                    if warned_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                        warned_at = Some(Instant::now());
                        tracing::warn!(hosts = ?self.host_list(), searching_secs = waited.as_secs(),
                            "no database host accepts writes; pushes are spooled until one does");
                    }
                    let pause = (100u64 << waited.as_secs().min(3)).min(500);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
        }
    }

    /// The periodic check: the current host, through the shared pool, still accepts writes.
    async fn pool_says_writable(&self, pool: &PgPool) -> bool {
        matches!(
            self.pool_state(pool).await,
            Some(HostState { writable: true, .. })
        )
    }

    /// What the current host says about itself, through the shared pool (no new connection);
    /// `None` when it does not answer within the connect timeout.
    async fn pool_state(&self, pool: &PgPool) -> Option<HostState> {
        let check = async {
            let mut conn = pool.acquire().await?;
            host_state(&mut conn).await
        };
        tokio::time::timeout(self.connect_timeout.max(Duration::from_millis(200)), check)
            .await
            .ok()?
            .ok()
    }
}

/// What a server says about itself: whether it accepts writes, and on which timeline it
/// writes (`None` on a standby). The timeline is the first 8 hex digits of the name of the WAL
/// file being written; a promotion starts a new, higher one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HostState {
    writable: bool,
    timeline: Option<i64>,
}

async fn host_state(conn: &mut PgConnection) -> Result<HostState, StorageError> {
    let (in_recovery, read_only, timeline): (bool, String, Option<i64>) = sqlx::query_as(
        "SELECT pg_is_in_recovery(),
                current_setting('transaction_read_only'),
                CASE WHEN pg_is_in_recovery() THEN NULL
                     ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
                END",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(HostState {
        writable: !in_recovery && read_only == "off",
        timeline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, port: u16) -> Host {
        Host {
            name: name.into(),
            port,
        }
    }

    #[test]
    fn a_multi_host_url_names_each_host_and_sqlx_gets_the_first() {
        let split =
            split_url("postgres://u:p%40w@h1:5433,h2,[::1]:6000/db?target_session_attrs=read-write&sslmode=disable")
                .unwrap();
        assert_eq!(
            split.hosts,
            [host("h1", 5433), host("h2", 5432), host("::1", 6000)]
        );
        assert_eq!(split.first, "postgres://u:p%40w@h1:5433/db?sslmode=disable");
    }

    #[test]
    fn a_single_host_url_is_kept() {
        let url = "postgresql://postgres@127.0.0.1:5432/postgres";
        let split = split_url(url).unwrap();
        assert_eq!(split.first, url);
        assert_eq!(split.hosts, [host("127.0.0.1", 5432)]);
    }

    #[test]
    fn a_read_only_target_is_refused_and_a_bad_port_is_named() {
        let err = split_url("postgres://h1,h2/db?target_session_attrs=standby")
            .unwrap_err()
            .to_string();
        assert!(err.contains("target_session_attrs=standby"), "{err}");
        let err = split_url("postgres://h1:x,h2/db").unwrap_err().to_string();
        assert!(err.contains("h1:x"), "{err}");
        assert!(split_url("postgres://h1,,h2/db").is_err());
    }

    #[test]
    fn every_host_gets_the_session_options_and_a_default_port() {
        let split = split_url("postgres://u@a:1,b,c/d?port=7").unwrap();
        let options: PgConnectOptions = split.first.parse().unwrap();
        let primary = Primary::new(&split, options, Duration::from_secs(1));
        assert!(primary.several());
        assert_eq!(primary.host_list(), ["a:1", "b:7", "c:7"]);
        assert_eq!(primary.current_host(), "a:1");
        assert!(!primary
            .switch_mark()
            .opened_before_switch(Duration::from_secs(3600)));
    }
}
