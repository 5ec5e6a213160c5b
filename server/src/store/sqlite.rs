//! The SQLite backend of [`ResponseStore`].
//!
//! # Durability
//!
//! The database runs in WAL journal mode with `synchronous=NORMAL`. Every mutating call is one
//! `BEGIN IMMEDIATE` transaction; when it returns `Ok`, the commit record has been written to the
//! WAL file with `write(2)`, so it is in the operating system's page cache. Killing the daemon
//! (`kill -9`, abort, panic) therefore loses nothing that was committed: the next open replays
//! the WAL. Only a power loss or kernel crash can lose the last few commits (never corrupt the
//! database), because NORMAL syncs the WAL at checkpoints rather than at every commit. That is the
//! trade-off we want for a cache of responses; `synchronous=FULL` would add an `fsync` per write.
//!
//! # Concurrency
//!
//! One connection behind a [`Mutex`]: calls are serialized. The connection uses
//! `locking_mode=EXCLUSIVE`, so one `SqliteStore` owns the file while it is open (a second
//! daemon on the same `--store-path` fails to open it rather than failing the first one's
//! running responses); the lock dies with the process, so a restart after `kill -9` opens fine. A poisoned lock is recovered, since an
//! interrupted transaction is rolled back when it is dropped. Calls block on disk I/O; call them
//! from async code through `tokio::task::spawn_blocking`.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use serde_json::Value;
use crate::protocol::items::parse_item;
use crate::protocol::{InputItem, ResponseObject, StreamEvent};

use super::{
    fail_for_restart, follow_chain, restart_failed_event, ttl_secs, Order,
    ResponseStore, StoreConfig, StoreError, StoredResponse, STATUS_FAILED,
};

/// The schema version this build writes and reads (the `schema_version` table).
pub const SCHEMA_VERSION: i64 = 3;

/// Tables and indexes of [`SCHEMA_VERSION`] 1. `bytes` is the response JSON plus its input
/// items; `event_bytes` is its stored events. Unfinished statuses are `queued`/`in_progress`.
const SCHEMA_V1: &str = "
CREATE TABLE responses (
    id TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    previous_response_id TEXT,
    background INTEGER NOT NULL,
    response TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    event_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX responses_created_at ON responses(created_at);
CREATE INDEX responses_status ON responses(status);
CREATE TABLE input_items (
    response_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    item_id TEXT,
    item TEXT NOT NULL,
    PRIMARY KEY (response_id, seq)
) WITHOUT ROWID;
CREATE INDEX input_items_item_id ON input_items(response_id, item_id);
CREATE TABLE events (
    response_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (response_id, seq)
) WITHOUT ROWID;
";

/// The version 1 schema, for migration tests.
#[cfg(test)]
pub(super) const SCHEMA_V1_FOR_TESTS: &str = SCHEMA_V1;

/// Version 2 adds LMSP tasks and their event histories.
const SCHEMA_V2: &str = "
CREATE TABLE tasks (
    id TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL,
    finished_at INTEGER,
    status TEXT NOT NULL,
    task TEXT NOT NULL
);
CREATE INDEX tasks_finished_at ON tasks(finished_at);
CREATE TABLE task_events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
";

/// Version 3 records which tenant owns each response (rows from before it
/// belong to the anonymous tenant of a server without keys).
const SCHEMA_V3: &str = "ALTER TABLE responses ADD COLUMN tenant TEXT NOT NULL DEFAULT '';";

/// How long to wait for the file lock (only another process can hold it).
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// SQL condition selecting finished rows (the ones eviction and expiry may delete).
const FINISHED: &str = "status NOT IN ('queued', 'in_progress')";

/// Row and byte totals, kept in step with the database so the cap check needs no scan.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    rows: u64,
    bytes: u64,
}

/// The connection and its totals, behind the store's mutex.
pub(super) struct Inner {
    pub(super) conn: Connection,
    totals: Totals,
}

