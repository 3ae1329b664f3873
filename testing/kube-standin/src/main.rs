//! `kube-standin`: a TEST FIXTURE standing in for the Kubernetes API server (in memory, HTTPS on
//! loopback with its own CA). For meshplane's e2e suite and demo only; not a Kubernetes distribution.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use meshplane_kube_standin::{StandIn, StandInOptions, WebhookClientCredentials};

/// Test fixture: an in-memory Kubernetes API stand-in for meshplane's e2e suite and demo.
/// Writes admin.kubeconfig, operator.kubeconfig and node.kubeconfig into --kubeconfig-dir and
/// prints its address. Not a Kubernetes API server: see the module docs for what it omits.
#[derive(Debug, Parser)]
#[command(name = "kube-standin", version)]
struct Args {
    /// Port on 127.0.0.1 (0: pick a free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Directory for the kubeconfigs (created if missing).
    #[arg(long)]
    kubeconfig_dir: PathBuf,
    /// Events kept for watch resumption before clients get 410 Gone.
    #[arg(long, default_value_t = 10_000)]
    history_limit: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5)]
    bookmark_interval_seconds: u64,
    /// A kubeconfig whose `users` give the client certificates admission webhooks are called
    /// with, by webhook host (the `kubeConfigFile` of a real API server's
    /// `WebhookAdmissionConfiguration`). Unset: webhooks are called without one.
    #[arg(long, value_name = "FILE")]
    admission_kubeconfig: Option<PathBuf>,
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
    let webhook_credentials = match &args.admission_kubeconfig {
        Some(path) => {
            WebhookClientCredentials::from_kubeconfig(path).map_err(anyhow::Error::msg)?
        }
        None => WebhookClientCredentials::default(),
    };
    let handle = StandIn::start(StandInOptions {
        webhook_credentials,
        port: args.port,
        kubeconfig_dir: Some(args.kubeconfig_dir),
        history_limit: args.history_limit,
        bookmark_interval: Duration::from_secs(args.bookmark_interval_seconds.max(1)),
        ..StandInOptions::default()
    })
    .await?;
    println!("{}", handle.url());
    println!("kubeconfigs in {}", handle.kubeconfig_dir().display());
    tokio::signal::ctrl_c().await?;
    handle.shutdown();
    Ok(())
}
