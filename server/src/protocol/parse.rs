//! Reading a `serde_json::Value` field by field, so that every type or range
//! error names the exact field path (`input[2].content[0].type`).

use super::error::{codes, ApiError};
use serde_json::{Map, Value};

/// The JSON type of `v` as error messages name it.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// 400 `invalid_type` at `path`.
pub(crate) fn wrong_type(path: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid_with_code(
        path,
        codes::INVALID_TYPE,
        format!(
            "Invalid type for '{path}': expected {expected}, but got {} instead.",
            type_name(got)
        ),
    )
}

/// 400 `missing_required_parameter` at `path`.
pub(crate) fn missing(path: &str) -> ApiError {
    ApiError::invalid_with_code(
        path,
        codes::MISSING_REQUIRED_PARAMETER,
        format!("Missing required parameter: '{path}'."),
    )
}

/// `base[index]`.
pub(crate) fn index_path(base: &str, index: usize) -> String {
    format!("{base}[{index}]")
}

/// Checks a string's length in characters against `max` (cheap for ASCII).
pub(crate) fn check_len(path: &str, s: &str, min: usize, max: usize) -> Result<(), ApiError> {
    if min > 0 && s.chars().take(min).count() < min {
        return Err(ApiError::invalid_with_code(
            path,
            codes::EMPTY_STRING,
            format!("Invalid '{path}': string too short; expected at least {min} characters."),
        ));
    }
    if s.len() > max && s.chars().count() > max {
        return Err(ApiError::invalid_with_code(
            path,
            codes::STRING_ABOVE_MAX_LENGTH,
            format!("Invalid '{path}': string too long; expected at most {max} characters."),
        ));
    }
    Ok(())
}

/// A JSON object being read, with its path for error messages.
pub(crate) struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    /// `value` as an object at `path` (`""` for the body).
    pub(crate) fn new(value: &'a Value, path: &str) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self {
                map,
                path: path.to_owned(),
            }),
            other if path.is_empty() => Err(ApiError::invalid_with_code(
                "",
                codes::INVALID_TYPE,
                format!(
                    "The request body must be a JSON object, not {}.",
                    type_name(other)
                ),
            )
            .without_param()),
            other => Err(wrong_type(path, "an object", other)),
        }
    }

    /// The path of `key` inside this object.
    pub(crate) fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The raw map.
    pub(crate) fn map(&self) -> &'a Map<String, Value> {
        self.map
    }

    /// `key`'s value, treating JSON null as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// An optional string.
    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(&self.path_of(key), "a string", other)),
        }
    }

    /// An optional string of `min..=max` characters, owned.
    pub(crate) fn opt_string(
        &self,
        key: &str,
        min: usize,
        max: usize,
    ) -> Result<Option<String>, ApiError> {
        let Some(s) = self.opt_str(key)? else {
            return Ok(None);
        };
        check_len(&self.path_of(key), s, min, max)?;
        Ok(Some(s.to_owned()))
    }

    /// A required string of `min..=max` characters, owned.
    pub(crate) fn req_string(&self, key: &str, min: usize, max: usize) -> Result<String, ApiError> {
        self.opt_string(key, min, max)?
            .ok_or_else(|| missing(&self.path_of(key)))
    }

    /// An optional boolean.
    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong_type(&self.path_of(key), "a boolean", other)),
        }
    }

    /// An optional number in `min..=max`.
    pub(crate) fn opt_f64(&self, key: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
        let path = self.path_of(key);
        let x = match self.get(key) {
            None => return Ok(None),
            Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
            Some(other) => return Err(wrong_type(&path, "a number", other)),
        };
        if x.is_nan() || x < min {
            return Err(ApiError::invalid_with_code(
                &path,
                codes::DECIMAL_BELOW_MIN_VALUE,
                format!("Invalid '{path}': decimal below minimum value. Expected a value >= {min}, but got {x} instead."),
            ));
        }
        if x > max {
            return Err(ApiError::invalid_with_code(
                &path,
                codes::DECIMAL_ABOVE_MAX_VALUE,
                format!("Invalid '{path}': decimal above maximum value. Expected a value <= {max}, but got {x} instead."),
            ));
        }
        Ok(Some(x))
    }

    /// An optional integer in `min..=max`.
    pub(crate) fn opt_int(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let path = self.path_of(key);
        let x = match self.get(key) {
            None => return Ok(None),
            Some(Value::Number(n)) if n.is_i64() => n.as_i64().unwrap_or_default(),
            Some(Value::Number(n)) if n.is_u64() => i64::MAX,
            Some(other) => return Err(wrong_type(&path, "an integer", other)),
        };
        if x < min {
            return Err(ApiError::invalid_with_code(
                &path,
                codes::INTEGER_BELOW_MIN_VALUE,
                format!("Invalid '{path}': integer below minimum value. Expected a value >= {min}, but got {x} instead."),
            ));
        }
        if x > max {
            return Err(ApiError::invalid_with_code(
                &path,
                codes::INTEGER_ABOVE_MAX_VALUE,
                format!("Invalid '{path}': integer above maximum value. Expected a value <= {max}, but got {x} instead."),
            ));
        }
        Ok(Some(x))
    }

    /// An optional array.
    pub(crate) fn opt_array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(other) => Err(wrong_type(&self.path_of(key), "an array", other)),
        }
    }

    /// An optional nested object.
    pub(crate) fn opt_obj(&self, key: &str) -> Result<Option<Obj<'a>>, ApiError> {
        self.get(key)
            .map(|v| Obj::new(v, &self.path_of(key)))
            .transpose()
    }

    /// An optional string that must be one of `allowed`; returns the index.
    pub(crate) fn opt_enum(&self, key: &str, allowed: &[&str]) -> Result<Option<usize>, ApiError> {
        let Some(s) = self.opt_str(key)? else {
            return Ok(None);
        };
        enum_index(&self.path_of(key), s, allowed).map(Some)
    }
}

