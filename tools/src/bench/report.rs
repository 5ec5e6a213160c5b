//! Results: the JSON document (schema version 1), the terminal table, and
//! the self-contained HTML report comparing one or more runs.

use super::args::Args;
use super::plots::{cdf_points, line_chart, ChartSpec, Scale, Series, Unit};
use super::run::LevelResult;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Version of the JSON layout; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// One run of `spindle-bench`: what was asked and what was measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Label for tables and charts.
    pub label: String,
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
    /// The flags (API key omitted).
    pub args: Args,
    /// One entry per load level.
    pub levels: Vec<LevelResult>,
}

fn level_name(l: &LevelResult) -> String {
    match l.level.rate {
        Some(r) => format!("rate {r}/s (cap {})", l.level.concurrency),
        None => format!("c={}", l.level.concurrency),
    }
}

/// The terminal table (Markdown, so it can be pasted into a README).
pub fn table(run: &RunResult) -> String {
    let mut out = format!("{}\n\n", run.label);
    out.push_str("| load | ok | errors | req/s | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT mean ms | E2E p50 ms | goodput req/s | cache hit |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for l in &run.levels {
        let a = &l.aggregates;
        let errors: usize = a.errors.values().sum();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {:.1} | {:.0} / {:.0} | {:.1} / {:.1} | {:.1} | {:.0} | {:.2} | {:.0}% |",
            level_name(l),
            a.completed,
            errors,
            a.request_s,
            a.output_tok_s,
            a.ttft_ms.p50,
            a.ttft_ms.p99,
            a.itl_ms.p50,
            a.itl_ms.p99,
            a.tpot_ms.mean,
            a.e2e_ms.p50,
            a.goodput,
            a.cache_hit_rate * 100.0
        );
    }
    for l in run.levels.iter().filter(|l| !l.aggregates.cache_hit_rate_by_turn.is_empty()) {
        let turns: Vec<String> = l.aggregates.cache_hit_rate_by_turn.iter().map(|r| format!("{:.0}%", r * 100.0)).collect();
        let _ = writeln!(out, "\n{}: prefix-cache hit rate by turn: {}", level_name(l), turns.join(", "));
    }
    for l in run.levels.iter().filter(|l| !l.aggregates.errors.is_empty()) {
        let _ = writeln!(out, "\n{}: errors {:?}", level_name(l), l.aggregates.errors);
    }
    out
}

/// The HTML report: throughput vs concurrency, TTFT vs rate, latency CDFs
/// (log-scaled latency axes), tables.
pub fn html(runs: &[RunResult]) -> Result<String, String> {
    let mut charts = Vec::new();
    let closed: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            label: r.label.clone(),
            points: r.levels.iter().filter(|l| l.level.rate.is_none()).map(|l| (l.level.concurrency as f64, l.aggregates.output_tok_s)).collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    if !closed.is_empty() {
        let spec = ChartSpec {
            title: "Output throughput vs concurrency",
            x_desc: "concurrent requests",
            y_desc: "output throughput",
            x_scale: Scale::Linear,
            x_unit: Unit::Count,
            y_unit: Unit::PerSecond("tok"),
        };
        charts.push(line_chart(&spec, &closed)?);
    }
    let open: Vec<Series> = runs
        .iter()
        .flat_map(|r| {
            let points = |p99: bool| -> Vec<(f64, f64)> {
                r.levels
                    .iter()
                    .filter_map(|l| l.level.rate.map(|rate| (rate, if p99 { l.aggregates.ttft_ms.p99 } else { l.aggregates.ttft_ms.p50 })))
                    .collect()
            };
            [Series { label: format!("{} p50", r.label), points: points(false) }, Series { label: format!("{} p99", r.label), points: points(true) }]
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    if !open.is_empty() {
        let spec = ChartSpec {
            title: "TTFT vs request rate",
            x_desc: "request rate",
            y_desc: "TTFT",
            x_scale: Scale::Linear,
            x_unit: Unit::PerSecond("req"),
            y_unit: Unit::Ms,
        };
        charts.push(line_chart(&spec, &open)?);
    }
    for (name, pick) in [("TTFT", 0), ("ITL", 1), ("E2E", 2)] {
        let series: Vec<Series> = runs
            .iter()
            .flat_map(|r| {
                r.levels.iter().map(move |l| {
                    let ok = l.records.iter().filter(|x| x.error.is_none());
                    let values: Vec<f64> = match pick {
                        0 => ok.filter_map(|x| x.ttft_ms).collect(),
                        1 => ok.flat_map(|x| x.itl_ms.iter().copied()).collect(),
                        _ => ok.map(|x| x.e2e_ms).collect(),
                    };
                    Series { label: format!("{} {}", r.label, level_name(l)), points: cdf_points(&values) }
                })
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if !series.is_empty() {
            let (title, x_desc) = (format!("{name} CDF"), format!("{name} (log scale)"));
            let spec = ChartSpec { title: &title, x_desc: &x_desc, y_desc: "requests at or below", x_scale: Scale::Log, x_unit: Unit::Ms, y_unit: Unit::Fraction };
            charts.push(line_chart(&spec, &series)?);
        }
    }
    let mut page = String::from("<!doctype html><html><head><meta charset=\"utf-8\"><title>spindle-bench report</title>");
    page.push_str("<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}figure{margin:1em 0}</style></head><body><h1>spindle-bench report</h1>");
    for run in runs {
        let _ = write!(page, "<h2>{}</h2><p>started {} · api {:?} · output_len {} · input_len {}</p>", escape(&run.label), escape(&run.started_at), run.args.api, run.args.output_len, run.args.input_len);
        page.push_str(&markdown_table_to_html(&table(run)));
    }
    for svg in charts {
        let _ = write!(page, "<figure>{svg}</figure>");
    }
    page.push_str("</body></html>\n");
    Ok(page)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn markdown_table_to_html(md: &str) -> String {
    let mut out = String::from("<table>");
    let mut extra = String::new();
    for line in md.lines() {
        if line.starts_with("| ---") {
            continue;
        }
        if let Some(row) = line.strip_prefix('|') {
            out.push_str("<tr>");
            for cell in row.trim_end_matches('|').split('|') {
                let _ = write!(out, "<td>{}</td>", escape(cell.trim()));
            }
            out.push_str("</tr>");
        } else if !line.trim().is_empty() {
            let _ = write!(extra, "<p>{}</p>", escape(line));
        }
    }
    out.push_str("</table>");
    out + &extra
}
