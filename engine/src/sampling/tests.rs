//! Unit tests for the sampler.

use super::select::{desc, TOP_P_HEAD};
use super::*;

fn params() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(1234),
        ..SamplingParams::default()
    }
}

fn sampler(p: SamplingParams) -> Sampler {
    match Sampler::new(p) {
        Ok(s) => s,
        Err(e) => panic!("sampler rejected valid params: {e}"),
    }
}

/// Logits whose softmax is exactly `probs`.
fn logits_of(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

/// Deterministic pseudo-random logits in [-5, 5).
fn random_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| (r.next_f64() * 10.0 - 5.0) as f32).collect()
}

/// Index of the largest value (lowest on ties), by a plain scan.
fn argmax(l: &[f32]) -> (u32, f32) {
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, &x) in l.iter().enumerate() {
        if x > best.1 {
            best = (i as u32, x);
        }
    }
    best
}

/// Draw `n` tokens from fixed logits and count them per token.
fn histogram(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        let mut l = logits.to_vec();
        counts[s.sample(&mut l, &[], &[]).token as usize] += 1;
    }
    counts
}

fn chi_square(counts: &[usize], probs: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

#[test]
fn default_is_greedy_and_valid() {
    let p = SamplingParams::default();
    assert!(p.is_greedy());
    assert!(p.validate().is_ok());
    assert!(SamplingParams {
        temperature: 1e-6,
        ..params()
    }
    .is_greedy());
    assert!(!SamplingParams {
        temperature: 1e-3,
        ..params()
    }
    .is_greedy());
}

#[test]
fn validate_names_the_bad_field() {
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                temperature: -0.1,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: 1.5,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: -0.1,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingParams {
                min_p: f32::NAN,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: 2.5,
                ..Default::default()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: -3.0,
                ..Default::default()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                top_logprobs: 21,
                ..Default::default()
            },
            "top_logprobs",
        ),
    ];
    for (p, field) in cases {
        match Sampler::new(p) {
            Err(EngineError::InvalidSampling(msg)) => assert!(msg.contains(field), "{msg}"),
            other => panic!("expected InvalidSampling for {field}, got {other:?}"),
        }
    }
}

#[test]
fn greedy_is_argmax() {
    let mut s = sampler(SamplingParams::default());
    for seed in 0..20 {
        let mut l = random_logits(1000, seed);
        let expect = argmax(&l).0;
        assert_eq!(s.sample(&mut l, &[], &[]).token, expect);
    }
    // Ties go to the lowest id.
    assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, 2.0], &[], &[]).token, 1);
}

#[test]
fn top_k_one_is_greedy() {
    let mut s = sampler(SamplingParams {
        top_k: 1,
        temperature: 1.5,
        ..params()
    });
    for seed in 0..20 {
        let mut l = random_logits(500, seed);
        let expect = argmax(&l).0;
        assert_eq!(s.sample(&mut l, &[], &[]).token, expect);
    }
}

#[test]
fn same_seed_same_sequence_regardless_of_neighbours() {
    let mut a = sampler(params());
    let mut b = sampler(params());
    let mut other = sampler(SamplingParams {
        seed: Some(99),
        ..params()
    });
    for step in 0..200 {
        let logits = random_logits(64, step);
        let ta = a.sample(&mut logits.clone(), &[], &[]).token;
        // `other` shares the "batch" with b but must not disturb it.
        other.sample(&mut logits.clone(), &[], &[]);
        let tb = b.sample(&mut logits.clone(), &[], &[]).token;
        assert_eq!(ta, tb, "step {step}");
    }
}

#[test]
fn different_seeds_differ() {
    let logits = vec![0.0f32; 64];
    let run = |seed| {
        let mut s = sampler(SamplingParams {
            seed: Some(seed),
            ..params()
        });
        (0..50)
            .map(|_| s.sample(&mut logits.clone(), &[], &[]).token)
            .collect::<Vec<_>>()
    };
    assert_ne!(run(1), run(2));
    assert_eq!(run(3), run(3));
}

#[test]
fn unseeded_samplers_get_distinct_seeds() {
    let a = sampler(SamplingParams {
        seed: None,
        ..params()
    });
    let b = sampler(SamplingParams {
        seed: None,
        ..params()
    });
    assert_ne!(a.seed(), b.seed());
}

#[test]
fn temperature_one_matches_distribution() {
    let probs = [0.1f32, 0.2, 0.3, 0.4];
    let mut s = sampler(params());
    let counts = histogram(&mut s, &logits_of(&probs), 20_000);
    let chi2 = chi_square(&counts, &[0.1, 0.2, 0.3, 0.4]);
    // 3 degrees of freedom: p = 0.001 at 16.27.
    assert!(chi2 < 16.27, "chi2 = {chi2}, counts = {counts:?}");
}

