//! Where Spindle's tests find the resources they need.
//!
//! A test that needs a resource calls one of these functions. When the
//! resource is missing the test **fails** with a message that says how to get
//! it — it never returns early and counts as passed. `scripts/test.sh`
//! installs everything these functions look for; tests that cannot run on a
//! machine at all (a GPU) are `#[ignore]`d instead.

use std::path::PathBuf;

/// The environment variable that holds the default test model's path.
pub const MODEL_VAR: &str = "SPINDLE_MODEL_GGUF";
/// The environment variable that holds the Python venv's path.
pub const VENV_VAR: &str = "SPINDLE_PY_VENV";

/// The real SmolLM2-135M-Instruct GGUF named by `SPINDLE_MODEL_GGUF`.
///
/// # Panics
/// When the variable is unset or does not name a file.
#[track_caller]
pub fn smollm2_gguf() -> PathBuf {
    required_file(MODEL_VAR, "the SmolLM2 test model", "export SPINDLE_MODEL_GGUF=$(scripts/fetch-model.sh | tail -n 1)")
}

/// The file named by environment variable `var`, which holds `what`.
///
/// # Panics
/// When `var` is unset or does not name a file; `how` says how to get it.
#[track_caller]
pub fn required_file(var: &str, what: &str, how: &str) -> PathBuf {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(p) if PathBuf::from(&p).is_file() => PathBuf::from(p),
        Some(p) => panic!("{var}={} is not a file ({what}); run scripts/test.sh or: {how}", PathBuf::from(p).display()),
        None => panic!("{var} is not set: this test needs {what}; run scripts/test.sh or: {how}"),
    }
}

/// The Python venv with the OpenAI SDK, named by `SPINDLE_PY_VENV`.
///
/// # Panics
/// When the variable is unset or the venv has no `bin/python`.
#[track_caller]
pub fn python_venv() -> PathBuf {
    let how = "python3 -m venv .venv-py && .venv-py/bin/pip install -r tests/python/requirements.txt && export SPINDLE_PY_VENV=$PWD/.venv-py";
    let Some(venv) = std::env::var_os(VENV_VAR).filter(|v| !v.is_empty()).map(PathBuf::from) else {
        panic!("{VENV_VAR} is not set: this test needs the Python venv with the OpenAI SDK; run scripts/test.sh or: {how}");
    };
    if !venv.join("bin/python").is_file() {
        panic!("{VENV_VAR}={} has no bin/python; run scripts/test.sh or: {how}", venv.display());
    }
    venv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "SPINDLE_TESTENV_UNSET_VAR is not set")]
    fn an_unset_variable_fails_the_test() {
        required_file("SPINDLE_TESTENV_UNSET_VAR", "nothing", "nothing");
    }

    #[test]
    #[should_panic(expected = "is not a file")]
    fn a_missing_file_fails_the_test() {
        std::env::set_var("SPINDLE_TESTENV_MISSING_FILE", "/nonexistent/spindle/model.gguf");
        required_file("SPINDLE_TESTENV_MISSING_FILE", "nothing", "nothing");
    }
}

/// xorshift64*: a small seeded generator for randomized tests, the same
/// sequence on every machine (seed it with any non-zero value).
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// One of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}
