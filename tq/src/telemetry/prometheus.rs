//! The state gauges of a [`DeploymentStatus`] in the Prometheus text format: the original
//! system's names (`tq_partitions_total`, `tq_partition_samples_total`, ..., `tq_storage_*`)
//! plus tq's (`tq_partition_leases_outstanding`, `tq_controller_waiting_fetches`, ...).
//! `docs/operations.md` lists each.

use std::fmt::Write as _;
use tq_client::DeploymentStatus;
use tq_core::telemetry::UnitStatus;

/// Escapes a label value for the text format (backslash, double quote, newline).
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Writes one metric family: `# HELP`, `# TYPE` and its samples. Families without samples are
/// left out entirely (so a metric whose label sets all vanished is gone from the scrape).
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    if samples.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The state gauges of `status` in the Prometheus text format: the original system's names
/// (`tq_partitions_total`, `tq_partition_samples_total`, ..., `tq_storage_*`) plus tq's
/// (`tq_partition_leases_outstanding`, `tq_controller_waiting_fetches`, ...). See
/// `docs/operations.md` for each.
pub fn render_status(status: &DeploymentStatus) -> String {
    let c = &status.controller;
    let mut out = String::new();
    let one = |v: f64| vec![(String::new(), v)];
    family(
        &mut out,
        "tq_controller_uptime_seconds",
        "gauge",
        "Seconds since the controller started.",
        &one(c.uptime_seconds),
    );
    if let Some(rss) = c.memory_rss_bytes {
        family(
            &mut out,
            "tq_controller_memory_rss_bytes",
            "gauge",
            "Resident memory of the controller process.",
            &one(rss as f64),
        );
    }
    family(
        &mut out,
        "tq_controller_connections",
        "gauge",
        "Open connections to the controller (0 embedded).",
        &one(c.connections as f64),
    );
    family(
        &mut out,
        "tq_controller_waiting_fetches",
        "gauge",
        "Fetches waiting for samples.",
        &one(c.waiting_fetches as f64),
    );
    family(
        &mut out,
        "tq_controller_leases_expired_total",
        "counter",
        "Leased samples whose lease expired unacknowledged (delivered again).",
        &one(c.leases_expired_total as f64),
    );
    family(
        &mut out,
        "tq_partitions_total",
        "gauge",
        "Partitions.",
        &one(c.partitions.len() as f64),
    );
    let mut samples = Vec::new();
    let mut production = Vec::new();
    let mut consumption = Vec::new();
    let mut leases = Vec::new();
    for p in &c.partitions {
        let id = p.name.as_str();
        samples.push((labels(&[("partition_id", id)]), p.samples as f64));
        // The original emits the overall production progress under "all" and every task.
        let progress = p.production_progress();
        production.push((
            labels(&[("partition_id", id), ("task_name", "all")]),
            progress,
        ));
        for t in &p.tasks {
            let task = t.name.as_str();
            let l = labels(&[("partition_id", id), ("task_name", task)]);
            production.push((l.clone(), progress));
            consumption.push((l.clone(), t.consumption_progress(p)));
            leases.push((l, t.leases as f64));
        }
    }
    family(
        &mut out,
        "tq_partition_samples_total",
        "gauge",
        "Visible samples of a partition (allocated and not being cleared).",
        &samples,
    );
    family(
        &mut out,
        "tq_partition_production_progress",
        "gauge",
        "Fraction of a partition's samples holding every field.",
        &production,
    );
    family(
        &mut out,
        "tq_partition_consumption_progress",
        "gauge",
        "Fraction of a partition's samples a task has consumed.",
        &consumption,
    );
    family(
        &mut out,
        "tq_partition_leases_outstanding",
        "gauge",
        "Samples a task holds under leases not yet acknowledged.",
        &leases,
    );
    family(
        &mut out,
        "tq_global_index_allocated_total",
        "gauge",
        "Sample indexes handed out and not released.",
        &one(c.index_allocated as f64),
    );
    family(
        &mut out,
        "tq_global_index_reusable_total",
        "gauge",
        "Released sample indexes waiting to be reused.",
        &one(c.index_reusable as f64),
    );
    render_units(&mut out, &status.units);
    out
}