#[test]
fn temperature_sharpens_and_flattens() {
    let probs = [0.1f32, 0.2, 0.3, 0.4];
    // T = 0.5 squares the probabilities: 1, 4, 9, 16 over 30.
    let mut s = sampler(SamplingParams {
        temperature: 0.5,
        ..params()
    });
    let counts = histogram(&mut s, &logits_of(&probs), 20_000);
    let sharp = [1.0 / 30.0, 4.0 / 30.0, 9.0 / 30.0, 16.0 / 30.0];
    let chi2 = chi_square(&counts, &sharp);
    assert!(chi2 < 16.27, "chi2 = {chi2}, counts = {counts:?}");
}

#[test]
fn top_k_keeps_only_the_k_best() {
    let probs = [0.1f32, 0.2, 0.3, 0.4];
    let mut s = sampler(SamplingParams {
        top_k: 2,
        ..params()
    });
    let counts = histogram(&mut s, &logits_of(&probs), 5_000);
    assert_eq!(counts[0] + counts[1], 0, "{counts:?}");
    let chi2 = chi_square(&counts[2..], &[3.0 / 7.0, 4.0 / 7.0]);
    assert!(chi2 < 10.83, "chi2 = {chi2}, counts = {counts:?}");
}

#[test]
fn top_p_excludes_the_tail() {
    let probs = [0.05f32, 0.5, 0.15, 0.3];
    let mut s = sampler(SamplingParams {
        top_p: 0.75,
        ..params()
    });
    let counts = histogram(&mut s, &logits_of(&probs), 5_000);
    assert_eq!(counts[0] + counts[2], 0, "{counts:?}");
    let chi2 = chi_square(&[counts[1], counts[3]], &[0.625, 0.375]);
    assert!(chi2 < 10.83, "chi2 = {chi2}, counts = {counts:?}");
}

#[test]
fn top_p_is_measured_on_the_top_k_set() {
    // Top-3 mass is 0.95; 0.8 of that (0.76) is reached by tokens 3 and 1.
    let probs = [0.05f32, 0.3, 0.15, 0.5];
    let mut s = sampler(SamplingParams {
        top_k: 3,
        top_p: 0.8,
        ..params()
    });
    let counts = histogram(&mut s, &logits_of(&probs), 3_000);
    assert_eq!(counts[0] + counts[2], 0, "{counts:?}");
    assert!(counts[1] > 0 && counts[3] > 0);
}

#[test]
fn top_p_with_a_large_nucleus() {
    // Uniform over 1000: the nucleus is ids 0..500 (ties broken by id), larger
    // than the head top-p examines first.
    let logits = vec![0.0f32; 1000];
    let mut s = sampler(SamplingParams {
        top_p: 0.5,
        ..params()
    });
    let counts = histogram(&mut s, &logits, 5_000);
    assert!(counts[500..].iter().all(|&c| c == 0));
    assert!(counts[TOP_P_HEAD..500].iter().any(|&c| c > 0));
}

#[test]
fn min_p_excludes_unlikely_tokens() {
    // Threshold 0.2 * 0.5 = 0.1: drops only the 0.05 token.
    let probs = [0.5f32, 0.3, 0.15, 0.05];
    for top_p in [1.0, 0.99] {
        let mut s = sampler(SamplingParams {
            min_p: 0.2,
            top_p,
            ..params()
        });
        let counts = histogram(&mut s, &logits_of(&probs), 5_000);
        assert_eq!(counts[3], 0, "{counts:?}");
        assert!(counts[2] > 0, "{counts:?}");
    }
    let mut s = sampler(SamplingParams {
        min_p: 1.0,
        ..params()
    });
    let counts = histogram(&mut s, &logits_of(&probs), 500);
    assert_eq!(counts[0], 500);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative() {
    let mut s = sampler(SamplingParams {
        repetition_penalty: 2.0,
        ..Default::default()
    });
    for _ in 0..2 {
        // Twice: scratch state must be reset between calls.
        let mut l = vec![2.0f32, -2.0, 1.0, 0.5];
        s.sample(&mut l, &[0, 0, 99], &[1, 1]);
        assert_eq!(l, vec![1.0, -4.0, 1.0, 0.5]);
    }
}

#[test]
fn presence_and_frequency_count_output_only() {
    let p = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..Default::default()
    };
    let mut s = sampler(p);
    for _ in 0..2 {
        let mut l = vec![1.0f32, 1.0, 1.0, 1.0];
        s.sample(&mut l, &[0, 1], &[2, 2, 3, 1000]);
        assert_eq!(l, vec![1.0, 1.0, 0.0, 0.25]);
    }
}

