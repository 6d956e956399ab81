//! Server processes of the criterion targets for the remote deployment: a controller and
//! storage units on free loopback ports, served from the bench binary itself (started again as
//! a child process), so `cargo bench` needs no `tq` binary built beforehand.

use std::sync::Arc;
use std::time::Duration;
use tq_controller::{RemoteControlPlane, UnitInfo};
use tq_core::Result;
use tq_net::{ClientConfig, Endpoint, Pool, Server, ServerConfig};

fn loopback() -> Result<Endpoint> {
    "tcp://127.0.0.1:0".parse()
}

fn named(name: &str) -> ServerConfig {
    ServerConfig {
        name: name.to_string(),
        ..ServerConfig::default()
    }
}

/// A controller expecting `units` storage units, serving on a free loopback port.
pub async fn controller(units: u32) -> Result<Server> {
    let service = tq::server::controller_service(&tq::Config::default(), Some(units), None)?;
    Server::bind(&loopback()?, named("controller"), Arc::new(service)).await
}

/// An in-memory storage unit `id` on a free loopback port, registered with the controller at
/// `controller` (in its epoch) before this returns.
pub async fn unit(id: &str, controller: &str) -> Result<Server> {
    let (server, handler) =
        tq::server::start_unit(id, &loopback()?, None, None, &tq::Config::default()).await?;
    let control = RemoteControlPlane::new(
        Pool::new(ClientConfig::default()),
        controller.parse()?,
        Duration::from_secs(30),
    );
    let info = UnitInfo {
        id: id.to_string(),
        endpoint: server.local_endpoint().to_string(),
        instance: tq_core::new_epoch(),
        registration: 0,
    };
    let registered = control.register_unit(info).await?;
    handler.adopt_epoch(registered.epoch)?;
    handler.adopt_registration(registered.registration);
    Ok(server)
}
