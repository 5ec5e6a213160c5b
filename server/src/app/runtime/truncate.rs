//! `truncation: auto`: which of the oldest history items to drop so that the
//! prompt fits, found with few renders.
//!
//! Fit is monotone in how many items are dropped. Each history item comes
//! with a lower bound on the tokens it adds to the prompt (its verbatim text,
//! tokenized once). From the too-long prompt's length, the first probe drops
//! items until their bounds cover the excess, so it fits. From a prompt that
//! fits, items are put back while their estimated cost (the bound plus the
//! mean overhead per item measured between the two nearest renders) fits
//! the room left; when not even the newest dropped item's bound fits, the
//! search ends without rendering. A probe that does not halve the interval
//! is followed by a bisecting one, so the estimates make it two or three
//! renders in the usual case and never more than about 2·log2(n).

use crate::protocol::error::ApiError;

/// What rendering the prompt without the first `k` history items gave: the
/// ids when they fit, else the prompt's length.
pub type Rendered = Result<Vec<u32>, usize>;

/// How many of the oldest items to drop, fewest first, for the prompt to fit
/// under `limit` tokens, and that prompt. `full_len` is the length of the whole prompt (known not
/// to fit); `lower_bounds[i]` bounds from below what item `i` adds;
/// `render(k)` renders without the first `k` items. A 400
/// `context_length_exceeded` when even dropping every item is not enough.
pub fn drop_oldest_until_fits(
    lower_bounds: &[usize],
    full_len: usize,
    limit: usize,
    mut render: impl FnMut(usize) -> Result<Rendered, ApiError>,
) -> Result<(usize, Vec<u32>), ApiError> {
    let n = lower_bounds.len();
    let room_for = |len: usize| limit.saturating_sub(1).saturating_sub(len);
    // The most items known too few to drop, and that prompt's length.
    let (mut too_few, mut too_few_len) = (0, full_len);
    // The fewest items known to be enough, and that prompt.
    let mut enough: Option<(usize, Vec<u32>)> = None;
    // After a probe that did not halve the interval, the next one bisects.
    let mut bisect = false;
    loop {
        let probe = match &enough {
            Some((e, prompt)) => {
                let room = room_for(prompt.len());
                // Done when no item lies between, or not even the newest
                // dropped item can come back.
                if *e == too_few + 1 || lower_bounds[*e - 1] > room {
                    None
                } else if bisect {
                    Some(too_few + (e - too_few) / 2)
                } else {
                    let measured = Measured { shed: too_few_len.saturating_sub(prompt.len()), items: e - too_few };
                    Some(put_back_estimate(lower_bounds, too_few, *e, room, measured))
                }
            }
            None if too_few == n => return Err(ApiError::context_length_exceeded(too_few_len, limit)),
            None if bisect => Some(too_few + (n - too_few).div_ceil(2)),
            None => Some(drop_estimate(lower_bounds, too_few, too_few_len.saturating_sub(limit.saturating_sub(1)))),
        };
        let Some(probe) = probe else { break };
        let before = enough.as_ref().map_or(n + 1, |(e, _)| *e) - too_few;
        match render(probe)? {
            Ok(prompt) => enough = Some((probe, prompt)),
            Err(len) => (too_few, too_few_len) = (probe, len),
        }
        let after = enough.as_ref().map_or(n + 1, |(e, _)| *e) - too_few;
        bisect = !bisect && after * 2 > before;
    }
    // The loop ends only with a fitting prompt in hand.
    enough.ok_or_else(|| ApiError::internal("truncation ended without a prompt that fits"))
}

/// Drops items from `from` on until their bounds cover `excess` tokens (at
/// least one item): the count dropped in all.
fn drop_estimate(lower_bounds: &[usize], from: usize, excess: usize) -> usize {
    let (mut k, mut shed) = (from, 0);
    while k < lower_bounds.len() && (shed < excess || k == from) {
        shed += lower_bounds[k];
        k += 1;
    }
    k
}

/// Tokens shed by dropping `items` more items, as two renders measured.
#[derive(Clone, Copy)]
struct Measured {
    shed: usize,
    items: usize,
}

