//! Server processes of the criterion targets for the remote deployment: a controller and
//! storage units on free loopback ports, served from the bench binary itself (started again as
//! a child process), so `cargo bench` needs no `tq` binary built beforehand.

use std::sync::Arc;
use std::time::Duration;
use tq_backend_simple::{MemoryUnit, UnitConfig, UnitServer};
use tq_controller::{Controller, ControllerConfig, ControllerServer, RemoteControlPlane, UnitInfo};
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
    let controller = Controller::new(ControllerConfig {
        storage_units: units,
        ..ControllerConfig::default()
    })?;
    let service = Arc::new(ControllerServer::new(Arc::new(controller), units));
    Server::bind(&loopback()?, named("controller"), service).await
}

/// An in-memory storage unit `id` on a free loopback port, registered with the controller at
/// `controller` (in its epoch) before this returns.
pub async fn unit(id: &str, controller: &str) -> Result<Server> {
    let handler = Arc::new(UnitServer::new(Arc::new(MemoryUnit::with_config(
        id,
        UnitConfig::default(),
    )?)));
    let server = Server::bind(&loopback()?, named(id), handler.clone()).await?;
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
