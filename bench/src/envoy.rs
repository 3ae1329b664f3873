//! One real Envoy for a micro-benchmark: one worker thread (so its CPU per request is one
//! core's), errors-only logging, no output, killed when dropped.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result};
use tokio::process::Child;

/// Starts `envoy_bin` with the bootstrap in `config` (YAML, JSON or binary proto).
pub fn spawn(envoy_bin: &Path, config: &Path) -> Result<Child> {
    tokio::process::Command::new(envoy_bin)
        .args([
            "--disable-hot-restart",
            "-l",
            "error",
            "--concurrency",
            "1",
            "-c",
        ])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", envoy_bin.display()))
}
