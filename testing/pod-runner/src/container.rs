//! One container of a local pod: a supervised process (or the built-in echo server) inside the
//! pod's network namespace, restarted with exponential backoff when it exits, as the kubelet
//! does for `restartPolicy: Always` (init containers: `OnFailure`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::echo::{serve_echo, EchoIdentity};
use super::net::{Placement, PodNet};

const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A container that ran this long before exiting starts over at the initial backoff.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);

/// How a container is run.
#[derive(Debug, Clone)]
pub enum Launch {
    /// A process inside the pod's network namespace, as the container's user.
    Process {
        program: PathBuf,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        /// The container's own directory (its `HOME`), owned by `owner`.
        work_dir: PathBuf,
        log_path: PathBuf,
        placement: Placement,
        /// `(uid, gid)` the process runs as.
        owner: (u32, u32),
    },
    /// The built-in echo server on every container port (all addresses of the pod).
    Echo {
        net: PodNet,
        ports: Vec<u16>,
        identity: EchoIdentity,
    },
    /// Nothing to run: an application image's init container without a command.
    Complete,
}

/// `restartPolicy` of the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    fn restarts_after(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// The state part of a `ContainerStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    Waiting { reason: String, message: String },
    Running { started_at: String },
    Terminated(Termination),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Termination {
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub started_at: String,
    pub finished_at: String,
}

/// What the supervisor reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSnapshot {
    pub state: ContainerState,
    pub last_termination: Option<Termination>,
    pub restart_count: i32,
}

/// Process groups of every running container process, so that they can be killed even when the
/// runner is dropped without an orderly shutdown.
#[derive(Debug, Default)]
pub struct ProcessRegistry {
    groups: Mutex<BTreeSet<u32>>,
}

impl ProcessRegistry {
    fn add(&self, pid: u32) {
        lock(&self.groups).insert(pid);
    }

    fn remove(&self, pid: u32) {
        lock(&self.groups).remove(&pid);
    }

    /// SIGKILLs every registered process group.
    pub fn kill_all(&self) {
        let groups: Vec<u32> = std::mem::take(&mut *lock(&self.groups))
            .into_iter()
            .collect();
        for group in groups {
            kill_process_group(group);
        }
    }
}

/// A supervised container.
#[derive(Debug)]
pub struct Container {
    snapshot: Arc<Mutex<ContainerSnapshot>>,
    crash: Arc<Notify>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Container {
    /// Starts supervising `launch` (the first start happens at once).
    /// `exited` is notified whenever the container's process ends.
    pub fn start(
        name: String,
        launch: Launch,
        policy: RestartPolicy,
        registry: Arc<ProcessRegistry>,
        exited: Arc<Notify>,
    ) -> Self {
        let snapshot = Arc::new(Mutex::new(ContainerSnapshot {
            state: ContainerState::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            },
            last_termination: None,
            restart_count: 0,
        }));
        let crash = Arc::new(Notify::new());
        let (stop, stop_rx) = watch::channel(false);
        let supervisor = Supervisor {
            name,
            launch,
            policy,
            registry,
            snapshot: Arc::clone(&snapshot),
            crash: Arc::clone(&crash),
            stop: stop_rx,
            exited,
        };
        let task = tokio::spawn(supervisor.run());
        Container {
            snapshot,
            crash,
            stop,
            task,
        }
    }

    pub fn snapshot(&self) -> ContainerSnapshot {
        lock(&self.snapshot).clone()
    }

    /// Kills the current process (SIGKILL) as a crash would; the supervisor restarts it.
    pub fn kill(&self) {
        self.crash.notify_one();
    }

    /// Kills the process and ends supervision.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(error) = self.task.await {
            tracing::warn!(%error, "container supervisor ended abnormally");
        }
    }
}

/// A process to start (the fields of [`Launch::Process`]).
struct ProcessLaunch {
    program: PathBuf,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    work_dir: PathBuf,
    log_path: PathBuf,
    placement: Placement,
    owner: (u32, u32),
}

struct Supervisor {
    name: String,
    launch: Launch,
    policy: RestartPolicy,
    registry: Arc<ProcessRegistry>,
    snapshot: Arc<Mutex<ContainerSnapshot>>,
    crash: Arc<Notify>,
    stop: watch::Receiver<bool>,
    exited: Arc<Notify>,
}

enum RunEnd {
    Exited(Termination),
    Stopped,
}

