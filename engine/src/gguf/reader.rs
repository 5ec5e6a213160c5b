//! The GGUF reader: header, metadata, tensor infos and tensor data over an
//! mmap (or an owned buffer, for tests).
//!
//! Supports GGUF v2 and v3, little-endian only. Every read is bounds-checked:
//! a truncated or corrupt file yields [`EngineError::InvalidGguf`] (or
//! [`EngineError::UnsupportedDtype`] for an unknown tensor type), never a
//! panic, and no count read from the file is trusted before it has been
//! checked against the bytes that remain.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use super::cursor::Cursor;
use super::types::GgmlType;
pub use super::value::MetadataValue;
use super::value::ValueParser;
use crate::error::{EngineError, Result};
use crate::weights::{StableBytes, TensorSource, TensorView, WeightBytes};

/// The four magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// Data-section alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Most dimensions a GGML tensor can have.
pub const MAX_DIMS: usize = 4;

/// The fewest bytes one tensor info occupies: name length (u64), n_dims
/// (u32), type (u32), offset (u64).
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;

/// The fewest bytes one metadata key/value pair occupies: key length (u64),
/// value type (u32), a one-byte value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;

/// Where one tensor's data lives and how to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name as stored in the file.
    pub name: String,
    /// Element type / quantization.
    pub dtype: GgmlType,
    /// Dimensions, outermost first (the reverse of GGUF's `ne[]`).
    pub shape: Vec<usize>,
    /// Absolute offset of the tensor's first byte in the file.
    pub offset: u64,
    /// Size of the tensor's data in bytes.
    pub size: usize,
}

impl TensorInfo {
    /// Number of elements (1 for a zero-dimensional tensor).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The bytes a [`GgufFile`] reads from.
enum Backing {
    /// A read-only memory map of the file.
    Mmap(memmap2::Mmap),
    /// An owned buffer.
    Owned(Vec<u8>),
}

// SAFETY: both variants are stable (see the impls for `Mmap` and `Vec<u8>`):
// a `Backing` is never written after it is made.
unsafe impl StableBytes for Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Mmap(m) => m,
            Self::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file: its metadata and tensor infos, plus the tensor bytes.
pub struct GgufFile {
    backing: Arc<Backing>,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: BTreeMap<String, MetadataValue>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("len", &self.backing.bytes().len())
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Everything parsed from a file apart from the bytes themselves.
struct Parsed {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: BTreeMap<String, MetadataValue>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl GgufFile {
    /// Memory-map and parse the GGUF file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let io_err = |source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        // SAFETY: a read-only shared mapping (`MAP_SHARED`), kept for as long
        // as any layer holds weights from it (the model's lifetime). As with
        // every mmap-based loader, the file must not be truncated or rewritten
        // in place while mapped (replacing it by rename is safe); model files
        // are treated as immutable.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        Self::from_backing(Backing::Mmap(mmap))
    }

    /// Parse a GGUF file held in memory (for tests and tools).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_backing(Backing::Owned(bytes))
    }

    /// [`TensorSource::move_to_huge_pages`] whatever the setting: only a
    /// file's own map, and only while no tensor shares it.
    fn copy_into_huge_pages(&mut self, copy: impl FnOnce(&memmap2::Mmap) -> std::io::Result<memmap2::Mmap>) -> Result<bool> {
        let moved = match Arc::get_mut(&mut self.backing) {
            Some(Backing::Mmap(map)) => copy(map).map_err(|e| EngineError::Backend(format!("copying the weights into huge pages: {e}")))?,
            _ => return Ok(false),
        };
        self.backing = Arc::new(Backing::Mmap(moved));
        Ok(true)
    }

    fn from_backing(backing: Backing) -> Result<Self> {
        let p = parse(backing.bytes())?;
        Ok(Self {
            backing: Arc::new(backing),
            version: p.version,
            alignment: p.alignment,
            data_offset: p.data_offset,
            metadata: p.metadata,
            tensors: p.tensors,
            index: p.index,
        })
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data-section alignment in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where the tensor data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, MetadataValue> {
        &self.metadata
    }

    /// The metadata value for `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.get(key)
    }

