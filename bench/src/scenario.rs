//! The benchmark scenarios: each generates a mesh, starts `meshplane-xds --source dir:`,
//! connects the load, drives mutations, samples the server and returns a markdown table.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::chart::{small_multiples, Panel};
use crate::load::{
    self, Condition, LoadConfig, LoadHandle, Protocol, StreamReport, StreamSpec, Visibility, Within,
};
use crate::meshgen::{MeshSpec, MeshState, Mutation, Planned, SHARED_NAMESPACE};
use crate::procstat::{self, Metrics, ProcSample, Sampler};
use crate::stats::{bytes, ms, quantile};

/// `short`: CI smoke sizes, seconds per scenario. `full`: the sizes docs/benchmarks.md reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Size {
    Short,
    Full,
}

/// Where things are.
#[derive(Clone, Debug)]
pub struct Env {
    pub xds_bin: PathBuf,
    /// `meshplane-operator` (S5).
    pub operator_bin: PathBuf,
    /// `kube-standin`, the Kubernetes API stand-in of `testing/kube-standin` (S5).
    pub standin_bin: PathBuf,
    /// Scratch space: generated state and server logs.
    pub work: PathBuf,
    /// Where charts (SVG) go.
    pub docs: PathBuf,
    pub size: Size,
    /// The Envoy binary of the fleet scenario (default: `ENVOY_BIN`, then `.venv`'s).
    pub envoy_bin: Option<PathBuf>,
    /// Every `delta_every`-th simulated proxy speaks delta xDS, the others state of the world
    /// (1: all delta, as injected sidecars by default; 0: none). S1 to S4 and the scale point.
    pub delta_every: usize,
    /// The simulated proxies do not accept compressed responses (as Envoy talking to the
    /// instance directly); by default they do, as the node agent does.
    pub plain_ads: bool,
}

/// How the proxies of a run split between the protocols, for the tables.
fn protocol_mix(delta_every: usize) -> String {
    match delta_every {
        0 => "every proxy SotW".to_string(),
        1 => "every proxy delta".to_string(),
        2 => "every 2nd delta".to_string(),
        3 => "every 3rd delta".to_string(),
        n => format!("every {n}th delta"),
    }
}

pub(crate) const TENANT: &str = "bench";
pub(crate) const REVISION: &str = "bench-r1";
pub(crate) const CONTROL_NS: &str = "meshplane-bench";
/// Bound on any wait for the connect storm.
const SYNC_TIMEOUT: Duration = Duration::from_secs(300);
/// After the last mutation, how long streams may take to converge before the run stops (a
/// pair not converged by then counts as not converged).
const DRAIN: Duration = Duration::from_secs(5);

/// A running `meshplane-xds` child process.
pub struct Server {
    child: tokio::process::Child,
    pub pid: u32,
    pub xds_addr: String,
    pub monitoring_addr: String,
}

/// `N` distinct free loopback ports for a child process to bind.
///
/// Every probe socket stays bound until all `N` are picked: the kernel may hand the same
/// ephemeral port to two probes made one after the other, and a server given one port twice
/// fails its second bind ("Address already in use"). A port can still be taken by another
/// process before the child binds it; [`Server::start`] retries on that.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let mut probes = Vec::with_capacity(N);
    for _ in 0..N {
        probes.push(std::net::TcpListener::bind("127.0.0.1:0").context("binding a probe port")?);
    }
    let mut ports = [0u16; N];
    for (port, probe) in ports.iter_mut().zip(&probes) {
        *port = probe.local_addr()?.port();
    }
    Ok(ports)
}

/// How many times a child that lost a port race is started again with fresh ports.
const PORT_RACE_ATTEMPTS: usize = 3;

/// Whether a child's log says one of its listeners could not bind.
fn lost_port_race(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("Address already in use"))
}

