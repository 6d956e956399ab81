//! [`MetricsSnapshot`]: the Prometheus text format, parsed.

use std::collections::BTreeMap;
use tq_core::{Error, Result};

/// The labels of one series, by name.
pub type Labels = BTreeMap<String, String>;

/// Metrics in the Prometheus text format, parsed: what a scrape returned, for tests, scripts
/// and programs that read their own metrics.
#[derive(Debug, Clone, Default)]
pub struct MetricsSnapshot {
    /// Series name → (sorted labels, value) of each series of that name.
    series: BTreeMap<String, Vec<(Labels, f64)>>,
}

impl MetricsSnapshot {
    /// Parses the text format (comments skipped). A line that is not a sample is an error
    /// naming it.
    pub fn parse(text: &str) -> Result<MetricsSnapshot> {
        let mut series: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || Error::invalid(format!("not a Prometheus sample line: `{line}`"));
            let (name, labels, rest) = match line.find('{') {
                Some(open) => {
                    let close = line.rfind('}').ok_or_else(bad)?;
                    (
                        &line[..open],
                        parse_labels(&line[open + 1..close]).ok_or_else(bad)?,
                        &line[close + 1..],
                    )
                }
                None => {
                    let (name, rest) = line.split_once(' ').ok_or_else(bad)?;
                    (name, BTreeMap::new(), rest)
                }
            };
            let value_text = rest.split_whitespace().next().ok_or_else(bad)?;
            let value = match value_text {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().map_err(|_| bad())?,
            };
            series
                .entry(name.to_string())
                .or_default()
                .push((labels, value));
        }
        Ok(MetricsSnapshot { series })
    }

    /// The value of the series `name` whose labels include every pair of `labels` (the first
    /// such series), or `None`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.series.get(name)?.iter().find_map(|(have, v)| {
            labels
                .iter()
                .all(|(k, want)| have.get(*k).is_some_and(|h| h == want))
                .then_some(*v)
        })
    }

    /// The sum over every series `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series.get(name).map_or(0.0, |all| {
            all.iter()
                .filter(|(have, _)| {
                    labels
                        .iter()
                        .all(|(k, want)| have.get(*k).is_some_and(|h| h == want))
                })
                .map(|(_, v)| v)
                .sum()
        })
    }

    /// Every label set of series `name`.
    pub fn label_sets(&self, name: &str) -> Vec<Labels> {
        self.series
            .get(name)
            .map(|all| all.iter().map(|(l, _)| l.clone()).collect())
            .unwrap_or_default()
    }

    /// Whether any series is called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.series.contains_key(name)
    }
}

/// `k="v",k2="v2"` → map, undoing the text format's escapes; `None` if malformed.
fn parse_labels(text: &str) -> Option<Labels> {
    let mut out = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let mut key = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key.trim().to_string(), value);
    }
}
