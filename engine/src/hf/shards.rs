//! Memory-mapped safetensors files (one, or a sharded set with an index).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{EngineError, Result};
use crate::gguf::types::GgmlType;
use crate::weights::TensorView;

/// Single-file weights.
const SINGLE: &str = "model.safetensors";
/// Index of sharded weights.
const INDEX: &str = "model.safetensors.index.json";

/// Where one tensor lives.
#[derive(Debug)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the shard's mapping.
    start: usize,
    end: usize,
}

/// One mapped file.
#[derive(Debug)]
struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// All the safetensors files of a model directory, mapped, with a tensor index.
#[derive(Debug)]
pub(super) struct ShardSet {
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
    names: Vec<String>,
}

fn invalid(msg: String) -> EngineError {
    EngineError::InvalidModelDir(msg)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> EngineError + '_ {
    move |source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl ShardSet {
    /// Find and map the weights of `dir`: `model.safetensors.index.json` and
    /// its shards, else `model.safetensors`, else every `*.safetensors`.
    pub(super) fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX);
        let single = dir.join(SINGLE);
        let mut set = Self {
            shards: Vec::new(),
            entries: HashMap::new(),
            names: Vec::new(),
        };
        if index_path.is_file() {
            set.open_indexed(dir, &index_path)?;
        } else if single.is_file() {
            set.add_shard(single)?;
        } else {
            let files = glob_safetensors(dir)?;
            if files.is_empty() {
                return Err(invalid(format!(
                    "{}: no {SINGLE}, {INDEX} or other *.safetensors file",
                    dir.display()
                )));
            }
            for file in files {
                set.add_shard(file)?;
            }
        }
        set.names = set.entries.keys().cloned().collect();
        set.names.sort();
        Ok(set)
    }

    /// Map every shard the index names and check each indexed tensor is there.
    fn open_indexed(&mut self, dir: &Path, index_path: &Path) -> Result<()> {
        let index = super::read_json(index_path)?;
        let map = index
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| invalid(format!("{}: no `weight_map` object", index_path.display())))?;
        let mut files = BTreeSet::new();
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| {
                invalid(format!(
                    "{}: shard of `{tensor}` is not a string",
                    index_path.display()
                ))
            })?;
            files.insert(file);
        }
        let mut shard_of = HashMap::new();
        for file in files {
            let plain = Path::new(file)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
            if !plain {
                return Err(invalid(format!(
                    "{} names shard {file}, which is not a plain relative path",
                    index_path.display()
                )));
            }
            let path = dir.join(file);
            if !path.is_file() {
                return Err(invalid(format!(
                    "{} names shard {file}, which is missing from {}",
                    index_path.display(),
                    dir.display()
                )));
            }
            shard_of.insert(file, self.shards.len());
            self.add_shard(path)?;
        }
        for (tensor, file) in map {
            let found = self.entries.get(tensor).map(|e| e.shard);
            let wanted = file.as_str().and_then(|f| shard_of.get(f)).copied();
            if found.is_none() || found != wanted {
                return Err(invalid(format!(
                    "{} puts tensor `{tensor}` in {file}, but that shard does not hold it",
                    index_path.display()
                )));
            }
        }
        Ok(())
    }

    /// Map `path`, parse its header and record its tensors.
    fn add_shard(&mut self, path: PathBuf) -> Result<()> {
        let file = File::open(&path).map_err(io_err(&path))?;
        // SAFETY: the mapping is read-only and lives as long as `self`. As with
        // every mmap-based loader, the file must not be truncated or rewritten
        // while the model is loaded.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err(&path))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            invalid(format!(
                "{}: corrupt safetensors header: {e}",
                path.display()
            ))
        })?;
        let data_start = header_len
            .checked_add(8)
            .ok_or_else(|| invalid(format!("{}: header length overflows", path.display())))?;
        let shard = self.shards.len();
        for (name, info) in metadata.tensors() {
            let (lo, hi) = info.data_offsets;
            let start = data_start.checked_add(lo);
            let end = data_start.checked_add(hi);
            let (Some(start), Some(end)) = (start, end) else {
                return Err(invalid(format!(
                    "{}: `{name}` offsets overflow",
                    path.display()
                )));
            };
            if start > end || end > mmap.len() {
                return Err(invalid(format!(
                    "{}: tensor `{name}` bytes {start}..{end} lie outside the {}-byte file",
                    path.display(),
                    mmap.len()
                )));
            }
            if self.entries.contains_key(&name) {
                return Err(invalid(format!(
                    "{}: tensor `{name}` also appears in another shard",
                    path.display()
                )));
            }
            let entry = Entry {
                shard,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start,
                end,
            };
            self.entries.insert(name, entry);
        }
        self.shards.push(Shard { path, mmap });
        Ok(())
    }

    /// All tensor names, sorted.
    pub(super) fn names(&self) -> &[String] {
        &self.names
    }

    /// The mapped files, in load order.
    pub(super) fn paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// Whether a tensor called `name` exists.
    pub(super) fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// A bounds-checked view of tensor `name`.
    pub(super) fn view(&self, name: &str) -> Result<TensorView<'_>> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| EngineError::MissingTensor(name.to_string()))?;
        let dtype = match entry.dtype {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            other => {
                return Err(EngineError::UnsupportedDtype(format!(
                    "safetensors dtype {other:?} of tensor `{name}` (only F32, F16 and BF16 are supported)"
                )))
            }
        };
        let shard = self
            .shards
            .get(entry.shard)
            .ok_or_else(|| invalid(format!("tensor `{name}`: bad shard index")))?;
        let data = shard.mmap.get(entry.start..entry.end).ok_or_else(|| {
            invalid(format!(
                "{}: tensor `{name}` is out of bounds",
                shard.path.display()
            ))
        })?;
        let numel = entry
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| invalid(format!("tensor `{name}`: shape overflows")))?;
        let expected = dtype.bytes_for(numel)?;
        if expected != data.len() {
            return Err(invalid(format!(
                "{}: tensor `{name}` of shape {:?} needs {expected} bytes, has {}",
                shard.path.display(),
                entry.shape,
                data.len()
            )));
        }
        Ok(TensorView {
            name: name.to_string(),
            dtype,
            shape: entry.shape.clone(),
            data,
            // HF weights are float types, converted to f32 when kept.
            shared: None,
        })
    }
}

/// Every `*.safetensors` file directly in `dir`, sorted.
fn glob_safetensors(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "safetensors") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}
