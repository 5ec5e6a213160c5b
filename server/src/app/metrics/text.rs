//! The Prometheus text format (0.0.4), for scrapers that ask for it or ask
//! for nothing: vLLM serves this format, and gateways that route by vLLM's
//! metrics often parse only it. It is derived from the OpenMetrics text
//! `prometheus-client` writes: a counter's family takes its sample's name
//! (`…_total`), an info metric becomes a gauge named `…_info`, and the
//! `# UNIT` and `# EOF` lines go.

/// The 0.0.4 format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// `openmetrics` (as `prometheus-client` encodes it) in the 0.0.4 format.
pub fn from_openmetrics(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if line.starts_with("# HELP ") {
            // Written once the TYPE line below says what the family is called.
            help = Some(line);
            continue;
        }
        if let Some(family) = line.strip_prefix("# TYPE ") {
            let (name, kind) = family.rsplit_once(' ').unwrap_or((family, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                other => (name.to_string(), other),
            };
            if let Some(text) = help.take().and_then(|h| h.strip_prefix("# HELP ")).and_then(|h| h.split_once(' ')) {
                out.push_str(&format!("# HELP {name} {}\n", text.1));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENMETRICS: &str = "# HELP vllm:prompt_tokens Prompt tokens processed.\n# TYPE vllm:prompt_tokens counter\n\
vllm:prompt_tokens_total{model_name=\"m\"} 7\n\
# HELP vllm:cache_config The KV cache's configuration.\n# TYPE vllm:cache_config info\n\
vllm:cache_config_info{model_name=\"m\",block_size=\"16\"} 1\n\
# HELP spindle_ttft_seconds Time to first token.\n# TYPE spindle_ttft_seconds histogram\n# UNIT spindle_ttft_seconds seconds\n\
spindle_ttft_seconds_sum 0.5\nspindle_ttft_seconds_count 1\n\
# HELP vllm:num_requests_waiting Waiting.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 3\n# EOF\n";

    #[test]
    fn counters_and_infos_are_named_as_their_samples_and_openmetrics_lines_go() {
        let text = from_openmetrics(OPENMETRICS);
        assert!(text.contains("# HELP vllm:prompt_tokens_total Prompt tokens processed.\n# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"m\"} 7\n"), "{text}");
        assert!(text.contains("# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{model_name=\"m\",block_size=\"16\"} 1\n"), "{text}");
        assert!(text.contains("# TYPE spindle_ttft_seconds histogram\nspindle_ttft_seconds_sum 0.5\n"), "{text}");
        assert!(text.contains("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 3\n"), "{text}");
        assert!(!text.contains("# UNIT") && !text.contains("# EOF"), "{text}");
    }

    #[test]
    fn only_an_accept_naming_openmetrics_gets_it() {
        assert!(wants_openmetrics(Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}
