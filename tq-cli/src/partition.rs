//! `tq partition`: look after a running deployment's partitions — list them, clear their
//! samples, drop them, mark them complete, reset what a task consumed.

use crate::deployment::DeploymentArgs;
use clap::{Args, Subcommand};
use tq_core::{Error, Result};

#[derive(Args, Debug)]
pub struct PartitionArgs {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    deployment: DeploymentArgs,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// One line per partition: samples, produced, keys, complete, and per task what it
    /// consumed and holds leased.
    List {
        /// One JSON object per partition instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Clear every sample of the partitions (their payloads are deleted from storage). A
    /// complete partition stays, with its mark and what its tasks consumed; an incomplete one
    /// left empty goes, as after any clear.
    Clear {
        #[arg(required = true)]
        partitions: Vec<String>,
    },
    /// Clear every sample of the partitions and remove them (completion mark, consumption and
    /// sampler state too). A partition that does not exist is skipped.
    Drop {
        #[arg(required = true)]
        partitions: Vec<String>,
    },
    /// Mark the partitions complete: no more samples come, and consumers end once they have
    /// consumed them all.
    Complete {
        #[arg(required = true)]
        partitions: Vec<String>,
    },
    /// Make the partition's samples unconsumed again for one task (`--task`) or for all.
    ResetConsumption {
        partition: String,
        /// Only this task (default: every task).
        #[arg(long)]
        task: Option<String>,
    },
}

pub async fn run(args: PartitionArgs) -> Result<()> {
    let tq = args.deployment.connect().await?;
    let known = tq.list_partitions().await?;
    // Clear, complete and reset name partitions that must exist: a typo is an error, not a
    // partition created empty or a silent no-op.
    let existing = |name: &str| -> Result<()> {
        if known.iter().any(|k| k == name) {
            Ok(())
        } else {
            Err(Error::not_found(format!(
                "partition `{name}` does not exist (`tq partition list` shows the {} there are)",
                known.len()
            )))
        }
    };
    match args.action {
        Action::List { json } => {
            let status = tq.status().await?;
            let partitions = &status.controller.partitions;
            if json {
                for p in partitions {
                    let line = serde_json::to_string(p)
                        .map_err(|e| Error::internal(format!("cannot encode a partition: {e}")))?;
                    println!("{line}");
                }
            } else {
                print!("{}", table(partitions));
            }
        }
        Action::Clear { partitions } => {
            for name in &partitions {
                existing(name)?;
            }
            for name in &partitions {
                let before = samples_in(&tq, name).await?;
                tq.partition(name.as_str()).clear_samples().await?;
                println!("cleared {before} samples of partition `{name}`");
            }
        }
        Action::Drop { partitions } => {
            for name in &partitions {
                if !known.contains(name) {
                    println!("partition `{name}` does not exist; skipped");
                    continue;
                }
                let before = samples_in(&tq, name).await?;
                tq.partition(name.as_str()).clear().await?;
                println!("dropped partition `{name}` ({before} samples cleared)");
            }
        }
        Action::Complete { partitions } => {
            for name in &partitions {
                existing(name)?;
            }
            for name in &partitions {
                tq.partition(name.as_str()).complete().await?;
                println!("partition `{name}` is complete");
            }
        }
        Action::ResetConsumption { partition, task } => {
            existing(&partition)?;
            let p = tq.partition(partition.as_str());
            match &task {
                Some(task) => p.reset_consumption(task).await?,
                None => p.reset_all_consumption().await?,
            }
            let whom = task.map_or("every task".to_string(), |t| format!("task `{t}`"));
            println!("consumption of partition `{partition}` reset for {whom}");
        }
    }
    Ok(())
}

async fn samples_in(tq: &tq_client::Client, name: &str) -> Result<u64> {
    let status = tq.status().await?;
    Ok(status
        .controller
        .partitions
        .iter()
        .find(|p| p.name == name)
        .map_or(0, |p| p.samples))
}

/// The partitions as an aligned table.
fn table(partitions: &[tq_controller::PartitionStatus]) -> String {
    let mut rows = vec![[
        "PARTITION".to_string(),
        "SAMPLES".into(),
        "PRODUCED".into(),
        "KEYS".into(),
        "COMPLETE".into(),
        "TASKS (consumed/leased)".into(),
    ]];
    for p in partitions {
        let tasks: Vec<String> = p
            .tasks
            .iter()
            .map(|t| format!("{}={}/{}", t.name, t.consumed, t.leased))
            .collect();
        rows.push([
            p.name.clone(),
            p.samples.to_string(),
            p.produced.to_string(),
            p.keys.to_string(),
            if p.complete { "yes" } else { "no" }.into(),
            if tasks.is_empty() {
                "-".into()
            } else {
                tasks.join(" ")
            },
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if partitions.is_empty() {
        out.push_str("(no partitions)\n");
    }
    out
}