impl Supervisor {
    async fn run(mut self) {
        let mut backoff = INITIAL_BACKOFF;
        loop {
            let started = Instant::now();
            let end = match self.launch.clone() {
                Launch::Process {
                    program,
                    args,
                    env,
                    work_dir,
                    log_path,
                    placement,
                    owner,
                } => {
                    let process = ProcessLaunch {
                        program,
                        args,
                        env,
                        work_dir,
                        log_path,
                        placement,
                        owner,
                    };
                    self.run_process(process).await
                }
                Launch::Echo {
                    net,
                    ports,
                    identity,
                } => self.run_echo(net, ports, identity).await,
                Launch::Complete => {
                    let now = now_rfc3339();
                    RunEnd::Exited(Termination {
                        exit_code: 0,
                        reason: "Completed".into(),
                        message: String::new(),
                        started_at: now.clone(),
                        finished_at: now,
                    })
                }
            };
            let termination = match end {
                RunEnd::Stopped => return,
                RunEnd::Exited(termination) => termination,
            };
            tracing::info!(container = %self.name, exit_code = termination.exit_code, reason = %termination.reason, "container exited");
            let restart = self.policy.restarts_after(termination.exit_code);
            {
                let mut snapshot = lock(&self.snapshot);
                snapshot.last_termination = Some(termination.clone());
                snapshot.state = if restart {
                    ContainerState::Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: format!(
                            "back-off {}ms restarting failed container",
                            backoff.as_millis()
                        ),
                    }
                } else {
                    ContainerState::Terminated(termination)
                };
            }
            self.exited.notify_one();
            if !restart {
                return;
            }
            if started.elapsed() >= BACKOFF_RESET_AFTER {
                backoff = INITIAL_BACKOFF;
            }
            // Back off before restarting, unless the pod is being stopped meanwhile.
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped(&mut self.stop) => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            lock(&self.snapshot).restart_count += 1;
        }
    }

    fn set_running(&self) -> String {
        let started_at = now_rfc3339();
        lock(&self.snapshot).state = ContainerState::Running {
            started_at: started_at.clone(),
        };
        started_at
    }

    async fn run_process(&mut self, process: ProcessLaunch) -> RunEnd {
        let ProcessLaunch {
            program,
            args,
            env,
            work_dir,
            log_path,
            placement,
            owner,
        } = process;
        let started_at = now_rfc3339();
        let failed = |message: String| {
            RunEnd::Exited(Termination {
                exit_code: 128,
                reason: "StartError".into(),
                message,
                started_at: started_at.clone(),
                finished_at: now_rfc3339(),
            })
        };
        if let Err(error) = std::fs::create_dir_all(&work_dir)
            .and_then(|()| std::os::unix::fs::chown(&work_dir, Some(owner.0), Some(owner.1)))
        {
            return failed(format!("cannot create {}: {error}", work_dir.display()));
        }
        let log = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
        {
            Ok(log) => log,
            Err(error) => return failed(format!("cannot open {}: {error}", log_path.display())),
        };
        // The process may reopen its stdout (`/dev/stdout`, as Envoy's access logs do): the
        // log file belongs to the container's user, as a container's stdout pipe would.
        if let Err(error) = std::os::unix::fs::chown(&log_path, Some(owner.0), Some(owner.1)) {
            return failed(format!(
                "cannot hand {} to the container's user: {error}",
                log_path.display()
            ));
        }
        let log_err = match log.try_clone() {
            Ok(log) => log,
            Err(error) => return failed(format!("cannot open {}: {error}", log_path.display())),
        };
        let mut command = tokio::process::Command::new(&program);
        command
            .args(&args)
            .env_clear()
            .envs(&env)
            .current_dir(&work_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .kill_on_drop(true);
        if let Err(error) = placement.apply(&mut command) {
            return failed(format!("cannot enter the pod's network namespace: {error}"));
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => return failed(format!("cannot start {}: {error}", program.display())),
        };
        let pid = child.id().unwrap_or_default();
        self.registry.add(pid);
        let started_at = self.set_running();
        tracing::info!(container = %self.name, pid, program = %program.display(), "container started");
        let outcome = tokio::select! {
            status = child.wait() => Some(status),
            _ = self.crash.notified() => {
                kill_process_group(pid);
                Some(child.wait().await)
            }
            _ = stopped(&mut self.stop) => {
                kill_process_group(pid);
                let _ = child.wait().await;
                None
            }
        };
        self.registry.remove(pid);
        let Some(status) = outcome else {
            return RunEnd::Stopped;
        };
        let (exit_code, reason) = match status {
            Ok(status) => match (
                status.code(),
                std::os::unix::process::ExitStatusExt::signal(&status),
            ) {
                (Some(0), _) => (0, "Completed"),
                (Some(code), _) => (code, "Error"),
                (None, Some(signal)) => (128 + signal, "Error"),
                (None, None) => (255, "Error"),
            },
            Err(_) => (255, "Error"),
        };
        RunEnd::Exited(Termination {
            exit_code,
            reason: reason.into(),
            message: String::new(),
            started_at,
            finished_at: now_rfc3339(),
        })
    }

    async fn run_echo(&mut self, net: PodNet, ports: Vec<u16>, identity: EchoIdentity) -> RunEnd {
        let started_at = now_rfc3339();
        let mut servers = Vec::new();
        for port in ports {
            let address = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
            match net.listen(address) {
                Ok(listener) => servers.push(tokio::spawn(serve_echo(listener, identity.clone()))),
                Err(error) => {
                    servers.iter().for_each(JoinHandle::abort);
                    return RunEnd::Exited(Termination {
                        exit_code: 1,
                        reason: "Error".into(),
                        message: format!("echo server cannot listen on {address}: {error}"),
                        started_at,
                        finished_at: now_rfc3339(),
                    });
                }
            }
        }
        let started_at = self.set_running();
        let end = tokio::select! {
            _ = self.crash.notified() => RunEnd::Exited(Termination {
                exit_code: 137,
                reason: "Error".into(),
                message: "killed".into(),
                started_at,
                finished_at: now_rfc3339(),
            }),
            _ = stopped(&mut self.stop) => RunEnd::Stopped,
        };
        servers.iter().for_each(JoinHandle::abort);
        end
    }
}

/// Resolves once the container is asked to stop (without holding the watch's read guard).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopping| *stopping).await;
}

/// SIGKILL to the process group `group` (each container process leads its own group, so
/// children such as Envoy die with it).
fn kill_process_group(group: u32) {
    if group == 0 {
        return;
    }
    let result = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(error) = result {
        tracing::warn!(%error, group, "cannot run kill");
    }
}

/// Current time in the API's RFC 3339 form, whole seconds.
pub fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or(now)
        .to_string()
}

// A poisoned lock only means a panic elsewhere; the snapshot is still meaningful.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