/// The `tq_storage_*` gauges of `units` (label `storage_unit_id`).
pub fn render_units(out: &mut String, units: &[UnitStatus]) {
    // A unit that did not answer has no numbers to show (its zeros would look like a drop).
    let units: Vec<&UnitStatus> = units.iter().filter(|u| u.down.is_none()).collect();
    let per_unit = |value: &dyn Fn(&UnitStatus) -> Option<f64>| -> Vec<(String, f64)> {
        units
            .iter()
            .filter_map(|u| value(u).map(|v| (labels(&[("storage_unit_id", &u.id)]), v)))
            .collect()
    };
    family(
        out,
        "tq_storage_capacity_total",
        "gauge",
        "Capacity of a storage unit in samples (absent when unlimited).",
        &per_unit(&|u| u.capacity.map(|c| c as f64)),
    );
    family(
        out,
        "tq_storage_utilization_ratio",
        "gauge",
        "Samples held over capacity (absent when unlimited).",
        &per_unit(&|u| {
            u.capacity
                .filter(|&c| c > 0)
                .map(|c| u.rows as f64 / c as f64)
        }),
    );
    family(
        out,
        "tq_storage_active_keys_total",
        "gauge",
        "Samples with at least one cell in a storage unit.",
        &per_unit(&|u| Some(u.rows as f64)),
    );
    family(
        out,
        "tq_storage_cells_total",
        "gauge",
        "Cells (sample, field) held by a storage unit.",
        &per_unit(&|u| Some(u.cells as f64)),
    );
    family(
        out,
        "tq_storage_bytes",
        "gauge",
        "Payload bytes held by a storage unit, in memory or on disk.",
        &per_unit(&|u| Some(u.bytes as f64)),
    );
    family(
        out,
        "tq_storage_offloaded_bytes",
        "gauge",
        "Payload bytes a storage unit keeps on disk (SSD units).",
        &per_unit(&|u| Some(u.offloaded_bytes as f64)),
    );
    family(
        out,
        "tq_storage_memory_rss_bytes",
        "gauge",
        "Resident memory of the process hosting a storage unit.",
        &per_unit(&|u| u.memory_rss_bytes.map(|b| b as f64)),
    );
    let names: std::collections::BTreeSet<&String> =
        units.iter().flat_map(|u| u.counters.keys()).collect();
    for name in names {
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        // By Prometheus convention a counter's name ends in `_total`; the rest are gauges
        // (the memory unit's bytes waiting to be freed).
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        family(
            out,
            &format!("tq_storage_{name}"),
            kind,
            "A figure particular to one kind of storage unit.",
            &per_unit(&|u| u.counters.get(name).map(|&v| v as f64)),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::telemetry::MetricsSnapshot;
    use tq_controller::{ControllerStatus, PartitionStatus, TaskStatus};

    fn status() -> DeploymentStatus {
        DeploymentStatus {
            storage_backend: "simple".into(),
            controller: ControllerStatus {
                epoch: 7,
                uptime_seconds: 1.5,
                partitions: vec![PartitionStatus {
                    name: "train \"a\"".into(),
                    samples: 4,
                    produced: 3,
                    fields: 2,
                    keys: 0,
                    complete: false,
                    tasks: vec![TaskStatus {
                        name: "actor".into(),
                        consumed: 1,
                        leased: 1,
                        leases: 1,
                    }],
                }],
                index_allocated: 4,
                index_reusable: 2,
                ..Default::default()
            },
            units: vec![UnitStatus {
                id: "unit-0".into(),
                rows: 2,
                cells: 4,
                bytes: 100,
                capacity: Some(8),
                counters: [("ssd_fallback_values_total".to_string(), 3)].into(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn state_gauges_round_trip_through_the_text_format() {
        let text = render_status(&status());
        let m = MetricsSnapshot::parse(&text).unwrap();
        let p = ("partition_id", "train \"a\"");
        assert_eq!(m.value("tq_partitions_total", &[]), Some(1.0));
        assert_eq!(m.value("tq_partition_samples_total", &[p]), Some(4.0));
        for task in ["all", "actor"] {
            let got = m.value(
                "tq_partition_production_progress",
                &[p, ("task_name", task)],
            );
            assert_eq!(got, Some(0.75), "{task}");
        }
        let consumed = m.value(
            "tq_partition_consumption_progress",
            &[p, ("task_name", "actor")],
        );
        assert_eq!(consumed, Some(0.25));
        let unit = [("storage_unit_id", "unit-0")];
        assert_eq!(m.value("tq_storage_utilization_ratio", &unit), Some(0.25));
        assert_eq!(m.value("tq_storage_bytes", &unit), Some(100.0));
        let fallback = m.value("tq_storage_ssd_fallback_values_total", &unit);
        assert_eq!(fallback, Some(3.0));
        assert_eq!(m.value("tq_global_index_reusable_total", &[]), Some(2.0));
    }

    #[test]
    fn unlimited_units_have_no_capacity_series_and_no_partitions_no_partition_series() {
        let mut s = status();
        s.units[0].capacity = None;
        s.controller.partitions.clear();
        let m = MetricsSnapshot::parse(&render_status(&s)).unwrap();
        assert!(!m.has("tq_storage_capacity_total"));
        assert!(!m.has("tq_storage_utilization_ratio"));
        assert!(!m.has("tq_partition_samples_total"));
        assert_eq!(m.value("tq_partitions_total", &[]), Some(0.0));
    }

    #[test]
    fn malformed_lines_are_refused_by_name() {
        let e = MetricsSnapshot::parse("tq_x{a=\"1\" 3").unwrap_err();
        assert!(e.to_string().contains("tq_x"), "{e}");
        assert!(MetricsSnapshot::parse("just_a_name").is_err());
    }
}
