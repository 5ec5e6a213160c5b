//! Stop handling of the `OutputProcessor`: stop ids, stop strings across and
//! inside tokens, multi-byte text, `max_tokens`, and a randomized check of
//! every delta stream against a brute-force reference.
//!
//! Most tests use a toy byte-level BPE tokenizer (`output_toy.rs`). The
//! real-model tests need `SPINDLE_MODEL_GGUF` (SmolLM2's GGUF, which
//! `scripts/test.sh` fetches); without it they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "output_toy.rs"]
mod toy;

use spindle_engine::gguf::GgufFile;
use spindle_engine::tokenizer::{gguf_tokenizer_spec, Tokenizer};
use spindle_scheduler::output::{OutputProcessor, StopConditions, StopReason, TokenOutput};
use toy::{ids, tid, toy, IM_END, IM_START};

fn stops(strings: &[&str]) -> StopConditions {
    StopConditions {
        stop_token_ids: vec![IM_END],
        stop_strings: strings.iter().map(|s| s.to_string()).collect(),
        ..StopConditions::default()
    }
}

/// Pushes `ids` until the processor finishes; returns every output.
fn run(tok: &Tokenizer, stop: StopConditions, ids: &[u32]) -> (OutputProcessor, Vec<TokenOutput>) {
    let mut p = OutputProcessor::new(tok.clone(), stop);
    let mut outs = Vec::new();
    for &id in ids {
        let out = p.push(id).unwrap();
        let done = out.finished.is_some();
        outs.push(out);
        if done {
            break;
        }
    }
    (p, outs)
}

fn deltas(outs: &[TokenOutput]) -> Vec<&str> {
    outs.iter().map(|o| o.text_delta.as_str()).collect()
}

fn reason(outs: &[TokenOutput]) -> Option<StopReason> {
    outs.last().and_then(|o| o.finished.clone())
}

fn stop_string(s: &str) -> Option<StopReason> {
    Some(StopReason::StopString(s.to_string()))
}

#[test]
fn stop_string_inside_one_token() {
    let tok = toy();
    let (p, outs) = run(
        &tok,
        stops(&["STOP"]),
        &ids(&tok, &["hello", "xSTOPy", "hello"]),
    );
    assert_eq!(deltas(&outs), ["hello", "x"]);
    assert_eq!(reason(&outs), stop_string("STOP"));
    assert_eq!(p.text(), "hellox");
    assert_eq!(p.output_token_count(), 2);
}

#[test]
fn stop_string_across_two_tokens_starting_mid_token() {
    let tok = toy();
    // "lo wor" starts inside "hello": its "hel" is emitted at once.
    let (p, outs) = run(&tok, stops(&["lo wor"]), &ids(&tok, &["hello", " world"]));
    assert_eq!(deltas(&outs), ["hel", ""]);
    assert_eq!(reason(&outs), stop_string("lo wor"));
    assert_eq!(p.text(), "hel");

    let (p, outs) = run(&tok, stops(&["Pyhel"]), &ids(&tok, &["xSTOPy", "hello"]));
    assert_eq!(deltas(&outs), ["xSTO", ""]);
    assert_eq!(p.text(), "xSTO");
}

#[test]
fn stop_string_across_three_tokens() {
    let tok = toy();
    let (p, outs) = run(
        &tok,
        stops(&["o STOP"]),
        &ids(&tok, &["hello", " ", "STOP", "hello"]),
    );
    assert_eq!(deltas(&outs), ["hell", "", ""]);
    assert_eq!(reason(&outs), stop_string("o STOP"));
    assert_eq!(p.text(), "hell");

    let (p, outs) = run(
        &tok,
        stops(&["END"]),
        &ids(&tok, &["hello", "E", "N", "D", " world"]),
    );
    assert_eq!(deltas(&outs), ["hello", "", "", ""]);
    assert_eq!(p.text(), "hello");
    assert_eq!(p.output_token_count(), 4);
}

#[test]
fn failed_partial_match_is_released() {
    let tok = toy();
    let (mut p, outs) = run(
        &tok,
        stops(&["low"]),
        &ids(&tok, &["hello", " world", "l", "o"]),
    );
    assert_eq!(deltas(&outs), ["hel", "lo world", "", ""]);
    assert_eq!(reason(&outs), None);
    // "lo" is still a possible start of "low": only finish releases it.
    assert_eq!(p.finish().unwrap(), "lo");
    assert_eq!(p.text(), "hello worldlo");
    assert_eq!(p.stop_reason(), None);
}

