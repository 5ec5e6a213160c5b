//! `spindle serve`: load the model, start the scheduler, serve HTTP until
//! SIGINT/SIGTERM, then drain.

use crate::cli::engine::{self, EngineArgs, Started};
use clap::Args;
use spindle_engine::models::cache_root;
use spindle_scheduler::SchedulerConfig;
use spindle_server::app::{self, access::auth::ApiKeys, metrics::HttpMetrics, AppState, Limits, SamplingDefaults};
use spindle_server::store::{ResponseStore, SqliteStore, StoreConfig, TaskStore};
use spindle_server::net::{self, ConnectionLimits};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `spindle serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// A file of serving flags (`key = value` or `key: value` lines, keys
    /// as the flags' names); flags on the command line win over it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where and how the model runs.
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    served: super::served::ServedModelArgs,
    /// Reuse cached prompt prefixes across requests (the default; on the
    /// command line it wins over SPINDLE_NO_ENABLE_PREFIX_CACHING).
    #[arg(long, overrides_with = "no_enable_prefix_caching", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    enable_prefix_caching: bool,
    /// Compute every prompt in full: no prefix cache.
    #[arg(long, env = "SPINDLE_NO_ENABLE_PREFIX_CACHING", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    no_enable_prefix_caching: bool,
    /// `max_output_tokens` when a request leaves it out (default: 4096, the most allowed).
    #[arg(long, env = "SPINDLE_DEFAULT_MAX_OUTPUT_TOKENS")]
    default_max_output_tokens: Option<usize>,
    /// Address to bind.
    #[arg(long, env = "SPINDLE_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to bind.
    #[arg(long, env = "SPINDLE_PORT", default_value_t = 8080)]
    port: u16,
    /// API keys clients must send as `Authorization: Bearer <key>` (repeatable; env: comma-separated).
    #[arg(long = "api-key", env = "SPINDLE_API_KEYS", value_delimiter = ',')]
    api_keys: Vec<String>,
    /// A file of API keys, one per line: `KEY` (its own tenant) or `TENANT KEY`
    /// (keys with one tenant name share their stored responses and cache).
    #[arg(long, env = "SPINDLE_API_KEY_FILE")]
    api_key_file: Option<PathBuf>,
    /// Serve `/metrics` without a key on this separate address (e.g.
    /// 127.0.0.1:9090) for a scraper; on the main address it needs a key
    /// whenever keys are configured.
    #[arg(long, env = "SPINDLE_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Most open connections (default: the file-descriptor limit, raised to
    /// its hard limit, less 64). At the cap a new connection replaces the
    /// oldest one that has not sent a request.
    #[arg(long, env = "SPINDLE_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Seconds a connection may take to send a request's headers, and may stay
    /// idle between keep-alive requests.
    #[arg(long, env = "SPINDLE_HEADER_READ_TIMEOUT_S", default_value_t = 30)]
    header_read_timeout_s: u64,
    /// Seconds a streamed response waits for a client that has stopped
    /// reading before it ends the response and frees its memory.
    #[arg(long, env = "SPINDLE_STREAM_STALL_TIMEOUT_S", default_value_t = 30)]
    stream_stall_timeout_s: u64,
    /// Most responses one tenant (API key) may have generating or queued at
    /// once; 429 with Retry-After beyond (default: --max-num-seqs plus
    /// --max-waiting, i.e. no cap below the scheduler's own).
    #[arg(long, env = "SPINDLE_MAX_STREAMS_PER_TENANT")]
    max_streams_per_tenant: Option<usize>,
    /// Seconds a request body may take to arrive (408 beyond).
    #[arg(long, env = "SPINDLE_BODY_READ_TIMEOUT_S", default_value_t = 30)]
    body_read_timeout_s: u64,
    /// Allow binding a non-loopback address without API keys.
    #[arg(long, env = "SPINDLE_ALLOW_UNAUTHENTICATED", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    allow_unauthenticated: bool,
    /// SQLite file for stored responses.
    #[arg(long, env = "SPINDLE_STORE_PATH")]
    store_path: Option<PathBuf>,
    /// How long stored responses are kept, in hours.
    #[arg(long, env = "SPINDLE_STORE_TTL_HOURS", default_value_t = 720)]
    store_ttl_hours: u64,
    /// Most stored responses kept (oldest completed evicted first).
    #[arg(long, env = "SPINDLE_STORE_MAX_RESPONSES", default_value_t = 100_000)]
    store_max_responses: usize,
    /// How long an LMSP task's event history stays replayable after the task ends, in seconds.
    #[arg(long, env = "SPINDLE_TASK_EVENT_RETENTION_S", default_value_t = 3600)]
    task_event_retention_s: u64,
    /// Most sequences per step.
    #[arg(long, env = "SPINDLE_MAX_NUM_SEQS", default_value_t = 64)]
    max_num_seqs: usize,
    /// Most new tokens per step.
    #[arg(long, env = "SPINDLE_MAX_NUM_BATCHED_TOKENS", default_value_t = 512)]
    max_num_batched_tokens: usize,
    /// Most requests waiting for admission (429 beyond).
    #[arg(long, env = "SPINDLE_MAX_WAITING", default_value_t = 256)]
    max_waiting: usize,
    /// Temperature when a request leaves it out.
    #[arg(long, env = "SPINDLE_DEFAULT_TEMPERATURE", default_value_t = 0.8)]
    default_temperature: f64,
    /// top_p when a request leaves it out.
    #[arg(long, env = "SPINDLE_DEFAULT_TOP_P", default_value_t = 0.95)]
    default_top_p: f64,
    /// top_k when a request leaves it out (0 = off).
    #[arg(long, env = "SPINDLE_DEFAULT_TOP_K", default_value_t = 40)]
    default_top_k: u32,
    /// min_p when a request leaves it out (0 = off).
    #[arg(long, env = "SPINDLE_DEFAULT_MIN_P", default_value_t = 0.05)]
    default_min_p: f64,
}

/// Run the daemon.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    super::init_threads(args.engine.threads)?;
    let addr: SocketAddr = format!("{}:{}", args.host, args.port).parse()?;
    let keys = api_keys(&args)?;
    if !addr.ip().is_loopback() && !keys.enabled() && !args.allow_unauthenticated {
        anyhow::bail!("refusing to serve {addr} without --api-key (or pass --allow-unauthenticated)");
    }
    let store = open_store(&args)?;
    let key_path = store_path(&args).with_extension("compaction-key");
    let sealer = spindle_server::app::access::seal::Sealer::load_or_create(&key_path)?;
    let started = start_engine(&args)?;
    if let Some(telemetry) = started.telemetry {
        spindle_server::app::metrics::gpu_stats::install(telemetry);
    }
    let meta = started.meta;
    let state = Arc::new(AppState {
        sealer,
        idempotency: Default::default(),
        tasks: Default::default(),
        scheduler: started.scheduler,
        model: args.served.model_info(meta, unix_now())?,
        store,
        keys,
        limits: Limits {
            sampling: SamplingDefaults {
                temperature: args.default_temperature,
                top_p: args.default_top_p,
                top_k: args.default_top_k,
                min_p: args.default_min_p,
            },
            task_event_retention: Duration::from_secs(args.task_event_retention_s),
            body_read_timeout: Duration::from_secs(args.body_read_timeout_s),
            max_streams_per_tenant: args.max_streams_per_tenant.unwrap_or(args.max_num_seqs + args.max_waiting),
            stream_stall_timeout: Duration::from_secs(args.stream_stall_timeout_s),
            default_output_tokens: default_output_tokens(&args)?,
            ..Limits::default()
        },
        metrics: HttpMetrics::default(),
        running: Default::default(),
        slots: Default::default(),
        draining: tokio::sync::watch::channel(false).0,
    });
    log_settings(&args, &state);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut connections = ConnectionLimits::from_fd_limit(Duration::from_secs(args.header_read_timeout_s));
    if let Some(max) = args.max_connections {
        connections.max_connections = max;
    }
    tracing::info!(
        "at most {} open connections; {} s for a request's headers, {} s for its body",
        connections.max_connections,
        args.header_read_timeout_s,
        args.body_read_timeout_s
    );
    runtime.block_on(serve(addr, args.metrics_addr, state, connections, Duration::from_secs(args.store_ttl_hours * 3600)))
}

/// `--default-max-output-tokens`, within the server's cap.
fn default_output_tokens(args: &ServeArgs) -> anyhow::Result<usize> {
    let cap = Limits::default().max_output_tokens;
    match args.default_max_output_tokens {
        Some(n) if n == 0 || n > cap => anyhow::bail!("--default-max-output-tokens must be between 1 and {cap}"),
        Some(n) => Ok(n),
        None => Ok(cap),
    }
}

impl ServeArgs {
    /// Whether cached prefixes are reused: `--enable-prefix-caching` given
    /// (the command line, or a config file) wins over the environment's
    /// `SPINDLE_NO_ENABLE_PREFIX_CACHING`, which clap fills in afterwards.
    fn prefix_caching(&self) -> bool {
        self.enable_prefix_caching || !self.no_enable_prefix_caching
    }
}

/// One line with the settings in force, for whoever reads the log.
fn log_settings(args: &ServeArgs, state: &AppState) {
    let m = &state.model;
    tracing::info!(
        "serving {}{}; context {} tokens; prefix caching {}; default max_output_tokens {}; max {} sequences per step, {} waiting, {} per tenant; chat template {}",
        m.name,
        if m.aliases.is_empty() { String::new() } else { format!(" (also as {:?})", m.aliases) },
        m.context_length,
        if args.prefix_caching() { "on" } else { "off" },
        state.limits.default_output_tokens,
        args.max_num_seqs,
        args.max_waiting,
        state.limits.max_streams_per_tenant,
        args.served.chat_template.as_ref().map_or_else(|| "the model's".to_string(), |p| p.display().to_string()),
    );
}

/// The keys of `--api-key` and `--api-key-file`, with their tenants.
fn api_keys(args: &ServeArgs) -> anyhow::Result<ApiKeys> {
    let mut keys = ApiKeys::new(args.api_keys.clone());
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading --api-key-file {}: {e}", path.display()))?;
        keys = keys.with_file_contents(&text).map_err(|e| anyhow::anyhow!("--api-key-file {}: {e}", path.display()))?;
    }
    if keys.enabled() {
        tracing::info!("API keys required; {} tenants, each seeing only its own stored responses, tasks and cached prefixes", keys.tenant_count());
    }
    Ok(keys)
}

/// Loads the model on the chosen device and starts its scheduler.
fn start_engine(args: &ServeArgs) -> anyhow::Result<Started> {
    let opened = args.engine.open(None)?;
    let config = SchedulerConfig {
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_waiting: args.max_waiting,
        enable_prefix_caching: args.prefix_caching(),
        model_salt: model_salt(&opened.meta.location.path),
    };
    Ok(engine::start(opened, config))
}

/// How long in-flight responses may run after a shutdown signal before they
/// are failed with a terminal event.
const DRAIN_PERIOD: Duration = Duration::from_secs(20);

async fn serve(
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    state: Arc<AppState>,
    connections: ConnectionLimits,
    store_ttl: Duration,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    if let Some(metrics_addr) = metrics_addr {
        let metrics_listener = tokio::net::TcpListener::bind(metrics_addr).await?;
        tracing::info!("metrics on http://{}/metrics", metrics_listener.local_addr()?);
        let router = app::metrics_app(state.clone());
        tokio::spawn(net::serve(metrics_listener, router, connections, std::future::pending()));
    }
    spawn_store_expiry(state.clone(), store_ttl);
    let drain_state = state.clone();
    let signal = async move {
        shutdown_signal().await;
        tokio::spawn(async move {
            tokio::time::sleep(DRAIN_PERIOD).await;
            tracing::warn!("drain period over: failing in-flight responses");
            let _ = drain_state.draining.send(true);
        });
    };
    net::serve(listener, app::app(state), connections, signal).await;
    tracing::info!("shut down");
    Ok(())
}

/// Once a minute: expired responses, task event histories past retention, and old tasks.
fn spawn_store_expiry(state: Arc<AppState>, store_ttl: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            let store = state.store.clone();
            let now = unix_now();
            let events_cutoff = now.saturating_sub(i64::try_from(state.limits.task_event_retention.as_secs()).unwrap_or(i64::MAX));
            let tasks_cutoff = now.saturating_sub(i64::try_from(store_ttl.as_secs()).unwrap_or(i64::MAX));
            let result = tokio::task::spawn_blocking(move || Ok::<_, spindle_server::store::StoreError>((store.expire(now)?, store.expire_tasks(events_cutoff, tasks_cutoff)?))).await;
            match result {
                Ok(Ok((responses, histories))) if responses + histories > 0 => {
                    tracing::info!("expired {responses} stored responses and {histories} task event histories")
                }
                Ok(Err(e)) => tracing::warn!("store expiry failed: {e}"),
                _ => {}
            }
        }
    });
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down: no new connections; finishing in-flight responses");
}

fn store_path(args: &ServeArgs) -> PathBuf {
    args.store_path.clone().unwrap_or_else(|| cache_root().join("responses.sqlite3"))
}

fn open_store(args: &ServeArgs) -> anyhow::Result<Arc<dyn ResponseStore>> {
    let path = store_path(args);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let config = StoreConfig::new(Duration::from_secs(args.store_ttl_hours * 3600), args.store_max_responses);
    let store = SqliteStore::open(&path, config)?;
    let failed = store.mark_unfinished_failed()?;
    if failed > 0 {
        tracing::warn!("{failed} responses left unfinished by a previous run were marked failed");
    }
    let failed_tasks = store.fail_unfinished_tasks(unix_now())?;
    if failed_tasks > 0 {
        tracing::warn!("{failed_tasks} tasks left unfinished by a previous run were marked failed");
    }
    tracing::info!("response store: {}", path.display());
    Ok(Arc::new(store))
}

fn model_salt(path: &std::path::Path) -> u64 {
    let meta = std::fs::metadata(path).ok();
    let size = meta.as_ref().map_or(0, |m| m.len());
    let mtime = meta.and_then(|m| m.modified().ok()).and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    size ^ mtime.map_or(0, |d| d.as_secs()).rotate_left(32)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;

    #[test]
    fn every_serving_flag_has_an_environment_variable() {
        let command = ServeArgs::augment_args(clap::Command::new("serve"));
        let mut missing = Vec::new();
        // --config is expanded before clap runs; --enable-prefix-caching is
        // the default's switch, the environment turns it off with
        // SPINDLE_NO_ENABLE_PREFIX_CACHING.
        let exempt = ["config", "enable-prefix-caching"];
        for arg in command.get_arguments().filter(|a| a.get_long().is_some_and(|l| !exempt.contains(&l))) {
            match arg.get_env().and_then(|e| e.to_str()) {
                Some(env) if env.starts_with("SPINDLE_") => {}
                _ => missing.push(arg.get_id().to_string()),
            }
        }
        assert!(missing.is_empty(), "flags without a SPINDLE_* variable: {missing:?}");
    }

    /// `ServeArgs` parsed from `args` with `env` as the environment (clap
    /// reads the process environment, so the variables are given through
    /// each argument's own env default instead).
    fn parse(args: &[&str], env: &[(&'static str, &'static str)]) -> ServeArgs {
        let mut command = ServeArgs::augment_args(clap::Command::new("serve").no_binary_name(true));
        for &(name, value) in env {
            command = command.mut_args(|a| if a.get_env().and_then(|e| e.to_str()) == Some(name) { a.default_value(value) } else { a });
        }
        let matches = command.try_get_matches_from(args).unwrap_or_else(|e| panic!("{args:?} {env:?}: {e}"));
        ServeArgs::from_arg_matches(&matches).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn switches_take_1_and_true_and_the_command_line_wins_over_the_environment() {
        let off = [("SPINDLE_NO_ENABLE_PREFIX_CACHING", "1")];
        assert!(!parse(&[], &off).prefix_caching(), "=1 turns prefix caching off");
        assert!(parse(&["--enable-prefix-caching"], &off).prefix_caching(), "the command line wins");
        assert!(!parse(&["--enable-prefix-caching", "--no-enable-prefix-caching"], &[]).prefix_caching(), "the last flag wins");
        assert!(parse(&[], &[]).prefix_caching(), "on by default");
        assert!(parse(&[], &[("SPINDLE_ALLOW_UNAUTHENTICATED", "true")]).allow_unauthenticated);
        assert!(!parse(&["--allow-unauthenticated=false"], &[("SPINDLE_ALLOW_UNAUTHENTICATED", "true")]).allow_unauthenticated, "an explicit false wins");
    }
}
