//! `local-cluster`: a TEST FIXTURE cluster on this machine for the demo: the Kubernetes API
//! stand-in (in memory, HTTPS on 127.0.0.1) and the local pod runner with a real pod network
//! (network namespaces, veths, netfilter). Writes admin/operator/node kubeconfigs, prints the
//! API's address, and on SIGINT/SIGTERM stops every pod and deletes every namespace it made.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;
use meshplane_kube_standin::{Dialer, Identity, StandIn, StandInOptions};
use meshplane_pod_runner::{default_bin_dir, PodRunner, PodRunnerOptions, TestNetwork};

#[derive(Debug, Parser)]
#[command(
    name = "local-cluster",
    about = "Test fixture: the Kubernetes API stand-in and the local pod runner on a real pod network, for meshplane's demo"
)]
struct Args {
    /// Directory for the kubeconfigs (admin.kubeconfig, operator.kubeconfig, node.kubeconfig).
    #[arg(long)]
    kubeconfig_dir: PathBuf,
    /// Pod directories and container logs.
    #[arg(long)]
    work_dir: PathBuf,
    /// Directory of meshplane-xds, meshplane-operator and meshplane-proxy.
    #[arg(long, env = "MESHPLANE_BIN_DIR")]
    bin_dir: Option<PathBuf>,
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
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let network = TestNetwork::create()?;
    let dialer = network.dialer();
    let standin = StandIn::start(StandInOptions {
        kubeconfig_dir: Some(args.kubeconfig_dir.clone()),
        advertise_address: Some(network.api_address()),
        webhook_dialer: Dialer::new(move |address| {
            let dialer = dialer.clone();
            async move { dialer.connect(address).await }
        }),
        pod_connector: network.pod_connector(),
        pod_logs: meshplane_pod_runner::pod_logs(meshplane_pod_runner::logs_dir(&args.work_dir)),
        ..StandInOptions::default()
    })
    .await?;
    network.serve_api_relay(standin.addr())?;
    let mut options = PodRunnerOptions::new(args.work_dir, network.clone());
    options.bin_dir = args.bin_dir.unwrap_or_else(default_bin_dir);
    options.envoy_bin = args.envoy_bin;
    options.process_env = BTreeMap::from([("RUST_LOG".to_string(), args.process_log)]);
    // The runner acts as admin: it also plays the ServiceAccount controller.
    let runner = PodRunner::start(&standin.kubeconfig(&Identity::Admin)?, options).await?;
    println!("{}", standin.url());
    println!("kubeconfigs in {}", standin.kubeconfig_dir().display());
    println!("pod network {} (ip netns list | grep {0})", network.id());
    tracing::info!(logs = %runner.logs_dir().display(), "local cluster started");
    wait_for_termination().await?;
    tracing::info!("stopping every pod");
    runner.shutdown().await;
    network.shutdown();
    standin.shutdown();
    Ok(())
}

async fn wait_for_termination() -> std::io::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = terminate.recv() => Ok(()),
    }
}
