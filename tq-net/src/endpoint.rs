//! [`Endpoint`]: where a tq server listens, written as a URL (`tcp://host:port`,
//! `unix:///absolute/path`) so that one string can be passed on a command line, stored in a
//! config file, handed from the controller to clients, and printed in every error message.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::str::FromStr;
use tq_core::Error;

/// A server address.
///
/// Serialized (serde) as its URL string, so configs and messages carry the same text that
/// [`Display`](fmt::Display) prints and [`FromStr`] parses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Endpoint {
    /// A TCP address, `host:port` (IPv6 hosts in brackets: `[::1]:7000`). Port 0 asks the OS for
    /// a free port when binding; [`Server::local_endpoint`](crate::Server::local_endpoint) then
    /// reports the real one.
    Tcp(String),
    /// A Unix domain socket at an absolute path (same-host peers).
    Unix(PathBuf),
}

const TCP_SCHEME: &str = "tcp://";
const UNIX_SCHEME: &str = "unix://";

impl Endpoint {
    /// A TCP endpoint from a `host:port` string (not checked here; `FromStr` checks).
    pub fn tcp(host_port: impl Into<String>) -> Endpoint {
        Endpoint::Tcp(host_port.into())
    }

    /// A Unix socket endpoint.
    pub fn unix(path: impl Into<PathBuf>) -> Endpoint {
        Endpoint::Unix(path.into())
    }

    /// True when only processes on this machine can reach the endpoint: every Unix socket, and a
    /// TCP host that is `localhost` or resolves only to loopback addresses (127.0.0.0/8, ::1).
    ///
    /// Servers use this to decide whether a token is required (binding beyond loopback exposes
    /// the store to the network). A host name other than `localhost` is resolved, which may block
    /// on DNS; a name that does not resolve counts as not loopback (the safe answer).
    pub fn is_loopback(&self) -> bool {
        match self {
            Endpoint::Unix(_) => true,
            Endpoint::Tcp(host_port) => {
                let Some((host, _port)) = split_host_port(host_port) else {
                    return false;
                };
                if host.eq_ignore_ascii_case("localhost") {
                    return true;
                }
                if let Ok(ip) = host.parse::<IpAddr>() {
                    return ip.is_loopback();
                }
                match (host, 0u16).to_socket_addrs() {
                    Ok(addrs) => {
                        let addrs: Vec<_> = addrs.collect();
                        !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
                    }
                    Err(_) => false,
                }
            }
        }
    }
}

/// Splits `host:port` (or `[v6]:port`) into the bare host and the port; `None` when malformed.
fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    let host = if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?;
        inner.parse::<std::net::Ipv6Addr>().ok()?;
        inner
    } else {
        // An unbracketed IPv6 address would be ambiguous with the port separator.
        if host.contains(':') {
            return None;
        }
        host
    };
    if host.is_empty() || host.contains('/') || host.chars().any(char::is_whitespace) {
        return None;
    }
    Some((host, port))
}

impl FromStr for Endpoint {
    type Err = Error;

    /// Parses `tcp://host:port` or `unix:///absolute/path`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "expected `tcp://host:port` or `unix:///absolute/path`";
        if let Some(rest) = s.strip_prefix(TCP_SCHEME) {
            if split_host_port(rest).is_none() {
                return Err(Error::invalid(format!(
                    "endpoint `{s}`: `{rest}` is not host:port (IPv6 hosts in brackets, port 0-65535); {usage}"
                )));
            }
            Ok(Endpoint::Tcp(rest.to_owned()))
        } else if let Some(rest) = s.strip_prefix(UNIX_SCHEME) {
            let path = PathBuf::from(rest);
            if !path.is_absolute() {
                return Err(Error::invalid(format!(
                    "endpoint `{s}`: the socket path must be absolute (three slashes: unix:///run/tq.sock); {usage}"
                )));
            }
            Ok(Endpoint::Unix(path))
        } else {
            Err(Error::invalid(format!("endpoint `{s}`: {usage}")))
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(host_port) => write!(f, "{TCP_SCHEME}{host_port}"),
            Endpoint::Unix(path) => write!(f, "{UNIX_SCHEME}{}", path.display()),
        }
    }
}

impl TryFrom<String> for Endpoint {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Endpoint> for String {
    fn from(e: Endpoint) -> String {
        e.to_string()
    }
}
