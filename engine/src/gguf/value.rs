//! GGUF metadata values: the typed value enum and its (bounds-checked) parser.

use super::cursor::Cursor;
use crate::error::{EngineError, Result};

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    /// `uint8` (type id 0).
    U8(u8),
    /// `int8` (type id 1).
    I8(i8),
    /// `uint16` (type id 2).
    U16(u16),
    /// `int16` (type id 3).
    I16(i16),
    /// `uint32` (type id 4).
    U32(u32),
    /// `int32` (type id 5).
    I32(i32),
    /// `float32` (type id 6).
    F32(f32),
    /// `bool` (type id 7).
    Bool(bool),
    /// UTF-8 `string` (type id 8).
    String(String),
    /// `array` (type id 9) of values that all share one type (arrays may nest).
    Array(Vec<MetadataValue>),
    /// `uint64` (type id 10).
    U64(u64),
    /// `int64` (type id 11).
    I64(i64),
    /// `float64` (type id 12).
    F64(f64),
}

impl MetadataValue {
    /// The value as a `u64`, for any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as an `i64`, for any integer type whose value fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => i64::try_from(v).ok(),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an `f64`, for float types and (converted) integer types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            Self::U64(v) => Some(v as f64),
            Self::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a `bool`, if it is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            Self::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The GGUF type id of this value (0 = u8 ... 12 = f64).
    pub fn type_id(&self) -> u32 {
        match self {
            Self::U8(_) => TYPE_U8,
            Self::I8(_) => TYPE_I8,
            Self::U16(_) => TYPE_U16,
            Self::I16(_) => TYPE_I16,
            Self::U32(_) => TYPE_U32,
            Self::I32(_) => TYPE_I32,
            Self::F32(_) => TYPE_F32,
            Self::Bool(_) => TYPE_BOOL,
            Self::String(_) => TYPE_STRING,
            Self::Array(_) => TYPE_ARRAY,
            Self::U64(_) => TYPE_U64,
            Self::I64(_) => TYPE_I64,
            Self::F64(_) => TYPE_F64,
        }
    }
}

pub(crate) const TYPE_U8: u32 = 0;
pub(crate) const TYPE_I8: u32 = 1;
pub(crate) const TYPE_U16: u32 = 2;
pub(crate) const TYPE_I16: u32 = 3;
pub(crate) const TYPE_U32: u32 = 4;
pub(crate) const TYPE_I32: u32 = 5;
pub(crate) const TYPE_F32: u32 = 6;
pub(crate) const TYPE_BOOL: u32 = 7;
pub(crate) const TYPE_STRING: u32 = 8;
pub(crate) const TYPE_ARRAY: u32 = 9;
pub(crate) const TYPE_U64: u32 = 10;
pub(crate) const TYPE_I64: u32 = 11;
pub(crate) const TYPE_F64: u32 = 12;

/// Deepest array nesting accepted (guards the recursive parser's stack).
pub(crate) const MAX_ARRAY_DEPTH: usize = 16;

/// Most metadata values (scalars plus array elements) one file may hold, so a
/// corrupt count cannot make the parser build gigabytes of values.
pub(crate) const MAX_METADATA_VALUES: usize = 1 << 26;

/// The fewest bytes a value of GGUF type `type_id` occupies in the file.
fn min_encoded_size(type_id: u32) -> Option<usize> {
    Some(match type_id {
        TYPE_U8 | TYPE_I8 | TYPE_BOOL => 1,
        TYPE_U16 | TYPE_I16 => 2,
        TYPE_U32 | TYPE_I32 | TYPE_F32 => 4,
        TYPE_U64 | TYPE_I64 | TYPE_F64 | TYPE_STRING => 8,
        // item type (u32) + count (u64)
        TYPE_ARRAY => 12,
        _ => return None,
    })
}

/// State shared across one file's metadata parse: limits and diagnostics.
#[derive(Debug)]
pub(crate) struct ValueParser {
    /// Values still allowed before [`MAX_METADATA_VALUES`] is hit.
    budget: usize,
    /// Strings that were not valid UTF-8 and were converted lossily.
    pub(crate) lossy_strings: usize,
}

impl ValueParser {
    /// A parser with the full value budget.
    pub(crate) fn new() -> Self {
        Self {
            budget: MAX_METADATA_VALUES,
            lossy_strings: 0,
        }
    }