    /// The string metadata value for `key`.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get(key)
            .and_then(MetadataValue::as_str)
            .ok_or_else(|| {
                EngineError::InvalidGguf(format!("missing or non-string metadata `{key}`"))
            })
    }

    /// The metadata value for `key` as a `u64`; accepts any non-negative integer type.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get(key)
            .and_then(MetadataValue::as_u64)
            .ok_or_else(|| {
                EngineError::InvalidGguf(format!("missing or non-integer metadata `{key}`"))
            })
    }

    /// The metadata value for `key` as an `f64`; accepts float or integer types.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.get(key)
            .and_then(MetadataValue::as_f64)
            .ok_or_else(|| {
                EngineError::InvalidGguf(format!("missing or non-numeric metadata `{key}`"))
            })
    }

    /// The array metadata value for `key`.
    pub fn get_array(&self, key: &str) -> Result<&[MetadataValue]> {
        self.get(key)
            .and_then(MetadataValue::as_array)
            .ok_or_else(|| {
                EngineError::InvalidGguf(format!("missing or non-array metadata `{key}`"))
            })
    }

    /// Tensor infos, in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of the tensor called `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The raw bytes of a tensor described by one of this file's infos.
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8]> {
        self.tensor_range(info).and_then(|r| self.backing.bytes().get(r)).ok_or_else(|| out_of_bounds(info))
    }

    /// A tensor's bytes as a handle sharing this file's map (no copy).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<WeightBytes> {
        let owner: Arc<dyn StableBytes> = self.backing.clone();
        self.tensor_range(info).and_then(|r| WeightBytes::shared(owner, r)).ok_or_else(|| out_of_bounds(info))
    }

    fn tensor_range(&self, info: &TensorInfo) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(info.offset).ok()?;
        start.checked_add(info.size).map(|end| start..end)
    }
}

impl TensorSource for GgufFile {
    fn move_to_huge_pages(&mut self) -> Result<bool> {
        if !crate::weights::huge_pages_offered() {
            return Ok(false);
        }
        self.copy_into_huge_pages(crate::weights::huge_page_copy)
    }

    fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| EngineError::MissingTensor(name.to_owned()))?;
        Ok(TensorView {
            name: info.name.clone(),
            dtype: info.dtype,
            shape: info.shape.clone(),
            data: self.tensor_data(info)?,
            shared: Some(self.tensor_bytes(info)?),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }
}

fn out_of_bounds(info: &TensorInfo) -> EngineError {
    EngineError::InvalidGguf(format!("tensor `{}` data is out of bounds", info.name))
}

/// Parse a whole file.
fn parse(bytes: &[u8]) -> Result<Parsed> {
    let mut c = Cursor::new(bytes);
    let version = parse_magic_and_version(&mut c)?;
    let n_tensors = c.count(MIN_TENSOR_INFO_BYTES, "tensor count")?;
    let n_kv = c.count(MIN_KV_BYTES, "metadata key/value count")?;
    let metadata = parse_metadata(&mut c, n_kv)?;
    let alignment = alignment_of(&metadata)?;
    let mut raw = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        raw.push(parse_tensor_info(&mut c, i)?);
    }
    let data_offset = align_up(c.pos() as u64, alignment)
        .ok_or_else(|| EngineError::InvalidGguf("data section offset overflows".to_owned()))?;
    let (tensors, index) = place_tensors(raw, data_offset, alignment, bytes.len())?;
    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
        index,
    })
}

fn parse_magic_and_version(c: &mut Cursor<'_>) -> Result<u32> {
    let magic = c.take(4, "magic")?;
    if magic != GGUF_MAGIC {
        return Err(EngineError::InvalidGguf(format!(
            "bad magic {magic:02x?}: not a GGUF file (expected \"GGUF\")"
        )));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => Ok(version),
        1 => Err(EngineError::InvalidGguf(
            "GGUF version 1 is not supported (only versions 2 and 3 are); re-convert the model"
                .to_owned(),
        )),
        v if v & 0xFFFF == 0 && matches!(v.swap_bytes(), 1..=3) => {
            Err(EngineError::InvalidGguf(format!(
                "big-endian GGUF (version {}) is not supported",
                v.swap_bytes()
            )))
        }
        v => Err(EngineError::InvalidGguf(format!(
            "unsupported GGUF version {v} (only versions 2 and 3 are supported)"
        ))),
    }
}

