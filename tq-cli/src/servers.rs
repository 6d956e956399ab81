//! Server processes (this very binary) started by the commands that need a deployment of their
//! own on loopback: `tq bench` and `tq soak` (built with either feature).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use tq_core::{Error, Result};

/// Server processes started by `tq bench` and `tq soak`; killed when dropped.
pub struct Servers {
    pub children: Vec<Child>,
    pub controller: String,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A controller (with `extra` arguments, e.g. `--state-dir`) and `units` storage-unit processes
/// (`unit-0`, ...) on loopback; returns them with the units' endpoints (where a unit restarted
/// in place must listen again).
pub fn start_controller_and_units(units: u32, extra: &[&str]) -> Result<(Servers, Vec<String>)> {
    let n = units.to_string();
    let mut args = vec!["controller", "--listen", "tcp://127.0.0.1:0", "--units", &n];
    args.extend_from_slice(extra);
    let (c, controller) = spawn_server(&args)?;
    let mut servers = Servers {
        children: vec![c],
        controller,
    };
    let mut endpoints = Vec::new();
    for i in 0..units {
        let (u, endpoint) = spawn_server(&[
            "storage-unit",
            "--controller",
            &servers.controller.clone(),
            "--id",
            &format!("unit-{i}"),
        ])?;
        servers.children.push(u);
        endpoints.push(endpoint);
    }
    Ok((servers, endpoints))
}

/// Starts `tq <args>` (this binary) and returns it with the endpoint it reports (for `tq
/// serve`, which reports its units first, the controller's).
pub fn spawn_server(args: &[&str]) -> Result<(Child, String)> {
    let wanted = if args.first() == Some(&"serve") {
        "listening controller "
    } else {
        "listening "
    };
    let exe = std::env::current_exe()
        .map_err(|e| Error::internal("cannot find the tq binary").with_source(e))?;
    let mut child = Command::new(exe)
        .args(args)
        .env_remove("TQ_NET_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Error::internal(format!("cannot start tq {args:?}")).with_source(e))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(Error::internal("the server's stdout was not piped"));
    };
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with(wanted) => {
                let endpoint = line
                    .split_whitespace()
                    .last()
                    .unwrap_or_default()
                    .to_string();
                // Keep draining stdout so the server never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines {});
                return Ok((child, endpoint));
            }
            Some(Ok(_)) => continue,
            _ => {
                let _ = child.kill();
                return Err(Error::unavailable(format!(
                    "tq {args:?} exited before listening"
                )));
            }
        }
    }
}
