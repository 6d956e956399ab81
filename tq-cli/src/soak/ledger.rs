//! What the soak's worker processes did, written as they do it and read back by the soak.
//!
//! A worker can be killed at any instruction, so it writes each step to its log *before* and
//! *after* the step takes effect: `P` before a put and `p` after it succeeded; `F` before an
//! acknowledgement and, after it, `A` (acknowledged), `L` (acknowledged as lost: the read
//! failed for missing data), `a` (acknowledged in part, or outcome unknown) or `N` (nothing
//! acknowledged: the lease had ended and the samples are another consumer's to settle). A
//! killed worker's last `P` or `F` without its ending is
//! "in doubt" (the step may or may not have taken effect), and the checks accept either outcome
//! for exactly those samples and no others. Each line is one `write` to a file opened for
//! appending, so a kill never leaves half a line that is taken for a whole one.
//!
//! Stream samples are named by id: `(worker << 40) | sequence`, so every incarnation of every
//! worker writes ids of its own, and the ledger keeps one byte of state per produced sample.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tq_core::{Error, Result};

/// Bits of the ledger's state of one stream sample.
const PUT_PENDING: u8 = 1;
const PRODUCED: u8 = 2;
const ACKED: u8 = 4;
const LOST: u8 = 8;
const ACK_IN_DOUBT: u8 = 16;

const SEQUENCE_BITS: u32 = 40;

/// The id of the `seq`-th sample of worker `worker`.
pub fn sample_id(worker: u64, seq: u64) -> i64 {
    ((worker << SEQUENCE_BITS) | seq) as i64
}

fn split_id(id: i64) -> (u64, usize) {
    let id = id as u64;
    (
        id >> SEQUENCE_BITS,
        (id & ((1 << SEQUENCE_BITS) - 1)) as usize,
    )
}

/// A worker's log: one line per write.
pub struct Log {
    file: Mutex<File>,
}

impl Log {
    pub fn create(path: &Path) -> Result<Log> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| {
                Error::internal(format!("cannot open the soak log {}", path.display()))
                    .with_source(e)
            })?;
        Ok(Log {
            file: Mutex::new(file),
        })
    }

    /// Appends `line` (one `write`; an error here is reported on stderr, as the worker has
    /// nowhere else to say it).
    pub fn line(&self, line: &str) {
        let mut text = String::with_capacity(line.len() + 1);
        text.push_str(line);
        text.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(text.as_bytes()) {
            eprintln!("soak worker: cannot write its log: {e}");
        }
    }
}

/// `ids` as ranges: `3-7,9`.
pub fn format_ids(ids: &[i64]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

fn parse_ids(text: &str) -> Option<Vec<i64>> {
    let mut ids = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => ids.extend(a.parse::<i64>().ok()?..=b.parse::<i64>().ok()?),
            None => ids.push(part.parse().ok()?),
        }
    }
    Some(ids)
}

/// Reads the complete lines a file gained since the last call.
struct Tail {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl Tail {
    fn new_lines(&mut self) -> Vec<String> {
        let Ok(mut file) = File::open(&self.path) else {
            return Vec::new();
        };
        let mut text = String::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err()
            || file.read_to_string(&mut text).is_err()
        {
            return Vec::new();
        }
        self.offset += text.len() as u64;
        self.partial.push_str(&text);
        let Some(last_newline) = self.partial.rfind('\n') else {
            return Vec::new();
        };
        let rest = self.partial.split_off(last_newline + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        complete.lines().map(str::to_string).collect()
    }
}

/// One worker log being read, and the steps it has begun and not yet ended: a worker's
/// producer and consumer run side by side, each one step at a time.
struct Source {
    tail: Tail,
    put: Option<Vec<i64>>,
    ack: Option<Vec<i64>>,
}

/// Totals and the first broken invariants, across every worker log.
#[derive(Default)]
pub struct Ledger {
    sources: BTreeMap<PathBuf, Source>,
    /// Stream samples by worker: one state byte per sequence number.
    samples: BTreeMap<u64, Vec<u8>>,
    pub errors: BTreeMap<String, u64>,
    pub mismatches: u64,
    pub violations: Vec<String>,
    pub kv_rounds: u64,
    pub kv_rows_verified: u64,
    pub kv_rows_lost: u64,
    pub stream_lost: u64,
}

impl Ledger {
    /// Starts reading a worker's log (its file need not exist yet).
    pub fn watch(&mut self, path: PathBuf) {
        self.sources.insert(
            path.clone(),
            Source {
                tail: Tail {
                    path,
                    offset: 0,
                    partial: String::new(),
                },
                put: None,
                ack: None,
            },
        );
    }

    fn violation(&mut self, what: String) {
        // The first hundred say what went wrong; the count says how often.
        if self.violations.len() < 100 {
            self.violations.push(what);
        }
        *self.errors.entry("VIOLATIONS".into()).or_default() += 1;
    }

