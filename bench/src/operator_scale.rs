//! S5 — the operator at scale: `meshplane-operator` (release binary, its own process) against
//! the Kubernetes API stand-in (`kube-standin`, another process), with many control planes and
//! namespaces.
//!
//! 1. Start `kube-standin` on loopback; install what `config/default` installs except the
//!    operator's Deployment and its admission webhook (the operator Namespace, the CRDs, the
//!    operator's ServiceAccount and RBAC from `config/rbac`).
//! 2. Create one `MeshControlPlane` per tenant (`t<i>`, revision `t<i>-v1`, Strict,
//!    `namespaceSelector` on the label `tenant=t<i>`) and the namespaces, round-robin over the
//!    tenants, each labelled `tenant=t<i>` and `meshplane.io/rev=t<i>-v1`.
//! 3. Watch (as admin, from this process) ConfigMaps and RoleBindings carrying the operator's
//!    `app.kubernetes.io/managed-by=meshplane` label in all namespaces, recording when each
//!    appears and disappears.
//! 4. Start the operator as its ServiceAccount (`operator.kubeconfig`) and wait until every
//!    namespace has its bootstrap ConfigMap `meshplane-<R>-bootstrap` and reader RoleBinding
//!    `meshplane-<R>-reader` (initial provisioning).
//! 5. Churn: at a fixed rate, remove the `meshplane.io/rev` label of a random member namespace
//!    (leave) or put it back on a namespace that left (join). Latency = label patch sent → the
//!    watch shows both objects present (join) or both gone (leave).
//! 6. Idle window: no changes; operator CPU and API writes.
//! 7. Steady-state resync: stop the operator, start a fresh process (it lists everything and
//!    reconciles every control plane) with no change made, wait until its reconciles stop, and
//!    count the API writes the stand-in answered meanwhile (`GET /standin/requests`); every one
//!    is listed.
//!
//! Operator and stand-in CPU and RSS are sampled from `/proc`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{self, Scope};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use meshplane_crds::names;
use meshplane_kube_standin::requests::RequestCounts;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use crate::procstat::{self, Metrics, ProcSample};
use crate::scenario::{free_ports, Env, Size, Table};
use crate::stats::{bytes, ms, quantile};

/// `config/` of the workspace: CRDs, RBAC and the operator Namespace are applied from there.
const CONFIG_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config");
/// The operator's namespace (what `config/default` puts namespaced objects into).
const OPERATOR_NAMESPACE: &str = "meshplane-system";
/// Field manager of the bench's own writes.
const BENCH_MANAGER: &str = "meshplane-bench";
/// Label the namespace selectors of the bench's control planes use.
const TENANT_LABEL: &str = "tenant";
/// How many API requests the bench's setup keeps in flight.
const SETUP_CONCURRENCY: usize = 16;
/// Bound on process start-up (stand-in printing its address, operator answering /healthz).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How often quiescence and readiness are polled.
const POLL: Duration = Duration::from_millis(250);

/// Sizes of one run.
#[derive(Clone, Debug)]
struct Params {
    control_planes: usize,
    namespaces: usize,
    /// Label changes made during churn (joins and leaves alternate).
    changes: usize,
    /// Label changes per second.
    rate: f64,
    /// Bound on the initial provisioning.
    provision_timeout: Duration,
    /// After the last change, how long pending changes may take before they count as not
    /// converged.
    settle: Duration,
    /// The operator counts as quiet once its reconcile and write counters have not moved for
    /// this long.
    quiet: Duration,
    /// Bound on waiting for quiet.
    quiet_timeout: Duration,
    /// Length of the idle measurement window.
    idle: Duration,
}

fn params(size: Size) -> Params {
    match size {
        Size::Short => Params {
            control_planes: 10,
            namespaces: 100,
            changes: 20,
            rate: 5.0,
            provision_timeout: Duration::from_secs(120),
            settle: Duration::from_secs(30),
            quiet: Duration::from_secs(2),
            quiet_timeout: Duration::from_secs(120),
            idle: Duration::from_secs(3),
        },
        Size::Full => Params {
            control_planes: 100,
            namespaces: 2000,
            changes: 300,
            rate: 2.0,
            provision_timeout: Duration::from_secs(900),
            settle: Duration::from_secs(120),
            quiet: Duration::from_secs(5),
            quiet_timeout: Duration::from_secs(600),
            idle: Duration::from_secs(15),
        },
    }
}

fn tenant(i: usize) -> String {
    format!("t{i}")
}

fn revision(i: usize) -> String {
    format!("t{i}-v1")
}

fn namespace_name(j: usize) -> String {
    format!("s5-{j:04}")
}

/// A child process of the bench, with its log file.
struct Proc {
    what: String,
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
}

