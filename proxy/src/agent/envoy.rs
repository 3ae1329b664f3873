//! Envoy as the agent's child: started in the runtime directory (so the relative socket paths
//! of its bootstrap resolve there), SIGTERM and SIGINT forwarded to it, its exit code returned.

use std::path::{Path, PathBuf};

use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};

use super::AgentError;

/// How Envoy is started.
#[derive(Debug, Clone)]
pub struct EnvoyCommand {
    pub bin: PathBuf,
    /// The final bootstrap.
    pub config: PathBuf,
    pub extra_args: Vec<String>,
}

fn forward(pid: Option<u32>, sig: i32) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    // SAFETY: kill(2) with a pid we spawned and a valid signal number has no memory effects.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc != 0 {
        tracing::warn!(pid, sig, error = %std::io::Error::last_os_error(), "forwarding a signal to Envoy");
    }
}

/// Runs Envoy until it exits; returns its exit code (128 + signal when killed).
pub async fn run(cmd: &EnvoyCommand, run_dir: &Path) -> Result<i32, AgentError> {
    let mut child = Command::new(&cmd.bin)
        .arg("-c")
        .arg(&cmd.config)
        .arg("--disable-hot-restart")
        .args(&cmd.extra_args)
        .current_dir(run_dir)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| AgentError::Spawn {
            bin: cmd.bin.clone(),
            source,
        })?;
    tracing::info!(envoy = %cmd.bin.display(), pid = ?child.id(), "Envoy started");
    let mut term = signal(SignalKind::terminate()).map_err(AgentError::Wait)?;
    let mut int = signal(SignalKind::interrupt()).map_err(AgentError::Wait)?;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(AgentError::Wait)?,
            _ = term.recv() => forward(child.id(), libc::SIGTERM),
            _ = int.recv() => forward(child.id(), libc::SIGINT),
        }
    };
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    tracing::info!(code, "Envoy exited");
    Ok(code)
}
