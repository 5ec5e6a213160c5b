//! Concurrent generations per tenant, capped: a tenant past its cap gets a
//! 429 with `Retry-After` instead of filling the scheduler's queue for
//! everyone else. A [`Slot`] is held for as long as the generation runs.

use crate::app::access::auth::Tenant;
use crate::protocol::error::ApiError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Running generations by tenant.
#[derive(Debug, Default, Clone)]
pub struct TenantSlots {
    running: Arc<Mutex<HashMap<Tenant, usize>>>,
}

/// One running generation of a tenant; released when dropped.
#[derive(Debug)]
pub struct Slot {
    running: Arc<Mutex<HashMap<Tenant, usize>>>,
    tenant: Tenant,
}

impl TenantSlots {
    fn lock(map: &Mutex<HashMap<Tenant, usize>>) -> MutexGuard<'_, HashMap<Tenant, usize>> {
        map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for `tenant` when it runs fewer than `max` generations; a 429
    /// otherwise.
    pub fn acquire(&self, tenant: &Tenant, max: usize) -> Result<Slot, ApiError> {
        let mut running = Self::lock(&self.running);
        let count = running.entry(tenant.clone()).or_insert(0);
        if *count >= max {
            let mut e = ApiError::too_many_requests(Some(1));
            e.message = format!("This API key already has {max} responses generating; retry when one ends.");
            return Err(e);
        }
        *count += 1;
        Ok(Slot { running: self.running.clone(), tenant: tenant.clone() })
    }

    /// How many generations `tenant` runs now.
    pub fn running(&self, tenant: &Tenant) -> usize {
        Self::lock(&self.running).get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = TenantSlots::lock(&self.running);
        if let Some(count) = running.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                running.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_past_its_cap_waits_and_others_do_not() -> Result<(), ApiError> {
        let slots = TenantSlots::default();
        let (a, b) = (Tenant::named("a"), Tenant::named("b"));
        let first = slots.acquire(&a, 1)?;
        let refused = slots.acquire(&a, 1).err().map(|e| (e.status, e.retry_after));
        assert_eq!(refused, Some((429, Some(1))));
        let _other = slots.acquire(&b, 1)?;
        drop(first);
        assert_eq!(slots.running(&a), 0);
        let _again = slots.acquire(&a, 1)?;
        Ok(())
    }
}
