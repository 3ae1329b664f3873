//! `pod-runner`: runs the pods of a (stand-in) cluster as local processes. Test fixture.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::Parser;
use meshplane_pod_runner::{default_bin_dir, PodRunner, PodRunnerOptions};

#[derive(Debug, Parser)]
#[command(about = "Local pod runner for the meshplane e2e suite and demo (a tiny kubelet)")]
struct Args {
    /// Kubeconfig of the runner's identity (the stand-in's node kubeconfig, or admin).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Pod directories and container logs.
    #[arg(long, default_value = ".e2e/pod-runner")]
    work_dir: PathBuf,
    /// Directory of meshplane-xds, meshplane-operator and meshplane-proxy.
    #[arg(long, env = "MESHPLANE_BIN_DIR")]
    bin_dir: Option<PathBuf>,
    /// Pods get addresses <subnet>.10 and up.
    #[arg(long, default_value = "127.0.0.0")]
    pod_subnet: Ipv4Addr,
    /// Envoy binary for proxy containers.
    #[arg(long, env = "ENVOY_BIN")]
    envoy_bin: Option<PathBuf>,
    /// RUST_LOG given to container processes that set none themselves.
    #[arg(long, default_value = "info")]
    process_log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let options = PodRunnerOptions {
        bin_dir: args.bin_dir.unwrap_or_else(default_bin_dir),
        work_dir: args.work_dir,
        pod_subnet: args.pod_subnet,
        envoy_bin: args.envoy_bin,
        process_env: BTreeMap::from([("RUST_LOG".to_string(), args.process_log)]),
    };
    let runner = PodRunner::start(&args.kubeconfig, options).await?;
    tracing::info!(logs = %runner.logs_dir().display(), "pod runner started");
    wait_for_termination().await?;
    tracing::info!("stopping every pod");
    runner.shutdown().await;
    Ok(())
}

async fn wait_for_termination() -> std::io::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = terminate.recv() => Ok(()),
    }
}
