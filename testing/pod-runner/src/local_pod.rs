//! One pod run locally: its directory, volumes, tokens, init containers (run to completion,
//! in order, before the app containers start), containers, readiness and the Pod status the
//! runner reports for it.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container as ContainerSpec, Pod, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::config::Kubeconfig;
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::container::{
    now_rfc3339, Container, ContainerSnapshot, ContainerState, ProcessRegistry, RestartPolicy,
    Termination,
};
use super::error::PodRunnerError;
use super::http_client::http_get;
use super::launch::{build_launch, LaunchContext};
use super::net::{NodeDialer, PodNet, NODE_IP};
use super::tokens::{kubeconfig_with_token, request_token, TokenOwner};
use super::volumes::{sync_dir, token_projections, volume_files, ObjectData, VolumeInputs};

const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const API_NOT_KNOWN: &str =
    "the API's in-cluster address (Service default/kubernetes) is not known yet";

/// What the runner hands every pod.
pub struct PodEnvironment<'a> {
    pub client: &'a Client,
    pub kubeconfig: &'a Kubeconfig,
    /// The API's in-cluster address (the `kubernetes` Service), once known.
    pub api_service: Option<(String, u16)>,
    pub bin_dir: &'a Path,
    pub objects: &'a dyn ObjectData,
    pub runner_env: &'a BTreeMap<String, String>,
    pub registry: &'a Arc<ProcessRegistry>,
    /// Notified when a container exits (an init container finishing moves the pod on).
    pub changed: &'a Arc<Notify>,
}

/// A pod the runner has taken on.
pub struct LocalPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub net: PodNet,
    node: NodeDialer,
    dir: PathBuf,
    /// Container logs live outside the pod directory so that they outlive the pod.
    log_dir: PathBuf,
    start_time: String,
    tokens: BTreeMap<(String, String), String>,
    kubeconfig_path: Option<PathBuf>,
    volume_dirs: Option<BTreeMap<String, PathBuf>>,
    /// Init containers that completed, in order.
    init_done: Vec<RunningContainer>,
    /// The init container running now.
    init_current: Option<RunningContainer>,
    /// An init container failed under `restartPolicy: Never`: the pod failed.
    init_failed: bool,
    /// App containers once started; empty while the pod is being prepared or initialized.
    containers: Vec<RunningContainer>,
    /// Why the containers have not started yet.
    waiting: Option<(String, String)>,
    ready: BTreeMap<String, bool>,
    conditions_since: BTreeMap<&'static str, (bool, String)>,
    /// The last status written, to write only changes.
    pub last_status: Option<Value>,
}

struct RunningContainer {
    name: String,
    image: String,
    container: Container,
    readiness: Option<Probe>,
    spec: ContainerSpec,
}

impl LocalPod {
    pub fn new(pod: &Pod, net: PodNet, node: NodeDialer, work_dir: &Path) -> Self {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = work_dir
            .join("pods")
            .join(&namespace)
            .join(format!("{name}-{}", short(&uid)));
        LocalPod {
            namespace,
            name,
            uid,
            net,
            node,
            dir,
            log_dir: work_dir.join("logs"),
            start_time: now_rfc3339(),
            tokens: BTreeMap::new(),
            kubeconfig_path: None,
            volume_dirs: None,
            init_done: Vec::new(),
            init_current: None,
            init_failed: false,
            containers: Vec::new(),
            waiting: Some(("ContainerCreating".into(), String::new())),
            ready: BTreeMap::new(),
            conditions_since: BTreeMap::new(),
            last_status: None,
        }
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.net.ip()
    }

    /// Whether the app containers run (or ran).
    pub fn started(&self) -> bool {
        !self.containers.is_empty()
    }

    /// Moves the pod on: tokens and volumes, then each init container to completion, then the
    /// app containers. On an error the pod stays Pending with the reason in its container
    /// statuses, and the runner tries again.
    pub async fn advance(&mut self, pod: &Pod, env: &PodEnvironment<'_>) {
        if self.started() || self.init_failed {
            return;
        }
        match self.start(pod, env).await {
            Ok(()) => self.waiting = None,
            Err((reason, error)) => {
                let message = error.to_string();
                if self.waiting.as_ref().map(|(_, m)| m) != Some(&message) {
                    tracing::info!(pod = %self.key(), %message, "pod cannot start yet");
                }
                self.waiting = Some((reason.to_string(), message));
            }
        }
    }

