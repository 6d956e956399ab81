//! Shared payloads (`kv_link`): memory and read throughput of a GRPO step whose `n` responses
//! per prompt link to one stored prompt, next to the same step with private copies.

use crate::kv::deep_copy;
use crate::measure::{rss_bytes, Stats};
use std::time::Instant;
use tq_client::{Client, Config, LinkOptions};
use tq_core::{Batch, Bytes, Column, DType, Result, Tensor};

/// Figures of one run.
#[derive(Debug, Clone)]
pub struct LinkReport {
    pub prompts: usize,
    pub n: usize,
    pub prompt_bytes: usize,
    /// RSS growth (bytes) while the step is stored: private copies, then links.
    pub rss_private: Option<u64>,
    pub rss_linked: Option<u64>,
    /// Reading every response's prompt: private copies, then links.
    pub read_private: Stats,
    pub read_linked: Stats,
}

fn prompts(rows: usize, bytes: usize) -> Result<Batch> {
    let mut data = Vec::with_capacity(rows * bytes);
    for r in 0..rows {
        data.extend((0..bytes).map(|i| (i as u64 * 31 + r as u64) as u8));
    }
    Batch::from_columns([(
        "prompt",
        Column::Dense(Tensor::new(
            DType::U8,
            vec![rows, bytes],
            Bytes::from(data),
        )?),
    )])
}

fn growth(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

/// Stores `prompts` prompts of `prompt_bytes` with `n` responses each, once with a private
/// copy of the prompt per response and once with every response linked to its prompt.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    prompts_n: usize,
    n: usize,
    prompt_bytes: usize,
    reps: usize,
) -> Result<LinkReport> {
    let tq = Client::embedded(Config::default())?;
    let base = prompts(prompts_n, prompt_bytes)?;
    let responses: Vec<String> = (0..prompts_n * n).map(|i| format!("resp_{i}")).collect();
    let owner: Vec<usize> = (0..prompts_n * n).map(|i| i / n).collect();
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<Stats> {
        f()?;
        let mut v = Vec::new();
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            f()?;
            v.push(t.elapsed());
        }
        Ok(Stats::from_samples(v))
    };
    runtime
        .block_on(async {
            // Links first (small), so the private run's growth is not hidden by freed memory.
            let public: Vec<String> = (0..prompts_n).map(|i| format!("prompt_{i}")).collect();
            let before = rss_bytes().0;
            tq.partition("__public__")
                .kv_batch_put(&public, &deep_copy(&base)?, None)
                .await?;
            let targets: Vec<&str> = owner.iter().map(|&o| public[o].as_str()).collect();
            tq.partition("step")
                .kv_link(&responses, &targets, &["prompt"], &LinkOptions::default())
                .await?;
            let rss_linked = growth(before, rss_bytes().0);
            Ok::<_, tq_core::Error>(rss_linked)
        })
        .and_then(|rss_linked| {
            let read_linked = time(&mut || {
                let got = runtime.block_on(tq.partition("step").kv_batch_get(&responses, None))?;
                std::hint::black_box(got);
                Ok(())
            })?;
            runtime
                .block_on(async {
                    tq.partition("step").kv_clear(&responses).await?;
                    tq.partition("__public__")
                        .kv_clear_unlinked_public("")
                        .await?;
                    let before = rss_bytes().0;
                    let private = deep_copy(&base.select_rows(&owner)?)?;
                    tq.partition("step")
                        .kv_batch_put(&responses, &private, None)
                        .await?;
                    drop(private);
                    let rss_private = growth(before, rss_bytes().0);
                    Ok::<_, tq_core::Error>(rss_private)
                })
                .and_then(|rss_private| {
                    let read_private = time(&mut || {
                        let got = runtime
                            .block_on(tq.partition("step").kv_batch_get(&responses, None))?;
                        std::hint::black_box(got);
                        Ok(())
                    })?;
                    runtime.block_on(tq.partition("step").kv_clear(&responses))?;
                    Ok(LinkReport {
                        prompts: prompts_n,
                        n,
                        prompt_bytes,
                        rss_private,
                        rss_linked,
                        read_private,
                        read_linked,
                    })
                })
        })
}

impl LinkReport {
    /// Markdown lines.
    pub fn lines(&self) -> String {
        let mib = |b: Option<u64>| {
            b.map(|b| format!("{:.0} MiB", b as f64 / 1048576.0))
                .unwrap_or_else(|| "n/a".into())
        };
        let bytes = self.prompts * self.n * self.prompt_bytes;
        let g = |s: &Stats| s.gbit_per_s(bytes);
        format!(
            "| layout | RSS growth while stored | read all prompts, ms median (min–max) | Gbit/s delivered |\n|---|---|---|---|\n\
             | private copies | {} | {:.1} ({:.1}–{:.1}) | {:.2} |\n\
             | linked to {} public rows | {} | {:.1} ({:.1}–{:.1}) | {:.2} |",
            mib(self.rss_private),
            self.read_private.median.as_secs_f64() * 1e3,
            self.read_private.min.as_secs_f64() * 1e3,
            self.read_private.max.as_secs_f64() * 1e3,
            g(&self.read_private),
            self.prompts,
            mib(self.rss_linked),
            self.read_linked.median.as_secs_f64() * 1e3,
            self.read_linked.min.as_secs_f64() * 1e3,
            self.read_linked.max.as_secs_f64() * 1e3,
            g(&self.read_linked),
        )
    }
}
