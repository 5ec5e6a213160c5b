//! Bearer-token authentication for `/v1` routes (constant-time compare).

use subtle::ConstantTimeEq;

/// The configured API keys; empty means no authentication.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys(Vec<String>);

impl ApiKeys {
    /// Keys from the command line / environment (empty strings dropped).
    pub fn new(keys: Vec<String>) -> Self {
        Self(keys.into_iter().filter(|k| !k.is_empty()).collect())
    }

    /// Whether any key is configured.
    pub fn enabled(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether an `Authorization` header value carries a configured key.
    pub fn accepts(&self, header: Option<&str>) -> bool {
        if !self.enabled() {
            return true;
        }
        let Some(token) = header.and_then(|h| h.strip_prefix("Bearer ")) else { return false };
        let mut ok = subtle::Choice::from(0);
        for key in &self.0 {
            // Compare every key (no early exit) so timing reveals nothing.
            let same_len = key.len() == token.len();
            let eq = if same_len { key.as_bytes().ct_eq(token.as_bytes()) } else { subtle::Choice::from(0) };
            ok |= eq;
        }
        ok.into()
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
}