impl Proc {
    /// Starts `command` with stderr (and, unless the caller set up stdout, stdout) in `log`.
    fn spawn(
        what: &str,
        mut command: tokio::process::Command,
        log: &Path,
        stdout_to_log: bool,
    ) -> Result<Proc> {
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        if stdout_to_log {
            command.stdout(Stdio::from(out.try_clone()?));
        }
        let child = command
            .stdin(Stdio::null())
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let pid = child
            .id()
            .with_context(|| format!("{what} exited at once"))?;
        Ok(Proc {
            what: what.to_string(),
            child,
            pid,
            log: log.to_path_buf(),
        })
    }

    /// Fails when the process has exited.
    fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited with {status}; see {}",
                self.what,
                self.log.display()
            );
        }
        Ok(())
    }

    fn sample(&self) -> Result<(Instant, ProcSample)> {
        procstat::now(self.pid).with_context(|| format!("sampling {}", self.what))
    }

    /// Sends `signal` (our own child, by pid), then SIGKILL after 15 s.
    async fn stop(mut self, signal: &str) {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            eprintln!(
                "meshplane-bench: {} ignored SIG{signal}; killing it",
                self.what
            );
            let _ = self.child.kill().await;
        }
    }
}

/// The running stand-in.
struct StandIn {
    proc: Proc,
    /// `127.0.0.1:<port>` (plain HTTP is served on the same port as HTTPS).
    addr: String,
    kubeconfig_dir: PathBuf,
}

impl StandIn {
    async fn start(env: &Env, work: &Path) -> Result<StandIn> {
        let [port] = free_ports::<1>()?;
        let kubeconfig_dir = work.join("kubeconfigs");
        let mut command = tokio::process::Command::new(&env.standin_bin);
        command
            .arg("--port")
            .arg(port.to_string())
            .arg("--kubeconfig-dir")
            .arg(&kubeconfig_dir)
            .env(
                "RUST_LOG",
                std::env::var("BENCH_STANDIN_LOG")
                    .unwrap_or_else(|_| "info,kube_standin::writes=debug".into()),
            )
            .stdout(Stdio::piped());
        let mut proc = Proc::spawn(
            "kube-standin",
            command,
            &work.join("kube-standin.log"),
            false,
        )?;
        let stdout = proc.child.stdout.take().context("kube-standin's stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(START_TIMEOUT, lines.next_line())
            .await
            .with_context(|| {
                format!(
                    "kube-standin printed no address within {START_TIMEOUT:?}; see {}",
                    proc.log.display()
                )
            })?
            .context("reading kube-standin's stdout")?;
        match first {
            Some(url) if url.starts_with("https://") => {}
            other => {
                proc.check_running()?;
                bail!(
                    "kube-standin printed {other:?} instead of its address; see {}",
                    proc.log.display()
                );
            }
        }
        // Keep draining stdout so the stand-in never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(StandIn {
            proc,
            addr: format!("127.0.0.1:{port}"),
            kubeconfig_dir,
        })
    }

    /// The request counter (`GET /standin/requests`).
    async fn requests(&self) -> Result<RequestCounts> {
        let (status, body) = procstat::http_get(&self.addr, "/standin/requests").await?;
        anyhow::ensure!(
            status == 200,
            "GET /standin/requests: HTTP {status}: {body}"
        );
        serde_json::from_str(&body).context("decoding /standin/requests")
    }
}

async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .with_context(|| format!("loading {}", kubeconfig.display()))?;
    Client::try_from(config).context("building a Kubernetes client")
}

/// The YAML documents of `config/default` that S5 needs: the operator Namespace, the CRDs and
/// the operator's RBAC (no Deployment: the operator runs as a process; no admission webhook:
/// nothing would serve it).
fn install_documents() -> Result<Vec<Value>> {
    let config = Path::new(CONFIG_DIR);
    let mut files = vec![config.join("default/namespace.yaml")];
    for dir in ["crd", "rbac"] {
        let dir = config.join(dir);
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("reading {}", dir.display()))?;
        entries.retain(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        });
        entries.sort();
        files.extend(entries);
    }
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        docs.extend(
            meshplane_crds::manifest::parse_documents(&text)
                .with_context(|| format!("parsing {}", file.display()))?,
        );
    }
    Ok(docs)
}

