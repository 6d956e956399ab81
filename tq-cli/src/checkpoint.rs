//! `tq checkpoint save|load DIR --controller URL`: checkpoints of a running deployment: the
//! controller's state, with the cells of its storage units copied, and KV payloads left in
//! their store or, with `--copy-payloads`, copied too (see `tq_client`'s checkpoint module).

use clap::{Args, Subcommand};
use tq::checkpoint::{CheckpointManifest, CheckpointOptions, Checkpoints};
use tq_client::Client;
use tq_core::Result;

#[derive(Args, Debug)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Save the controller's whole state and the storage units' cells (to `DIR`, `file://DIR`
    /// or `s3://bucket/prefix`).
    Save {
        #[command(flatten)]
        target: Target,
        /// Copy KV payloads into the checkpoint too (by default they stay in their store and
        /// the checkpoint reattaches to them). Clears and overwrites wait while they are read.
        #[arg(long)]
        copy_payloads: bool,
    },
    /// Restore a checkpoint into a controller that holds nothing yet (and empty storage units).
    Load(Target),
}

#[derive(Args, Debug)]
struct Target {
    /// Where the checkpoint lives: a directory (a path or `file://DIR`), or `s3://bucket/prefix`
    /// (a tq built with feature `s3`; credentials from the `AWS_*` environment).
    dir: String,
    #[command(flatten)]
    deployment: crate::deployment::DeploymentArgs,
}

impl Target {
    async fn client(&self) -> Result<Client> {
        self.deployment.connect().await
    }
}

fn report(what: &str, m: &CheckpointManifest) {
    println!(
        "{what} checkpoint: epoch {}, {} partitions, {} samples, {} keys, {} leases; storage {}",
        m.epoch, m.counts.partitions, m.counts.samples, m.counts.keys, m.counts.leases, m.storage
    );
    if !m.units.is_empty() {
        println!(
            "  cells of {} storage units: {} cells, {} bytes",
            m.units.len(),
            m.units.iter().map(|u| u.cells).sum::<u64>(),
            m.units.iter().map(|u| u.bytes).sum::<u64>()
        );
    }
    if let Some(kv) = &m.kv_copy {
        println!(
            "  KV payloads copied: {} cells, {} bytes in {} files",
            kv.cells,
            kv.bytes,
            kv.files.len()
        );
    }
}

pub async fn run(args: CheckpointArgs) -> Result<()> {
    match args.action {
        Action::Save {
            target: t,
            copy_payloads,
        } => {
            let options = CheckpointOptions { copy_payloads };
            let m = t
                .client()
                .await?
                .save_checkpoint_with(&t.dir, options)
                .await?;
            report("saved", &m);
        }
        Action::Load(t) => {
            let client = t.client().await?;
            let m = client.load_checkpoint_from_url(&t.dir).await?;
            report("loaded", &m);
            let now = format!("{:016x}", client.epoch());
            if now != m.epoch {
                println!("  the controller is in a fresh epoch {now} (copied KV payloads are written back under it)");
            }
        }
    }
    Ok(())
}