impl Server {
    /// Starts the server on `dir` and waits until it reports ready (sources synced).
    pub async fn start(env: &Env, dir: &Path, log: &Path) -> Result<Server> {
        let mut attempt = 1;
        loop {
            match Self::start_once(env, dir, log).await {
                Err(e) if attempt < PORT_RACE_ATTEMPTS && lost_port_race(log) => {
                    eprintln!("meshplane-xds lost a port race (attempt {attempt}: {e:#}); starting it again on fresh ports");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(env: &Env, dir: &Path, log: &Path) -> Result<Server> {
        let [xds, mon, hook] = free_ports::<3>()?;
        let log_file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err_file = log_file.try_clone()?;
        let child = tokio::process::Command::new(&env.xds_bin)
            .args([
                "--tenant",
                TENANT,
                "--revision",
                REVISION,
                "--control-namespace",
                CONTROL_NS,
            ])
            .arg("--source")
            .arg(format!("dir:{}", dir.display()))
            .args(["--xds-addr", &format!("127.0.0.1:{xds}")])
            .args(["--monitoring-addr", &format!("127.0.0.1:{mon}")])
            .args(["--webhook-addr", &format!("127.0.0.1:{hook}")])
            .arg("--webhook-tls-dir")
            .arg(dir.with_extension("tls"))
            .env(
                "RUST_LOG",
                std::env::var("BENCH_XDS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(err_file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", env.xds_bin.display()))?;
        let pid = child.id().context("server exited at once")?;
        let mut server = Server {
            child,
            pid,
            xds_addr: format!("127.0.0.1:{xds}"),
            monitoring_addr: format!("127.0.0.1:{mon}"),
        };
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "meshplane-xds exited with {status} before it was ready; see {}",
                    log.display()
                );
            }
            if let Ok((200, _)) = procstat::http_get(&server.monitoring_addr, "/readyz").await {
                return Ok(server);
            }
            if Instant::now() > deadline {
                server.stop().await;
                bail!("meshplane-xds not ready after 300 s; see {}", log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(mut self) {
        // Our own child, by pid: a graceful stop first so it can close its streams.
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    pub fn sample(&self) -> Result<(Instant, ProcSample)> {
        procstat::now(self.pid)
    }

    pub async fn metrics(&self) -> Metrics {
        procstat::scrape(&self.monitoring_addr)
            .await
            .unwrap_or_default()
    }
}

/// The length-delimited protobuf encoding of a short string: what an address looks like
/// inside an encoded resource (the length byte keeps 198.18.0.1 from matching 198.18.0.10).
pub fn pb_string(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    let mut n = s.len();
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(s.as_bytes());
    out
}

/// What streams must see for a mutation to count as converged.
pub fn conditions(m: &Mutation) -> Vec<Condition> {
    let ip = |ip: &Ipv4Addr| pb_string(&ip.to_string());
    match m {
        Mutation::EndpointReplaced { new_ip, .. } => {
            vec![Condition {
                type_index: 1,
                pattern: ip(new_ip),
                present: true,
                within: Within::Encoding,
            }]
        }
        Mutation::ServiceAdded {
            host, endpoint_ips, ..
        } => {
            let mut c = vec![Condition {
                type_index: 0,
                pattern: host.as_bytes().to_vec(),
                present: true,
                within: Within::Name,
            }];
            if let Some(first) = endpoint_ips.first() {
                c.push(Condition {
                    type_index: 1,
                    pattern: ip(first),
                    present: true,
                    within: Within::Encoding,
                });
            }
            // Routable: its virtual host (inline in the route configuration, or over VHDS).
            c.push(Condition {
                type_index: 3,
                pattern: host.as_bytes().to_vec(),
                present: true,
                within: Within::VirtualHostName,
            });
            c
        }
        Mutation::ServiceRemoved { host, .. } => {
            vec![Condition {
                type_index: 0,
                pattern: host.as_bytes().to_vec(),
                present: false,
                within: Within::Encoding,
            }]
        }
    }
}

/// Proxies spread round-robin over `namespaces`; every `delta_every`-th speaks delta; one in
/// `nack_every` NACKs (0: none).
pub fn proxies(
    n: usize,
    namespaces: &[String],
    scoped: bool,
    delta_every: usize,
    nack_every: usize,
) -> Result<Vec<StreamSpec>> {
    (0..n)
        .map(|i| {
            let namespace = namespaces[i % namespaces.len()].clone();
            let ip = crate::meshgen::proxy_ip(i)?;
            Ok(StreamSpec {
                pod: format!("bench-proxy-{i}"),
                ip: ip.to_string(),
                protocol: if delta_every > 0 && i % delta_every == delta_every - 1 {
                    Protocol::Delta
                } else {
                    Protocol::Sotw
                },
                nack: nack_every > 0 && i % nack_every == nack_every / 2,
                visibility: if scoped {
                    Visibility::Namespaces(vec![namespace.clone(), SHARED_NAMESPACE.to_string()])
                } else {
                    Visibility::All
                },
                capture: i == 0,
                namespace,
            })
        })
        .collect()
}

pub(crate) fn load_config(server: &Server, env: &Env) -> LoadConfig {
    LoadConfig {
        addr: server.xds_addr.clone(),
        tenant: TENANT.into(),
        revision: REVISION.into(),
        streams_per_connection: 1,
        connect_concurrency: 128,
        accept_zstd: !env.plain_ads,
    }
}

/// Latencies of every (stream, change) pair whose change is of `kind` (NACKing streams left
/// out: they refuse updates on purpose), and how many there are.
pub(crate) fn convergence(
    log: &[std::sync::Arc<load::Change>],
    reports: &[StreamReport],
    kind: &str,
) -> (Vec<Duration>, usize) {
    let lat: Vec<Duration> = converged_pairs(log, reports, |c| c.kind == kind)
        .map(|done| done.after)
        .collect();
    let n = lat.len();
    (lat, n)
}

/// The (stream, change) pairs that converged, of the changes `which` selects (NACKing streams
/// left out).
fn converged_pairs<'a>(
    log: &'a [std::sync::Arc<load::Change>],
    reports: &'a [StreamReport],
    which: impl Fn(&load::Change) -> bool + 'a,
) -> impl Iterator<Item = &'a load::Converged> + 'a {
    reports
        .iter()
        .filter(|r| !r.nack)
        .flat_map(|r| r.converged.iter())
        .filter(move |done| log.get(done.change).is_some_and(|c| which(c)))
}

/// Per condition of the changes of `kind` (all alike: the first one's list names them), the
/// p99 from the mutation until the condition was met, with the name of its resource type.
fn condition_p99(
    log: &[std::sync::Arc<load::Change>],
    reports: &[StreamReport],
    kind: &str,
) -> Vec<(&'static str, Option<Duration>)> {
    let Some(first) = log.iter().find(|c| c.kind == kind) else {
        return Vec::new();
    };
    first
        .conditions
        .iter()
        .enumerate()
        .map(|(i, cond)| {
            let mut lat: Vec<Duration> = converged_pairs(log, reports, |c| c.kind == kind)
                .filter_map(|done| done.conditions.get(i).copied())
                .collect();
            (
                load::TYPE_NAMES
                    .get(cond.type_index)
                    .copied()
                    .unwrap_or("?"),
                quantile(&mut lat, 0.99),
            )
        })
        .collect()
}

/// Pairs expected (all kinds) minus pairs converged, over non-NACKing streams.
pub(crate) fn missing_pairs(reports: &[StreamReport]) -> usize {
    reports
        .iter()
        .filter(|r| !r.nack)
        .map(|r| r.expected_changes.saturating_sub(r.converged.len()))
        .sum()
}

pub(crate) fn storm_time(reports: &[StreamReport]) -> Option<Duration> {
    reports.iter().filter_map(|r| r.synced_after).max()
}

fn errors(reports: &[StreamReport]) -> (usize, Option<String>) {
    let errs: Vec<&String> = reports.iter().filter_map(|r| r.error.as_ref()).collect();
    (errs.len(), errs.first().map(|e| e.to_string()))
}

pub(crate) struct Table {
    title: String,
    rows: Vec<(String, String)>,
}

impl Table {
    pub(crate) fn new(title: impl Into<String>) -> Self {
        Table {
            title: title.into(),
            rows: Vec::new(),
        }
    }
    pub(crate) fn row(&mut self, k: impl Into<String>, v: impl Into<String>) {
        self.rows.push((k.into(), v.into()));
    }
    pub(crate) fn render(&self) -> String {
        let mut out = format!("### {}\n\n| metric | value |\n|---|---|\n", self.title);
        for (k, v) in &self.rows {
            let _ = writeln!(out, "| {k} | {v} |");
        }
        out
    }
}

/// Parameters of an S1-shaped run (also the cost curves).
#[derive(Clone, Debug)]
pub struct S1Params {
    pub services: usize,
    pub endpoints_per_service: usize,
    pub namespaces: usize,
    pub proxies: usize,
    pub churn: Duration,
    pub endpoint_changes_per_sec: u32,
    pub new_service_every: Duration,
    /// See [`Env::delta_every`].
    pub delta_every: usize,
}

/// Figures of one S1-shaped run.
#[derive(Clone, Debug, Default)]
pub struct S1Result {
    pub storm: Option<Duration>,
    pub storm_vcpu: f64,
    pub churn_vcpu: f64,
    pub peak_rss: u64,
    pub idle_rss: u64,
    pub loaded_rss: u64,
    pub ep_p50: Option<Duration>,
    pub ep_p99: Option<Duration>,
    pub ep_samples: usize,
    pub svc_p50: Option<Duration>,
    pub svc_p99: Option<Duration>,
    pub svc_samples: usize,
    /// New services: p99 until each condition was met (cluster, endpoints, route), by type.
    pub svc_condition_p99: Vec<(&'static str, Option<Duration>)>,
    /// New services in the namespace every scope imports (a push to every proxy): p50, p99.
    pub svc_shared: (Option<Duration>, Option<Duration>),
    /// New services elsewhere (a push to one namespace's proxies): p50, p99.
    pub svc_elsewhere: (Option<Duration>, Option<Duration>),
    pub missing: usize,
    pub changes: usize,
    pub pushes: f64,
    pub server_push_p99: Option<f64>,
    pub errors: usize,
    pub first_error: Option<String>,
    pub synced: usize,
    pub config_bytes_per_proxy: f64,
}

/// Runs an S1-shaped scenario: scoped proxies, connect storm, endpoint churn, new services.
pub async fn run_s1(env: &Env, name: &str, p: &S1Params) -> Result<S1Result> {
    let dir = env.work.join(name).join("mesh");
    let _ = std::fs::remove_dir_all(&dir);
    let spec = MeshSpec {
        services: p.services,
        endpoints_per_service: p.endpoints_per_service,
        namespaces: p.namespaces,
        scoped: true,
        revision: REVISION.into(),
        control_namespace: CONTROL_NS.into(),
    };
    let mut mesh = MeshState::new(spec, &dir)?;
    mesh.write_all()?;
    let server = Server::start(env, &dir, &env.work.join(name).join("xds.log")).await?;
    let result = drive_s1(&server, env, &mut mesh, p).await;
    server.stop().await;
    result
}

async fn drive_s1(
    server: &Server,
    env: &Env,
    mesh: &mut MeshState,
    p: &S1Params,
) -> Result<S1Result> {
    let mut r = S1Result::default();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = server.sample()?;
    r.idle_rss = idle.1.rss_bytes;
    let (sampler, sampling) = Sampler::start(server.pid, Duration::from_millis(200));
    let specs = proxies(p.proxies, &mesh.namespaces, true, p.delta_every, 0)?;
    let handle = load::start(load_config(server, env), specs);
    r.synced = handle.wait_synced(SYNC_TIMEOUT).await;
    let after_storm = server.sample()?;
    r.storm_vcpu = procstat::vcpu(idle, after_storm);
    // Let allocator and buffers settle before reading the loaded footprint.
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.loaded_rss = server.sample()?.1.rss_bytes;

    let churn_start = server.sample()?;
    let changes = churn_s1(mesh, &handle, p).await?;
    let churn_end = server.sample()?;
    r.churn_vcpu = procstat::vcpu(churn_start, churn_end);
    handle.wait_converged(DRAIN).await;
    r.changes = changes;
    let metrics = server.metrics().await;
    r.pushes = metrics.sum("meshplane_xds_pushes_total", &[]);
    r.server_push_p99 = metrics.histogram_quantile("meshplane_xds_push_latency_seconds", 0.99);
    r.config_bytes_per_proxy = {
        let sum = metrics.sum("meshplane_xds_proxy_config_bytes_sum", &[]);
        let count = metrics.sum("meshplane_xds_proxy_config_bytes_count", &[]);
        if count > 0.0 {
            sum / count
        } else {
            f64::NAN
        }
    };
    let log = handle.changes.all();
    let started = handle.started;
    let reports = handle.stop().await;
    let end = server.sample()?;
    sampling.abort();
    r.peak_rss = end
        .1
        .peak_rss_bytes
        .max(sampler.peak_rss(started, Instant::now()));
    r.storm = storm_time(&reports);
    let (mut ep, n_ep) = convergence(&log, &reports, "endpoint");
    let (mut svc, n_svc) = convergence(&log, &reports, "service-add");
    r.ep_samples = n_ep;
    r.svc_samples = n_svc;
    r.ep_p50 = quantile(&mut ep, 0.5);
    r.ep_p99 = quantile(&mut ep, 0.99);
    r.svc_p50 = quantile(&mut svc, 0.5);
    r.svc_p99 = quantile(&mut svc, 0.99);
    r.svc_condition_p99 = condition_p99(&log, &reports, "service-add");
    for (shared, out) in [(true, &mut r.svc_shared), (false, &mut r.svc_elsewhere)] {
        let mut lat: Vec<Duration> = converged_pairs(&log, &reports, |c| {
            c.kind == "service-add" && (c.namespace == SHARED_NAMESPACE) == shared
        })
        .map(|done| done.after)
        .collect();
        *out = (quantile(&mut lat, 0.5), quantile(&mut lat, 0.99));
    }
    r.missing = missing_pairs(&reports);
    (r.errors, r.first_error) = errors(&reports);
    Ok(r)
}

async fn churn_s1(mesh: &mut MeshState, handle: &LoadHandle, p: &S1Params) -> Result<usize> {
    let mut rng = StdRng::seed_from_u64(1);
    let tick = Duration::from_secs(1) / p.endpoint_changes_per_sec.max(1);
    let mut interval = tokio::time::interval(tick);
    let start = Instant::now();
    let mut next_service = start + p.new_service_every;
    let mut count = 0;
    let mut touched = HashMap::new();
    while start.elapsed() < p.churn {
        interval.tick().await;
        if Instant::now() >= next_service {
            next_service += p.new_service_every;
            let ns = mesh.namespaces[rng.random_range(0..mesh.namespaces.len())].clone();
            mutate(mesh, handle, "service-add", |m| m.plan_add_service(&ns))?;
            touched.insert(mesh.services.len() - 1, Instant::now());
            count += 1;
        }
        let svc = pick_untouched(&mut rng, mesh.services.len(), &mut touched);
        let slot = rng.random_range(0..usize::MAX);
        mutate(mesh, handle, "endpoint", |m| {
            m.plan_replace_endpoint(svc, slot)
        })?;
        count += 1;
    }
    Ok(count)
}

/// How long a service is left alone after a change: a second change before the first was
/// pushed would supersede it (its new address never reaches the wire) and count as lost.
const SETTLE: Duration = Duration::from_secs(5);

/// A random service index not changed within [`SETTLE`] (best effort: 20 tries).
fn pick_untouched(rng: &mut StdRng, len: usize, touched: &mut HashMap<usize, Instant>) -> usize {
    let now = Instant::now();
    let mut pick = 0;
    for _ in 0..20 {
        pick = rng.random_range(0..len.max(1));
        if touched
            .get(&pick)
            .is_none_or(|t| now.duration_since(*t) > SETTLE)
        {
            break;
        }
    }
    touched.insert(pick, now);
    pick
}

/// Plans a mutation, registers what streams must see, then makes the file change: the
/// change is in the log before the server can possibly observe it.
fn mutate(
    mesh: &mut MeshState,
    handle: &LoadHandle,
    kind: &'static str,
    plan: impl FnOnce(&mut MeshState) -> Result<Planned>,
) -> Result<Mutation> {
    let planned = plan(mesh)?;
    let m = &planned.mutation;
    handle.changes.register(kind, m.namespace(), conditions(m));
    planned.apply()
}

fn s1_params(size: Size, delta_every: usize) -> S1Params {
    match size {
        Size::Short => S1Params {
            services: 100,
            endpoints_per_service: 2,
            namespaces: 5,
            proxies: 200,
            churn: Duration::from_secs(20),
            endpoint_changes_per_sec: 10,
            new_service_every: Duration::from_secs(5),
            delta_every,
        },
        Size::Full => S1Params {
            services: 1000,
            endpoints_per_service: 2,
            namespaces: 20,
            proxies: 2000,
            churn: Duration::from_secs(300),
            endpoint_changes_per_sec: 10,
            new_service_every: Duration::from_secs(10),
            delta_every,
        },
    }
}

fn s1_table(title: &str, p: &S1Params, r: &S1Result) -> Table {
    let mut t = Table::new(title);
    t.row("size", format!("{} services × {} endpoints, {} namespaces, {} proxies (scoped: own namespace + `shared`; {})", p.services, p.endpoints_per_service, p.namespaces, p.proxies, protocol_mix(p.delta_every)));
    t.row(
        "churn",
        format!(
            "{} endpoint changes/s + 1 new service every {} s for {} s",
            p.endpoint_changes_per_sec,
            p.new_service_every.as_secs(),
            p.churn.as_secs()
        ),
    );
    t.row(
        "streams synced / errors",
        format!(
            "{} / {}{}",
            r.synced,
            r.errors,
            r.first_error
                .as_ref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        ),
    );
    t.row("connect storm: all proxies synced after", ms(r.storm));
    t.row("server vCPU during storm", format!("{:.2}", r.storm_vcpu));
    t.row(
        "server avg vCPU during churn",
        format!("{:.3}", r.churn_vcpu),
    );
    t.row("server peak RSS", bytes(r.peak_rss as f64));
    t.row(
        "RSS idle (state loaded, no proxies) → with proxies",
        format!(
            "{} → {}",
            bytes(r.idle_rss as f64),
            bytes(r.loaded_rss as f64)
        ),
    );
    let per_proxy = r.loaded_rss.saturating_sub(r.idle_rss) as f64 / p.proxies.max(1) as f64;
    t.row(
        "memory per proxy (marginal / total RSS ÷ proxies)",
        format!(
            "{} / {}",
            bytes(per_proxy),
            bytes(r.loaded_rss as f64 / p.proxies.max(1) as f64)
        ),
    );
    t.row(
        "avg rendered config per proxy (server metric)",
        bytes(r.config_bytes_per_proxy),
    );
    t.row(
        "endpoint-change convergence p50 / p99",
        format!(
            "{} / {} ({} stream×change samples)",
            ms(r.ep_p50),
            ms(r.ep_p99),
            r.ep_samples
        ),
    );
    t.row(
        "new-service propagation p50 / p99 (cluster, endpoints and route ACKed)",
        format!(
            "{} / {} ({} samples)",
            ms(r.svc_p50),
            ms(r.svc_p99),
            r.svc_samples
        ),
    );
    if !r.svc_condition_p99.is_empty() {
        let (names, values): (Vec<&str>, Vec<String>) = r
            .svc_condition_p99
            .iter()
            .map(|(name, p99)| (*name, ms(*p99)))
            .unzip();
        t.row(
            format!(
                "new-service p99 until each was ACKed: {}",
                names.join(" / ")
            ),
            values.join(" / "),
        );
    }
    t.row(
        "new-service p50 / p99: added to `shared` (every proxy) · elsewhere (one namespace)",
        format!(
            "{} / {} · {} / {}",
            ms(r.svc_shared.0),
            ms(r.svc_shared.1),
            ms(r.svc_elsewhere.0),
            ms(r.svc_elsewhere.1)
        ),
    );
    t.row(
        "changes made / stream×change pairs not converged",
        format!("{} / {}", r.changes, r.missing),
    );
    t.row(
        "server pushes (all types) / server push-latency p99",
        format!(
            "{:.0} / {}",
            r.pushes,
            r.server_push_p99
                .map_or("n/a".into(), |s| format!("{:.1} ms", s * 1e3))
        ),
    );
    t
}

/// The 10,000-proxy scale point: S1's shape (scoped, 2 endpoints per service, 20 namespaces)
/// with 2,000 services and 10,000 proxies on one instance, a short churn after the storm.
pub async fn scale10k(env: &Env) -> Result<String> {
    let delta_every = env.delta_every;
    let p = match env.size {
        Size::Short => S1Params {
            services: 200,
            endpoints_per_service: 2,
            namespaces: 10,
            proxies: 1000,
            churn: Duration::from_secs(5),
            endpoint_changes_per_sec: 10,
            new_service_every: Duration::from_secs(5),
            delta_every,
        },
        Size::Full => S1Params {
            services: 2000,
            endpoints_per_service: 2,
            namespaces: 20,
            proxies: 10_000,
            churn: Duration::from_secs(30),
            endpoint_changes_per_sec: 10,
            new_service_every: Duration::from_secs(10),
            delta_every,
        },
    };
    let r = run_s1(env, "scale10k", &p).await?;
    Ok(s1_table("Scale point — 10,000 proxies on one instance", &p, &r).render())
}

/// S1: Istio-doc parity.
pub async fn s1(env: &Env) -> Result<String> {
    let p = s1_params(env.size, env.delta_every);
    let r = run_s1(env, "s1", &p).await?;
    Ok(s1_table("S1 — Istio-doc parity", &p, &r).render())
}

/// Cost curves: S1 at growing sizes (services = proxies = N), plus an SVG chart.
pub async fn curves(env: &Env) -> Result<String> {
    let (sizes, churn): (&[usize], u64) = match env.size {
        Size::Short => (&[25, 50, 100, 200], 8),
        Size::Full => (&[250, 500, 1000, 2000], 45),
    };
    let mut out = String::from("### Cost curves — S1 shape at growing size (services = proxies = N)\n\n| N | storm | avg vCPU (churn) | peak RSS | memory/proxy (marginal) | endpoint p50 / p99 | new-service p99 | not converged |\n|---|---|---|---|---|---|---|---|\n");
    let mut rows = Vec::new();
    for &n in sizes {
        let p = S1Params {
            services: n,
            endpoints_per_service: 2,
            namespaces: 20.min(n / 5).max(2),
            proxies: n,
            churn: Duration::from_secs(churn),
            endpoint_changes_per_sec: 10,
            new_service_every: Duration::from_secs(10.min(churn / 2).max(1)),
            delta_every: env.delta_every,
        };
        let r = run_s1(env, &format!("curve-{n}"), &p).await?;
        let per_proxy = r.loaded_rss.saturating_sub(r.idle_rss) as f64 / n as f64;
        let _ = writeln!(
            out,
            "| {n} | {} | {:.3} | {} | {} | {} / {} | {} | {} |",
            ms(r.storm),
            r.churn_vcpu,
            bytes(r.peak_rss as f64),
            bytes(per_proxy),
            ms(r.ep_p50),
            ms(r.ep_p99),
            ms(r.svc_p99),
            r.missing
        );
        rows.push((n as f64, r, per_proxy));
    }
    let xs: Vec<f64> = rows.iter().map(|r| r.0).collect();
    let ms_of = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    let panels = vec![
        Panel {
            title: "avg CPU (churn)".into(),
            unit: "vCPU".into(),
            values: rows.iter().map(|r| r.1.churn_vcpu).collect(),
        },
        Panel {
            title: "peak RSS".into(),
            unit: "MiB".into(),
            values: rows
                .iter()
                .map(|r| r.1.peak_rss as f64 / 1048576.0)
                .collect(),
        },
        Panel {
            title: "memory/proxy".into(),
            unit: "KiB".into(),
            values: rows.iter().map(|r| r.2 / 1024.0).collect(),
        },
        Panel {
            title: "endpoint p99".into(),
            unit: "ms".into(),
            values: rows.iter().map(|r| ms_of(r.1.ep_p99)).collect(),
        },
        Panel {
            title: "connect storm".into(),
            unit: "ms".into(),
            values: rows.iter().map(|r| ms_of(r.1.storm)).collect(),
        },
    ];
    let svg = small_multiples(
        &format!(
            "meshplane-xds cost curves ({} run)",
            if env.size == Size::Full {
                "full"
            } else {
                "short"
            }
        ),
        "N (services = proxies)",
        &xs,
        &panels,
    );
    let file = if env.size == Size::Full {
        "bench-curves.svg"
    } else {
        "bench-curves-short.svg"
    };
    std::fs::create_dir_all(&env.docs)?;
    std::fs::write(env.docs.join(file), svg)?;
    let _ = writeln!(out, "\nChart: `docs/{file}`");
    Ok(out)
}

/// S2: one big unscoped tenant; a service added or removed every 5 s.
pub async fn s2(env: &Env) -> Result<String> {
    let (services, eps, proxies_n, churn, every) = match env.size {
        Size::Short => (1000, 3, 20, 20u64, 5u64),
        Size::Full => (10_000, 3, 200, 120, 5),
    };
    let dir = env.work.join("s2").join("mesh");
    let _ = std::fs::remove_dir_all(&dir);
    let spec = MeshSpec {
        services,
        endpoints_per_service: eps,
        namespaces: 20,
        scoped: false,
        revision: REVISION.into(),
        control_namespace: CONTROL_NS.into(),
    };
    let mut mesh = MeshState::new(spec, &dir)?;
    mesh.write_all()?;
    let load_started = Instant::now();
    let server = Server::start(env, &dir, &env.work.join("s2").join("xds.log")).await?;
    let ready_after = load_started.elapsed();
    let result = async {
        let idle = server.sample()?;
        let specs = proxies(proxies_n, &mesh.namespaces, false, env.delta_every, 0)?;
        let handle = load::start(load_config(&server, env), specs);
        let synced = handle.wait_synced(SYNC_TIMEOUT).await;
        let storm_end = server.sample()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let c0 = server.sample()?;
        let m0 = server.metrics().await;
        let mut rng = StdRng::seed_from_u64(2);
        let start = Instant::now();
        let mut changes = 0usize;
        let mut add = true;
        while start.elapsed() < Duration::from_secs(churn) {
            let ns = mesh.namespaces[rng.random_range(0..mesh.namespaces.len())].clone();
            if add {
                mutate(&mut mesh, &handle, "service-add", |m| {
                    m.plan_add_service(&ns)
                })?;
            } else {
                let i = rng.random_range(0..usize::MAX);
                mutate(&mut mesh, &handle, "service-remove", |m| {
                    m.plan_remove_service(i)
                })?;
            }
            add = !add;
            changes += 1;
            tokio::time::sleep(Duration::from_secs(every)).await;
        }
        let c1 = server.sample()?;
        handle.wait_converged(DRAIN).await;
        let m1 = server.metrics().await;
        let log = handle.changes.all();
        let reports = handle.stop().await;
        let end = server.sample()?;
        anyhow::Ok((
            idle, storm_end, c0, c1, end, m0, m1, log, reports, synced, changes,
        ))
    }
    .await;
    server.stop().await;
    let (idle, storm_end, c0, c1, end, m0, m1, log, reports, synced, changes) = result?;
    let (mut add_lat, n_add) = convergence(&log, &reports, "service-add");
    let (mut rm_lat, n_rm) = convergence(&log, &reports, "service-remove");
    let mut all: Vec<Duration> = add_lat.iter().chain(rm_lat.iter()).copied().collect();
    let after_sync_bytes: u64 = reports
        .iter()
        .map(|r| r.bytes_after_sync.iter().sum::<u64>())
        .sum();
    let per_proxy_per_push =
        after_sync_bytes as f64 / (changes.max(1) * reports.len().max(1)) as f64;
    let per_proxy_per_push_sotw = per_type_bytes(&reports, Protocol::Sotw, changes);
    let per_proxy_per_push_delta = per_type_bytes(&reports, Protocol::Delta, changes);
    let cpu_per_change = (c1.1.cpu_seconds - c0.1.cpu_seconds) / changes.max(1) as f64;
    let encode_once = reports.first().map(encode_once_cost).transpose()?.flatten();
    let initial_bytes = reports
        .iter()
        .find(|r| r.protocol == Some(Protocol::Sotw))
        .map(first_bytes);
    let pushes =
        m1.sum("meshplane_xds_pushes_total", &[]) - m0.sum("meshplane_xds_pushes_total", &[]);
    let (errs, first_err) = errors(&reports);

    let mut t = Table::new("S2 — unscoped big tenant");
    t.row("size", format!("{services} services × {eps} endpoints ({} endpoints), 20 namespaces, no Sidecars, {proxies_n} proxies ({})", services * eps, protocol_mix(env.delta_every)));
    t.row(
        "churn",
        format!("a service added or removed every {every} s for {churn} s ({changes} changes)"),
    );
    t.row(
        "server start → ready (parse + index)",
        ms(Some(ready_after)),
    );
    t.row(
        "streams synced / errors",
        format!(
            "{synced} / {errs}{}",
            first_err
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        ),
    );
    t.row(
        "connect storm: all proxies synced after",
        ms(storm_time(&reports)),
    );
    t.row(
        "full config per proxy (first response of each type, SotW)",
        initial_bytes.map_or_else(|| "n/a (no SotW proxy)".to_string(), |b| bytes(b as f64)),
    );
    t.row(
        "bytes per proxy per change: all / SotW / delta",
        format!(
            "{} / {} / {}",
            bytes(per_proxy_per_push),
            bytes(per_proxy_per_push_sotw),
            bytes(per_proxy_per_push_delta)
        ),
    );
    t.row(
        "server pushes during churn (responses, all types)",
        format!("{pushes:.0}"),
    );
    t.row(
        "server CPU per change (one full push to all proxies)",
        format!("{:.1} ms", cpu_per_change * 1e3),
    );
    match encode_once {
        Some(enc) => {
            t.row(
                "encoding the snapshot once (prost encode of one proxy's full config)",
                format!("{:.1} ms", enc * 1e3),
            );
            t.row(
                "CPU per full push ÷ encode-once",
                format!("{:.1}×", cpu_per_change / enc.max(1e-9)),
            );
        }
        None => t.row("encoding the snapshot once", "n/a (no capture)"),
    }
    t.row(
        "server avg vCPU during churn / during storm",
        format!(
            "{:.3} / {:.2}",
            procstat::vcpu(c0, c1),
            procstat::vcpu(idle, storm_end)
        ),
    );
    t.row(
        "convergence add p50 / p99",
        format!(
            "{} / {} ({n_add} samples)",
            ms(quantile(&mut add_lat, 0.5)),
            ms(quantile(&mut add_lat, 0.99))
        ),
    );
    t.row(
        "convergence remove p50 / p99",
        format!(
            "{} / {} ({n_rm} samples)",
            ms(quantile(&mut rm_lat, 0.5)),
            ms(quantile(&mut rm_lat, 0.99))
        ),
    );
    t.row(
        "convergence p99 (all changes) / pairs not converged",
        format!(
            "{} / {}",
            ms(quantile(&mut all, 0.99)),
            missing_pairs(&reports)
        ),
    );
    t.row(
        "server RSS idle → peak",
        format!(
            "{} → {}",
            bytes(idle.1.rss_bytes as f64),
            bytes(end.1.peak_rss_bytes as f64)
        ),
    );
    Ok(t.render())
}

/// Bytes of a stream's first response of each type (its initial config).
fn first_bytes(r: &StreamReport) -> u64 {
    r.first_bytes.iter().sum()
}

fn per_type_bytes(reports: &[StreamReport], protocol: Protocol, changes: usize) -> f64 {
    let rs: Vec<&StreamReport> = reports
        .iter()
        .filter(|r| r.protocol == Some(protocol))
        .collect();
    if rs.is_empty() {
        return f64::NAN;
    }
    let after: u64 = rs
        .iter()
        .map(|r| r.bytes_after_sync.iter().sum::<u64>())
        .sum();
    after as f64 / (changes.max(1) * rs.len()) as f64
}

/// Decodes a captured config and times encoding it once (median of 5): the floor a control
/// plane that encodes each resource once pays per full snapshot.
fn encode_once_cost(r: &StreamReport) -> Result<Option<f64>> {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    use prost::Message;
    if r.captured.iter().all(Vec::is_empty) {
        return Ok(None);
    }
    let clusters: Vec<Cluster> = r.captured[0]
        .iter()
        .map(|b| Cluster::decode(b.as_slice()))
        .collect::<Result<_, _>>()?;
    let cla: Vec<ClusterLoadAssignment> = r.captured[1]
        .iter()
        .map(|b| ClusterLoadAssignment::decode(b.as_slice()))
        .collect::<Result<_, _>>()?;
    let listeners: Vec<Listener> = r.captured[2]
        .iter()
        .map(|b| Listener::decode(b.as_slice()))
        .collect::<Result<_, _>>()?;
    let routes: Vec<RouteConfiguration> = r.captured[3]
        .iter()
        .map(|b| RouteConfiguration::decode(b.as_slice()))
        .collect::<Result<_, _>>()?;
    let mut times = Vec::new();
    let mut total = 0usize;
    for _ in 0..5 {
        let t = Instant::now();
        total = clusters
            .iter()
            .map(|m| m.encode_to_vec().len())
            .sum::<usize>()
            + cla.iter().map(|m| m.encode_to_vec().len()).sum::<usize>()
            + listeners
                .iter()
                .map(|m| m.encode_to_vec().len())
                .sum::<usize>()
            + routes
                .iter()
                .map(|m| m.encode_to_vec().len())
                .sum::<usize>();
        times.push(t.elapsed());
    }
    std::hint::black_box(total);
    Ok(quantile(&mut times, 0.5).map(|d| d.as_secs_f64()))
}

/// S3: rollout churn with 1% NACKing clients.
pub async fn s3(env: &Env) -> Result<String> {
    let (services, eps, streams, namespaces) = match env.size {
        Size::Short => (100, 10, 500, 5),
        Size::Full => (500, 10, 5000, 10),
    };
    let rate = 30u32;
    let to_replace = services * eps / 4;
    let dir = env.work.join("s3").join("mesh");
    let _ = std::fs::remove_dir_all(&dir);
    let spec = MeshSpec {
        services,
        endpoints_per_service: eps,
        namespaces,
        scoped: true,
        revision: REVISION.into(),
        control_namespace: CONTROL_NS.into(),
    };
    let mut mesh = MeshState::new(spec, &dir)?;
    mesh.write_all()?;
    let server = Server::start(env, &dir, &env.work.join("s3").join("xds.log")).await?;
    let result = async {
        let specs = proxies(streams, &mesh.namespaces, true, env.delta_every, 100)?;
        let handle = load::start(load_config(&server, env), specs);
        let synced = handle.wait_synced(SYNC_TIMEOUT).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let m0 = server.metrics().await;
        let c0 = server.sample()?;
        // A rolling update: walk services in order, replacing each endpoint once.
        let mut interval = tokio::time::interval(Duration::from_secs(1) / rate);
        for k in 0..to_replace {
            interval.tick().await;
            let (svc, slot) = (k / eps, k % eps);
            mutate(&mut mesh, &handle, "endpoint", |m| {
                m.plan_replace_endpoint(svc, slot)
            })?;
        }
        let c1 = server.sample()?;
        handle.wait_converged(DRAIN).await;
        let m1 = server.metrics().await;
        let log = handle.changes.all();
        let reports = handle.stop().await;
        anyhow::Ok((synced, m0, m1, c0, c1, log, reports))
    }
    .await;
    server.stop().await;
    let (synced, m0, m1, c0, c1, log, reports) = result?;
    let d = |name: &str, with: &[&str]| m1.sum(name, with) - m0.sum(name, with);
    let (mut eds, n_eds) = convergence(&log, &reports, "endpoint");
    let nackers: Vec<&StreamReport> = reports.iter().filter(|r| r.nack).collect();
    // A NACKing client must get at most one EDS push per config change it can see.
    let loops: Vec<&&StreamReport> = nackers
        .iter()
        .filter(|r| r.responses_after_sync[1] > r.expected_changes as u64)
        .collect();
    let nacker_pushes: u64 = nackers.iter().map(|r| r.responses_after_sync[1]).sum();
    let nacker_changes: usize = nackers.iter().map(|r| r.expected_changes).sum();
    let client_eds: u64 = reports.iter().map(|r| r.responses_after_sync[1]).sum();
    let watched: usize = reports.iter().map(|r| r.expected_changes).sum();
    let (errs, first_err) = errors(&reports);
    let mut t = Table::new("S3 — rollout churn with NACKing clients");
    t.row("size", format!("{services} services × {eps} endpoints, {namespaces} namespaces (scoped), {streams} streams ({}, 1% NACK every EDS update)", protocol_mix(env.delta_every)));
    t.row(
        "churn",
        format!("{to_replace} endpoints (25%) replaced at {rate}/s"),
    );
    t.row(
        "streams synced / errors",
        format!(
            "{synced} / {errs}{}",
            first_err
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        ),
    );
    t.row(
        "connect storm: all streams synced after",
        ms(storm_time(&reports)),
    );
    t.row(
        "server pushes during churn: cds / eds / lds / rds",
        format!(
            "{:.0} / {:.0} / {:.0} / {:.0}",
            d("meshplane_xds_pushes_total", &["\"cds\""]),
            d("meshplane_xds_pushes_total", &["\"eds\""]),
            d("meshplane_xds_pushes_total", &["\"lds\""]),
            d("meshplane_xds_pushes_total", &["\"rds\""])
        ),
    );
    t.row(
        "EDS responses received ÷ (stream × change) pairs (debounce at work: < 1)",
        format!(
            "{client_eds} ÷ {watched} = {:.3}",
            client_eds as f64 / watched.max(1) as f64
        ),
    );
    t.row(
        "EDS convergence p50 / p99",
        format!(
            "{} / {} ({n_eds} samples)",
            ms(quantile(&mut eds, 0.5)),
            ms(quantile(&mut eds, 0.99))
        ),
    );
    t.row(
        "pairs not converged (non-NACKing)",
        missing_pairs(&reports).to_string(),
    );
    t.row(
        "NACKs counted by the server",
        format!("{:.0}", d("meshplane_xds_nacks_total", &[])),
    );
    t.row(
        "NACKing clients: EDS pushes received vs changes they could see",
        format!(
            "{nacker_pushes} vs {nacker_changes} ({} clients)",
            nackers.len()
        ),
    );
    t.row(
        "resend loops (NACKing clients pushed more often than config changed)",
        if loops.is_empty() {
            "none".to_string()
        } else {
            format!("{} clients — FAIL", loops.len())
        },
    );
    t.row(
        "server avg vCPU during churn",
        format!("{:.3}", procstat::vcpu(c0, c1)),
    );
    let table = t.render();
    if !loops.is_empty() {
        println!("{table}");
        bail!(
            "S3: {} NACKing clients got more EDS pushes than config changes (resend loop)",
            loops.len()
        );
    }
    Ok(table)
}

/// S4: noisy neighbour — several instances, one churning hard.
pub async fn s4(env: &Env) -> Result<String> {
    let (instances, services, proxies_n, phase) = match env.size {
        Size::Short => (3, 50, 20, 10u64),
        Size::Full => (10, 200, 50, 60),
    };
    let mut servers = Vec::new();
    let mut meshes = Vec::new();
    let mut handles = Vec::new();
    let setup = async {
        for i in 0..instances {
            let dir = env.work.join(format!("s4-{i}")).join("mesh");
            let _ = std::fs::remove_dir_all(&dir);
            let spec = MeshSpec {
                services,
                endpoints_per_service: 2,
                namespaces: 5,
                scoped: true,
                revision: REVISION.into(),
                control_namespace: CONTROL_NS.into(),
            };
            let mesh = MeshState::new(spec, &dir)?;
            mesh.write_all()?;
            let server =
                Server::start(env, &dir, &env.work.join(format!("s4-{i}")).join("xds.log")).await?;
            let handle = load::start(
                load_config(&server, env),
                proxies(proxies_n, &mesh.namespaces, true, env.delta_every, 0)?,
            );
            handle.wait_synced(SYNC_TIMEOUT).await;
            servers.push(server);
            meshes.push(mesh);
            handles.push(handle);
        }
        anyhow::Ok(())
    }
    .await;
    let result = match setup {
        Ok(()) => s4_phases(&servers, &mut meshes, &handles, phase).await,
        Err(e) => Err(e),
    };
    let mut all_reports = Vec::new();
    for h in handles {
        let log = h.changes.all();
        all_reports.push((log, h.stop().await));
    }
    for s in servers {
        s.stop().await;
    }
    let (quiet_end, churner_vcpu, churn_changes) = result?;
    // Probe changes of the quiet instances: those registered before `quiet_end` are the quiet
    // phase, the rest the noisy phase.
    let mut quiet = Vec::new();
    let mut noisy = Vec::new();
    for (log, reports) in all_reports.iter().skip(1) {
        for r in reports {
            for done in &r.converged {
                if let Some(c) = log.get(done.change) {
                    if c.at < quiet_end {
                        quiet.push(done.after)
                    } else {
                        noisy.push(done.after)
                    }
                }
            }
        }
    }
    let (nq, nn) = (quiet.len(), noisy.len());
    let q99 = quantile(&mut quiet, 0.99);
    let n99 = quantile(&mut noisy, 0.99);
    let mut t = Table::new("S4 — noisy neighbour");
    t.row("setup", format!("{instances} meshplane-xds instances, each {services} services × 2 endpoints, {proxies_n} proxies; quiet instances get 1 endpoint change/s"));
    t.row("noisy phase", format!("instance 0: 50 endpoint changes/s (bursts of 10 every 200 ms) + a service added every second for {phase} s ({churn_changes} changes, churner avg {churner_vcpu:.2} vCPU)"));
    t.row(
        "quiet instances: convergence p50 quiet → noisy",
        format!(
            "{} → {}",
            ms(quantile(&mut quiet, 0.5)),
            ms(quantile(&mut noisy, 0.5))
        ),
    );
    t.row(
        "quiet instances: convergence p99 quiet → noisy",
        format!("{} → {} ({nq} / {nn} samples)", ms(q99), ms(n99)),
    );
    t.row(
        "p99 ratio noisy ÷ quiet",
        match (q99, n99) {
            (Some(q), Some(n)) => format!("{:.2}×", n.as_secs_f64() / q.as_secs_f64().max(1e-9)),
            _ => "n/a".into(),
        },
    );
    Ok(t.render())
}

async fn s4_phases(
    servers: &[Server],
    meshes: &mut [MeshState],
    handles: &[LoadHandle],
    phase: u64,
) -> Result<(Instant, f64, usize)> {
    let mut rng = StdRng::seed_from_u64(4);
    // Quiet phase: everyone gets probes only.
    let mut touched: Vec<HashMap<usize, Instant>> = vec![HashMap::new(); meshes.len()];
    let mut probe = |meshes: &mut [MeshState], rng: &mut StdRng| -> Result<()> {
        for (i, mesh) in meshes.iter_mut().enumerate().skip(1) {
            let svc = pick_untouched(rng, mesh.services.len(), &mut touched[i]);
            let slot = rng.random_range(0..usize::MAX);
            mutate(mesh, &handles[i], "probe", |m| {
                m.plan_replace_endpoint(svc, slot)
            })?;
        }
        Ok(())
    };
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while start.elapsed() < Duration::from_secs(phase) {
        tick.tick().await;
        probe(meshes, &mut rng)?;
    }
    tokio::time::sleep(DRAIN).await;
    let quiet_end = Instant::now();
    // Noisy phase: instance 0 churns hard, the others keep their probes. The churn comes in
    // bursts of 10 changes every 200 ms (50/s): the directory source waits for 100 ms of quiet
    // before it reads, so a steady 50/s stream would starve it and cost the churner nothing.
    let c0 = servers[0].sample()?;
    let mut burst = tokio::time::interval(Duration::from_millis(200));
    let start = Instant::now();
    let mut next_probe = start;
    let mut next_service = start;
    let mut changes = 0;
    while start.elapsed() < Duration::from_secs(phase) {
        burst.tick().await;
        let (first, _) = meshes.split_at_mut(1);
        for _ in 0..10 {
            let (svc, slot) = (
                rng.random_range(0..usize::MAX),
                rng.random_range(0..usize::MAX),
            );
            mutate(&mut first[0], &handles[0], "churn", |m| {
                m.plan_replace_endpoint(svc, slot)
            })?;
            changes += 1;
        }
        if Instant::now() >= next_service {
            next_service += Duration::from_secs(1);
            let ns = first[0].namespaces[rng.random_range(0..first[0].namespaces.len())].clone();
            mutate(&mut first[0], &handles[0], "churn", |m| {
                m.plan_add_service(&ns)
            })?;
            changes += 1;
        }
        if Instant::now() >= next_probe {
            next_probe += Duration::from_secs(1);
            probe(meshes, &mut rng)?;
        }
    }
    let c1 = servers[0].sample()?;
    tokio::time::sleep(DRAIN).await;
    Ok((quiet_end, procstat::vcpu(c0, c1), changes))
}

/// S5: the operator at scale against the API stand-in; see [`crate::operator_scale`].
pub async fn s5(env: &Env) -> Result<String> {
    crate::operator_scale::run(env).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new service counts as propagated once it is routable: its cluster, an endpoint and
    /// its virtual host (route slot, which VHDS responses fill too) were ACKed.
    #[test]
    fn a_new_service_converges_on_cluster_endpoints_and_route() {
        let host = "svc-7.ns-01.svc.cluster.local";
        let added = Mutation::ServiceAdded {
            namespace: "ns-01".into(),
            host: host.into(),
            endpoint_ips: vec![Ipv4Addr::new(198, 18, 4, 7)],
        };
        let slots: Vec<(usize, Vec<u8>)> = conditions(&added)
            .into_iter()
            .map(|c| (c.type_index, c.pattern))
            .collect();
        assert_eq!(
            slots,
            vec![
                (0, host.as_bytes().to_vec()),
                (1, pb_string("198.18.4.7")),
                (3, host.as_bytes().to_vec()),
            ]
        );
    }

    /// Where a new service's time goes: each condition's own time, named by its type, over
    /// the pairs of the selected changes; NACKing streams are left out as in the totals.
    #[test]
    fn new_service_time_splits_by_condition_and_namespace() {
        let added = Mutation::ServiceAdded {
            namespace: "ns-01".into(),
            host: "svc-7.ns-01.svc.cluster.local".into(),
            endpoint_ips: vec![Ipv4Addr::new(198, 18, 4, 7)],
        };
        let change = |id, namespace: &str| {
            std::sync::Arc::new(load::Change::new(
                id,
                "service-add",
                namespace,
                conditions(&added),
                Instant::now(),
            ))
        };
        let log = vec![change(0, "ns-01"), change(1, SHARED_NAMESPACE)];
        let ms = Duration::from_millis;
        let done = |change, times: [u64; 3]| load::Converged {
            change,
            after: ms(times.into_iter().max().unwrap_or(0)),
            conditions: times.into_iter().map(ms).collect(),
        };
        let reports = vec![
            StreamReport {
                converged: vec![done(0, [10, 12, 30]), done(1, [100, 110, 150])],
                ..Default::default()
            },
            StreamReport {
                nack: true,
                converged: vec![done(1, [900, 900, 900])],
                ..Default::default()
            },
        ];
        assert_eq!(
            condition_p99(&log, &reports, "service-add"),
            vec![
                ("cds", Some(ms(100))),
                ("eds", Some(ms(110))),
                ("rds", Some(ms(150)))
            ]
        );
        let shared: Vec<Duration> =
            converged_pairs(&log, &reports, |c| c.namespace == SHARED_NAMESPACE)
                .map(|done| done.after)
                .collect();
        assert_eq!(shared, vec![ms(150)]);
        assert!(condition_p99(&log, &reports, "endpoint").is_empty());
    }
}