fn parse_metadata(c: &mut Cursor<'_>, n_kv: usize) -> Result<BTreeMap<String, MetadataValue>> {
    let mut parser = ValueParser::new();
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string_strict(&format!("metadata key #{i}"))?;
        let type_id = c.u32("metadata value type")?;
        let lossy_before = parser.lossy_strings;
        let value = parser.value(c, type_id, &key, 0)?;
        if parser.lossy_strings > lossy_before {
            tracing::warn!(
                key = %key,
                count = parser.lossy_strings - lossy_before,
                "GGUF metadata strings are not valid UTF-8; invalid bytes were replaced"
            );
        }
        if metadata.contains_key(&key) {
            return Err(EngineError::InvalidGguf(format!(
                "duplicate metadata key `{key}`"
            )));
        }
        metadata.insert(key, value);
    }
    Ok(metadata)
}

fn alignment_of(metadata: &BTreeMap<String, MetadataValue>) -> Result<u64> {
    let Some(value) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_u64() {
        Some(a) if a.is_power_of_two() => Ok(a),
        _ => Err(EngineError::InvalidGguf(format!(
            "`general.alignment` must be a non-zero power of two, got {value:?}"
        ))),
    }
}

/// A tensor info as read, before its offset is made absolute and checked.
struct RawTensorInfo {
    name: String,
    dtype: GgmlType,
    shape: Vec<usize>,
    size: usize,
    rel_offset: u64,
}

fn parse_tensor_info(c: &mut Cursor<'_>, i: usize) -> Result<RawTensorInfo> {
    let name = c.string_strict(&format!("name of tensor #{i}"))?;
    let n_dims = c.u32("tensor dimension count")?;
    let n_dims = usize::try_from(n_dims)
        .ok()
        .filter(|&n| n <= MAX_DIMS)
        .ok_or_else(|| {
            EngineError::InvalidGguf(format!(
                "tensor `{name}` has {n_dims} dimensions (at most {MAX_DIMS} are allowed)"
            ))
        })?;
    let mut ne = Vec::with_capacity(n_dims);
    for _ in 0..n_dims {
        let d = c.u64("tensor dimension")?;
        let d = usize::try_from(d)
            .ok()
            .filter(|&d| d as u64 <= i64::MAX as u64)
            .ok_or_else(|| {
                EngineError::InvalidGguf(format!("tensor `{name}` has an absurd dimension {d}"))
            })?;
        ne.push(d);
    }
    let type_id = c.u32("tensor type")?;
    let dtype = GgmlType::from_id(type_id).map_err(|_| {
        EngineError::UnsupportedDtype(format!(
            "ggml type id {type_id} (tensor `{name}`; supported: {})",
            GgmlType::SUPPORTED_NAMES
        ))
    })?;
    let rel_offset = c.u64("tensor offset")?;
    let size = tensor_size(&name, dtype, &ne)?;
    ne.reverse();
    Ok(RawTensorInfo {
        name,
        dtype,
        shape: ne,
        size,
        rel_offset,
    })
}

/// Byte size of a tensor with GGUF dims `ne` (innermost first).
fn tensor_size(name: &str, dtype: GgmlType, ne: &[usize]) -> Result<usize> {
    let numel = ne
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            EngineError::InvalidGguf(format!(
                "tensor `{name}` dims {ne:?}: element count overflows"
            ))
        })?;
    let bs = dtype.block_size();
    if let Some(&row) = ne.first() {
        if row % bs != 0 {
            return Err(EngineError::InvalidGguf(format!(
                "tensor `{name}`: row length {row} is not a multiple of the {dtype:?} block size {bs}"
            )));
        }
    }
    dtype
        .bytes_for(numel)
        .map_err(|e| EngineError::InvalidGguf(format!("tensor `{name}`: {e}")))
}