    fn state(&mut self, id: i64) -> &mut u8 {
        let (worker, seq) = split_id(id);
        let states = self.samples.entry(worker).or_default();
        if states.len() <= seq {
            states.resize(seq + 1, 0);
        }
        &mut states[seq]
    }

    /// Reads what every log gained since the last call.
    pub fn ingest(&mut self) {
        let paths: Vec<PathBuf> = self.sources.keys().cloned().collect();
        for path in paths {
            let lines = match self.sources.get_mut(&path) {
                Some(source) => source.tail.new_lines(),
                None => continue,
            };
            for line in lines {
                self.apply(&path, &line);
            }
        }
    }

    fn apply(&mut self, path: &Path, line: &str) {
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        // A step's begin (`P`, `F`) is pending until its end (`p`/`x`, `A`/`a`/`L`).
        let source = self.sources.get_mut(path);
        let pending = match (tag, source) {
            ("p" | "x", Some(source)) => source.put.take(),
            ("A" | "a" | "L" | "N", Some(source)) => source.ack.take(),
            _ => None,
        };
        match tag {
            // Stream producer: a put begins, succeeded, failed.
            "P" | "F" => {
                let Some(ids) = parse_ids(rest) else {
                    return self.violation(format!("{}: unreadable line `{line}`", path.display()));
                };
                if tag == "P" {
                    for &id in &ids {
                        *self.state(id) |= PUT_PENDING;
                    }
                }
                if let Some(source) = self.sources.get_mut(path) {
                    if tag == "P" {
                        source.put = Some(ids);
                    } else {
                        source.ack = Some(ids);
                    }
                }
            }
            "p" => {
                for id in pending.unwrap_or_default() {
                    *self.state(id) |= PRODUCED;
                }
            }
            // A put that failed for good may still have taken effect (a timeout after the
            // controller applied it): its samples stay "put pending", so consuming them is
            // accepted and not consuming them is too.
            "x" => *self.errors.entry(format!("put: {rest}")).or_default() += 1,
            // Stream consumer: acknowledged, acknowledged in part, reported lost.
            "A" => {
                for id in pending.unwrap_or_default() {
                    let state = self.state(id);
                    let twice = *state & ACKED != 0;
                    *state |= ACKED;
                    if twice {
                        self.violation(format!("sample {id} consumed twice"));
                    }
                }
            }
            "a" => {
                for id in pending.unwrap_or_default() {
                    *self.state(id) |= ACK_IN_DOUBT;
                }
            }
            // Not this worker's to settle: its lease had ended; whoever holds them settles them.
            "N" => {}
            "L" => {
                let ids = pending.unwrap_or_default();
                self.stream_lost += ids.len() as u64;
                for id in ids {
                    *self.state(id) |= LOST;
                }
                *self.errors.entry(format!("read: {rest}")).or_default() += 1;
            }
            // KV worker: a round done, rows verified, rows reported lost.
            "R" => self.kv_rounds += 1,
            "G" => self.kv_rows_verified += rest.parse::<u64>().unwrap_or(0),
            "KL" => {
                let (n, kind) = rest.split_once(' ').unwrap_or((rest, ""));
                self.kv_rows_lost += n.parse::<u64>().unwrap_or(0);
                *self.errors.entry(format!("kv read: {kind}")).or_default() += 1;
            }
            "E" => *self.errors.entry(rest.to_string()).or_default() += 1,
            "M" => {
                self.mismatches += 1;
                self.violation(format!("content mismatch: {rest}"));
            }
            "V" => self.violation(rest.to_string()),
            _ => self.violation(format!("{}: unknown line `{line}`", path.display())),
        }
    }

    /// A worker was killed: whatever step its logs had begun may or may not have taken effect.
    pub fn killed(&mut self, paths: &[PathBuf]) {
        self.ingest();
        for path in paths {
            // A put begun and not ended stays "put pending"; an acknowledgement is in doubt.
            let pending = self.sources.get_mut(path).and_then(|s| s.ack.take());
            for id in pending.unwrap_or_default() {
                *self.state(id) |= ACK_IN_DOUBT;
            }
        }
    }

    /// Samples produced, acknowledged and reported lost so far.
    pub fn stream_totals(&self) -> (u64, u64, u64) {
        let mut produced = 0;
        let mut consumed = 0;
        for states in self.samples.values() {
            for s in states {
                produced += u64::from(s & PRODUCED != 0);
                consumed += u64::from(s & ACKED != 0);
            }
        }
        (produced, consumed, self.stream_lost)
    }