/// Puts back items before `enough` (but never `too_few` or fewer dropped)
/// while their estimated costs (bound plus the measured mean overhead) fit
/// `room`, at least one: the count still dropped.
fn put_back_estimate(lower_bounds: &[usize], too_few: usize, enough: usize, room: usize, measured: Measured) -> usize {
    let bounded: usize = lower_bounds[too_few..enough].iter().sum();
    let overhead = measured.shed.saturating_sub(bounded) / measured.items.max(1);
    let (mut k, mut added) = (enough - 1, lower_bounds[enough - 1] + overhead);
    while k > too_few + 1 && added + lower_bounds[k - 1] + overhead <= room {
        added += lower_bounds[k - 1] + overhead;
        k -= 1;
    }
    k
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, lo: usize, hi: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            lo + (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as usize % (hi - lo)
        }
    }

    /// A prompt of `base` tokens plus each kept item's cost; counts renders.
    struct Fake {
        costs: Vec<usize>,
        base: usize,
        limit: usize,
        renders: usize,
    }

    impl Fake {
        fn len_without(&self, k: usize) -> usize {
            self.base + self.costs[k..].iter().sum::<usize>()
        }
        fn render(&mut self, k: usize) -> Result<Rendered, ApiError> {
            self.renders += 1;
            let len = self.len_without(k);
            Ok(if len < self.limit { Ok(vec![7; len]) } else { Err(len) })
        }
        fn fewest_to_drop(&self) -> Option<usize> {
            (0..=self.costs.len()).find(|&k| self.len_without(k) < self.limit)
        }
        fn run(&mut self, bounds: &[usize]) -> Result<Vec<u32>, ApiError> {
            let full = self.len_without(0);
            let limit = self.limit;
            let (dropped, prompt) = drop_oldest_until_fits(bounds, full, limit, |k| self.render(k))?;
            assert_eq!(prompt.len(), self.len_without(dropped), "the prompt is the one without {dropped} items");
            Ok(prompt)
        }
    }

    #[test]
    fn close_bounds_need_about_three_renders_and_keep_the_longest_suffix() {
        let mut rng = Rng(7);
        let mut renders = Vec::new();
        for _ in 0..500 {
            let n = rng.below(1, 2000);
            let costs: Vec<usize> = (0..n).map(|_| rng.below(4, 400)).collect();
            let total: usize = costs.iter().sum();
            let mut fake = Fake { base: 50, limit: rng.below(60, total + 60), costs, renders: 0 };
            // Each item's text, tokenized alone, undercounts its template
            // overhead (4 tokens) and up to 2 tokens at its edges.
            let bounds: Vec<usize> = fake.costs.iter().map(|c| c.saturating_sub(4 + rng.below(0, 2 + 1))).collect();
            let want = fake.fewest_to_drop().expect("dropping everything fits");
            let prompt = fake.run(&bounds).expect("fits");
            assert_eq!(prompt.len(), fake.len_without(want), "dropped exactly the fewest items ({want})");
            renders.push(fake.renders);
        }
        let mean = renders.iter().sum::<usize>() as f64 / renders.len() as f64;
        let most = renders.iter().max().copied().unwrap_or(0);
        eprintln!("renders: mean {mean:.2}, most {most}");
        assert!(mean <= 3.0 && most <= 8, "renders: mean {mean:.2}, most {most}");
    }

    #[test]
    fn useless_bounds_still_find_the_fewest_in_logarithmic_renders() {
        let mut rng = Rng(11);
        for _ in 0..500 {
            let n = rng.below(1, 3000);
            let costs: Vec<usize> = (0..n).map(|_| rng.below(1, 300)).collect();
            let total: usize = costs.iter().sum();
            let mut fake = Fake { base: 20, limit: rng.below(30, total + 30), costs, renders: 0 };
            let bounds = vec![0; n];
            let want = fake.fewest_to_drop().expect("dropping everything fits");
            let prompt = fake.run(&bounds).expect("fits");
            assert_eq!(prompt.len(), fake.len_without(want));
            let log2 = (usize::BITS - n.leading_zeros()) as usize;
            assert!(fake.renders <= 2 * log2 + 2, "{} renders for {n} items", fake.renders);
        }
    }

    #[test]
    fn when_nothing_fits_the_error_names_the_shortest_length() {
        let mut fake = Fake { costs: vec![10, 10, 10], base: 100, limit: 50, renders: 0 };
        let e = fake.run(&[10, 10, 10]).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
        assert!(e.message.contains("100"), "{}", e.message);
    }
}