#[test]
fn released_text_restarts_a_new_partial_match() {
    let tok = toy();
    // "l", "ll", "llo" are held for "llo!"; " world" rules that out, and the
    // new tail "ld" is held for "ld!".
    let stop = stops(&["llo!", "ld!"]);
    let (mut p, outs) = run(&tok, stop, &ids(&tok, &["he", "l", "l", "o", " world"]));
    assert_eq!(deltas(&outs), ["he", "", "", "", "llo wor"]);
    assert_eq!(p.finish().unwrap(), "ld");
    assert_eq!(p.text(), "hello world");
}

#[test]
fn two_stop_strings_the_first_occurrence_wins() {
    let tok = toy();
    let words = ids(&tok, &["hello", " world", "END"]);
    for order in [["world", "ll"], ["ll", "world"]] {
        let (p, outs) = run(&tok, stops(&order), &words);
        assert_eq!(reason(&outs), stop_string("ll"));
        assert_eq!(p.text(), "he");
    }
    // Both in one push: the one that is complete first wins.
    let (p, outs) = run(&tok, stops(&["STOP", "xS"]), &ids(&tok, &["xSTOPy"]));
    assert_eq!(reason(&outs), stop_string("xS"));
    assert_eq!(p.text(), "");
    let (p, outs) = run(
        &tok,
        stops(&["ENDxST", "Dx"]),
        &ids(&tok, &["END", "xSTOPy"]),
    );
    assert_eq!(reason(&outs), stop_string("Dx"));
    assert_eq!(p.text(), "EN");
}

#[test]
fn multibyte_characters_split_across_tokens_then_a_stop() {
    let tok = toy();
    let (e, c) = ("😀".as_bytes(), "你".as_bytes());
    let cjk_tail_en = [&c[2..], b"EN".as_slice()].concat();
    let tokens = [
        tid(&tok, &e[..2]),
        tid(&tok, &e[2..]),
        tid(&tok, &c[..2]),
        tid(&tok, &cjk_tail_en),
        tid(&tok, b"D"),
        tid(&tok, b"hello"),
    ];
    let (p, outs) = run(&tok, stops(&["END"]), &tokens);
    assert_eq!(deltas(&outs), ["", "😀", "", "你", ""]);
    assert_eq!(reason(&outs), stop_string("END"));
    assert_eq!(p.text(), "😀你");

    // A stop string that starts with a split character.
    let (p, outs) = run(&tok, stops(&["你END"]), &tokens);
    assert_eq!(deltas(&outs), ["", "😀", "", "", ""]);
    assert_eq!(p.text(), "😀");

    // A multi-byte partial match that is ruled out.
    let (p, outs) = run(&tok, stops(&["😀!"]), &tokens[..3]);
    assert_eq!(deltas(&outs), ["", "", ""]);
    let (_, outs2) = run(&tok, stops(&["😀!"]), &tokens[..4]);
    assert_eq!(deltas(&outs2), ["", "", "", "😀你EN"]);
    assert_eq!(p.text(), "");
}

#[test]
fn stop_token_id_ends_and_is_not_emitted() {
    let tok = toy();
    let mut tokens = ids(&tok, &["hello"]);
    tokens.extend([IM_END, tid(&tok, b"hello")]);
    let (p, outs) = run(&tok, stops(&[]), &tokens);
    assert_eq!(deltas(&outs), ["hello", ""]);
    assert_eq!(reason(&outs), Some(StopReason::Eos));
    assert_eq!(p.output_token_count(), 2);

    // Held-back text is released by `finish` after the stop id.
    let (mut p, outs) = run(&tok, stops(&["lo!"]), &tokens);
    assert_eq!(deltas(&outs), ["hel", ""]);
    assert_eq!(p.finish().unwrap(), "lo");
    assert_eq!(p.text(), "hello");
    assert_eq!(p.finish().unwrap(), "");
    // Later tokens are ignored and repeat the reason.
    let again = p.push(tid(&tok, b"hello")).unwrap();
    assert_eq!(again.text_delta, "");
    assert_eq!(again.finished, Some(StopReason::Eos));
    assert_eq!(p.output_token_count(), 2);

    // An incomplete character before EOS comes out as U+FFFD, like decode.
    let half = tid(&tok, &"😀".as_bytes()[..2]);
    let (mut p, _) = run(&tok, stops(&[]), &[half, IM_END]);
    assert_eq!(p.finish().unwrap(), "\u{FFFD}");
    assert_eq!(p.text(), tok.decode(&[half], true).unwrap());
    assert_eq!(p.text(), "\u{FFFD}");
}

