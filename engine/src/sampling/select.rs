//! Partial selection: top-k without sorting, and the top-p cut.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// Largest top-k handled with a heap; above it, `select_nth_unstable`.
pub(super) const HEAP_TOP_K: usize = 256;

/// Candidates top-p examines first, and the most it ever sorts at once.
pub(super) const TOP_P_HEAD: usize = 128;

/// Min-heap (through `Reverse`) of `(ordered value key, Reverse(token))`.
pub(super) type TopKHeap = BinaryHeap<Reverse<(u32, Reverse<u32>)>>;

/// Descending by value, then ascending by token id: a total order.
pub(super) fn desc(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// Total weight of some candidates, in f64.
pub(super) fn mass(cand: &[(f32, u32)]) -> f64 {
    cand.iter().map(|c| f64::from(c.0)).sum()
}

/// A `u32` ordered as the (non-NaN) `f32` it comes from.
fn key(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The `k` largest `(values[i], i)` with `values[i] >= floor` (ties: lower `i`
/// first), in no particular order, into `out`. One pass with a `k`-sized heap.
pub(super) fn top_k_into(
    values: &[f32],
    k: usize,
    floor: f32,
    heap: &mut TopKHeap,
    out: &mut Vec<(f32, u32)>,
) {
    heap.clear();
    out.clear();
    if k == 0 {
        return;
    }
    for (i, &v) in values.iter().enumerate() {
        if v >= floor {
            let item = Reverse((key(v), Reverse(i as u32)));
            if heap.len() < k {
                heap.push(item);
            } else if let Some(mut worst) = heap.peek_mut() {
                if item < *worst {
                    *worst = item;
                }
            }
        }
    }
    out.extend(
        heap.drain()
            .map(|Reverse((_, Reverse(i)))| (values[i as usize], i)),
    );
}

/// Keep the shortest descending prefix of `cand` whose mass reaches `target`
/// (at least one token), without sorting it all: a weighted quickselect that
/// first tries a head of [`TOP_P_HEAD`] candidates, then halves the undecided
/// range, and finally sorts a range of at most [`TOP_P_HEAD`] candidates.
/// Expected O(n). The kept candidates end up at the front, not fully sorted.
pub(super) fn truncate_top_p(cand: &mut Vec<(f32, u32)>, target: f64) {
    // cand[..lo] is kept; the cut lies in cand[lo..hi]; cand[hi..] is dropped.
    let (mut lo, mut hi) = (0, cand.len());
    let mut mass_before = 0.0;
    let mut split = TOP_P_HEAD;
    while hi - lo > TOP_P_HEAD {
        let mid = lo + split.min(hi - lo - 1);
        cand[lo..hi].select_nth_unstable_by(mid - lo, desc);
        let head = mass(&cand[lo..mid]);
        if mass_before + head >= target {
            hi = mid;
        } else {
            mass_before += head;
            lo = mid;
        }
        split = (hi - lo) / 2;
    }
    cand[lo..hi].sort_unstable_by(desc);
    let mut acc = mass_before;
    for i in lo..hi {
        acc += f64::from(cand[i].0);
        if acc >= target {
            cand.truncate(i + 1);
            return;
        }
    }
    cand.truncate(hi.max(1)); // rounding: the whole undecided range is in
}
