//! A tenant's view of a store: what another tenant created reads exactly as
//! an id that was never stored, so no route can tell the two apart.

use crate::protocol::StreamEvent;

use super::{Order, ResponseStore, StoreError, StoredResponse, TaskEvent, TaskRecord};

/// The records of one tenant in a store (see the module docs).
#[derive(Clone, Copy)]
pub struct Owned<'a> {
    store: &'a dyn ResponseStore,
    tenant: &'a str,
}

impl<'a> Owned<'a> {
    /// `tenant`'s view of `store`.
    pub fn new(store: &'a dyn ResponseStore, tenant: &'a str) -> Self {
        Self { store, tenant }
    }

    /// Whether this tenant owns a stored response with this id.
    pub fn tenant_owns(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.store.tenant_of(id)?.as_deref() == Some(self.tenant))
    }

    /// The stored response with this id, if this tenant owns it.
    pub fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        Ok(self.store.get(id)?.filter(|r| r.tenant == self.tenant))
    }

    /// Deletes the response if this tenant owns it; `true` if it did.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        if !self.tenant_owns(id)? {
            return Ok(false);
        }
        self.store.delete(id)
    }

    /// A page of the response's input items ([`ResponseStore::input_items`]).
    pub fn input_items(&self, id: &str, after: Option<&str>, limit: usize, order: Order) -> Result<Option<Vec<crate::protocol::InputItem>>, StoreError> {
        if !self.tenant_owns(id)? {
            return Ok(None);
        }
        self.store.input_items(id, after, limit, order)
    }

    /// The response's stored events ([`ResponseStore::events`]).
    pub fn events(&self, id: &str, starting_after: Option<u64>) -> Result<Option<Vec<StreamEvent>>, StoreError> {
        if !self.tenant_owns(id)? {
            return Ok(None);
        }
        self.store.events(id, starting_after)
    }

    /// The conversation ending at `id` ([`ResponseStore::chain`]), if this
    /// tenant owns every turn of it.
    pub fn chain(&self, id: &str) -> Result<Option<Vec<StoredResponse>>, StoreError> {
        Ok(self.store.chain(id)?.filter(|turns| turns.iter().all(|r| r.tenant == self.tenant)))
    }

    /// The task with this id, if this tenant owns it.
    pub fn get_task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.store.get_task(id)?.filter(|t| t.tenant == self.tenant))
    }

    /// The task's events after `after`, if this tenant owns the task.
    pub fn task_events(&self, id: &str, after: u64) -> Result<Option<Vec<TaskEvent>>, StoreError> {
        if self.get_task(id)?.is_none() {
            return Ok(None);
        }
        self.store.task_events(id, after).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::items::ItemReference;
    use crate::protocol::InputItem;
    use crate::store::{MemoryStore, StoreConfig};

    fn request() -> crate::protocol::request::ValidRequest {
        crate::protocol::request::validate(serde_json::json!({"input": "hi"}), &Default::default()).expect("a valid body")
    }

    fn record(id: &str, tenant: &str, previous: Option<&str>) -> StoredResponse {
        StoredResponse {
            id: id.into(),
            created_at: 1,
            status: "completed".into(),
            previous_response_id: previous.map(str::to_string),
            background: false,
            response: crate::protocol::ResponseObject::new(id.into(), 1, &request()),
            input_items: vec![InputItem::ItemReference(ItemReference { id: "msg_1".into() })],
            tenant: tenant.into(),
        }
    }

    #[test]
    fn another_tenants_records_read_as_absent() -> Result<(), StoreError> {
        let store = MemoryStore::new(StoreConfig::default());
        store.put(&record("r1", "a", None))?;
        store.put(&record("r2", "a", Some("r1")))?;
        let (a, b) = (Owned::new(&store, "a"), Owned::new(&store, "b"));
        assert!(a.get("r1")?.is_some() && b.get("r1")?.is_none());
        assert!(b.input_items("r1", None, 10, Order::Asc)?.is_none());
        assert!(a.input_items("r1", None, 10, Order::Asc)?.is_some_and(|items| items.len() == 1));
        assert!(b.events("r1", None)?.is_none());
        assert!(b.chain("r2")?.is_none());
        assert_eq!(a.chain("r2")?.map(|c| c.len()), Some(2));
        assert!(!b.delete("r1")?);
        assert!(a.get("r1")?.is_some(), "the other tenant's delete left it");
        assert!(a.delete("r1")?);
        Ok(())
    }

    #[test]
    fn a_chain_through_another_tenants_turn_is_not_found() -> Result<(), StoreError> {
        let store = MemoryStore::new(StoreConfig::default());
        store.put(&record("r1", "b", None))?;
        store.put(&record("r2", "a", Some("r1")))?;
        assert!(Owned::new(&store, "a").chain("r2")?.is_none());
        Ok(())
    }
}
