//! A uniform view of named tensors, whatever file format they come from.

use crate::error::{EngineError, Result};
use crate::gguf::types::GgmlType;
use std::sync::Arc;

/// Borrowed raw bytes of one tensor plus how to read them.
///
/// `shape` is row-major, outermost dimension first (the HF / PyTorch order;
/// GGUF stores dims innermost first, so its reader reverses them). For a
/// linear weight that is `[out_features, in_features]`.
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    /// Tensor name as stored in the file.
    pub name: String,
    /// Element type / quantization.
    pub dtype: GgmlType,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The raw bytes (exactly `dtype.bytes_for(numel)` long).
    pub data: &'a [u8],
    /// The same bytes as a handle that outlives the source (a range of its
    /// memory map), where the source can share them; `None` where they
    /// must be copied to be kept.
    pub shared: Option<WeightBytes>,
}

impl TensorView<'_> {
    /// The bytes, kept: shared with the source where it allows (no copy,
    /// nothing allocated), copied otherwise.
    pub fn keep_bytes(&self) -> WeightBytes {
        self.shared.clone().unwrap_or_else(|| WeightBytes::owned(self.data.to_vec()))
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Error unless the shape equals `expected`.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(EngineError::ShapeMismatch {
                name: self.name.clone(),
                expected: expected.to_vec(),
                actual: self.shape.clone(),
            });
        }
        Ok(())
    }
}

/// Anything that hands out tensors by name (a GGUF file, a safetensors directory).
pub trait TensorSource {
    /// The tensor called `name`, or `EngineError::MissingTensor`.
    fn tensor(&self, name: &str) -> Result<TensorView<'_>>;
    /// Whether a tensor called `name` exists.
    fn contains(&self, name: &str) -> bool;
    /// Moves the tensor bytes into anonymous memory the OS may back with
    /// transparent huge pages, before any tensor is taken, where asked
    /// ([`huge_pages_offered`]): the CPU kernels stream every weight each
    /// step, and with 4 KiB pages a TLB miss every 4 KiB cost batched
    /// decode 12-15% on a Xeon VM (the `kquant_decode_16tok` kernel bench
    /// with its weights advised for huge pages, README 2026-12-05). True if
    /// it moved them; by default nothing moves.
    fn move_to_huge_pages(&mut self) -> Result<bool> {
        Ok(false)
    }
}

/// Whether weights should move to huge pages: `SPINDLE_HUGE_PAGES=1`, on
/// Linux with transparent huge pages not set to `never`. Off by default:
/// the copy leaves the file's shared map (one copy of the pages for every
/// process serving the file), and where memory is fragmented the kernel
/// may compact it at the first touch (10-15 s for 1 GB on a VM, once).
pub fn huge_pages_offered() -> bool {
    let asked = std::env::var("SPINDLE_HUGE_PAGES").ok();
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok();
    huge_pages_wanted(asked.as_deref(), mode.as_deref(), cfg!(target_os = "linux"))
}

/// [`huge_pages_offered`] from the variable's value, the kernel's
/// transparent-huge-page mode (`always [madvise] never`) and the OS.
fn huge_pages_wanted(asked: Option<&str>, thp_mode: Option<&str>, linux: bool) -> bool {
    asked == Some("1") && linux && thp_mode.is_some_and(|mode| !mode.contains("[never]"))
}

/// Bytes copied between releases of the source's pages.
const COPY_CHUNK: usize = 64 << 20;

/// A read-only anonymous copy of the file map `map`, advised for huge
/// pages. The map's pages are released as they are copied (they stay in
/// the page cache), so the process holds at most one chunk twice.
pub(crate) fn huge_page_copy(map: &memmap2::Mmap) -> std::io::Result<memmap2::Mmap> {
    huge_page_copy_in_chunks(map, COPY_CHUNK)
}

/// [`huge_page_copy`], releasing the map's pages every `chunk` bytes (a
/// multiple of the page size).
pub(crate) fn huge_page_copy_in_chunks(map: &memmap2::Mmap, chunk: usize) -> std::io::Result<memmap2::Mmap> {
    let mut copy = memmap2::MmapOptions::new().len(map.len()).map_anon()?;
    #[cfg(target_os = "linux")]
    // Advice only: where refused, the copy keeps small pages.
    let _ = copy.advise(memmap2::Advice::HugePage);
    for start in (0..map.len()).step_by(chunk.max(1)) {
        let end = (start + chunk).min(map.len());
        copy[start..end].copy_from_slice(&map[start..end]);
        #[cfg(unix)]
        // SAFETY: a read-only shared map of a file: dropping its pages only
        // unmaps them from this process (a later read faults them in again
        // from the file with the same contents); `start` is a multiple of
        // the chunk, so page-aligned (the map starts at the file's start).
        let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
    }
    copy.make_read_only()
}

/// Memory whose bytes never move or change while it is alive: a memory map
/// of a file treated as immutable, or a buffer nobody writes.
///
/// # Safety
/// `bytes` must return the same slice on every call, and its contents must
/// not change, for as long as only shared access to the value exists (here:
/// while it sits behind the `Arc` of a [`WeightBytes`]).
pub(crate) unsafe trait StableBytes: Send + Sync {
    /// The bytes.
    fn bytes(&self) -> &[u8];
}