#[test]
fn max_tokens_emits_the_last_token_then_finishes() {
    let tok = toy();
    let words = ids(&tok, &["hello", " world", "hello"]);
    let stop = StopConditions {
        max_tokens: 2,
        ..stops(&[" worlds"])
    };
    let (mut p, outs) = run(&tok, stop.clone(), &words);
    // " world" may start " worlds": held until `finish`.
    assert_eq!(deltas(&outs), ["hello", ""]);
    assert_eq!(reason(&outs), Some(StopReason::MaxTokens));
    assert_eq!(p.output_token_count(), 2);
    assert_eq!(p.finish().unwrap(), " world");
    assert_eq!(p.finish().unwrap(), "");
    assert_eq!(p.text(), "hello world");

    // A stop string completed by the last allowed token wins over MaxTokens.
    let (p, outs) = run(
        &tok,
        StopConditions {
            max_tokens: 2,
            ..stops(&["o w"])
        },
        &words,
    );
    assert_eq!(reason(&outs), stop_string("o w"));
    assert_eq!(p.text(), "hell");

    // So does a stop id as the last allowed token.
    let (_, outs) = run(
        &tok,
        StopConditions {
            max_tokens: 2,
            ..stops(&[])
        },
        &[words[0], IM_END],
    );
    assert_eq!(reason(&outs), Some(StopReason::Eos));
    assert_eq!(deltas(&outs), ["hello", ""]);
}

#[test]
fn include_stop_str_in_output() {
    let tok = toy();
    let inc = |s: &[&str]| StopConditions {
        include_stop_str_in_output: true,
        ..stops(s)
    };
    let (p, outs) = run(&tok, inc(&["STOP"]), &ids(&tok, &["hello", "xSTOPy"]));
    assert_eq!(deltas(&outs), ["hello", "xSTOP"]);
    assert_eq!(p.text(), "helloxSTOP");
    let (p, outs) = run(&tok, inc(&["lo wor"]), &ids(&tok, &["hello", " world"]));
    assert_eq!(deltas(&outs), ["hel", "lo wor"]);
    assert_eq!(reason(&outs), stop_string("lo wor"));
    assert_eq!(p.text(), "hello wor");
}

#[test]
fn special_tokens_are_skipped_or_matched() {
    let tok = toy();
    let tokens = [tid(&tok, b"hello"), IM_START, tid(&tok, b" world")];
    let (mut p, outs) = run(&tok, stops(&["<|im_start|>"]), &tokens);
    assert_eq!(reason(&outs), None);
    p.finish().unwrap();
    assert_eq!(p.text(), "hello world");

    let keep = StopConditions {
        skip_special_tokens: false,
        ..stops(&["<|im_start|>"])
    };
    let (p, outs) = run(&tok, keep, &tokens);
    assert_eq!(reason(&outs), stop_string("<|im_start|>"));
    assert_eq!(p.text(), "hello");
}

#[test]
fn out_of_vocabulary_id_is_an_error() {
    let tok = toy();
    let mut p = OutputProcessor::new(tok.clone(), stops(&["x"]));
    assert!(p.push(tok.vocab_size() as u32 + 5).is_err());
}

// ---------------------------------------------------------------------------
// Randomized comparison against a brute-force reference.

/// The expected outcome: text, reason, and how many tokens were consumed.
#[derive(Debug, PartialEq)]
struct Outcome {
    text: String,
    reason: Option<StopReason>,
    tokens: usize,
}

