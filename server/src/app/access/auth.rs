//! Bearer-token authentication (constant-time compare) and the tenant each
//! key acts for.
//!
//! Every key belongs to a tenant: a name given in a keys file, or else one
//! derived from the key (`key-` and the first 16 hex digits of its SHA-256),
//! so two keys are two tenants unless a file names them alike. Without keys
//! every request acts for the one anonymous tenant.

use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// Who a request acts for: what it creates is owned by this tenant and
/// visible to no other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Tenant(Arc<str>);

impl Tenant {
    /// A tenant by name.
    pub fn named(name: &str) -> Self {
        Self(name.into())
    }

    /// The anonymous tenant of a server without keys (the empty name).
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// The tenant of a key that no file names: derived from the key.
    pub fn of_key(key: &str) -> Self {
        let digest = Sha256::digest(key.as_bytes());
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        Self(format!("key-{hex}").into())
    }

    /// The tenant's name (empty for the anonymous tenant).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The prefix-cache salt of a request: the tenant with the request's
    /// `prompt_cache_key`, so cached prefixes are shared only within one
    /// tenant (and one cache key). `None` for the anonymous tenant without a
    /// cache key (the scheduler's plain per-model salt).
    pub fn cache_salt(&self, prompt_cache_key: Option<&str>) -> Option<String> {
        match (self.0.is_empty(), prompt_cache_key) {
            (true, None) => None,
            (true, Some(key)) => Some(key.to_string()),
            (false, key) => Some(format!("tenant:{}\u{1f}{}", self.0, key.unwrap_or(""))),
        }
    }
}

/// The configured API keys with their tenants; empty means no authentication.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys(Vec<(String, Tenant)>);

/// A keys file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("keys file line {line}: {reason}")]
pub struct KeysFileError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

impl ApiKeys {
    /// Keys from the command line / environment (empty strings dropped), each
    /// its own tenant.
    pub fn new(keys: Vec<String>) -> Self {
        Self(keys.into_iter().filter(|k| !k.is_empty()).map(|k| (k.clone(), Tenant::of_key(&k))).collect())
    }

    /// Adds the keys of a keys file: one per line, `KEY` or `TENANT KEY`
    /// (whitespace between); blank lines and `#` comments are skipped.
    pub fn with_file_contents(mut self, text: &str) -> Result<Self, KeysFileError> {
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (tenant, key) = match fields.as_slice() {
                [key] => (Tenant::of_key(key), *key),
                [name, key] => (Tenant::named(name), *key),
                _ => return Err(KeysFileError { line: i + 1, reason: "expected `KEY` or `TENANT KEY`".into() }),
            };
            self.0.push((key.to_string(), tenant));
        }
        Ok(self)
    }

    /// Whether any key is configured.
    pub fn enabled(&self) -> bool {
        !self.0.is_empty()
    }

    /// How many distinct tenants the keys belong to.
    pub fn tenant_count(&self) -> usize {
        self.0.iter().map(|(_, t)| t).collect::<std::collections::HashSet<_>>().len()
    }

    /// Whether an `Authorization` header value carries a configured key.
    pub fn accepts(&self, header: Option<&str>) -> bool {
        self.identify(header).is_some()
    }

    /// The tenant an `Authorization` header acts for: the anonymous tenant
    /// without keys, `None` when the header carries no configured key.
    /// Every key is compared (no early exit), so timing reveals nothing.
    pub fn identify(&self, header: Option<&str>) -> Option<Tenant> {
        if !self.enabled() {
            return Some(Tenant::anonymous());
        }
        let token = header.and_then(|h| h.strip_prefix("Bearer "))?;
        let mut found = subtle::Choice::from(0);
        let mut index = 0u64;
        for (i, (key, _)) in self.0.iter().enumerate() {
            let eq = if key.len() == token.len() { key.as_bytes().ct_eq(token.as_bytes()) } else { subtle::Choice::from(0) };
            index.conditional_assign(&(i as u64), eq);
            found |= eq;
        }
        bool::from(found).then(|| self.0.get(index as usize).map(|(_, t)| t.clone())).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys() {
        let keys = ApiKeys::new(vec!["k1".into(), "secret".into()]);
        assert!(keys.accepts(Some("Bearer secret")));
        assert!(!keys.accepts(Some("Bearer secre")));
        assert!(!keys.accepts(Some("secret")));
        assert!(!keys.accepts(None));
        assert!(ApiKeys::default().accepts(None));
    }

    #[test]
    fn each_key_is_its_own_tenant_unless_a_file_names_them() -> Result<(), KeysFileError> {
        let keys = ApiKeys::new(vec!["k1".into(), "k2".into()]);
        let (a, b) = (keys.identify(Some("Bearer k1")), keys.identify(Some("Bearer k2")));
        assert!(a.is_some() && b.is_some() && a != b, "{a:?} {b:?}");
        assert_eq!(a.as_ref().map(Tenant::as_str).map(str::len), Some(20));
        let keys = ApiKeys::default().with_file_contents("# team keys\n\nacme  k-one\nacme k-two\nk-three\n")?;
        assert_eq!(keys.identify(Some("Bearer k-one")), Some(Tenant::named("acme")));
        assert_eq!(keys.identify(Some("Bearer k-two")), Some(Tenant::named("acme")));
        assert_eq!(keys.identify(Some("Bearer k-three")), Some(Tenant::of_key("k-three")));
        assert_eq!(keys.tenant_count(), 2);
        assert_eq!(ApiKeys::default().identify(None), Some(Tenant::anonymous()));
        let bad = ApiKeys::default().with_file_contents("a b c\n");
        assert!(matches!(bad, Err(KeysFileError { line: 1, .. })));
        Ok(())
    }

    #[test]
    fn cache_salts_differ_by_tenant_and_key() {
        let (a, b) = (Tenant::named("a"), Tenant::named("b"));
        assert_ne!(a.cache_salt(None), b.cache_salt(None));
        assert_ne!(a.cache_salt(Some("x")), a.cache_salt(None));
        assert_eq!(Tenant::anonymous().cache_salt(None), None);
        assert_eq!(Tenant::anonymous().cache_salt(Some("x")).as_deref(), Some("x"));
    }
}
