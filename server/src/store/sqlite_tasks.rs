//! [`TaskStore`] on the SQLite backend (tables `tasks` and `task_events`,
//! schema version 2). Each call is one transaction.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::tasks::{fail_task_for_restart, TaskEvent, TaskRecord, TaskStore, TASK_UNFINISHED};
use super::{SqliteStore, StoreError};

impl TaskStore for SqliteStore {
    fn put_task(&self, task: &TaskRecord) -> Result<(), StoreError> {
        let max_tasks = i64::try_from(self.config().max_responses).unwrap_or(i64::MAX);
        let mut inner = self.lock();
        let tx = inner.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        write_task(&tx, task)?;
        // The cap: the oldest finished tasks go first, never a running one.
        let count: i64 = tx.query_row("SELECT COUNT(*) FROM tasks", [], |r| r.get(0))?;
        if count > max_tasks {
            let doomed = "SELECT id FROM tasks WHERE finished_at IS NOT NULL AND id <> ?1 ORDER BY created_at, rowid LIMIT ?2";
            tx.execute(&format!("DELETE FROM task_events WHERE task_id IN ({doomed})"), params![task.id, count - max_tasks])?;
            tx.execute(&format!("DELETE FROM tasks WHERE id IN ({doomed})"), params![task.id, count - max_tasks])?;
        }
        tx.commit()?;
        Ok(())
    }

    fn get_task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        read_task(&self.lock().conn, id)
    }

    fn append_task_events(&self, id: &str, events: &[TaskEvent]) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let tx = inner.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if read_task(&tx, id)?.is_none() {
            return Err(StoreError::NotFound(id.to_string()));
        }
        insert_events(&tx, id, events)?;
        tx.commit()?;
        Ok(())
    }

    fn task_events(&self, id: &str, after: u64) -> Result<Vec<TaskEvent>, StoreError> {
        let inner = self.lock();
        let mut stmt = inner.conn.prepare_cached("SELECT event FROM task_events WHERE task_id = ?1 AND seq > ?2 ORDER BY seq")?;
        let texts = stmt
            .query_map(params![id, i64::try_from(after).unwrap_or(i64::MAX)], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(texts.iter().map(|t| serde_json::from_str(t)).collect::<Result<Vec<TaskEvent>, _>>()?)
    }

    fn expire_tasks(&self, events_cutoff: i64, tasks_cutoff: i64) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let tx = inner.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let histories: i64 = tx.query_row(
            "SELECT COUNT(DISTINCT task_id) FROM task_events WHERE task_id IN
             (SELECT id FROM tasks WHERE finished_at IS NOT NULL AND finished_at <= ?1)",
            [events_cutoff],
            |r| r.get(0),
        )?;
        tx.execute(
            "DELETE FROM task_events WHERE task_id IN (SELECT id FROM tasks WHERE finished_at IS NOT NULL AND finished_at <= ?1)",
            [events_cutoff],
        )?;
        tx.execute(
            "DELETE FROM task_events WHERE task_id IN (SELECT id FROM tasks WHERE finished_at IS NOT NULL AND finished_at <= ?1)",
            [tasks_cutoff],
        )?;
        tx.execute("DELETE FROM tasks WHERE finished_at IS NOT NULL AND finished_at <= ?1", [tasks_cutoff])?;
        tx.commit()?;
        Ok(usize::try_from(histories).unwrap_or(0))
    }

    fn fail_unfinished_tasks(&self, now: i64) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let tx = inner.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ids = tx
            .prepare("SELECT id FROM tasks WHERE status IN (?1, ?2)")?
            .query_map(params![TASK_UNFINISHED[0], TASK_UNFINISHED[1]], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        for id in &ids {
            let Some(mut task) = read_task(&tx, id)? else { continue };
            let last_stored: Option<i64> = tx.query_row("SELECT MAX(seq) FROM task_events WHERE task_id = ?1", [id], |r| r.get(0))?;
            let event = fail_task_for_restart(&mut task, last_stored.map_or(0, |n| u64::try_from(n).unwrap_or(0)), now);
            write_task(&tx, &task)?;
            insert_events(&tx, id, &[event])?;
        }
        tx.commit()?;
        Ok(ids.len())
    }
}

fn write_task(conn: &Connection, task: &TaskRecord) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO tasks (id, created_at, finished_at, status, task) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(id) DO UPDATE SET finished_at = excluded.finished_at, status = excluded.status, task = excluded.task",
    )?
    .execute(params![task.id, task.created_at, task.finished_at, task.status, serde_json::to_string(task)?])?;
    Ok(())
}

fn read_task(conn: &Connection, id: &str) -> Result<Option<TaskRecord>, StoreError> {
    let text: Option<String> =
        conn.prepare_cached("SELECT task FROM tasks WHERE id = ?1")?.query_row([id], |r| r.get(0)).optional()?;
    Ok(text.map(|t| serde_json::from_str(&t)).transpose()?)
}

fn insert_events(conn: &Connection, id: &str, events: &[TaskEvent]) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached("INSERT OR REPLACE INTO task_events (task_id, seq, event) VALUES (?1, ?2, ?3)")?;
    for e in events {
        stmt.execute(params![id, i64::try_from(e.id).unwrap_or(i64::MAX), serde_json::to_string(e)?])?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;

    #[test]
    fn sqlite_tasks_behave_like_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("t.sqlite3"), StoreConfig::default()).unwrap();
        crate::store::tasks::conformance::check(&store);
    }

    #[test]
    fn a_version_1_database_gains_the_task_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sqlite3");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (1);").unwrap();
            conn.execute_batch(super::super::sqlite::SCHEMA_V1_FOR_TESTS).unwrap();
        }
        let store = SqliteStore::open(&path, StoreConfig::default()).unwrap();
        crate::store::tasks::conformance::check(&store);
    }

    #[test]
    fn a_version_1_database_keeps_its_responses_for_the_anonymous_tenant() -> Result<(), Box<dyn std::error::Error>> {
        use crate::store::ResponseStore;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("old.sqlite3");
        {
            let conn = Connection::open(&path)?;
            conn.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (1);")?;
            conn.execute_batch(super::super::sqlite::SCHEMA_V1_FOR_TESTS)?;
            let request = crate::protocol::request::validate(serde_json::json!({"input": "hi"}), &Default::default())?;
            let response = serde_json::to_string(&crate::protocol::ResponseObject::new("resp_old".into(), 1, &request))?;
            conn.execute(
                "INSERT INTO responses (id, created_at, status, background, response, bytes) VALUES ('resp_old', 1, 'completed', 0, ?1, 2)",
                [response],
            )?;
        }
        let store = SqliteStore::open(&path, StoreConfig::default())?;
        assert_eq!(store.tenant_of("resp_old")?.as_deref(), Some(""));
        assert!(crate::store::Owned::new(&store, "").get("resp_old")?.is_some());
        assert!(crate::store::Owned::new(&store, "key-0123").get("resp_old")?.is_none());
        Ok(())
    }
}
