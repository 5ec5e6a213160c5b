//! [`TaskStore`] on the in-memory backend.

use std::collections::{BTreeMap, HashMap};
use std::sync::{MutexGuard, PoisonError};

use super::memory::MemoryTask;
use super::tasks::{fail_task_for_restart, TaskEvent, TaskRecord, TaskStore};
use super::{MemoryStore, StoreError};

impl MemoryStore {
    fn task_map(&self) -> MutexGuard<'_, HashMap<String, MemoryTask>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl TaskStore for MemoryStore {
    fn put_task(&self, task: &TaskRecord) -> Result<(), StoreError> {
        let mut map = self.task_map();
        match map.get_mut(&task.id) {
            Some(entry) => entry.task = task.clone(),
            None => {
                map.insert(task.id.clone(), MemoryTask { task: task.clone(), events: BTreeMap::new() });
            }
        }
        while map.len() > self.config().max_responses {
            let oldest = map
                .values()
                .filter(|e| e.task.finished_at.is_some() && e.task.id != task.id)
                .min_by_key(|e| e.task.created_at)
                .map(|e| e.task.id.clone());
            let Some(id) = oldest else { break };
            map.remove(&id);
        }
        Ok(())
    }

    fn get_task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.task_map().get(id).map(|e| e.task.clone()))
    }

    fn append_task_events(&self, id: &str, events: &[TaskEvent]) -> Result<(), StoreError> {
        let mut map = self.task_map();
        let entry = map.get_mut(id).ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        entry.events.extend(events.iter().map(|e| (e.id, e.clone())));
        Ok(())
    }

    fn task_events(&self, id: &str, after: u64) -> Result<Vec<TaskEvent>, StoreError> {
        let map = self.task_map();
        let Some(entry) = map.get(id) else { return Ok(Vec::new()) };
        Ok(entry.events.range(after.saturating_add(1)..).map(|(_, e)| e.clone()).collect())
    }

    fn expire_tasks(&self, events_cutoff: i64, tasks_cutoff: i64) -> Result<usize, StoreError> {
        let mut map = self.task_map();
        map.retain(|_, e| e.task.finished_at.is_none_or(|f| f > tasks_cutoff));
        let mut dropped = 0;
        for entry in map.values_mut().filter(|e| e.task.finished_at.is_some_and(|f| f <= events_cutoff)) {
            if !entry.events.is_empty() {
                entry.events.clear();
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    fn fail_unfinished_tasks(&self, now: i64) -> Result<usize, StoreError> {
        let mut map = self.task_map();
        let mut changed = 0;
        for entry in map.values_mut().filter(|e| e.task.is_unfinished()) {
            let last_stored = entry.events.keys().next_back().copied().unwrap_or(0);
            let event = fail_task_for_restart(&mut entry.task, last_stored, now);
            entry.events.insert(event.id, event);
            changed += 1;
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_tasks_behave_like_the_contract() {
        crate::store::tasks::conformance::check(&super::MemoryStore::default());
    }
}