/// A [`ResponseStore`] in an SQLite database file (WAL mode). See the module docs for durability.
pub struct SqliteStore {
    inner: Mutex<Inner>,
    config: StoreConfig,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed, with its parent directory) the database at `path`: WAL journal,
    /// `synchronous=NORMAL`, exclusive locking, schema created or checked against
    /// [`SCHEMA_VERSION`] (`Err(Corrupt)` for a newer or unknown one).
    ///
    /// The store holds the file's lock until it is dropped: a second `SqliteStore` (in this or
    /// another process) on the same file gets `Err(Sqlite)` after a short wait. One owner is what
    /// makes [`ResponseStore::mark_unfinished_failed`] at start safe and the cached totals exact.
    pub fn open(path: impl AsRef<Path>, config: StoreConfig) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Io(format!("creating {}: {e}", dir.display())))?;
        }
        let mut conn = Connection::open(path)?;
        init(&mut conn).map_err(|e| match e {
            StoreError::Sqlite(m) if m.contains("locked") || m.contains("busy") => {
                StoreError::Sqlite(format!(
                    "{}: {m} (is another spindle using this store?)",
                    path.display()
                ))
            }
            StoreError::Sqlite(m) => StoreError::Sqlite(format!("{}: {m}", path.display())),
            other => other,
        })?;
        let totals = compute_totals(&conn)?;
        Ok(SqliteStore {
            inner: Mutex::new(Inner { conn, totals }),
            config,
        })
    }

    /// The bounds this store enforces.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Runs `PRAGMA integrity_check`; `Ok(())` when SQLite answers `ok`.
    pub fn integrity_check(&self) -> Result<(), StoreError> {
        let inner = self.lock();
        let answer: String = inner
            .conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        if answer == "ok" {
            Ok(())
        } else {
            Err(StoreError::Corrupt(answer))
        }
    }

    /// Total bytes counted against [`StoreConfig::max_bytes`].
    pub fn total_bytes(&self) -> u64 {
        self.lock().totals.bytes
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` in an immediate transaction, commits, then recomputes the totals.
    fn write_recount<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut inner = self.lock();
        let tx = inner
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        inner.totals = compute_totals(&inner.conn)?;
        Ok(out)
    }
}

/// Sets the connection up (see [`SqliteStore::open`]) and migrates the schema.
fn init(conn: &mut Connection) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Before the first WAL access: no shared-memory index, and the first write (the migration
    // below) takes a lock held until this store is dropped.
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Sqlite(format!(
            "could not enable WAL journal mode (got {mode})"
        )));
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    migrate(conn)
}

/// Creates the schema in a fresh database, or checks the version of an existing one.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);")?;
    let version: Option<i64> =
        tx.query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))?;
    match version {
        None | Some(1..SCHEMA_VERSION) => {
            let from = version.unwrap_or(0);
            for (to, schema) in [(1, SCHEMA_V1), (2, SCHEMA_V2), (3, SCHEMA_V3)] {
                if from < to {
                    tx.execute_batch(schema)?;
                }
            }
            tx.execute("INSERT INTO schema_version (version) VALUES (?1)", [SCHEMA_VERSION])?;
        }
        Some(SCHEMA_VERSION) => {}
        Some(other) => {
            return Err(StoreError::Corrupt(format!(
                "database schema version {other}; this build knows {SCHEMA_VERSION}"
            )))
        }
    }
    tx.commit()?;
    Ok(())
}

fn compute_totals(conn: &Connection) -> Result<Totals, StoreError> {
    let (rows, bytes): (i64, i64) = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(bytes + event_bytes), 0) FROM responses",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(Totals {
        rows: u64::try_from(rows).unwrap_or(0),
        bytes: u64::try_from(bytes).unwrap_or(0),
    })
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn exists(conn: &Connection, id: &str) -> Result<bool, StoreError> {
    let found = conn
        .prepare_cached("SELECT 1 FROM responses WHERE id = ?1")?
        .query_row([id], |_| Ok(()))
        .optional()?;
    Ok(found.is_some())
}

/// Deletes one response and everything hanging off it. `true` if the response row existed.
fn delete_rows(conn: &Connection, id: &str) -> Result<bool, StoreError> {
    conn.prepare_cached("DELETE FROM input_items WHERE response_id = ?1")?
        .execute([id])?;
    conn.prepare_cached("DELETE FROM events WHERE response_id = ?1")?
        .execute([id])?;
    let n = conn
        .prepare_cached("DELETE FROM responses WHERE id = ?1")?
        .execute([id])?;
    Ok(n > 0)
}

/// Reads one full record (response, input items) or `None`.
fn read_record(conn: &Connection, id: &str) -> Result<Option<StoredResponse>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT created_at, status, previous_response_id, background, response, tenant
             FROM responses WHERE id = ?1",
        )?
        .query_row([id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, bool>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
            ))
        })
        .optional()?;
    let Some((created_at, status, previous_response_id, background, response, tenant)) = row else {
        return Ok(None);
    };
    let mut stmt =
        conn.prepare_cached("SELECT item FROM input_items WHERE response_id = ?1 ORDER BY seq")?;
    let texts = stmt
        .query_map([id], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    let input_items = parse_items(&texts)?;
    Ok(Some(StoredResponse {
        id: id.to_owned(),
        created_at,
        status,
        previous_response_id,
        background,
        response: serde_json::from_str(&response)?,
        input_items,
        tenant,
    }))
}

/// Stored input items, read by the parser that reads request input.
fn parse_items(texts: &[String]) -> Result<Vec<InputItem>, StoreError> {
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let value: Value = serde_json::from_str(text)?;
            parse_item(&value, &format!("input_items[{i}]")).map_err(|e| StoreError::Invalid(e.message))
        })
        .collect()
}

/// Deletes the oldest finished responses (never `keep`) until `totals` fit the config.
/// Returns the totals after eviction.
fn evict(
    tx: &Transaction<'_>,
    keep: &str,
    mut totals: Totals,
    config: &StoreConfig,
) -> Result<Totals, StoreError> {
    let max_rows = u64::try_from(config.max_responses).unwrap_or(u64::MAX);
    let over = |t: &Totals| t.rows > max_rows || t.bytes > config.max_bytes;
    if !over(&totals) {
        return Ok(totals);
    }
    let mut victims = Vec::new();
    {
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT id, bytes + event_bytes FROM responses
             WHERE {FINISHED} AND id <> ?1 ORDER BY created_at, rowid"
        ))?;
        let mut rows = stmt.query([keep])?;
        while over(&totals) {
            let Some(row) = rows.next()? else { break };
            let bytes: i64 = row.get(1)?;
            victims.push(row.get::<_, String>(0)?);
            totals.rows = totals.rows.saturating_sub(1);
            totals.bytes = totals.bytes.saturating_sub(to_u64(bytes));
        }
    }
    for id in &victims {
        delete_rows(tx, id)?;
    }
    Ok(totals)
}

/// Appends `events` to `id` inside `tx`; returns the bytes added (net of replaced events).
fn insert_events(tx: &Transaction<'_>, id: &str, events: &[StreamEvent]) -> Result<i64, StoreError> {
    let mut old_len = tx.prepare_cached(
        "SELECT length(CAST(event AS BLOB)) FROM events WHERE response_id = ?1 AND seq = ?2",
    )?;
    let mut insert = tx.prepare_cached(
        "INSERT OR REPLACE INTO events (response_id, seq, event) VALUES (?1, ?2, ?3)",
    )?;
    let mut added: i64 = 0;
    for event in events {
        let seq = to_i64(event.sequence_number());
        let text = serde_json::to_string(event)?;
        let replaced: Option<i64> = old_len
            .query_row(params![id, seq], |r| r.get(0))
            .optional()?;
        insert.execute(params![id, seq, text])?;
        added += i64::try_from(text.len()).unwrap_or(i64::MAX) - replaced.unwrap_or(0);
    }
    tx.prepare_cached("UPDATE responses SET event_bytes = event_bytes + ?2 WHERE id = ?1")?
        .execute(params![id, added])?;
    Ok(added)
}

/// The stored response object marked failed, as JSON, and typed when it
/// reads back as a [`ResponseObject`]; a row this build cannot read is
/// patched as JSON (it must not stop the daemon from starting).
fn failed_for_restart(response_text: &str) -> Result<(Value, Option<ResponseObject>), StoreError> {
    if let Ok(mut response) = serde_json::from_str::<ResponseObject>(response_text) {
        fail_for_restart(&mut response);
        return Ok((serde_json::to_value(&response)?, Some(response)));
    }
    let mut response: Value = serde_json::from_str(response_text)?;
    if let Some(object) = response.as_object_mut() {
        object.insert("status".into(), Value::from(STATUS_FAILED));
        object.insert("error".into(), serde_json::to_value(super::restart_error())?);
    }
    Ok((response, None))
}

/// Fails one unfinished response for the restart (row, object, terminal event if it has events).
fn fail_one(tx: &Transaction<'_>, id: &str, response_text: &str) -> Result<(), StoreError> {
    let (response, typed) = failed_for_restart(response_text)?;
    let new_text = serde_json::to_string(&response)?;
    let delta = i64::try_from(new_text.len()).unwrap_or(i64::MAX)
        - i64::try_from(response_text.len()).unwrap_or(i64::MAX);
    tx.prepare_cached(
        "UPDATE responses SET status = ?2, response = ?3, bytes = bytes + ?4 WHERE id = ?1",
    )?
    .execute(params![id, STATUS_FAILED, new_text, delta])?;
    let last: Option<i64> = tx
        .prepare_cached("SELECT MAX(seq) FROM events WHERE response_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    match (last, typed) {
        (Some(last), Some(response)) => {
            let event = restart_failed_event(&response, to_u64(last.saturating_add(1)));
            insert_events(tx, id, &[event])?;
        }
        (Some(_), None) => tracing::warn!("stored response {id} does not read back; marked failed without a terminal event"),
        (None, _) => {}
    }
    Ok(())
}

impl ResponseStore for SqliteStore {
    fn put(&self, rec: &StoredResponse) -> Result<(), StoreError> {
        self.put_with_events(rec, &[])
    }

    fn put_with_events(&self, rec: &StoredResponse, events: &[StreamEvent]) -> Result<(), StoreError> {
        let response = serde_json::to_string(&rec.response)?;
        let items = rec
            .input_items
            .iter()
            .map(|item| Ok((item.item_id(), serde_json::to_string(item)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let bytes = response.len() as u64 + items.iter().map(|(_, t)| t.len() as u64).sum::<u64>();
        let mut inner = self.lock();
        let Inner { conn, totals } = &mut *inner;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let old: Option<(i64, i64)> = tx
            .prepare_cached("SELECT bytes, event_bytes FROM responses WHERE id = ?1")?
            .query_row([&rec.id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        tx.prepare_cached(
            "INSERT INTO responses
                 (id, created_at, status, previous_response_id, background, response, bytes, tenant)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT(id) DO UPDATE SET
                 created_at = excluded.created_at, status = excluded.status,
                 previous_response_id = excluded.previous_response_id,
                 background = excluded.background, response = excluded.response,
                 bytes = excluded.bytes, tenant = excluded.tenant",
        )?
        .execute(params![
            rec.id,
            rec.created_at,
            rec.status,
            rec.previous_response_id,
            rec.background,
            response,
            to_i64(bytes),
            rec.tenant
        ])?;
        tx.prepare_cached("DELETE FROM input_items WHERE response_id = ?1")?
            .execute([&rec.id])?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO input_items (response_id, seq, item_id, item) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (seq, (item_id, text)) in items.iter().enumerate() {
                insert.execute(params![rec.id, to_i64(seq as u64), item_id, text])?;
            }
        }
        let mut after = *totals;
        match old {
            Some((old_bytes, _)) => {
                after.bytes = (after.bytes + bytes).saturating_sub(to_u64(old_bytes));
            }
            None => {
                after.rows += 1;
                after.bytes += bytes;
            }
        }
        if !events.is_empty() {
            let added = insert_events(&tx, &rec.id, events)?;
            after.bytes = to_u64(to_i64(after.bytes).saturating_add(added));
        }
        let after = evict(&tx, &rec.id, after, &self.config)?;
        tx.commit()?;
        *totals = after;
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        read_record(&self.lock().conn, id)
    }

    fn tenant_of(&self, id: &str) -> Result<Option<String>, StoreError> {
        let inner = self.lock();
        let mut stmt = inner.conn.prepare_cached("SELECT tenant FROM responses WHERE id = ?1")?;
        Ok(stmt.query_row([id], |r| r.get(0)).optional()?)
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        self.write_recount(|tx| delete_rows(tx, id))
    }

    fn input_items(
        &self,
        id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Option<Vec<InputItem>>, StoreError> {
        let inner = self.lock();
        let conn = &inner.conn;
        if !exists(conn, id)? {
            return Ok(None);
        }
        let cursor: Option<i64> = match after {
            None => None,
            Some(item) => {
                let seq = conn
                    .prepare_cached(
                        "SELECT MIN(seq) FROM input_items WHERE response_id = ?1 AND item_id = ?2",
                    )?
                    .query_row([id, item], |r| r.get::<_, Option<i64>>(0))?;
                match seq {
                    Some(seq) => Some(seq),
                    None => return Ok(Some(Vec::new())),
                }
            }
        };
        let limit = to_i64(limit as u64);
        let texts = match order {
            Order::Asc => conn
                .prepare_cached(
                    "SELECT item FROM input_items WHERE response_id = ?1 AND seq > ?2
                     ORDER BY seq ASC LIMIT ?3",
                )?
                .query_map(params![id, cursor.unwrap_or(-1), limit], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?,
            Order::Desc => conn
                .prepare_cached(
                    "SELECT item FROM input_items WHERE response_id = ?1 AND seq < ?2
                     ORDER BY seq DESC LIMIT ?3",
                )?
                .query_map(params![id, cursor.unwrap_or(i64::MAX), limit], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?,
        };
        Ok(Some(parse_items(&texts)?))
    }

    fn append_events(&self, id: &str, events: &[StreamEvent]) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let Inner { conn, totals } = &mut *inner;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if !exists(&tx, id)? {
            return Err(StoreError::NotFound(id.to_owned()));
        }
        let added = insert_events(&tx, id, events)?;
        tx.commit()?;
        totals.bytes = to_u64(to_i64(totals.bytes).saturating_add(added));
        Ok(())
    }

    fn events(
        &self,
        id: &str,
        starting_after: Option<u64>,
    ) -> Result<Option<Vec<StreamEvent>>, StoreError> {
        let inner = self.lock();
        let conn = &inner.conn;
        if !exists(conn, id)? {
            return Ok(None);
        }
        let from = starting_after.map_or(-1, to_i64);
        let texts = conn
            .prepare_cached(
                "SELECT event FROM events WHERE response_id = ?1 AND seq > ?2 ORDER BY seq",
            )?
            .query_map(params![id, from], |r| r.get(0))?
            .collect::<Result<Vec<String>, _>>()?;
        // An event this build cannot read (written by another version) is
        // left out of the replay rather than failing all of it.
        let events = texts
            .iter()
            .filter_map(|t| match serde_json::from_str(t) {
                Ok(event) => Some(event),
                Err(e) => {
                    tracing::warn!("a stored event of {id} does not read back; left out of the replay: {e}");
                    None
                }
            })
            .collect();
        Ok(Some(events))
    }

    fn chain(&self, id: &str) -> Result<Option<Vec<StoredResponse>>, StoreError> {
        let inner = self.lock();
        follow_chain(id, |cur| read_record(&inner.conn, cur))
    }

    fn mark_unfinished_failed(&self) -> Result<usize, StoreError> {
        self.write_recount(|tx| {
            let unfinished = tx
                .prepare_cached(
                    "SELECT id, response FROM responses
                     WHERE status IN ('queued', 'in_progress')",
                )?
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            for (id, text) in &unfinished {
                fail_one(tx, id, text)?;
            }
            Ok(unfinished.len())
        })
    }

    fn expire(&self, now: i64) -> Result<usize, StoreError> {
        let cutoff = now.saturating_sub(ttl_secs(self.config.ttl));
        self.write_recount(|tx| {
            let doomed = format!("SELECT id FROM responses WHERE created_at <= ?1 AND {FINISHED}");
            tx.prepare_cached(&format!(
                "DELETE FROM input_items WHERE response_id IN ({doomed})"
            ))?
            .execute([cutoff])?;
            tx.prepare_cached(&format!(
                "DELETE FROM events WHERE response_id IN ({doomed})"
            ))?
            .execute([cutoff])?;
            let n = tx
                .prepare_cached(&format!(
                    "DELETE FROM responses WHERE created_at <= ?1 AND {FINISHED}"
                ))?
                .execute([cutoff])?;
            Ok(n)
        })
    }

    fn len(&self) -> Result<usize, StoreError> {
        Ok(usize::try_from(self.lock().totals.rows).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_this_build_cannot_read_is_still_failed_at_restart() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("store.sqlite3");
        drop(SqliteStore::open(&path, StoreConfig::default())?);
        {
            let conn = Connection::open(&path)?;
            conn.execute(
                "INSERT INTO responses (id, created_at, status, background, response, bytes) VALUES ('resp_odd', 1, 'in_progress', 1, ?1, 2)",
                [r#"{"id": "resp_odd", "status": "in_progress"}"#],
            )?;
            conn.execute("INSERT INTO events (response_id, seq, event) VALUES ('resp_odd', 0, '{}')", [])?;
        }
        let store = SqliteStore::open(&path, StoreConfig::default())?;
        assert_eq!(store.mark_unfinished_failed()?, 1);
        let events = store.events("resp_odd", None)?.ok_or("the response is stored")?;
        // The unreadable event is left out (the response itself did not
        // read back, so no terminal event could be added).
        assert!(events.is_empty(), "{events:?}");
        drop(store);
        let conn = Connection::open(&path)?;
        let (status, response): (String, String) =
            conn.query_row("SELECT status, response FROM responses WHERE id = 'resp_odd'", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let response: Value = serde_json::from_str(&response)?;
        assert_eq!((status.as_str(), &response["status"], &response["error"]["code"]), ("failed", &Value::from("failed"), &Value::from("server_error")));
        Ok(())
    }
}
