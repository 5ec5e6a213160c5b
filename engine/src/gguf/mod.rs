//! GGUF files: header, metadata, tensor infos, tensor data.
//!
//! [`GgufFile`] parses GGUF v2/v3 over an mmap with every read bounds-checked;
//! [`writer::GgufWriter`] builds small v3 files in memory for tests and tools.

mod cursor;
pub mod reader;
pub mod types;
mod value;
pub mod writer;

pub use reader::{GgufFile, MetadataValue, TensorInfo};
pub use writer::GgufWriter;