// SAFETY: a read-only map stays at its address until dropped; model files
// are treated as immutable while mapped (see `GgufFile::open`).
unsafe impl StableBytes for memmap2::Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: the buffer is only reachable through the `Arc` that owns it, and
// nothing takes `&mut` to it, so its heap allocation neither moves nor changes.
unsafe impl StableBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A weight's bytes, kept for as long as the model: a range of a shared
/// memory map (the file's pages, never copied: a model costs its file's size
/// once, in the page cache) or an owned buffer. Cloning shares.
#[derive(Clone)]
pub struct WeightBytes {
    ptr: *const u8,
    len: usize,
    /// Keeps `ptr..ptr + len` alive and unchanged.
    owner: Arc<dyn StableBytes>,
}

// SAFETY: the bytes are immutable and owned by `owner`, which is Send + Sync.
unsafe impl Send for WeightBytes {}
// SAFETY: as above: shared references to immutable bytes.
unsafe impl Sync for WeightBytes {}

impl WeightBytes {
    /// Bytes held in a buffer of their own.
    pub fn owned(bytes: Vec<u8>) -> Self {
        let owner: Arc<dyn StableBytes> = Arc::new(bytes);
        let (ptr, len) = (owner.bytes().as_ptr(), owner.bytes().len());
        Self { ptr, len, owner }
    }

    /// `range` of `owner`'s bytes, sharing them; `None` if out of range.
    pub(crate) fn shared(owner: Arc<dyn StableBytes>, range: std::ops::Range<usize>) -> Option<Self> {
        let slice = owner.bytes().get(range)?;
        let (ptr, len) = (slice.as_ptr(), slice.len());
        Some(Self { ptr, len, owner })
    }

    /// Whether both handles keep the same owner alive (the same file map or
    /// buffer).
    pub fn is_shared_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.owner, &other.owner)
    }

    /// Reads one byte of every 4 KiB page, so a mapped range's pages are
    /// present before the first forward pass needs them (a minor fault per
    /// page now, none in a request later). Returns a value derived from the
    /// bytes so the reads are not optimised away.
    pub fn touch_pages(&self) -> u8 {
        const PAGE: usize = 4096;
        let (Some(&first), Some(&last)) = (self.first(), self.last()) else { return 0 };
        let ends = if self.len() == 1 { first } else { first ^ last };
        // Each byte read once: the first, the page starts strictly between, the last.
        let inner_start = match (PAGE - self.ptr as usize % PAGE) % PAGE {
            0 => PAGE,
            b => b,
        };
        let inner = self.get(inner_start..self.len() - 1).unwrap_or(&[]).iter().step_by(PAGE);
        inner.fold(ends, |acc, &b| acc ^ b)
    }
}

impl std::ops::Deref for WeightBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr + len lies in `owner`'s bytes, which neither move
        // nor change while `owner` (held by self) is alive.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightBytes").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn huge_pages_only_when_asked_on_linux_with_transparent_huge_pages() {
        let madvise = Some("always [madvise] never\n");
        assert!(huge_pages_wanted(Some("1"), madvise, true));
        assert!(huge_pages_wanted(Some("1"), Some("[always] madvise never"), true));
        assert!(!huge_pages_wanted(None, madvise, true), "off by default");
        assert!(!huge_pages_wanted(Some("0"), madvise, true));
        assert!(!huge_pages_wanted(Some("1"), Some("always madvise [never]"), true), "the kernel says never");
        assert!(!huge_pages_wanted(Some("1"), None, true), "no transparent huge pages at all");
        assert!(!huge_pages_wanted(Some("1"), madvise, false), "not Linux");
    }

    use super::*;

    #[test]
    fn shared_bytes_are_the_range_and_outlive_every_other_handle() {
        let owner: Arc<dyn StableBytes> = Arc::new((0u8..=255).collect::<Vec<u8>>());
        let a = WeightBytes::shared(owner.clone(), 10..20).expect("in range");
        let b = WeightBytes::shared(owner.clone(), 200..256).expect("in range");
        drop(owner);
        assert_eq!(&a[..], &(10u8..20).collect::<Vec<_>>()[..]);
        assert_eq!(b.len(), 56);
        assert!(a.is_shared_with(&b));
        assert!(!a.is_shared_with(&WeightBytes::owned(vec![1, 2])));
        let none = WeightBytes::shared(Arc::new(vec![0u8; 4]), 2..9);
        assert!(none.is_none(), "a range past the end is refused");
        assert_eq!(WeightBytes::owned(Vec::new()).touch_pages(), 0, "nothing to touch");
        assert_eq!(WeightBytes::owned(vec![7]).touch_pages(), 7, "one byte, read once");
    }

    /// Every page of an unaligned range is read: its first byte, each page
    /// boundary inside it, and its last byte.
    #[test]
    fn touching_reads_the_first_byte_every_page_start_and_the_last() {
        let mut buf = vec![0u8; 3 * 4096 + 700];
        let base = buf.as_ptr() as usize;
        let mut want = 0u8;
        let boundaries: Vec<usize> = (1..buf.len() - 1).filter(|i| (base + i).is_multiple_of(4096)).collect();
        assert!(boundaries.len() >= 3);
        for (j, &i) in boundaries.iter().enumerate() {
            buf[i] = 1 << j;
            want |= 1 << j;
        }
        buf[0] |= 0x40;
        let last = buf.len() - 1;
        buf[last] |= 0x80;
        want |= 0x40 | 0x80;
        let bytes = WeightBytes::owned(buf);
        assert_eq!(bytes.touch_pages(), want);
    }
}