    /// The end-of-run checks of the stream samples: every sample produced was consumed once or
    /// reported lost, and nothing was consumed that was not (or might not have been) produced.
    /// Returns the samples produced and never accounted for (for a closer look).
    pub fn check_streams(&mut self) -> Vec<i64> {
        let mut unaccounted = Vec::new();
        let mut broken = Vec::new();
        for (&worker, states) in &self.samples {
            for (seq, &s) in states.iter().enumerate() {
                let id = sample_id(worker, seq as u64);
                if s & ACKED != 0 && s & (PRODUCED | PUT_PENDING) == 0 {
                    broken.push(format!("sample {id} consumed but never produced"));
                }
                if s & PRODUCED != 0 && s & (ACKED | LOST | ACK_IN_DOUBT) == 0 {
                    unaccounted.push(id);
                    broken.push(format!(
                        "sample {id} produced, then neither consumed nor reported lost"
                    ));
                }
                if s & ACKED != 0 && s & LOST != 0 {
                    broken.push(format!("sample {id} consumed and also reported lost"));
                }
            }
        }
        for b in broken {
            self.violation(b);
        }
        unaccounted
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_round_trip_as_ranges() {
        let ids = vec![9, 3, 4, 5, 7, 6, 12];
        assert_eq!(format_ids(&ids), "3-7,9,12");
        assert_eq!(parse_ids("3-7,9,12").unwrap(), vec![3, 4, 5, 6, 7, 9, 12]);
        assert_eq!(parse_ids("").unwrap(), Vec::<i64>::new());
        assert!(parse_ids("3-x").is_none());
    }

    fn ledger_of(lines: &[&str]) -> (Ledger, PathBuf, tempfile_dir::Dir) {
        let dir = tempfile_dir::Dir::new();
        let path = dir.0.join("w.log");
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let mut ledger = Ledger::default();
        ledger.watch(path.clone());
        ledger.ingest();
        (ledger, path, dir)
    }

    /// A throwaway directory (the CLI has no tempfile dependency).
    mod tempfile_dir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let n = std::sync::atomic::AtomicU64::new(0);
                let path = std::env::temp_dir().join(format!(
                    "tq-ledger-{}-{:?}-{}",
                    std::process::id(),
                    std::thread::current().id(),
                    n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn a_sample_consumed_twice_or_never_is_a_violation() {
        let (mut l, _, _d) = ledger_of(&["P 0-3", "p", "F 0-1", "A", "F 1-2", "A"]);
        l.check_streams();
        assert!(l.violations.iter().any(|v| v == "sample 1 consumed twice"));
        assert!(l
            .violations
            .iter()
            .any(|v| v.starts_with("sample 3 produced, then neither")));
        assert_eq!(l.stream_totals(), (4, 3, 0));
    }

    #[test]
    fn a_late_consumer_whose_lease_ended_settles_nothing() {
        // Worker 1 read sample 2 too late (lease over, another consumer acknowledged it and
        // cleared it): not lost, not consumed twice.
        let (mut l, _, _d) = ledger_of(&["P 0-3", "p", "F 0-3", "A", "F 2", "N"]);
        l.check_streams();
        assert!(l.violations.is_empty(), "{:?}", l.violations);
        assert_eq!(l.stream_totals(), (4, 4, 0));
    }

    #[test]
    fn a_producers_and_a_consumers_steps_interleave_in_one_log() {
        let (mut l, _, _d) = ledger_of(&["P 0-1", "F 7", "E ack (retried): Timeout", "p", "A"]);
        assert_eq!(l.stream_totals(), (2, 1, 0));
        l.check_streams();
        // 7 was consumed without a put naming it; 0-1 were not consumed yet.
        assert_eq!(l.violations.len(), 3, "{:?}", l.violations);
    }

    #[test]
    fn a_killed_workers_begun_steps_are_in_doubt_and_nothing_else() {
        // Consumed 0-1; began acknowledging 2-3 and was killed: in doubt, not lost.
        let (mut l, path, _d) = ledger_of(&["P 0-3", "p", "F 0-1", "A", "F 2-3"]);
        l.killed(&[path]);
        l.check_streams();
        assert!(l.violations.is_empty(), "{:?}", l.violations);
        // Without the kill, 2-3 would be unaccounted for.
        let (mut l, _, _d) = ledger_of(&["P 0-3", "p", "F 0-1", "A", "F 2-3"]);
        l.check_streams();
        assert_eq!(l.violations.len(), 2, "{:?}", l.violations);
    }

    #[test]
    fn a_failed_put_is_in_doubt_and_lost_samples_are_counted() {
        let (mut l, _, _d) = ledger_of(&[
            "P 0-1",
            "x Unavailable",
            "P 2-3",
            "p",
            "F 2-3",
            "L DataLost",
        ]);
        l.check_streams();
        assert!(l.violations.is_empty(), "{:?}", l.violations);
        assert_eq!(l.stream_totals(), (2, 0, 2));
        assert_eq!(l.errors.get("put: Unavailable"), Some(&1));
        // Consuming a sample no put ever named is a violation.
        let (mut l, _, _d) = ledger_of(&["P 0-1", "p", "F 5", "A"]);
        l.check_streams();
        assert!(
            l.violations
                .iter()
                .any(|v| v == "sample 5 consumed but never produced"),
            "{:?}",
            l.violations
        );
    }
}