    async fn start(
        &mut self,
        pod: &Pod,
        env: &PodEnvironment<'_>,
    ) -> Result<(), (&'static str, PodRunnerError)> {
        let creating = |e| ("ContainerCreating", e);
        if self.volume_dirs.is_none() {
            self.prepare(pod, env).await.map_err(creating)?;
        }
        let volume_dirs = self.volume_dirs.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = RestartPolicy::parse(spec.restart_policy.as_deref());
        let inits = spec.init_containers.clone().unwrap_or_default();
        while self.init_done.len() < inits.len() {
            if let Some(current) = &self.init_current {
                match current.container.snapshot().state {
                    ContainerState::Terminated(t) if t.exit_code == 0 => {
                        tracing::info!(pod = %self.key(), container = %current.name, "init container completed");
                        if let Some(done) = self.init_current.take() {
                            self.init_done.push(done);
                        }
                        continue;
                    }
                    ContainerState::Terminated(_) => {
                        tracing::warn!(pod = %self.key(), container = %current.name, "init container failed; the pod fails");
                        self.init_failed = true;
                        return Ok(());
                    }
                    // Running, or backing off before a retry.
                    _ => {
                        return Err((
                            "PodInitializing",
                            PodRunnerError::NotReadyToStart {
                                pod: self.key(),
                                reason: format!(
                                    "init container {} has not completed",
                                    current.name
                                ),
                            },
                        ))
                    }
                }
            }
            let spec = &inits[self.init_done.len()];
            // Init containers are retried until they succeed, unless the pod never restarts.
            let init_policy = match policy {
                RestartPolicy::Never => RestartPolicy::Never,
                _ => RestartPolicy::OnFailure,
            };
            let running = self.launch(pod, env, spec, true, init_policy, &volume_dirs)?;
            self.init_current = Some(running);
        }
        for container in &spec.containers {
            let running = self.launch(pod, env, container, false, policy, &volume_dirs)?;
            self.containers.push(running);
        }
        Ok(())
    }

    /// Tokens, the ServiceAccount kubeconfig and the volumes, once.
    async fn prepare(&mut self, pod: &Pod, env: &PodEnvironment<'_>) -> Result<(), PodRunnerError> {
        let spec = pod.spec.clone().unwrap_or_default();
        let service_account = spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        let owner = TokenOwner {
            namespace: &self.namespace,
            service_account: &service_account,
            pod_name: &self.name,
            pod_uid: &self.uid,
        };
        for projection in token_projections(pod) {
            let key = (projection.volume.clone(), projection.path.clone());
            if let std::collections::btree_map::Entry::Vacant(slot) = self.tokens.entry(key) {
                let token = request_token(
                    env.client,
                    &owner,
                    projection.audience.as_deref(),
                    projection.expiration_seconds,
                )
                .await?;
                slot.insert(token);
            }
        }
        if self.kubeconfig_path.is_none() && spec.automount_service_account_token != Some(false) {
            let not_known = || PodRunnerError::NotReadyToStart {
                pod: self.key(),
                reason: API_NOT_KNOWN.into(),
            };
            let (host, port) = env.api_service.clone().ok_or_else(not_known)?;
            let token = request_token(env.client, &owner, None, None).await?;
            let path = self.dir.join("kubeconfig");
            std::fs::create_dir_all(&self.dir)
                .map_err(|e| PodRunnerError::io("cannot create", &self.dir, e))?;
            let server = format!("https://{host}:{port}");
            let content = kubeconfig_with_token(env.kubeconfig, &token, Some(&server))?;
            std::fs::write(&path, content)
                .map_err(|e| PodRunnerError::io("cannot write", &path, e))?;
            self.kubeconfig_path = Some(path);
        }
        let volume_dirs = self.sync_volumes(pod, env.objects)?;
        std::fs::create_dir_all(&self.log_dir)
            .map_err(|e| PodRunnerError::io("cannot create", &self.log_dir, e))?;
        self.volume_dirs = Some(volume_dirs);
        Ok(())
    }

    fn launch(
        &self,
        pod: &Pod,
        env: &PodEnvironment<'_>,
        container: &ContainerSpec,
        init: bool,
        policy: RestartPolicy,
        volume_dirs: &BTreeMap<String, PathBuf>,
    ) -> Result<RunningContainer, (&'static str, PodRunnerError)> {
        let ctx = LaunchContext {
            pod,
            net: &self.net,
            bin_dir: env.bin_dir,
            volume_dirs,
            container_dir: self.dir.join("containers").join(&container.name),
            log_path: self.log_dir.join(format!(
                "{}_{}_{}.log",
                self.namespace, self.name, container.name
            )),
            kubeconfig: self.kubeconfig_path.as_deref(),
            api_service: env.api_service.clone(),
            objects: env.objects,
            runner_env: env.runner_env,
        };
        let launch = build_launch(container, init, &ctx).map_err(|reason| {
            (
                "CreateContainerConfigError",
                PodRunnerError::CannotRun {
                    container: container.name.clone(),
                    reason,
                },
            )
        })?;
        let supervised = Container::start(
            format!("{}/{}", self.key(), container.name),
            launch,
            policy,
            Arc::clone(env.registry),
            Arc::clone(env.changed),
        );
        Ok(RunningContainer {
            name: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
            container: supervised,
            readiness: (!init).then(|| container.readiness_probe.clone()).flatten(),
            spec: container.clone(),
        })
    }