/// The index of `s` in `allowed`, or 400 `invalid_value` at `path`.
pub(crate) fn enum_index(path: &str, s: &str, allowed: &[&str]) -> Result<usize, ApiError> {
    allowed.iter().position(|a| *a == s).ok_or_else(|| {
        let list = allowed
            .iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(", ");
        ApiError::invalid(
            path,
            format!("Invalid value for '{path}': '{s}'. Supported values are: {list}."),
        )
    })
}

impl ApiError {
    /// Clears `param` (for errors about the body as a whole).
    pub(crate) fn without_param(mut self) -> Self {
        self.param = None;
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn lengths_count_characters_not_bytes() {
        assert!(check_len("p", "ééé", 1, 3).is_ok());
        let e = check_len("p", "éééé", 1, 3).unwrap_err();
        assert_eq!(e.code.as_deref(), Some(codes::STRING_ABOVE_MAX_LENGTH));
        let e = check_len("p", "", 1, 3).unwrap_err();
        assert_eq!(e.code.as_deref(), Some(codes::EMPTY_STRING));
    }

    #[test]
    fn integers_reject_fractions_and_clamp_huge_values() {
        let v = json!({"a": 16.5, "b": 18446744073709551615u64, "c": -1, "d": 7});
        let o = Obj::new(&v, "").unwrap();
        assert_eq!(
            o.opt_int("a", 0, 10).unwrap_err().code.as_deref(),
            Some(codes::INVALID_TYPE)
        );
        let e = o.opt_int("b", 0, 10).unwrap_err();
        assert_eq!(e.code.as_deref(), Some(codes::INTEGER_ABOVE_MAX_VALUE));
        let e = o.opt_int("c", 0, 10).unwrap_err();
        assert_eq!(e.code.as_deref(), Some(codes::INTEGER_BELOW_MIN_VALUE));
        assert_eq!(o.opt_int("d", 0, 10).unwrap(), Some(7));
        assert_eq!(o.opt_int("missing", 0, 10).unwrap(), None);
    }

    #[test]
    fn nested_paths_and_enums() {
        let v = json!({"text": {"format": {"type": "xml"}}});
        let o = Obj::new(&v, "").unwrap();
        let f = o
            .opt_obj("text")
            .unwrap()
            .unwrap()
            .opt_obj("format")
            .unwrap()
            .unwrap();
        let e = f.opt_enum("type", &["text", "json_schema"]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("text.format.type"));
        assert!(e.message.contains("'text', 'json_schema'"), "{}", e.message);
        assert_eq!(index_path("input", 2), "input[2]");
        let e = Obj::new(&json!(3), "").err().unwrap();
        assert_eq!(
            (e.param, e.code.as_deref()),
            (None, Some(codes::INVALID_TYPE))
        );
    }
}
