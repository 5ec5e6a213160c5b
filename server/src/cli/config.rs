//! `spindle serve --config FILE`: every serving flag from a file, as vLLM's
//! `--config`. The file is a flat list of `key = value` (TOML) or
//! `key: value` (YAML) lines, keys named as the flags without their dashes
//! (`max-num-seqs` or `max_num_seqs`); values are strings, numbers, booleans
//! or `[a, b]` lists. Flags on the command line win over the file (a flag
//! given there replaces every value the file gives it, lists included), and
//! the file over the environment.

use anyhow::{bail, Context};
use std::path::Path;

/// `args` with every `--config FILE` (or `--config=FILE`) after `serve`
/// replaced by the flags the file holds that the command line does not
/// give, placed right after `serve` (so the command line's flags come later).
pub fn expand(args: Vec<String>) -> anyhow::Result<Vec<String>> {
    let Some(serve) = args.iter().position(|a| a == "serve") else { return Ok(args) };
    let (mut out, mut rest, mut from_files) = (args[..=serve].to_vec(), Vec::new(), Vec::new());
    let mut tail = args[serve + 1..].iter();
    while let Some(arg) = tail.next() {
        let file = match arg.strip_prefix("--config=") {
            Some(file) => Some(file.to_string()),
            None if arg == "--config" => Some(tail.next().context("--config needs a file")?.clone()),
            None => None,
        };
        match file {
            Some(file) => from_files.extend(flags_of(Path::new(&file))?),
            None => rest.push(arg.clone()),
        }
    }
    let given: Vec<&str> = rest.iter().filter_map(|a| a.strip_prefix("--")).map(|a| a.split_once('=').map_or(a, |(name, _)| name)).collect();
    for (flag, value) in from_files {
        let name = flag[2..].split_once('=').map_or(&flag[2..], |(name, _)| name);
        if !given.contains(&name) {
            out.push(flag);
            out.extend(value);
        }
    }
    out.extend(rest);
    Ok(out)
}

/// The command-line flags a config file stands for: each flag with its value
/// (none for a boolean switch), a list giving one pair per item.
pub fn flags_of(path: &Path) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading --config {}", path.display()))?;
    parse(&text).with_context(|| format!("--config {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let mut flags = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line == "---" {
            continue;
        }
        let Some((key, value)) = split_key(line) else { bail!("line {}: expected `key = value` or `key: value`", n + 1) };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            bail!("line {}: {key:?} is not a flag name", n + 1);
        }
        if key == "config" {
            bail!("line {}: a config file cannot name another", n + 1);
        }
        let flag = format!("--{}", key.replace('_', "-"));
        let value = strip_comment(value.trim());
        match value {
            "true" => flags.push((flag, None)),
            // Explicit, so that the file's false wins over the environment's true.
            "false" => flags.push((format!("{flag}=false"), None)),
            list if list.starts_with('[') => {
                let inner = list.strip_suffix(']').with_context(|| format!("line {}: unclosed list", n + 1))?;
                for item in inner[1..].split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    flags.push((flag.clone(), Some(unquote(item).to_string())));
                }
            }
            scalar => flags.push((flag, Some(unquote(scalar).to_string()))),
        }
    }
    Ok(flags)
}

/// `key = value` or `key: value` (the first `=` or `:` outside quotes).
fn split_key(line: &str) -> Option<(&str, &str)> {
    let at = line.find(['=', ':'])?;
    Some((line[..at].trim(), &line[at + 1..]))
}

/// A value without a trailing `# comment` (outside quotes).
fn strip_comment(value: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(end) = value.strip_prefix(q).and_then(|v| v.find(q)) {
            return &value[..end + 2];
        }
    }
    value.split_once(" #").map_or(value, |(v, _)| v.trim_end())
}

fn unquote(value: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = value.strip_prefix(q).and_then(|v| v.strip_suffix(q)) {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn flat(text: &str) -> anyhow::Result<Vec<String>> {
        Ok(parse(text)?.into_iter().flat_map(|(flag, value)| std::iter::once(flag).chain(value)).collect())
    }

    #[test]
    fn toml_and_yaml_lines_become_flags() -> anyhow::Result<()> {
        let toml = "# serving\nport = 9000\nserved_model_name = [\"a\", \"b\"]\nno-enable-prefix-caching = true\nallow_unauthenticated = false\nhost = \"0.0.0.0\" # all\n";
        assert_eq!(flat(toml)?, strings(&["--port", "9000", "--served-model-name", "a", "--served-model-name", "b", "--no-enable-prefix-caching", "--allow-unauthenticated=false", "--host", "0.0.0.0"]));
        let yaml = "---\nmax-num-seqs: 8\nchat_template: '/tmp/t.jinja'\n";
        assert_eq!(flat(yaml)?, strings(&["--max-num-seqs", "8", "--chat-template", "/tmp/t.jinja"]));
        assert!(parse("just words\n").is_err());
        assert!(parse("config = other.toml\n").is_err());
        Ok(())
    }

    #[test]
    fn the_command_line_comes_after_the_file_and_wins() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("spindle-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("c.toml");
        std::fs::write(&file, "port = 9000\napi-key = [file1, file2]\nhost = h\n")?;
        let path = file.to_str().unwrap_or_default();
        let args = strings(&["spindle", "serve", "--port", "1", "--config", path]);
        assert_eq!(expand(args)?, strings(&["spindle", "serve", "--api-key", "file1", "--api-key", "file2", "--host", "h", "--port", "1"]));
        // A list on the command line replaces the file's list: no key of the file stays valid.
        let args = strings(&["spindle", "serve", "--config", path, "--api-key=cli", "--host", "x"]);
        assert_eq!(expand(args)?, strings(&["spindle", "serve", "--port", "9000", "--api-key=cli", "--host", "x"]));
        assert_eq!(expand(strings(&["spindle", "models"]))?, strings(&["spindle", "models"]));
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
