//! A small in-memory GGUF v3 writer, for tests and tools that need real
//! GGUF files (it is not meant for multi-gigabyte models).

use std::path::Path;

use super::reader::{align_up, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use super::types::GgmlType;
use super::value::{MetadataValue, TYPE_U8};
use crate::error::{EngineError, Result};

/// One tensor queued for writing.
#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dtype: GgmlType,
    /// Outermost first.
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Builds a little-endian GGUF v3 file from metadata and tensors.
///
/// Metadata and tensors are written in the order they were added. The data
/// section alignment is taken from a `general.alignment` metadata entry if
/// one was added (it must be a non-zero power of two), else 32.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add (or replace) a metadata entry.
    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Set the data section alignment (stored as `general.alignment`, u32).
    pub fn set_alignment(&mut self, alignment: u32) -> &mut Self {
        self.add_metadata("general.alignment", MetadataValue::U32(alignment))
    }

    /// Add a tensor with `shape` outermost first and its raw (already
    /// encoded) bytes, which must be exactly the size `dtype` implies.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: GgmlType,
        shape: &[usize],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        if shape.len() > MAX_DIMS {
            return Err(EngineError::InvalidGguf(format!(
                "tensor `{name}` has {} dimensions (at most {MAX_DIMS})",
                shape.len()
            )));
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                EngineError::InvalidGguf(format!("tensor `{name}` shape {shape:?} overflows"))
            })?;
        if let Some(&row) = shape.last() {
            if row % dtype.block_size() != 0 {
                return Err(EngineError::InvalidGguf(format!(
                    "tensor `{name}`: row length {row} is not a multiple of the {dtype:?} block size"
                )));
            }
        }
        let expected = dtype.bytes_for(numel)?;
        if data.len() != expected {
            return Err(EngineError::InvalidGguf(format!(
                "tensor `{name}` ({dtype:?}, shape {shape:?}) needs {expected} bytes, got {}",
                data.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(EngineError::InvalidGguf(format!(
                "duplicate tensor name `{name}`"
            )));
        }
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            data,
        });
        Ok(self)
    }

    fn alignment(&self) -> Result<u64> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, v)) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => Ok(a),
                _ => Err(EngineError::InvalidGguf(format!(
                    "`general.alignment` must be a non-zero power of two, got {v:?}"
                ))),
            },
        }
    }

    /// Serialize the whole file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let align = self.alignment()?;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            write_value(&mut out, value, key)?;
        }
        // Relative offsets: each tensor starts on an aligned boundary.
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut next = 0u64;
        for t in &self.tensors {
            offsets.push(next);
            next = align_up(next + t.data.len() as u64, align)
                .ok_or_else(|| EngineError::InvalidGguf("tensor data overflows".to_owned()))?;
        }
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&t.dtype.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        let data_start = align_up(out.len() as u64, align)
            .ok_or_else(|| EngineError::InvalidGguf("header overflows".to_owned()))?;
        out.resize(data_start as usize, 0);
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            out.resize((data_start + offset) as usize, 0);
            out.extend_from_slice(&t.data);
        }
        if !self.tensors.is_empty() {
            out.resize((data_start + next) as usize, 0);
        }
        Ok(out)
    }

    /// Serialize and write the file to `path`.
    pub fn write_to(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &MetadataValue, key: &str) -> Result<()> {
    match value {
        MetadataValue::U8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::Bool(v) => out.push(u8::from(*v)),
        MetadataValue::String(s) => write_string(out, s),
        MetadataValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::Array(items) => {
            // An empty array needs some item type; u8 is as good as any.
            let item_type = items.first().map_or(TYPE_U8, MetadataValue::type_id);
            if items.iter().any(|v| v.type_id() != item_type) {
                return Err(EngineError::InvalidGguf(format!(
                    "metadata `{key}`: array items must all have the same type"
                )));
            }
            out.extend_from_slice(&item_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item, key)?;
            }
        }
    }
    Ok(())
}
