//! One pod run locally: its directory, volumes, tokens, containers, readiness and the Pod
//! status the runner reports for it.

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

use super::container::{
    now_rfc3339, Container, ContainerSnapshot, ContainerState, ProcessRegistry, RestartPolicy,
    Termination,
};
use super::error::PodRunnerError;
use super::http_client::http_get;
use super::launch::{build_launch, LaunchContext};
use super::tokens::{kubeconfig_with_token, request_token, TokenOwner};
use super::volumes::{sync_dir, token_projections, volume_files, ObjectData, VolumeInputs};

const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the runner hands every pod.
pub struct PodEnvironment<'a> {
    pub client: &'a Client,
    pub kubeconfig: &'a Kubeconfig,
    pub bin_dir: &'a Path,
    pub objects: &'a dyn ObjectData,
    pub runner_env: &'a BTreeMap<String, String>,
    pub registry: &'a Arc<ProcessRegistry>,
}

/// A pod the runner has taken on.
pub struct LocalPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ip: Ipv4Addr,
    dir: PathBuf,
    /// Container logs live outside the pod directory so that they outlive the pod.
    log_dir: PathBuf,
    start_time: String,
    tokens: BTreeMap<(String, String), String>,
    kubeconfig_path: Option<PathBuf>,
    /// Containers once started; empty while the pod waits for its volumes or config.
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
    pub fn new(pod: &Pod, ip: Ipv4Addr, work_dir: &Path) -> Self {
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
            ip,
            dir,
            log_dir: work_dir.join("logs"),
            start_time: now_rfc3339(),
            tokens: BTreeMap::new(),
            kubeconfig_path: None,
            containers: Vec::new(),
            waiting: Some(("ContainerCreating".into(), String::new())),
            ready: BTreeMap::new(),
            conditions_since: BTreeMap::new(),
            last_status: None,
        }
    }

    pub fn started(&self) -> bool {
        !self.containers.is_empty()
    }

    /// Tries to start the pod: tokens, volumes, then containers. On failure the pod stays
    /// Pending with the reason in its container statuses, and the runner tries again.
    pub async fn try_start(&mut self, pod: &Pod, env: &PodEnvironment<'_>) {
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
        let creating = |e| ("ContainerCreating", e);
        for projection in token_projections(pod) {
            let key = (projection.volume.clone(), projection.path.clone());
            if let std::collections::btree_map::Entry::Vacant(slot) = self.tokens.entry(key) {
                let token = request_token(
                    env.client,
                    &owner,
                    projection.audience.as_deref(),
                    projection.expiration_seconds,
                )
                .await
                .map_err(creating)?;
                slot.insert(token);
            }
        }
        if self.kubeconfig_path.is_none() && spec.automount_service_account_token != Some(false) {
            let token = request_token(env.client, &owner, None, None)
                .await
                .map_err(creating)?;
            let path = self.dir.join("kubeconfig");
            std::fs::create_dir_all(&self.dir)
                .map_err(|e| creating(PodRunnerError::io("cannot create", &self.dir, e)))?;
            let content = kubeconfig_with_token(env.kubeconfig, &token).map_err(creating)?;
            std::fs::write(&path, content)
                .map_err(|e| creating(PodRunnerError::io("cannot write", &path, e)))?;
            self.kubeconfig_path = Some(path);
        }
        let volume_dirs = self.sync_volumes(pod, env.objects).map_err(creating)?;
        std::fs::create_dir_all(&self.log_dir)
            .map_err(|e| creating(PodRunnerError::io("cannot create", &self.log_dir, e)))?;

        let policy = RestartPolicy::parse(spec.restart_policy.as_deref());
        let mut launches = Vec::new();
        for container in &spec.containers {
            let ctx = LaunchContext {
                pod,
                pod_ip: self.ip,
                bin_dir: env.bin_dir,
                volume_dirs: &volume_dirs,
                container_dir: self.dir.join("containers").join(&container.name),
                log_path: self.log_dir.join(format!(
                    "{}_{}_{}.log",
                    self.namespace, self.name, container.name
                )),
                kubeconfig: self.kubeconfig_path.as_deref(),
                objects: env.objects,
                runner_env: env.runner_env,
            };
            let launch = build_launch(container, &ctx).map_err(|reason| {
                (
                    "CreateContainerConfigError",
                    PodRunnerError::CannotRun {
                        container: container.name.clone(),
                        reason,
                    },
                )
            })?;
            launches.push((container.clone(), launch));
        }
        for (spec, launch) in launches {
            let container = Container::start(
                format!("{}/{}", self.key(), spec.name),
                launch,
                policy,
                Arc::clone(env.registry),
            );
            self.containers.push(RunningContainer {
                name: spec.name.clone(),
                image: spec.image.clone().unwrap_or_default(),
                container,
                readiness: spec.readiness_probe.clone(),
                spec,
            });
        }
        Ok(())
    }

    /// Writes every volume's files (again); returns volume name → directory.
    pub fn sync_volumes(
        &self,
        pod: &Pod,
        objects: &dyn ObjectData,
    ) -> Result<BTreeMap<String, PathBuf>, PodRunnerError> {
        let inputs = VolumeInputs {
            pod,
            pod_ip: self.ip,
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
                Ok(None) => std::fs::create_dir_all(&dir)
                    .map_err(|e| PodRunnerError::io("cannot create", &dir, e))?,
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
                    Some(probe) => probe_passes(probe, &running.spec, self.ip).await,
                };
            self.ready.insert(running.name.clone(), ready);
        }
    }

    /// Stops every container and removes the pod's directory.
    pub async fn stop(self) {
        for running in self.containers {
            running.container.stop().await;
        }
        if let Err(error) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!(%error, dir = %self.dir.display(), "pod directory not removed");
        }
    }

    /// The Pod `status` this pod has now.
    pub fn status(&mut self, pod: &Pod) -> Value {
        let spec = pod.spec.clone().unwrap_or_default();
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
                    let (reason, message) = self.waiting.clone().unwrap_or_default();
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
        let phase = if all_terminated {
            if any_failed {
                "Failed"
            } else {
                "Succeeded"
            }
        } else if any_running {
            "Running"
        } else {
            "Pending"
        };
        let init_statuses: Vec<Value> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|init| {
                // Init containers (iptables setup) are recorded as completed: the runner has no
                // network namespace to set up.
                let done = Termination {
                    exit_code: 0,
                    reason: "Completed".into(),
                    message: String::new(),
                    started_at: self.start_time.clone(),
                    finished_at: self.start_time.clone(),
                };
                let snapshot = ContainerSnapshot {
                    state: ContainerState::Terminated(done),
                    last_termination: None,
                    restart_count: 0,
                };
                container_status(
                    &init.name,
                    init.image.as_deref().unwrap_or_default(),
                    &snapshot,
                    true,
                )
            })
            .collect();
        let conditions = vec![
            self.condition("PodScheduled", true),
            self.condition("Initialized", true),
            self.condition("ContainersReady", all_ready),
            self.condition("Ready", all_ready),
        ];
        let ip = self.ip.to_string();
        json!({
            "phase": phase,
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
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

async fn probe_passes(probe: &Probe, container: &ContainerSpec, pod_ip: Ipv4Addr) -> bool {
    if let Some(get) = &probe.http_get {
        let Some(port) = probe_port(&get.port, container) else {
            return false;
        };
        let address = SocketAddr::from((pod_ip, port));
        if get.scheme.as_deref() == Some("HTTPS") {
            // The kubelet does not verify the serving certificate; a TCP connect is the
            // runner's approximation of an HTTPS probe.
            return tcp_connects(address).await;
        }
        let path = get.path.as_deref().unwrap_or("/");
        return matches!(http_get(address, &pod_ip.to_string(), path, PROBE_TIMEOUT).await,
            Ok(reply) if (200..400).contains(&reply.status));
    }
    if let Some(tcp) = &probe.tcp_socket {
        let Some(port) = probe_port(&tcp.port, container) else {
            return false;
        };
        return tcp_connects(SocketAddr::from((pod_ip, port))).await;
    }
    if let Some(grpc) = &probe.grpc {
        let Ok(port) = u16::try_from(grpc.port) else {
            return false;
        };
        return tcp_connects(SocketAddr::from((pod_ip, port))).await;
    }
    // exec probes: the runner cannot exec into a process; a running container counts as ready.
    true
}

async fn tcp_connects(address: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await,
        Ok(Ok(_))
    )
}

fn short(uid: &str) -> String {
    uid.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect()
}
