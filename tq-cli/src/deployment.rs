//! How every client subcommand names the deployment it talks to: one spelling everywhere
//! (`--controller URL`, `--token`, `--config FILE`), with the spellings of earlier releases
//! (`--connect`, a positional URL for `tq stats` / `tq health`) kept as aliases.

use clap::Args;
use std::path::PathBuf;
use tq_client::{Client, Config};
use tq_core::{Error, Result};

/// The deployment a client subcommand talks to.
#[derive(Args, Debug, Clone, Default)]
pub struct DeploymentArgs {
    /// The controller (`tcp://host:port` or `unix:///path`).
    #[arg(
        long = "controller",
        visible_alias = "connect",
        value_name = "URL",
        global = true
    )]
    pub controller: Option<String>,
    /// The shared token the deployment's servers require (or set TQ_NET_TOKEN, or `net.token`
    /// in the configuration file).
    #[arg(long, env = "TQ_NET_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Configuration file (TOML; for a client: network settings such as timeouts and the
    /// token). `TQ_*` environment variables override it, and flags override both.
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
}

impl DeploymentArgs {
    /// The controller's URL; `Invalid` naming the flag when none was given.
    pub fn url(&self) -> Result<&str> {
        self.controller
            .as_deref()
            .ok_or_else(|| Error::invalid("name the deployment's controller with --controller URL"))
    }

    /// Connects to the controller named by `--controller` or by `positional` (the older
    /// spelling of `tq stats URL`), which must agree when both are given.
    pub async fn connect_or_at(&self, positional: Option<&str>) -> Result<Client> {
        let url = match (self.controller.as_deref(), positional) {
            (Some(flag), Some(url)) if flag != url => {
                return Err(Error::invalid(format!(
                    "two controllers named: `{url}` and --controller `{flag}`; give one"
                )))
            }
            (_, Some(url)) => url,
            (_, None) => self.url()?,
        };
        Client::connect_with(url, self.config()?).await
    }

    /// The client configuration: the file (if any), the environment, then `--token`.
    pub fn config(&self) -> Result<Config> {
        let mut config = Config::load(self.config.as_deref())?;
        if let Some(token) = &self.token {
            config.net.token = Some(token.clone());
        }
        Ok(config)
    }

    /// Connects to the controller.
    pub async fn connect(&self) -> Result<Client> {
        self.connect_or_at(None).await
    }
}