    /// Writes every volume's files (again); returns volume name → directory.
    pub fn sync_volumes(
        &self,
        pod: &Pod,
        objects: &dyn ObjectData,
    ) -> Result<BTreeMap<String, PathBuf>, PodRunnerError> {
        let inputs = VolumeInputs {
            pod,
            pod_ip: self.ip(),
            objects,
            tokens: &self.tokens,
        };
        let mut dirs = BTreeMap::new();
        for volume in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
        {
            let dir = self.dir.join("volumes").join(&volume.name);
            match volume_files(volume, &inputs) {
                Ok(Some(files)) => {
                    if sync_dir(&dir, &files)? && self.started() {
                        tracing::info!(pod = %self.key(), volume = %volume.name, "volume content updated");
                    }
                }
                Ok(None) => {
                    // emptyDir: writable by every container's user, as the kubelet makes it.
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::create_dir_all(&dir)
                        .and_then(|()| {
                            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
                        })
                        .map_err(|e| PodRunnerError::io("cannot create", &dir, e))?
                }
                Err(reason) => {
                    return Err(PodRunnerError::NotReadyToStart {
                        pod: self.key(),
                        reason: format!("volume {}: {reason}", volume.name),
                    })
                }
            }
            dirs.insert(volume.name.clone(), dir);
        }
        Ok(dirs)
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Kills one container's process as a crash would (it is restarted).
    pub fn kill_container(&self, container: &str) -> bool {
        match self.containers.iter().find(|c| c.name == container) {
            Some(running) => {
                running.container.kill();
                true
            }
            None => false,
        }
    }

    /// Runs every readiness probe once.
    pub async fn probe(&mut self) {
        for running in &self.containers {
            let snapshot = running.container.snapshot();
            let is_running = matches!(snapshot.state, ContainerState::Running { .. });
            let ready = is_running
                && match &running.readiness {
                    None => true,
                    Some(probe) => probe_passes(probe, &running.spec, &self.node, self.ip()).await,
                };
            self.ready.insert(running.name.clone(), ready);
        }
    }

    /// Stops every container and removes the pod's directory (the network is the runner's to
    /// remove).
    pub async fn stop(self) {
        if let Some(init) = self.init_current {
            init.container.stop().await;
        }
        for running in self.init_done.into_iter().chain(self.containers) {
            running.container.stop().await;
        }
        if let Err(error) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!(%error, dir = %self.dir.display(), "pod directory not removed");
        }
    }

    /// The Pod `status` this pod has now.
    pub fn status(&mut self, pod: &Pod) -> Value {
        let spec = pod.spec.clone().unwrap_or_default();
        let inits = spec.init_containers.clone().unwrap_or_default();
        let initialized = self.init_done.len() == inits.len();
        let mut statuses = Vec::new();
        let mut all_ready = !spec.containers.is_empty();
        let mut any_running = false;
        let mut all_terminated = !self.containers.is_empty();
        let mut any_failed = false;
        for container in &spec.containers {
            let running = self.containers.iter().find(|c| c.name == container.name);
            let snapshot = match running {
                Some(running) => running.container.snapshot(),
                None => {
                    let (reason, message) = if !initialized {
                        ("PodInitializing".to_string(), String::new())
                    } else {
                        self.waiting.clone().unwrap_or_default()
                    };
                    ContainerSnapshot {
                        state: ContainerState::Waiting { reason, message },
                        last_termination: None,
                        restart_count: 0,
                    }
                }
            };
            let ready = self.ready.get(&container.name).copied().unwrap_or(false)
                && matches!(snapshot.state, ContainerState::Running { .. });
            all_ready &= ready;
            any_running |= matches!(
                snapshot.state,
                ContainerState::Running { .. } | ContainerState::Waiting { .. }
            ) && running.is_some();
            if let ContainerState::Terminated(t) = &snapshot.state {
                any_failed |= t.exit_code != 0;
            } else {
                all_terminated = false;
            }
            statuses.push(container_status(
                &container.name,
                running
                    .map(|r| r.image.as_str())
                    .unwrap_or(container.image.as_deref().unwrap_or_default()),
                &snapshot,
                ready,
            ));
        }
        let phase = if self.init_failed || (all_terminated && any_failed) {
            "Failed"
        } else if all_terminated {
            "Succeeded"
        } else if any_running {
            "Running"
        } else {
            "Pending"
        };
        let init_statuses: Vec<Value> = inits
            .iter()
            .enumerate()
            .map(|(index, init)| {
                let known = self
                    .init_done
                    .get(index)
                    .or(self.init_current.as_ref().filter(|c| c.name == init.name));
                let snapshot = match known {
                    Some(running) => running.container.snapshot(),
                    None => ContainerSnapshot {
                        state: ContainerState::Waiting {
                            reason: "PodInitializing".into(),
                            message: String::new(),
                        },
                        last_termination: None,
                        restart_count: 0,
                    },
                };
                let done =
                    matches!(&snapshot.state, ContainerState::Terminated(t) if t.exit_code == 0);
                container_status(
                    &init.name,
                    init.image.as_deref().unwrap_or_default(),
                    &snapshot,
                    done,
                )
            })
            .collect();
        let conditions = vec![
            self.condition("PodScheduled", true),
            self.condition("Initialized", initialized),
            self.condition("ContainersReady", all_ready),
            self.condition("Ready", all_ready),
        ];
        let ip = self.ip().to_string();
        json!({
            "phase": phase,
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": NODE_IP.to_string(),
            "hostIPs": [{"ip": NODE_IP.to_string()}],
            "startTime": self.start_time,
            "conditions": conditions,
            "initContainerStatuses": init_statuses,
            "containerStatuses": statuses,
        })
    }

