//! `tq config`: check a configuration file as a controller would at start, and print the
//! configuration reference (docs/configuration.md is its output).

use clap::{Args, Subcommand};
use std::path::PathBuf;
use tq_client::Config;
use tq_core::Result;

#[derive(Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Check FILE, with the `TQ_*` environment applied, as `tq controller --config FILE`
    /// would at start: unknown keys, values that cannot work, settings the backend would
    /// ignore, samplers, and a storage backend this build cannot build. Nothing is contacted.
    Check { file: PathBuf },
    /// Print the configuration reference (Markdown): every key, its default, its
    /// environment variable and what it does.
    Reference,
}

pub fn run(args: ConfigArgs) -> Result<()> {
    match args.action {
        Action::Reference => {
            print!("{}", tq_client::configuration_reference());
            Ok(())
        }
        Action::Check { file } => {
            let context = |e: tq_core::Error| e.context(format!("{}", file.display()));
            let config = Config::load(Some(&file)).map_err(context)?;
            let (_, samplers) = config.sampler_specs().map_err(context)?;
            if config.storage_is_shared() {
                config.check_shared_storage().map_err(context)?;
            }
            let storage = if config.storage_is_shared() {
                format!("storage backend `{}`", config.storage.backend)
            } else {
                format!(
                    "storage backend `simple` with {} units",
                    config.storage.num_units
                )
            };
            println!(
                "{}: ok ({storage}; default sampler `{}`; {} named sampler(s))",
                file.display(),
                config.controller.default_sampler,
                samplers.len()
            );
            Ok(())
        }
    }
}