/// The first stop completed in `text`, char by char: earliest end, then the
/// longest (earliest start). Returns (start, end, stop).
fn brute_force_stop(text: &str, stops: &[String]) -> Option<(usize, usize, String)> {
    let mut by_len: Vec<&String> = stops.iter().filter(|s| !s.is_empty()).collect();
    by_len.sort_by_key(|s| std::cmp::Reverse(s.len()));
    (1..=text.len())
        .filter(|&end| text.is_char_boundary(end))
        .find_map(|end| {
            let s = by_len.iter().find(|s| text[..end].ends_with(s.as_str()))?;
            Some((end - s.len(), end, s.to_string()))
        })
}

/// What a correct processor must produce for `ids`: decodes growing prefixes.
///
/// A stop string is seen at the first prefix whose decoding contains it and
/// does not end in an incomplete character: the incremental decoder holds a
/// whole delta back while it ends in one (e.g. SmolLM2's `Ġð` token, a space
/// plus an emoji's first byte), so the stop is found one token later.
fn reference(tok: &Tokenizer, stop: &StopConditions, ids: &[u32]) -> Outcome {
    let skip = stop.skip_special_tokens;
    for k in 1..=ids.len() {
        if stop.stop_token_ids.contains(&ids[k - 1]) {
            let text = tok.decode(&ids[..k - 1], skip).unwrap();
            return Outcome {
                text,
                reason: Some(StopReason::Eos),
                tokens: k,
            };
        }
        let text = tok.decode(&ids[..k], skip).unwrap();
        // Text ending in an incomplete character is not released yet (by the
        // incremental decoder), so no stop can be seen in it before it is.
        let visible = !text.ends_with('\u{FFFD}');
        if let Some((start, end, s)) =
            brute_force_stop(&text, &stop.stop_strings).filter(|_| visible)
        {
            let cut = if stop.include_stop_str_in_output {
                end
            } else {
                start
            };
            let reason = Some(StopReason::StopString(s));
            return Outcome {
                text: text[..cut].to_string(),
                reason,
                tokens: k,
            };
        }
        if k >= stop.max_tokens {
            return Outcome {
                text,
                reason: Some(StopReason::MaxTokens),
                tokens: k,
            };
        }
    }
    let text = tok.decode(ids, skip).unwrap();
    Outcome {
        text,
        reason: None,
        tokens: ids.len(),
    }
}

/// Runs the processor on `ids` (then `finish`), checking the delta stream.
fn actual(tok: &Tokenizer, stop: &StopConditions, ids: &[u32]) -> Outcome {
    let (mut p, outs) = run(tok, stop.clone(), ids);
    for out in &outs[..outs.len().saturating_sub(1)] {
        assert!(out.finished.is_none());
    }
    let mut text: String = outs.iter().map(|o| o.text_delta.as_str()).collect();
    text.push_str(&p.finish().unwrap());
    assert_eq!(text, p.text());
    Outcome {
        text,
        reason: p.stop_reason().cloned(),
        tokens: p.output_token_count(),
    }
}

use spindle_testenv::Rng;

/// A random stop string: usually a substring of `text`, sometimes not.
fn random_stop(rng: &mut Rng, text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() || rng.below(4) == 0 {
        let alphabet: Vec<char> = "lo wENDS!😀你".chars().collect();
        let len = 1 + rng.below(4);
        return (0..len)
            .map(|_| alphabet[rng.below(alphabet.len())])
            .collect();
    }
    let start = rng.below(chars.len());
    let len = 1 + rng.below(6.min(chars.len() - start));
    chars[start..start + len].iter().collect()
}

/// Random stop conditions for a sequence whose full text is `text`.
fn random_conditions(rng: &mut Rng, text: &str, n_ids: usize) -> StopConditions {
    let n_stops = rng.below(4);
    StopConditions {
        stop_token_ids: vec![IM_END],
        stop_strings: (0..n_stops).map(|_| random_stop(rng, text)).collect(),
        max_tokens: if rng.below(3) == 0 {
            1 + rng.below(n_ids + 2)
        } else {
            usize::MAX
        },
        include_stop_str_in_output: rng.below(2) == 0,
        skip_special_tokens: rng.below(4) != 0,
    }
}