    fn condition(&mut self, kind: &'static str, status: bool) -> Value {
        let since = match self.conditions_since.get(kind) {
            Some((previous, since)) if *previous == status => since.clone(),
            _ => {
                let now = now_rfc3339();
                self.conditions_since.insert(kind, (status, now.clone()));
                now
            }
        };
        json!({"type": kind, "status": if status { "True" } else { "False" }, "lastTransitionTime": since})
    }
}

fn container_status(name: &str, image: &str, snapshot: &ContainerSnapshot, ready: bool) -> Value {
    let terminated = |t: &Termination| {
        json!({"terminated": {
            "exitCode": t.exit_code, "reason": t.reason, "message": t.message,
            "startedAt": t.started_at, "finishedAt": t.finished_at,
        }})
    };
    let state = match &snapshot.state {
        ContainerState::Waiting { reason, message } => {
            json!({"waiting": {"reason": reason, "message": message}})
        }
        ContainerState::Running { started_at } => json!({"running": {"startedAt": started_at}}),
        ContainerState::Terminated(t) => terminated(t),
    };
    let last_state = snapshot
        .last_termination
        .as_ref()
        .map(terminated)
        .unwrap_or_else(|| json!({}));
    json!({
        "name": name,
        "image": image,
        "imageID": "",
        "ready": ready,
        "started": matches!(snapshot.state, ContainerState::Running { .. }),
        "restartCount": snapshot.restart_count,
        "state": state,
        "lastState": last_state,
    })
}

/// Resolves a probe port (number or container port name).
fn probe_port(port: &IntOrString, container: &ContainerSpec) -> Option<u16> {
    match port {
        IntOrString::Int(number) => u16::try_from(*number).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .or_else(|| name.parse().ok()),
    }
}

/// Runs one probe from the node, as the kubelet does (so a pod's capture rules apply to it).
async fn probe_passes(
    probe: &Probe,
    container: &ContainerSpec,
    node: &NodeDialer,
    pod_ip: Ipv4Addr,
) -> bool {
    if let Some(get) = &probe.http_get {
        let Some(port) = probe_port(&get.port, container) else {
            return false;
        };
        let address = SocketAddr::from((pod_ip, port));
        if get.scheme.as_deref() == Some("HTTPS") {
            // The kubelet does not verify the serving certificate; a TCP connect is the
            // runner's approximation of an HTTPS probe.
            return tcp_connects(node, address).await;
        }
        let path = get.path.as_deref().unwrap_or("/");
        let target = address.to_string();
        return matches!(http_get(node.connect(address), &target, &pod_ip.to_string(), path, PROBE_TIMEOUT).await,
            Ok(reply) if (200..400).contains(&reply.status));
    }
    if let Some(tcp) = &probe.tcp_socket {
        let Some(port) = probe_port(&tcp.port, container) else {
            return false;
        };
        return tcp_connects(node, SocketAddr::from((pod_ip, port))).await;
    }
    if let Some(grpc) = &probe.grpc {
        let Ok(port) = u16::try_from(grpc.port) else {
            return false;
        };
        return tcp_connects(node, SocketAddr::from((pod_ip, port))).await;
    }
    // exec probes: the runner does not exec into a process; a running container counts as ready.
    true
}

async fn tcp_connects(node: &NodeDialer, address: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, node.connect(address)).await,
        Ok(Ok(_))
    )
}

fn short(uid: &str) -> String {
    uid.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect()
}