    fn spend(&mut self, n: usize, key: &str) -> Result<()> {
        self.budget = self.budget.checked_sub(n).ok_or_else(|| {
            EngineError::InvalidGguf(format!(
                "metadata `{key}`: more than {MAX_METADATA_VALUES} metadata values in total"
            ))
        })?;
        Ok(())
    }

    /// Parse one value of GGUF type `type_id` for metadata key `key`.
    pub(crate) fn value(
        &mut self,
        c: &mut Cursor<'_>,
        type_id: u32,
        key: &str,
        depth: usize,
    ) -> Result<MetadataValue> {
        self.spend(1, key)?;
        let what = "metadata value";
        Ok(match type_id {
            TYPE_U8 => MetadataValue::U8(c.u8(what)?),
            TYPE_I8 => MetadataValue::I8(c.i8(what)?),
            TYPE_U16 => MetadataValue::U16(c.u16(what)?),
            TYPE_I16 => MetadataValue::I16(c.i16(what)?),
            TYPE_U32 => MetadataValue::U32(c.u32(what)?),
            TYPE_I32 => MetadataValue::I32(c.i32(what)?),
            TYPE_F32 => MetadataValue::F32(c.f32(what)?),
            TYPE_BOOL => MetadataValue::Bool(c.u8(what)? != 0),
            TYPE_STRING => MetadataValue::String(self.string(c)?),
            TYPE_ARRAY => self.array(c, key, depth)?,
            TYPE_U64 => MetadataValue::U64(c.u64(what)?),
            TYPE_I64 => MetadataValue::I64(c.i64(what)?),
            TYPE_F64 => MetadataValue::F64(c.f64(what)?),
            other => {
                return Err(EngineError::InvalidGguf(format!(
                    "metadata `{key}` has unknown value type id {other} (offset {})",
                    c.pos()
                )))
            }
        })
    }

    /// A string value; invalid UTF-8 is replaced (and counted), not rejected,
    /// because some published vocabularies contain raw byte tokens.
    fn string(&mut self, c: &mut Cursor<'_>) -> Result<String> {
        let bytes = c.string_bytes("metadata string")?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => {
                self.lossy_strings += 1;
                Ok(String::from_utf8_lossy(bytes).into_owned())
            }
        }
    }

    fn array(&mut self, c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<MetadataValue> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(EngineError::InvalidGguf(format!(
                "metadata `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}"
            )));
        }
        let item_type = c.u32("metadata array item type")?;
        let min = min_encoded_size(item_type).ok_or_else(|| {
            EngineError::InvalidGguf(format!(
                "metadata `{key}`: array of unknown value type id {item_type}"
            ))
        })?;
        let n = c.count(min, &format!("array length of metadata `{key}`"))?;
        // Fail on a too-large count before parsing (each item then spends one).
        if n > self.budget {
            return Err(EngineError::InvalidGguf(format!(
                "metadata `{key}`: array of {n} items exceeds the limit of {MAX_METADATA_VALUES} metadata values"
            )));
        }
        let mut items = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            items.push(self.value(c, item_type, key, depth + 1)?);
        }
        Ok(MetadataValue::Array(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_conversions() {
        assert_eq!(MetadataValue::I32(-1).as_u64(), None);
        assert_eq!(MetadataValue::I32(7).as_u64(), Some(7));
        assert_eq!(MetadataValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetadataValue::U8(3).as_f64(), Some(3.0));
        assert_eq!(MetadataValue::F32(0.5).as_f64(), Some(0.5));
        assert_eq!(MetadataValue::F32(0.5).as_u64(), None);
        assert_eq!(MetadataValue::Bool(true).as_bool(), Some(true));
        assert_eq!(MetadataValue::String("x".into()).as_str(), Some("x"));
        assert!(MetadataValue::U8(1).as_array().is_none());
    }

    #[test]
    fn deep_nesting_is_rejected() {
        let mut buf = Vec::new();
        for _ in 0..100 {
            buf.extend_from_slice(&TYPE_ARRAY.to_le_bytes());
            buf.extend_from_slice(&1u64.to_le_bytes());
        }
        buf.extend_from_slice(&[0u8; 64]);
        let mut c = Cursor::new(&buf);
        let r = ValueParser::new().value(&mut c, TYPE_ARRAY, "k", 0);
        assert!(matches!(r, Err(EngineError::InvalidGguf(_))));
    }
}
