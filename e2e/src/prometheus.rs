//! A real Prometheus (Debian's `prometheus` and `promtool`, installed by `make host-tools`) on
//! the cluster's node, where pod addresses are reachable as from a Prometheus running in the
//! cluster; the scenarios that check `config/monitoring/` query it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::reach::OnNode;

/// A Prometheus process on the node, killed on drop.
pub struct Prometheus {
    _child: tokio::process::Child,
    node: OnNode,
    /// On the node's loopback.
    address: SocketAddr,
}

/// A tool on `PATH`; panics naming the package that has it.
pub fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("{name} not found on PATH: run `make host-tools` (Debian's prometheus package)")
    })
}

/// Percent-encodes a query parameter.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Prometheus {
    /// Writes `config` to `work/prometheus.json`, has `promtool check config` accept it, and
    /// starts Prometheus with it on `node` (data and log in `work`).
    pub fn start(node: OnNode, config: &Value, work: &Path) -> Prometheus {
        let config_file = work.join("prometheus.json");
        std::fs::write(&config_file, config.to_string()).expect("write config");
        let check = Command::new(tool("promtool"))
            .arg("check")
            .arg("config")
            .arg(&config_file)
            .output()
            .expect("promtool runs");
        assert!(
            check.status.success(),
            "promtool check config: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let address = SocketAddr::from((
            Ipv4Addr::LOCALHOST,
            node.free_port().expect("a free port on the node"),
        ));
        let log = std::fs::File::create(work.join("prometheus.log")).expect("log");
        let child = node
            .command(tool("prometheus"))
            .expect("a command on the node")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                work.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("prometheus starts");
        Prometheus {
            _child: child,
            node,
            address,
        }
    }

    /// The `data` of a successful API answer at `path`.
    pub async fn get(&self, path: &str) -> Result<Value, String> {
        let reply = self
            .node
            .http_get(self.address, "prometheus", path)
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = serde_json::from_str(&reply.body)
            .map_err(|e| format!("{path}: {e}: {}", reply.body))?;
        if reply.status != 200 || body["status"] != "success" {
            return Err(format!("{path}: {} {}", reply.status, reply.body));
        }
        Ok(body["data"].clone())
    }

    /// The result of an instant query.
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self
            .get(&format!("/api/v1/query?query={}", encode(expr)))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }
}