#[test]
fn logprobs_are_pre_temperature_log_softmax() {
    let probs = [0.1f32, 0.2, 0.3, 0.4];
    let p = SamplingParams {
        temperature: 2.0,
        top_logprobs: 4,
        logprobs: true,
        ..params()
    };
    let mut s = sampler(p);
    for _ in 0..20 {
        // Shift by a constant: logprobs must not change.
        let mut l: Vec<f32> = logits_of(&probs).iter().map(|x| x + 7.0).collect();
        let out = s.sample(&mut l, &[], &[]);
        let expect = probs[out.token as usize].ln();
        assert!((out.logprob - expect).abs() < 1e-5, "{out:?}");
        let ids: Vec<u32> = out.top_logprobs.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![3, 2, 1, 0]);
        let total: f32 = out.top_logprobs.iter().map(|t| t.1.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert!(out.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
    }
}

#[test]
fn top_logprobs_on_a_large_vocab() {
    let p = SamplingParams {
        top_k: 40,
        top_logprobs: 5,
        ..params()
    };
    let mut s = sampler(p);
    let logits = random_logits(49_152, 5);
    let mut sorted: Vec<(f32, u32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (l, i as u32))
        .collect();
    sorted.sort_by(desc);
    let out = s.sample(&mut logits.clone(), &[], &[]);
    assert!(sorted[..40].iter().any(|c| c.1 == out.token));
    let ids: Vec<u32> = out.top_logprobs.iter().map(|t| t.0).collect();
    let best: Vec<u32> = sorted[..5].iter().map(|c| c.1).collect();
    assert_eq!(ids, best);
}

#[test]
fn non_finite_logits_do_not_panic() {
    for p in [
        SamplingParams::default(),
        params(),
        SamplingParams {
            top_p: 0.9,
            min_p: 0.1,
            ..params()
        },
    ] {
        let mut s = sampler(SamplingParams {
            top_logprobs: 3,
            ..p
        });
        let out = s.sample(&mut [f32::NAN, 1.0, f32::NAN, 0.5], &[], &[]);
        assert!(out.token == 1 || out.token == 3);
        assert!(out.logprob.is_finite());
        let out = s.sample(&mut [f32::NAN; 8], &[1], &[2]);
        assert!(out.token < 8);
        assert!((out.logprob - (1.0f32 / 8.0).ln()).abs() < 1e-5);
        let out = s.sample(&mut [0.0, f32::INFINITY, f32::NEG_INFINITY], &[], &[]);
        assert_eq!(out.token, 1);
        assert!(!out.logprob.is_nan());
        let out = s.sample(&mut [], &[], &[]);
        assert_eq!(out.token, 0);
    }
}

#[test]
fn nucleus_on_a_large_vocab_stays_inside_the_nucleus() {
    let logits = random_logits(49_152, 11);
    let p = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        ..params()
    };
    let mut s = sampler(p);
    // The reference nucleus, by a full sort.
    let mut sorted: Vec<(f32, u32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (l / 0.8, i as u32))
        .collect();
    sorted.sort_by(desc);
    let max = sorted[0].0;
    let weight = |x: f32| f64::from(x).exp();
    let total: f64 = sorted.iter().map(|c| weight(c.0 - max)).sum();
    let mut acc = 0.0;
    let mut nucleus = std::collections::HashSet::new();
    for c in &sorted {
        nucleus.insert(c.1);
        acc += weight(c.0 - max);
        if acc >= 0.9 * total {
            break;
        }
    }
    for _ in 0..200 {
        let token = s.sample(&mut logits.clone(), &[], &[]).token;
        assert!(nucleus.contains(&token));
    }
}

#[test]
fn top_k_ties_and_large_k() {
    // Ties at the cut go to the lowest ids.
    let mut s = sampler(SamplingParams {
        top_k: 2,
        ..params()
    });
    let counts = histogram(&mut s, &[1.0, 3.0, 3.0, 3.0], 2_000);
    assert_eq!(counts[0] + counts[3], 0, "{counts:?}");
    // A top-k above the heap limit takes the select_nth path.
    let logits = random_logits(1000, 3);
    let sorted = {
        let mut v: Vec<(f32, u32)> = logits.iter().copied().zip(0..).collect();
        v.sort_by(desc);
        v
    };
    let allowed: std::collections::HashSet<u32> = sorted[..300].iter().map(|c| c.1).collect();
    let mut s = sampler(SamplingParams {
        top_k: 300,
        top_p: 0.95,
        min_p: 0.01,
        ..params()
    });
    for _ in 0..500 {
        assert!(allowed.contains(&s.sample(&mut logits.clone(), &[], &[]).token));
    }
}

#[test]
fn set_seed_restarts_the_stream() {
    let logits = random_logits(64, 9);
    let mut a = sampler(params());
    let first: Vec<u32> = (0..20)
        .map(|_| a.sample(&mut logits.clone(), &[], &[]).token)
        .collect();
    a.set_seed(1234);
    assert_eq!(a.seed(), 1234);
    let again: Vec<u32> = (0..20)
        .map(|_| a.sample(&mut logits.clone(), &[], &[]).token)
        .collect();
    assert_eq!(first, again);
}
