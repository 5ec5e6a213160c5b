//! The daemon driven by the official OpenAI Python SDK (installed from PyPI
//! by `scripts/test.sh` into `.venv-py`): starts `spindle serve` on a free
//! loopback port with a temporary store, waits for `/ready`, then runs
//! `python -m pytest tests/python` against it and requires it to pass.
//!
//! Fails unless both `SPINDLE_MODEL_GGUF` and `SPINDLE_PY_VENV` name what
//! they should; `scripts/test.sh` installs both and sets them.

mod common;

use common::daemon::start_daemon;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the whole pytest run may take.
const PYTEST_TIMEOUT: Duration = Duration::from_secs(900);

#[test]
fn openai_python_sdk_drives_the_daemon() {
    let model = spindle_testenv::smollm2_gguf();
    let python = spindle_testenv::python_venv().join("bin").join("python");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();

    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = start_daemon(Path::new(&model), dir.path(), &[]);

    let pytest_log = dir.path().join("pytest.log");
    let out = std::fs::File::create(&pytest_log).expect("pytest log");
    let err = out.try_clone().expect("pytest log");
    let mut pytest = Command::new(&python)
        .args(["-m", "pytest", "tests/python", "-q", "-p", "no:cacheprovider"])
        .current_dir(&root)
        .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{}/v1", daemon.port))
        .env("OPENAI_API_KEY", "dummy")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("OPENAI_ORG_ID")
        .env_remove("OPENAI_PROJECT_ID")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("run pytest");
    let deadline = Instant::now() + PYTEST_TIMEOUT;
    let status = loop {
        if let Some(status) = pytest.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = pytest.kill();
            let _ = pytest.wait();
            let output = std::fs::read_to_string(&pytest_log).unwrap_or_default();
            panic!("pytest ran past {PYTEST_TIMEOUT:?}:\n{output}\ndaemon log:\n{}", daemon.log_text());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&pytest_log).unwrap_or_default();
    println!("{output}");
    assert!(status.success(), "pytest failed ({status}):\n{output}\ndaemon log:\n{}", daemon.log_text());
    assert!(!output.contains(" skipped"), "every SDK test must run, none skipped:\n{output}");
    drop(daemon);
}