#[test]
fn random_streams_match_the_reference() {
    let tok = toy();
    let (e, c) = ("😀".as_bytes(), "你".as_bytes());
    let cjk_tail_en = [&c[2..], b"EN".as_slice()].concat();
    // Units keep the stream valid UTF-8 (split characters stay together).
    let mut units: Vec<Vec<u32>> = [
        "hello", " world", "END", "STOP", "xSTOPy", " ", "E", "N", "D",
    ]
    .iter()
    .chain(["l", "o", "!", "S", "P", "w", "y"].iter())
    .map(|p| vec![tid(&tok, p.as_bytes())])
    .collect();
    units.push(vec![tid(&tok, &e[..2]), tid(&tok, &e[2..])]);
    units.push(vec![tid(&tok, &c[..2]), tid(&tok, &cjk_tail_en)]);
    units.push(vec![IM_START]);
    units.push(vec![IM_END]);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut stopped = 0;
    for case in 0..3000 {
        let n_units = rng.below(12);
        let ids: Vec<u32> = (0..n_units)
            .flat_map(|_| units[rng.below(units.len())].clone())
            .collect();
        let text = tok.decode(&ids, false).unwrap();
        let stop = random_conditions(&mut rng, &text, ids.len());
        let want = reference(&tok, &stop, &ids);
        let got = actual(&tok, &stop, &ids);
        assert_eq!(got, want, "case {case}: ids {ids:?}, {stop:?}");
        stopped += usize::from(matches!(want.reason, Some(StopReason::StopString(_))));
    }
    assert!(stopped > 500, "only {stopped} cases hit a stop string");
}

// ---------------------------------------------------------------------------
// The real SmolLM2 tokenizer.

fn real_tokenizer() -> Tokenizer {
    let path = spindle_testenv::smollm2_gguf();
    let file = GgufFile::open(&path).expect("open GGUF");
    let spec = gguf_tokenizer_spec(&file).expect("tokenizer spec");
    Tokenizer::from_gguf_spec(spec).expect("build tokenizer")
}

const REAL_TEXT: &str =
    "Hello world! 你好, 世界 😀🎉 The answer is 42.\nUser: what about naïve café?\nAssistant: ok";

#[test]
fn real_tokenizer_stops() {
    let tok = real_tokenizer();
    let ids = tok.encode(REAL_TEXT, false).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), REAL_TEXT);
    let eos = tok.eos_ids().to_vec();
    let stop = |s: &[&str]| StopConditions {
        stop_token_ids: eos.clone(),
        stop_strings: s.iter().map(|x| x.to_string()).collect(),
        ..StopConditions::default()
    };
    let (p, outs) = run(&tok, stop(&["\nUser:", "Assistant"]), &ids);
    assert_eq!(reason(&outs), stop_string("\nUser:"));
    assert_eq!(p.text(), "Hello world! 你好, 世界 😀🎉 The answer is 42.");
    // Mid-token, across a multi-byte boundary.
    let (p, _) = run(&tok, stop(&["好, 世"]), &ids);
    assert_eq!(p.text(), "Hello world! 你");
    let (p, _) = run(&tok, stop(&["🎉 Th"]), &ids);
    assert_eq!(p.text(), "Hello world! 你好, 世界 😀");
    // EOS after the text: everything comes out, EOS itself does not.
    let mut with_eos = ids.clone();
    with_eos.push(eos[0]);
    let (mut p, outs) = run(&tok, stop(&["ok!"]), &with_eos);
    assert_eq!(reason(&outs), Some(StopReason::Eos));
    assert_eq!(p.text(), REAL_TEXT.strip_suffix("ok").unwrap());
    assert_eq!(p.finish().unwrap(), "ok");
    assert_eq!(p.text(), REAL_TEXT);
    assert_eq!(p.output_token_count(), with_eos.len());
}

#[test]
fn real_tokenizer_random_stops_match_the_reference() {
    let tok = real_tokenizer();
    let text = format!("{REAL_TEXT}<|im_end|> tail");
    let ids = tok.encode(&text, false).unwrap();
    let full = tok.decode(&ids, false).unwrap();
    let mut rng = Rng(42);
    for case in 0..500 {
        let mut stop = random_conditions(&mut rng, &full, ids.len());
        stop.stop_token_ids = if rng.below(2) == 0 {
            tok.eos_ids().to_vec()
        } else {
            vec![]
        };
        let want = reference(&tok, &stop, &ids);
        let got = actual(&tok, &stop, &ids);
        assert_eq!(got, want, "case {case}: {stop:?}");
    }
}
