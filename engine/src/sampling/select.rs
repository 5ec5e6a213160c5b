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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Rng;

    fn random_values(n: usize, seed: u64, distinct: u64) -> Vec<f32> {
        let mut r = Rng::new(seed);
        (0..n)
            .map(|_| (r.next_u64() % distinct) as f32 - distinct as f32 / 2.0)
            .collect()
    }

    fn sorted_pairs(values: &[f32]) -> Vec<(f32, u32)> {
        let mut all: Vec<(f32, u32)> = values.iter().copied().zip(0..).collect();
        all.sort_by(desc);
        all
    }

    #[test]
    fn key_preserves_order() {
        let xs = [f32::NEG_INFINITY, -3.5, -0.0, 0.0, 1e-30, 2.0, f32::MAX];
        for w in xs.windows(2) {
            assert!(key(w[0]) <= key(w[1]), "{w:?}");
        }
        assert!(key(-1.0) < key(1.0));
    }

    #[test]
    fn heap_top_k_matches_sorting() {
        for (seed, k) in [(1, 1), (2, 5), (3, 40), (4, 300), (5, 1000)] {
            // Few distinct values: plenty of ties, which must go to the lower id.
            let values = random_values(1000, seed, 50);
            let mut heap = TopKHeap::new();
            let mut out = Vec::new();
            top_k_into(&values, k, f32::NEG_INFINITY, &mut heap, &mut out);
            out.sort_by(desc);
            assert_eq!(
                out,
                sorted_pairs(&values)[..k.min(1000)].to_vec(),
                "k = {k}"
            );
        }
        let mut heap = TopKHeap::new();
        let mut out = Vec::new();
        top_k_into(&[1.0, 5.0, 3.0], 3, 2.0, &mut heap, &mut out);
        out.sort_by(desc);
        assert_eq!(out, vec![(5.0, 1), (3.0, 2)]);
    }

    #[test]
    fn top_p_cut_matches_a_full_sort() {
        for (seed, n, p) in [
            (1, 50, 0.5),
            (2, 1000, 0.9),
            (3, 5000, 0.3),
            (4, 5000, 0.999),
        ] {
            let values: Vec<f32> = random_values(n, seed, 1000)
                .iter()
                .map(|v| (v / 100.0).exp())
                .collect();
            let sorted = sorted_pairs(&values);
            let target = p * mass(&sorted);
            let mut acc = 0.0;
            let expect = sorted
                .iter()
                .position(|c| {
                    acc += f64::from(c.0);
                    acc >= target
                })
                .map_or(n, |i| i + 1);
            let mut cand: Vec<(f32, u32)> = values.iter().copied().zip(0..).collect();
            truncate_top_p(&mut cand, target);
            cand.sort_by(desc);
            assert_eq!(cand.len(), expect, "seed {seed}");
            assert_eq!(cand, sorted[..expect].to_vec());
        }
    }
}
