//! Local pod runner: a tiny kubelet (plus Deployment, EndpointSlice and kube-proxy parts) for
//! the e2e suite and the demo. A test fixture, not shipped.
//!
//! It runs each container of each Pod as a local process chosen by image (meshplane's images →
//! the workspace binaries, anything else → a built-in echo server), executing exactly what the
//! operator and the injector produced. Accommodations, because every pod shares the host's
//! network and filesystem:
//! - each pod gets its own loopback address (`<subnet>.10-254`); wildcard listen addresses
//!   `0.0.0.0:` in args become `<podIP>:`, and processes get `MESHPLANE_LOOPBACK_ADDR=<podIP>`;
//! - volumes are materialised under the pod's directory, and volume mount paths in args and env
//!   are rewritten to those directories;
//! - init containers (iptables) are recorded as completed without running;
//! - HTTPS and gRPC readiness probes are TCP connects; exec probes pass while running;
//!   liveness probes are not run; projected tokens are issued once, at pod start.

mod addresses;
mod binaries;
mod container;
mod deployments;
mod downward;
mod echo;
mod endpoints;
mod error;
mod expand;
mod http_client;
mod launch;
mod local_pod;
mod runner;
mod service_accounts;
mod service_proxy;
mod tokens;
mod volumes;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub use binaries::{
    default_bin_dir, locate_binary, workspace_root, OPERATOR_BINARY, PROXY_BINARY, XDS_BINARY,
};
pub use deployments::TEMPLATE_HASH_LABEL;
pub use endpoints::SERVICE_NAME_LABEL;
pub use error::PodRunnerError;
pub use http_client::{http_get, HttpReply};
pub use runner::{logs_dir, NODE_NAME};

use container::ProcessRegistry;
use runner::{Runner, RunnerCommand};

/// How the runner runs pods.
#[derive(Debug, Clone)]
pub struct PodRunnerOptions {
    /// Where `meshplane-xds`, `meshplane-operator` and `meshplane-proxy` are.
    pub bin_dir: PathBuf,
    /// Pod directories and container logs go under it.
    pub work_dir: PathBuf,
    /// Pods get `<a.b.c>.10` and up from this `a.b.c.0`.
    pub pod_subnet: Ipv4Addr,
    /// The Envoy binary, passed to proxy containers as `ENVOY_BIN`.
    pub envoy_bin: Option<PathBuf>,
    /// Extra environment for every container process (a container's own env wins).
    pub process_env: BTreeMap<String, String>,
}

impl PodRunnerOptions {
    /// Defaults: binaries from [`default_bin_dir`], pods in 127.0.0.0/24, `ENVOY_BIN` from the
    /// environment.
    pub fn new(work_dir: impl Into<PathBuf>) -> Self {
        PodRunnerOptions {
            bin_dir: default_bin_dir(),
            work_dir: work_dir.into(),
            pod_subnet: Ipv4Addr::new(127, 0, 0, 0),
            envoy_bin: std::env::var_os("ENVOY_BIN").map(PathBuf::from),
            process_env: BTreeMap::new(),
        }
    }
}

/// A running pod runner. Dropping it kills every container process it started.
pub struct PodRunner {
    commands: mpsc::UnboundedSender<RunnerCommand>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    registry: Arc<ProcessRegistry>,
    work_dir: PathBuf,
}

impl PodRunner {
    /// Connects with `kubeconfig`, syncs its caches and starts running pods.
    pub async fn start(
        kubeconfig: &Path,
        options: PodRunnerOptions,
    ) -> Result<Self, PodRunnerError> {
        let config_file =
            Kubeconfig::read_from(kubeconfig).map_err(|source| PodRunnerError::Kubeconfig {
                path: kubeconfig.to_path_buf(),
                source,
            })?;
        let config = kube::Config::from_custom_kubeconfig(
            config_file.clone(),
            &KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| PodRunnerError::ClientConfig(e.to_string()))?;
        let client = kube::Client::try_from(config)
            .map_err(|e| PodRunnerError::ClientConfig(e.to_string()))?;
        std::fs::create_dir_all(&options.work_dir)
            .map_err(|e| PodRunnerError::io("cannot create", &options.work_dir, e))?;
        let work_dir = options.work_dir.clone();
        let registry = Arc::new(ProcessRegistry::default());
        let runner = Runner::connect(client, config_file, options, Arc::clone(&registry)).await?;
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(runner.run(commands_rx, shutdown_rx));
        Ok(PodRunner {
            commands,
            shutdown,
            task: Some(task),
            registry,
            work_dir,
        })
    }

    /// Kills one container's process (SIGKILL), as a crash would; it is restarted with backoff.
    pub async fn kill_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<(), PodRunnerError> {
        let (reply, reply_rx) = oneshot::channel();
        let command = RunnerCommand::KillContainer {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.into(),
            reply,
        };
        let no_such = || PodRunnerError::NoSuchContainer {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.into(),
        };
        self.commands.send(command).map_err(|_| no_such())?;
        reply_rx.await.map_err(|_| no_such())?
    }

    /// Where container logs are written (`<namespace>_<pod>_<container>.log`).
    pub fn logs_dir(&self) -> PathBuf {
        logs_dir(&self.work_dir)
    }

    /// Stops every pod and the control loop.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            if let Err(error) = task.await {
                tracing::warn!(%error, "pod runner loop ended abnormally");
            }
        }
    }
}

impl Drop for PodRunner {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.registry.kill_all();
    }
}
