//! Unit tests: the matching helpers, and the processor's internal state on
//! the toy tokenizer (end-to-end cases live in `tests/output_stop.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

#[path = "../../tests/output_toy.rs"]
mod toy;

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn earliest_stop_prefers_earliest_end_then_earliest_start() {
    let stops = strings(&["abcd", "bc", "zz"]);
    assert_eq!(earliest_stop("xabcd", &stops), Some((2, 1)));
    let stops = strings(&["bc", "abc"]);
    // Both end at 3: the longer one (starting first) wins.
    assert_eq!(earliest_stop("abc", &stops), Some((0, 1)));
    assert_eq!(earliest_stop("nothing", &stops), None);
    assert_eq!(earliest_stop("anything", &[]), None);
}

#[test]
fn holdback_keeps_longest_suffix_that_starts_a_stop() {
    let stops = strings(&["abc", "cd"]);
    assert_eq!(holdback_start("xxab", &stops, 3), 2);
    assert_eq!(holdback_start("xxa", &stops, 3), 2);
    assert_eq!(holdback_start("xxc", &stops, 3), 2);
    assert_eq!(holdback_start("xxx", &stops, 3), 3);
    // A complete stop is not a *proper* prefix: not held (the caller found it).
    assert_eq!(holdback_start("x", &strings(&["x"]), 1), 1);
    assert_eq!(holdback_start("", &stops, 3), 0);
    assert_eq!(holdback_start("abc", &[], 0), 3);
}

#[test]
fn holdback_cuts_on_char_boundaries_only() {
    // "é" is 2 bytes; the stop starts with it.
    let stops = strings(&["é!", "ü"]);
    assert_eq!(holdback_start("caé", &stops, 3), 2);
    // A complete stop ("ü") is not held; nothing else starts a stop.
    assert_eq!(holdback_start("ca\u{fc}", &stops, 3), 4);
    assert_eq!(holdback_start("日本", &stops, 3), "日本".len());
}

#[test]
fn held_text_never_exceeds_longest_stop() {
    let tok = toy::toy();
    let stop = StopConditions {
        stop_strings: strings(&["hello worlds", "ldx!"]),
        ..StopConditions::default()
    };
    let mut p = OutputProcessor::new(tok.clone(), stop);
    for id in toy::ids(&tok, &["hello", " world", " world", "x"]) {
        let out = p.push(id).unwrap();
        assert!(out.finished.is_none());
        assert!(p.held.len() < p.max_stop_len, "held {:?}", p.held);
    }
    assert_eq!(p.held, "ldx");
    assert_eq!(p.finish().unwrap(), "ldx");
}

#[test]
fn empty_stop_strings_are_ignored() {
    let tok = toy::toy();
    let stop = StopConditions {
        stop_strings: strings(&[""]),
        ..StopConditions::default()
    };
    let mut p = OutputProcessor::new(tok.clone(), stop);
    assert_eq!(p.max_stop_len, 0);
    let out = p.push(toy::tid(&tok, b"hello")).unwrap();
    assert_eq!(out.text_delta, "hello");
    assert!(out.finished.is_none());
}

#[test]
fn for_tokenizer_uses_eos_ids() {
    let tok = toy::toy();
    let stop = StopConditions::for_tokenizer(&tok, 7);
    assert_eq!(stop.stop_token_ids, vec![toy::IM_END]);
    assert_eq!(stop.max_tokens, 7);
    assert!(stop.skip_special_tokens && !stop.include_stop_str_in_output);
}

#[test]
fn finish_closes_and_later_pushes_are_ignored() {
    let tok = toy::toy();
    let stop = StopConditions {
        stop_strings: strings(&["low"]),
        ..StopConditions::default()
    };
    let mut p = OutputProcessor::new(tok.clone(), stop);
    assert_eq!(p.push(toy::tid(&tok, b"hello")).unwrap().text_delta, "hel");
    assert_eq!(p.finish().unwrap(), "lo");
    assert!(p.is_finished() && p.stop_reason().is_none());
    assert_eq!(
        p.push(toy::tid(&tok, b"w")).unwrap(),
        TokenOutput::default()
    );
    assert_eq!(p.finish().unwrap(), "");
    assert_eq!(p.text(), "hello");
    assert_eq!(p.output_token_count(), 1);
}