/// Server-side applies one document; namespaced objects without a namespace go into the
/// operator's namespace, as kustomize does for `config/default`.
async fn apply_document(client: &Client, mut doc: Value) -> Result<()> {
    let text = |pointer: &str| -> Result<String> {
        doc.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
            .with_context(|| format!("a document without {pointer}"))
    };
    let (api_version, kind, name) = (
        text("/apiVersion")?,
        text("/kind")?,
        text("/metadata/name")?,
    );
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let gvk = GroupVersionKind::gvk(group, version, &kind);
    let (resource, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
        let namespace = doc
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or(OPERATOR_NAMESPACE)
            .to_string();
        if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("namespace".into(), json!(namespace));
        }
        Api::namespaced_with(client.clone(), &namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    api.patch(
        &name,
        &PatchParams::apply(BENCH_MANAGER).force(),
        &Patch::Apply(&doc),
    )
    .await
    .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}

fn control_plane(i: usize) -> Value {
    json!({
        "apiVersion": "meshplane.io/v1alpha1",
        "kind": "MeshControlPlane",
        "metadata": {"name": revision(i)},
        "spec": {
            "tenant": tenant(i),
            "version": "0.1.0",
            "isolation": "Strict",
            "namespaceSelector": {"matchLabels": {TENANT_LABEL: tenant(i)}},
        },
    })
}

/// Creates the control planes and the labelled namespaces.
async fn populate(client: &Client, p: &Params) -> Result<()> {
    let gvk = GroupVersionKind::gvk("meshplane.io", "v1alpha1", "MeshControlPlane");
    let mcps: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "meshcontrolplanes"),
    );
    futures::stream::iter(0..p.control_planes)
        .map(|i| {
            let mcps = mcps.clone();
            async move {
                mcps.patch(
                    &revision(i),
                    &PatchParams::apply(BENCH_MANAGER).force(),
                    &Patch::Apply(&control_plane(i)),
                )
                .await
                .with_context(|| format!("applying MeshControlPlane {}", revision(i)))
                .map(|_| ())
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    futures::stream::iter(0..p.namespaces)
        .map(|j| {
            let namespaces = namespaces.clone();
            let t = j % p.control_planes;
            async move {
                let ns: Namespace = serde_json::from_value(json!({
                    "metadata": {
                        "name": namespace_name(j),
                        "labels": {TENANT_LABEL: tenant(t), names::REV_LABEL: revision(t)},
                    },
                }))?;
                namespaces
                    .create(&PostParams::default(), &ns)
                    .await
                    .with_context(|| format!("creating Namespace {}", namespace_name(j)))
                    .map(|_| ())
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The two per-namespace objects of a revision that S5 watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Obj {
    ConfigMap,
    RoleBinding,
}

impl Obj {
    fn name(self, revision: &str) -> String {
        match self {
            Obj::ConfigMap => names::bootstrap_configmap(revision),
            Obj::RoleBinding => names::member_reader(revision),
        }
    }
}

/// What a label change should lead to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// Operator start → present (all namespaces, at once).
    Initial,
    /// Label added → present.
    Join,
    /// Label removed → gone.
    Leave,
}

struct Expectation {
    change: Change,
    revision: String,
    present: bool,
    since: Instant,
}

/// A watch event, reduced to what the tracker needs.
enum Seen {
    Init,
    InitApply(String, String),
    InitDone,
    Apply(String, String),
    Delete(String, String),
}

#[derive(Default)]
struct TrackerState {
    /// (object, namespace, name) currently present, as the watches report.
    present: HashSet<(Obj, String, String)>,
    /// Objects listed by a watch (re)starting, until its initial list is complete.
    relisting: HashMap<Obj, HashSet<(String, String)>>,
    synced: HashSet<Obj>,
    /// Namespace → what its last change should lead to, until it does.
    pending: HashMap<String, Expectation>,
    done: Vec<(Change, Duration)>,
    /// Appearances and disappearances seen so far.
    transitions: u64,
}

impl TrackerState {
    fn set(&mut self, obj: Obj, namespace: String, name: String, present: bool) {
        let key = (obj, namespace, name);
        let changed = if present {
            self.present.insert(key.clone())
        } else {
            self.present.remove(&key)
        };
        if changed {
            self.transitions += 1;
            self.check(&key.1);
        }
    }

    fn satisfied(&self, namespace: &str, e: &Expectation) -> bool {
        [Obj::ConfigMap, Obj::RoleBinding].into_iter().all(|obj| {
            let key = (obj, namespace.to_string(), obj.name(&e.revision));
            self.present.contains(&key) == e.present
        })
    }

    fn check(&mut self, namespace: &str) {
        let met = self
            .pending
            .get(namespace)
            .is_some_and(|e| self.satisfied(namespace, e));
        if met {
            if let Some(e) = self.pending.remove(namespace) {
                self.done.push((e.change, e.since.elapsed()));
            }
        }
    }
}

/// Watches the operator's ConfigMaps and RoleBindings in all namespaces and times label
/// changes against them.
#[derive(Clone)]
struct Tracker {
    state: Arc<Mutex<TrackerState>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Tracker {
    fn start(client: &Client) -> (Tracker, Vec<tokio::task::JoinHandle<()>>) {
        let tracker = Tracker {
            state: Arc::default(),
            changed: Arc::new(tokio::sync::watch::channel(0).0),
        };
        let tasks = vec![
            tracker.watch::<ConfigMap>(client, Obj::ConfigMap),
            tracker.watch::<RoleBinding>(client, Obj::RoleBinding),
        ];
        (tracker, tasks)
    }

    fn watch<K>(&self, client: &Client, obj: Obj) -> tokio::task::JoinHandle<()>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let api: Api<K> = Api::all(client.clone());
        let config = watcher::Config::default().labels(&format!(
            "{}={}",
            names::MANAGED_BY_LABEL,
            names::MANAGED_BY_VALUE
        ));
        let tracker = self.clone();
        tokio::spawn(async move {
            let key = |o: &K| (o.namespace().unwrap_or_default(), o.name_any());
            let mut events = watcher(api, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                let seen = match event {
                    Ok(watcher::Event::Init) => Seen::Init,
                    Ok(watcher::Event::InitApply(o)) => {
                        let (ns, name) = key(&o);
                        Seen::InitApply(ns, name)
                    }
                    Ok(watcher::Event::InitDone) => Seen::InitDone,
                    Ok(watcher::Event::Apply(o)) => {
                        let (ns, name) = key(&o);
                        Seen::Apply(ns, name)
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        let (ns, name) = key(&o);
                        Seen::Delete(ns, name)
                    }
                    Err(e) => {
                        eprintln!("meshplane-bench: S5 watch of {obj:?}: {e}");
                        continue;
                    }
                };
                tracker.seen(obj, seen);
            }
        })
    }

    fn seen(&self, obj: Obj, seen: Seen) {
        {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            match seen {
                Seen::Init => {
                    s.relisting.insert(obj, HashSet::new());
                }
                Seen::InitApply(ns, name) => {
                    s.relisting.entry(obj).or_default().insert((ns, name));
                }
                Seen::InitDone => {
                    let listed = s.relisting.remove(&obj).unwrap_or_default();
                    let gone: Vec<(String, String)> = s
                        .present
                        .iter()
                        .filter(|(o, ns, name)| {
                            *o == obj && !listed.contains(&(ns.clone(), name.clone()))
                        })
                        .map(|(_, ns, name)| (ns.clone(), name.clone()))
                        .collect();
                    for (ns, name) in gone {
                        s.set(obj, ns, name, false);
                    }
                    for (ns, name) in listed {
                        s.set(obj, ns, name, true);
                    }
                    s.synced.insert(obj);
                }
                Seen::Apply(ns, name) => s.set(obj, ns, name, true),
                Seen::Delete(ns, name) => s.set(obj, ns, name, false),
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    fn with<T>(&self, f: impl FnOnce(&mut TrackerState) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Registers what namespace `ns` (of `revision`) should come to; the clock starts now.
    fn expect(&self, ns: &str, revision: &str, change: Change) {
        self.with(|s| {
            s.pending.insert(
                ns.to_string(),
                Expectation {
                    change,
                    revision: revision.to_string(),
                    present: change != Change::Leave,
                    since: Instant::now(),
                },
            );
            s.check(ns);
        });
        self.changed.send_modify(|n| *n += 1);
    }

    /// Forgets what `ns` was expected to come to.
    fn cancel(&self, ns: &str) {
        self.with(|s| s.pending.remove(ns));
    }

    fn is_pending(&self, ns: &str) -> bool {
        self.with(|s| s.pending.contains_key(ns))
    }

    /// Waits until `cond` holds; false when `timeout` passed first.
    async fn wait(&self, timeout: Duration, cond: impl Fn(&TrackerState) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if self.with(|s| cond(s)) {
                return true;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return self.with(|s| cond(s)),
            }
        }
    }

    /// Latencies of finished changes of one kind, taking them out.
    fn take(&self, change: Change) -> Vec<Duration> {
        self.with(|s| {
            let (taken, rest) = std::mem::take(&mut s.done)
                .into_iter()
                .partition(|(c, _)| *c == change);
            s.done = rest;
            taken.into_iter().map(|(_, d)| d).collect()
        })
    }

    /// Drops pending expectations, returning how many there were.
    fn abandon(&self) -> usize {
        self.with(|s| std::mem::take(&mut s.pending).len())
    }
}

/// A running operator process and its monitoring address.
struct Operator {
    proc: Proc,
    metrics_addr: String,
    started: Instant,
}

impl Operator {
    async fn start(env: &Env, work: &Path, kubeconfig: &Path, n: usize) -> Result<Operator> {
        let [metrics, webhook] = free_ports::<2>()?;
        let mut command = tokio::process::Command::new(&env.operator_bin);
        command
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
            .args(["--webhook-addr", &format!("127.0.0.1:{webhook}")])
            .args(["--namespace", OPERATOR_NAMESPACE])
            // No caBundle to keep: the bench registers no admission webhook for the operator.
            .arg("--webhook-config-name=")
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("POD_NAME", format!("meshplane-operator-bench-{n}"))
            .env("POD_NAMESPACE", OPERATOR_NAMESPACE)
            .env(
                "RUST_LOG",
                std::env::var("BENCH_OPERATOR_LOG").unwrap_or_else(|_| "info".into()),
            );
        let started = Instant::now();
        let what = format!("meshplane-operator #{n}");
        let mut proc = Proc::spawn(
            &what,
            command,
            &work.join(format!("operator-{n}.log")),
            true,
        )?;
        let metrics_addr = format!("127.0.0.1:{metrics}");
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            proc.check_running()?;
            if let Ok((200, _)) = procstat::http_get(&metrics_addr, "/healthz").await {
                break;
            }
            if Instant::now() > deadline {
                proc.stop("TERM").await;
                bail!("{what} did not answer /healthz within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(Operator {
            proc,
            metrics_addr,
            started,
        })
    }

    async fn metrics(&self) -> Metrics {
        procstat::scrape(&self.metrics_addr)
            .await
            .unwrap_or_default()
    }

    /// (control-plane reconciles, API writes) the operator counted itself.
    async fn counters(&self) -> (f64, f64) {
        let m = self.metrics().await;
        (
            m.sum(
                "meshplane_operator_reconciles_total",
                &["controller=\"meshcontrolplane\""],
            ),
            m.sum("meshplane_operator_api_writes_total", &[]),
        )
    }

    /// Waits until at least `min_reconciles` control-plane reconciles ran and neither the
    /// reconcile nor the write counter moved for `quiet`. Returns when the counters last moved,
    /// and whether quiet was reached before `timeout`.
    async fn wait_quiet(
        &mut self,
        min_reconciles: f64,
        quiet: Duration,
        timeout: Duration,
    ) -> Result<(Instant, bool)> {
        let deadline = Instant::now() + timeout;
        let mut last = self.counters().await;
        let mut moved = Instant::now();
        loop {
            self.proc.check_running()?;
            let now = self.counters().await;
            if now != last {
                last = now;
                moved = Instant::now();
            }
            if last.0 >= min_reconciles && moved.elapsed() >= quiet {
                return Ok((moved, true));
            }
            if Instant::now() > deadline {
                return Ok((moved, false));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Picks a random namespace whose label state is `want` and that has no change in flight.
fn pick(
    rng: &mut StdRng,
    labelled: &[Option<bool>],
    want: bool,
    tracker: &Tracker,
) -> Option<usize> {
    let ok = |j: usize| labelled[j] == Some(want) && !tracker.is_pending(&namespace_name(j));
    for _ in 0..64 {
        let j = rng.random_range(0..labelled.len());
        if ok(j) {
            return Some(j);
        }
    }
    let start = rng.random_range(0..labelled.len());
    (0..labelled.len())
        .map(|k| (start + k) % labelled.len())
        .find(|&j| ok(j))
}

/// What the churn phase did.
#[derive(Debug, Default)]
struct Churned {
    made: usize,
    /// Ticks without a candidate namespace (every one had a change in flight).
    skipped: usize,
    /// Label patches the API answered with an error (or not at all); their namespaces are
    /// left out of the rest of the run, since their label is unknown.
    failed: usize,
}

/// The label changes of the churn phase.
async fn churn(client: &Client, tracker: &Tracker, p: &Params) -> Churned {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    // true: labelled, false: not, None: unknown after a failed patch.
    let mut labels: Vec<Option<bool>> = vec![Some(true); p.namespaces];
    let mut rng = StdRng::seed_from_u64(5);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / p.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Churned::default();
    for i in 0..p.changes {
        tick.tick().await;
        // Leaves and joins alternate; a join needs a namespace whose leave has converged.
        let leave_first = i % 2 == 0;
        let picked = pick(&mut rng, &labels, leave_first, tracker)
            .or_else(|| pick(&mut rng, &labels, !leave_first, tracker));
        let Some(j) = picked else {
            out.skipped += 1;
            continue;
        };
        let name = namespace_name(j);
        let rev = revision(j % p.control_planes);
        let leaving = labels[j] == Some(true);
        tracker.expect(
            &name,
            &rev,
            if leaving { Change::Leave } else { Change::Join },
        );
        let value = if leaving { Value::Null } else { json!(rev) };
        let patched = namespaces
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {names::REV_LABEL: value}}})),
            )
            .await;
        match patched {
            Ok(_) => {
                labels[j] = Some(!leaving);
                out.made += 1;
            }
            Err(e) => {
                eprintln!("meshplane-bench: S5 relabelling Namespace {name} failed: {e}");
                tracker.cancel(&name);
                labels[j] = None;
                out.failed += 1;
            }
        }
    }
    out
}

fn p50_p99(mut v: Vec<Duration>) -> String {
    let n = v.len();
    format!(
        "{} / {} ({n} samples)",
        ms(quantile(&mut v, 0.5)),
        ms(quantile(&mut v, 0.99))
    )
}

/// A Prometheus counter value as an integer.
fn count(v: f64) -> u64 {
    v.max(0.0).round() as u64
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn verb_summary(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The writes between two counter readings, as one table cell (and a full list on stderr and
/// in the work directory).
fn writes_cell(
    before: &RequestCounts,
    after: &RequestCounts,
    label: &str,
    work: &Path,
) -> Result<String> {
    let n = after.writes.saturating_sub(before.writes);
    if n == 0 {
        return Ok("**0**".into());
    }
    let logged = after.writes_after(before);
    let mut list = String::new();
    for w in &logged {
        let _ = writeln!(list, "{w}");
    }
    let file = work.join(format!("{label}-writes.txt"));
    std::fs::write(&file, &list).with_context(|| format!("writing {}", file.display()))?;
    eprintln!(
        "meshplane-bench: S5 {label}: {n} API writes (also in {}):\n{list}",
        file.display()
    );
    let examples: Vec<String> = logged.iter().take(3).map(|w| format!("`{w}`")).collect();
    Ok(format!(
        "**{n}**: {}; e.g. {}",
        verb_summary(&after.writes_by_resource_since(before)),
        examples.join(", ")
    ))
}

/// Runs S5 and returns its table.
pub async fn run(env: &Env) -> Result<String> {
    for (bin, hint) in [
        (&env.operator_bin, "-p meshplane-operator"),
        (&env.standin_bin, "-p meshplane-kube-standin --bins"),
    ] {
        anyhow::ensure!(
            bin.exists(),
            "{} not found: build it with `cargo build --release {hint}`",
            bin.display()
        );
    }
    let p = params(env.size);
    let work = env.work.join("s5");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let standin = StandIn::start(env, &work).await?;
    let result = drive(env, &work, &standin, &p).await;
    standin.proc.stop("INT").await;
    result
}

async fn drive(env: &Env, work: &Path, standin: &StandIn, p: &Params) -> Result<String> {
    let admin = client_for(&standin.kubeconfig_dir.join("admin.kubeconfig")).await?;
    let operator_kubeconfig = standin.kubeconfig_dir.join("operator.kubeconfig");

    let setup_started = Instant::now();
    for doc in install_documents()? {
        apply_document(&admin, doc).await?;
    }
    populate(&admin, p).await?;
    let setup = setup_started.elapsed();
    eprintln!(
        "meshplane-bench: S5 {} control planes and {} namespaces created in {}",
        p.control_planes,
        p.namespaces,
        secs(setup)
    );

    let (tracker, watches) = Tracker::start(&admin);
    let result = measure(
        env,
        work,
        standin,
        &admin,
        p,
        &tracker,
        &operator_kubeconfig,
    )
    .await;
    for w in watches {
        w.abort();
    }
    let mut m = result?;
    m.setup = setup;
    m.standin_peak_rss = standin.proc.sample()?.1.peak_rss_bytes;
    Ok(table(p, &m))
}

/// Everything the table reports.
struct Measured {
    setup: Duration,
    initial: Vec<Duration>,
    initial_missing: usize,
    initial_vcpu: f64,
    rss_provisioned: u64,
    churned: Churned,
    churn_secs: f64,
    joins: Vec<Duration>,
    leaves: Vec<Duration>,
    not_converged: usize,
    churn_vcpu: f64,
    standin_churn_vcpu: f64,
    reconcile_p50_p99: (Option<f64>, Option<f64>),
    idle_secs: f64,
    idle_vcpu: f64,
    idle_writes: String,
    peak_rss_first: u64,
    errors_first: u64,
    shutdown_writes: u64,
    resync_writes: String,
    resync_reads: String,
    resync_operator_writes: u64,
    resync_reconciles: u64,
    resync_duration: Duration,
    resync_quiet: bool,
    resync_cpu: f64,
    resync_transitions: u64,
    rss_after_resync: u64,
    peak_rss_second: u64,
    errors_second: u64,
    standin_peak_rss: u64,
}

async fn measure(
    env: &Env,
    work: &Path,
    standin: &StandIn,
    admin: &Client,
    p: &Params,
    tracker: &Tracker,
    kubeconfig: &Path,
) -> Result<Measured> {
    anyhow::ensure!(
        tracker.wait(START_TIMEOUT, |s| s.synced.len() == 2).await,
        "the bench's ConfigMap/RoleBinding watches did not sync within {START_TIMEOUT:?}"
    );
    // Initial provisioning: the clock of every namespace starts when the operator starts.
    for j in 0..p.namespaces {
        tracker.expect(
            &namespace_name(j),
            &revision(j % p.control_planes),
            Change::Initial,
        );
    }
    let t0 = Instant::now();
    let mut op = Operator::start(env, work, kubeconfig, 1).await?;
    let outcome = async {
        let c0 = op.proc.sample()?;
        tracker
            .wait(p.provision_timeout, |s| s.pending.is_empty())
            .await;
        let initial_missing = tracker.abandon();
        let c1 = op.proc.sample()?;
        let initial = tracker.take(Change::Initial);
        eprintln!(
            "meshplane-bench: S5 initial provisioning: {} namespaces in {} ({initial_missing} missing)",
            initial.len(),
            secs(c1.0 - t0)
        );
        let (_, quiet) = op
            .wait_quiet(p.control_planes as f64, p.quiet, p.quiet_timeout)
            .await?;
        if !quiet {
            eprintln!("meshplane-bench: S5 the operator did not go quiet after provisioning");
        }
        let rss_provisioned = op.proc.sample()?.1.rss_bytes;

        // Churn.
        eprintln!("meshplane-bench: S5 churn: {} label changes at {}/s", p.changes, p.rate);
        let reconcile_hist_before = op.metrics().await;
        let (s0, c2) = (standin.proc.sample()?, op.proc.sample()?);
        let churned = churn(admin, tracker, p).await;
        tracker.wait(p.settle, |s| s.pending.is_empty()).await;
        let not_converged = tracker.abandon();
        let (s1, c3) = (standin.proc.sample()?, op.proc.sample()?);
        let reconcile_hist = op.metrics().await;
        let joins = tracker.take(Change::Join);
        let leaves = tracker.take(Change::Leave);
        let (_, quiet) = op.wait_quiet(0.0, p.quiet, p.quiet_timeout).await?;
        if !quiet {
            eprintln!("meshplane-bench: S5 the operator did not go quiet after churn");
        }

        // Idle window: no changes at all (a measurement window, not a wait for a condition).
        eprintln!("meshplane-bench: S5 idle window of {}", secs(p.idle));
        let (w0, i0) = (standin.requests().await?, op.proc.sample()?);
        tokio::time::sleep(p.idle).await;
        let (w1, i1) = (standin.requests().await?, op.proc.sample()?);
        let idle_writes = writes_cell(&w0, &w1, "idle", work)?;
        let errors_first = count(
            op.metrics()
                .await
                .sum("meshplane_operator_reconcile_errors_total", &[]),
        );
        let peak_rss_first = op.proc.sample()?.1.peak_rss_bytes;
        anyhow::Ok(Measured {
            setup: Duration::ZERO,
            initial,
            initial_missing,
            initial_vcpu: procstat::vcpu(c0, c1),
            rss_provisioned,
            churned,
            churn_secs: (c3.0 - c2.0).as_secs_f64(),
            joins,
            leaves,
            not_converged,
            churn_vcpu: procstat::vcpu(c2, c3),
            standin_churn_vcpu: procstat::vcpu(s0, s1),
            reconcile_p50_p99: reconcile_quantiles(&reconcile_hist_before, &reconcile_hist),
            idle_secs: (i1.0 - i0.0).as_secs_f64(),
            idle_vcpu: procstat::vcpu(i0, i1),
            idle_writes,
            peak_rss_first,
            errors_first,
            shutdown_writes: 0,
            resync_writes: String::new(),
            resync_reads: String::new(),
            resync_operator_writes: 0,
            resync_reconciles: 0,
            resync_duration: Duration::ZERO,
            resync_quiet: false,
            resync_cpu: 0.0,
            resync_transitions: 0,
            rss_after_resync: 0,
            peak_rss_second: 0,
            errors_second: 0,
            standin_peak_rss: 0,
        })
    }
    .await;
    let before_stop = standin.requests().await;
    op.proc.stop("TERM").await;
    let mut m = outcome?;

    // Steady-state resync: a fresh operator process, nothing changed.
    eprintln!("meshplane-bench: S5 steady-state resync: restarting the operator");
    let before = standin.requests().await?;
    if let Ok(b) = before_stop {
        m.shutdown_writes = before.writes.saturating_sub(b.writes);
    }
    let transitions_before = tracker.with(|s| s.transitions);
    let mut op = Operator::start(env, work, kubeconfig, 2).await?;
    let resync = async {
        let (moved, quiet) = op
            .wait_quiet(p.control_planes as f64, p.quiet, p.quiet_timeout)
            .await?;
        let after = standin.requests().await?;
        let sample = op.proc.sample()?.1;
        let metrics = op.metrics().await;
        m.resync_writes = writes_cell(&before, &after, "resync", work)?;
        m.resync_reads = ["get", "list", "watch"]
            .iter()
            .map(|v| format!("{v} {}", after.verb(v).saturating_sub(before.verb(v))))
            .collect::<Vec<_>>()
            .join(", ");
        m.resync_operator_writes = count(metrics.sum("meshplane_operator_api_writes_total", &[]));
        m.resync_reconciles = count(metrics.sum(
            "meshplane_operator_reconciles_total",
            &["controller=\"meshcontrolplane\""],
        ));
        m.errors_second = count(metrics.sum("meshplane_operator_reconcile_errors_total", &[]));
        m.resync_duration = moved.saturating_duration_since(op.started);
        m.resync_quiet = quiet;
        m.resync_cpu = sample.cpu_seconds;
        m.rss_after_resync = sample.rss_bytes;
        m.peak_rss_second = sample.peak_rss_bytes;
        m.resync_transitions = tracker.with(|s| s.transitions) - transitions_before;
        anyhow::Ok(())
    }
    .await;
    op.proc.stop("TERM").await;
    resync?;
    Ok(m)
}

/// p50 and p99 (seconds) of the control-plane reconciles between two scrapes.
fn reconcile_quantiles(before: &Metrics, after: &Metrics) -> (Option<f64>, Option<f64>) {
    const NAME: &str = "meshplane_operator_reconcile_duration_seconds";
    let bucket = format!("{NAME}_bucket");
    let earlier: HashMap<&str, f64> = before
        .0
        .iter()
        .filter(|(s, _)| s.starts_with(&bucket) && s.contains("controller=\"meshcontrolplane\""))
        .map(|(s, v)| (s.as_str(), *v))
        .collect();
    let delta = Metrics(
        after
            .0
            .iter()
            .filter(|(s, _)| {
                s.starts_with(&bucket) && s.contains("controller=\"meshcontrolplane\"")
            })
            .map(|(s, v)| {
                (
                    s.clone(),
                    v - earlier.get(s.as_str()).copied().unwrap_or(0.0),
                )
            })
            .collect(),
    );
    (
        delta.histogram_quantile(NAME, 0.5),
        delta.histogram_quantile(NAME, 0.99),
    )
}

fn table(p: &Params, m: &Measured) -> String {
    let per_tenant = p.namespaces / p.control_planes.max(1);
    let mut t = Table::new("S5 — operator at scale");
    t.row(
        "size",
        format!(
            "{} MeshControlPlanes (tenants t0..t{}, one revision each, Strict, namespaceSelector on a `tenant` label), {} namespaces ({per_tenant} per tenant), operator as its ServiceAccount with `config/rbac`, against `kube-standin`",
            p.control_planes,
            p.control_planes.saturating_sub(1),
            p.namespaces
        ),
    );
    t.row(
        "setup (CRDs, RBAC, control planes, namespaces created by the bench)",
        secs(m.setup),
    );
    let mut initial = m.initial.clone();
    t.row(
        "initial provisioning: operator start → bootstrap ConfigMap + RoleBinding in a namespace, p50 / all namespaces",
        format!(
            "{} / {} ({} namespaces{})",
            ms(quantile(&mut initial, 0.5)),
            ms(quantile(&mut initial, 1.0)),
            initial.len(),
            if m.initial_missing > 0 {
                format!(", **{} not provisioned**", m.initial_missing)
            } else {
                String::new()
            }
        ),
    );
    t.row(
        "operator avg vCPU during initial provisioning / RSS after it",
        format!(
            "{:.2} / {}",
            m.initial_vcpu,
            bytes(m.rss_provisioned as f64)
        ),
    );
    t.row(
        "churn",
        format!(
            "{} `meshplane.io/rev` label changes at {}/s over {:.0} s, random namespaces: label removed (leave) and put back (join) alternately{}{}",
            m.churned.made,
            p.rate,
            m.churn_secs,
            if m.churned.skipped > 0 {
                format!(" ({} ticks skipped: no candidate)", m.churned.skipped)
            } else {
                String::new()
            },
            if m.churned.failed > 0 {
                format!("; **{} label patches failed** (API error or timeout)", m.churned.failed)
            } else {
                String::new()
            }
        ),
    );
    t.row(
        "join: label added → ConfigMap and RoleBinding present, p50 / p99",
        p50_p99(m.joins.clone()),
    );
    t.row(
        "leave: label removed → ConfigMap and RoleBinding gone, p50 / p99",
        p50_p99(m.leaves.clone()),
    );
    t.row(
        format!(
            "changes not converged {} s after the last one",
            p.settle.as_secs()
        ),
        m.not_converged.to_string(),
    );
    let (r50, r99) = m.reconcile_p50_p99;
    let s = |v: Option<f64>| ms(v.map(Duration::from_secs_f64));
    t.row(
        "reconcile duration during churn p50 / p99 (operator metric)",
        format!("{} / {}", s(r50), s(r99)),
    );
    t.row(
        "avg vCPU during churn: operator / stand-in",
        format!("{:.3} / {:.3}", m.churn_vcpu, m.standin_churn_vcpu),
    );
    t.row(
        format!(
            "idle ({:.0} s, no changes): operator vCPU / API writes",
            m.idle_secs
        ),
        format!("{:.4} / {}", m.idle_vcpu, m.idle_writes),
    );
    t.row(
        "**API writes during steady-state resync** (operator restarted, nothing changed; counted at the stand-in)",
        m.resync_writes.clone(),
    );
    t.row(
        "resync: reads at the stand-in / reconciles / operator's own write counter",
        format!(
            "{} / {} / {}",
            m.resync_reads, m.resync_reconciles, m.resync_operator_writes
        ),
    );
    t.row(
        "resync: start → last reconcile / operator CPU (whole new process) / ConfigMap+RoleBinding changes seen",
        format!(
            "{}{} / {:.2} s / {}",
            secs(m.resync_duration),
            if m.resync_quiet { "" } else { " (did not go quiet)" },
            m.resync_cpu,
            m.resync_transitions
        ),
    );
    t.row(
        "operator peak RSS: first process / restarted process (RSS after resync)",
        format!(
            "{} / {} ({})",
            bytes(m.peak_rss_first as f64),
            bytes(m.peak_rss_second as f64),
            bytes(m.rss_after_resync as f64)
        ),
    );
    t.row("stand-in peak RSS", bytes(m.standin_peak_rss as f64));
    t.row(
        "reconcile errors (first / restarted process); API writes while stopping the first",
        format!(
            "{} / {}; {}",
            m.errors_first, m.errors_second, m.shutdown_writes
        ),
    );
    t.render()
}