/// Make offsets absolute and check every tensor lies inside the file.
fn place_tensors(
    raw: Vec<RawTensorInfo>,
    data_offset: u64,
    alignment: u64,
    file_len: usize,
) -> Result<(Vec<TensorInfo>, HashMap<String, usize>)> {
    let mut tensors = Vec::with_capacity(raw.len());
    let mut index = HashMap::with_capacity(raw.len());
    for t in raw {
        if t.rel_offset % alignment != 0 {
            return Err(EngineError::InvalidGguf(format!(
                "tensor `{}` offset {} is not a multiple of the alignment {alignment}",
                t.name, t.rel_offset
            )));
        }
        let offset = data_offset.checked_add(t.rel_offset);
        let end = offset.and_then(|o| o.checked_add(t.size as u64));
        let (Some(offset), Some(end)) = (offset, end) else {
            return Err(EngineError::InvalidGguf(format!(
                "tensor `{}` offset overflows",
                t.name
            )));
        };
        if end > file_len as u64 {
            return Err(EngineError::InvalidGguf(format!(
                "tensor `{}` data [{offset}, {end}) extends past the end of the file ({file_len} bytes)",
                t.name
            )));
        }
        if index.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(EngineError::InvalidGguf(format!(
                "duplicate tensor name `{}`",
                t.name
            )));
        }
        tensors.push(TensorInfo {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            offset,
            size: t.size,
        });
    }
    Ok((tensors, index))
}

/// `x` rounded up to a multiple of the power of two `align`; `None` on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    let mask = align.checked_sub(1)?;
    x.checked_add(mask).map(|v| v & !mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_works() {
        assert_eq!(align_up(0, 32), Some(0));
        assert_eq!(align_up(1, 32), Some(32));
        assert_eq!(align_up(32, 32), Some(32));
        assert_eq!(align_up(u64::MAX, 32), None);
    }

    #[test]
    fn minimal_header_parses() {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        let f = GgufFile::from_bytes(b);
        assert!(matches!(f.as_ref().map(GgufFile::version), Ok(3)), "{f:?}");
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_file_moved_into_huge_pages_keeps_its_tensors_and_a_shared_map_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let data: Vec<u8> = (0..4096u32 * 3).map(|i| (i * 7 % 251) as u8).collect();
        let mut w = crate::gguf::GgufWriter::new();
        w.add_tensor("w", crate::gguf::types::GgmlType::Q8_0, &[341, 32], data[..34 * 341].to_vec()).unwrap();
        w.write_to(&path).unwrap();
        let mut file = GgufFile::open(&path).unwrap();
        let before = file.tensor("w").unwrap().data.to_vec();
        let old = file.tensor("w").unwrap().data.as_ptr();
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        assert!(len > 2 * 4096 && !len.is_multiple_of(4096), "several chunks and a partial one: {len}");
        // In chunks of one page: the releases of the source cover every chunk and the tail.
        assert!(file.copy_into_huge_pages(|map| crate::weights::huge_page_copy_in_chunks(map, 4096)).unwrap(), "a file's own map moves");
        let after = file.tensor("w").unwrap();
        assert_eq!(after.data, &before[..]);
        assert_ne!(after.data.as_ptr(), old, "read from the copy");
        let shared = after.shared.clone().expect("a view shares its bytes");
        drop(after);
        assert!(!file.copy_into_huge_pages(crate::weights::huge_page_copy).unwrap(), "not while a tensor shares the bytes");
        assert_eq!(&shared[..], &before[..]);
        let mut in_memory = GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap();
        assert!(!in_memory.copy_into_huge_pages(crate::weights::huge_page_copy).unwrap(), "an owned buffer stays");
    }

    #[test]
    fn big_endian_is_named() {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_be_bytes());
        b.extend_from_slice(&[0u8; 16]);
        match GgufFile::from_bytes(b) {
            Err(EngineError::InvalidGguf(m)) => assert!(m.contains("big-endian"), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
