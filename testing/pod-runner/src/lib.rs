//! **Test fixture**: the local pod runner, a tiny kubelet (plus the Deployment, EndpointSlice,
//! ServiceAccount and kube-proxy parts of a cluster) for the e2e suite and the demo. Not
//! shipped.
//!
//! It runs the pods of a cluster (the API stand-in, usually) on real pod networks ([`net`]):
//! every pod gets its own Linux network namespace and address (198.18.0.0/16) behind a "node"
//! namespace the runner creates; Service ClusterIPs (198.19.0.0/16) work through netfilter DNAT
//! rules in the node namespace, rewritten as EndpointSlices change, as kube-proxy's iptables
//! mode does; Service names resolve inside pods through per-pod `/etc/hosts` and
//! `/etc/resolv.conf`; pods reach the API at the `kubernetes` Service (a relay in the node
//! namespace forwards to the stand-in on the host's loopback).
//!
//! Each container is a local process chosen by image (meshplane's images → the workspace
//! binaries, their other commands → the host's programs, anything else → a built-in echo
//! server), started inside the pod's namespace as the user its securityContext names, so the
//! injected proxy runs as UID 1337 and the capture init container as root with the pod's
//! netfilter to itself. Init containers run to completion, in order, before the app containers.
//! What still differs from a kubelet:
//! - the filesystem is the host's: volumes are materialised under the pod's directory and
//!   volume mount paths in args and env are rewritten to those directories; processes get a
//!   `KUBECONFIG` with their ServiceAccount token pointing at the in-cluster API address;
//! - HTTPS and gRPC readiness probes are TCP connects (from the node, as the kubelet's are);
//!   exec probes pass while running; liveness probes are not run; projected tokens are issued
//!   once, at pod start; capabilities are not dropped (a non-root process has none anyway).

pub mod net;

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
mod services;
mod tokens;
mod volumes;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub use addresses::POD_NETWORK;
pub use binaries::{
    default_bin_dir, locate_binary, workspace_root, OPERATOR_BINARY, PROXY_BINARY, XDS_BINARY,
};
pub use deployments::TEMPLATE_HASH_LABEL;
pub use endpoints::SERVICE_NAME_LABEL;
pub use error::PodRunnerError;
pub use http_client::{http_get, HttpReply};
pub use net::{PodNet, TestNetwork};
pub use runner::{logs_dir, NODE_NAME};

use container::ProcessRegistry;
use runner::{Runner, RunnerCommand};

/// The kubelet's part of `pods/log`, for the API stand-in: what each container wrote, from the
/// runner's log files under `logs_dir` (`<namespace>_<pod>_<container>.log`; empty before the
/// container started).
pub fn pod_logs(logs_dir: PathBuf) -> meshplane_kube_standin::PodLogs {
    meshplane_kube_standin::PodLogs::new(move |pod, container| {
        let path = logs_dir.join(format!("{}_{}_{container}.log", pod.namespace, pod.name));
        async move {
            match tokio::fs::read(&path).await {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                other => other,
            }
        }
    })
}

/// How the runner runs pods.
#[derive(Debug, Clone)]
pub struct PodRunnerOptions {
    /// Where `meshplane-xds`, `meshplane-operator` and `meshplane-proxy` are.
    pub bin_dir: PathBuf,
    /// Pod directories and container logs go under it.
    pub work_dir: PathBuf,
    /// The pod network pods are placed in.
    pub network: TestNetwork,
    /// The Envoy binary, passed to proxy containers as `ENVOY_BIN`.
    pub envoy_bin: Option<PathBuf>,
    /// Extra environment for every container process (a container's own env wins).
    pub process_env: BTreeMap<String, String>,
}

impl PodRunnerOptions {
    /// Defaults: binaries from [`default_bin_dir`], `ENVOY_BIN` from the environment.
    pub fn new(work_dir: impl Into<PathBuf>, network: TestNetwork) -> Self {
        PodRunnerOptions {
            bin_dir: default_bin_dir(),
            work_dir: work_dir.into(),
            network,
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
    network: TestNetwork,
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
        let network = options.network.clone();
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
            network,
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

    /// The pod network.
    pub fn network(&self) -> &TestNetwork {
        &self.network
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
