//! `meshplane-mtls-bench`: what the tenant's mutual TLS costs, and whether rotation holds under
//! load.
//!
//! Three tables:
//!
//! 1. **Added latency of mutual TLS.** Two real Envoys on loopback, a client sidecar and a
//!    server sidecar, with the transport sockets meshplane renders
//!    (`translate::mtls::istio_mutual_transport_socket` on the client's cluster,
//!    `inbound_mtls_transport_socket` and the XFCC settings on the server's listener), their
//!    certificates pushed by the node agent's own SDS server (`meshplane_proxy::agent::sds`).
//!    One keep-alive connection from the bench sends sequential `GET`s through client Envoy →
//!    server Envoy → a local upstream; rows: plaintext between the Envoys, mutual TLS on pooled
//!    connections (the steady state), and mutual TLS with a new handshake for every request
//!    (`maxRequestsPerConnection: 1`, rendered by `translate::policy`). p50/p99 as the client
//!    sees it, and both Envoys' CPU per request.
//! 2. **Certificates signed per second by one instance on one core.** The instance's certificate
//!    service (`CertificateServer` behind the TLS port, as `meshplane-xds` serves it) runs on a
//!    single-threaded runtime of its own thread; it checks every caller's token by TokenReview
//!    against the Kubernetes API stand-in (`meshplane-kube-standin`, in process, on the other
//!    threads) and signs real CSRs (ECDSA P-256, pre-generated so the clients' key generation is
//!    not counted). Rows: 8 callers on persistent channels; and a new TLS connection per CSR, as
//!    the node agent does.
//! 3. **Failed requests during rotation under steady load.** On the new-handshake path, a
//!    request every 10 ms while both sidecars get a new key and certificate every second
//!    (certificates of 3 seconds, so a sidecar that missed a rotation would fail within the
//!    loop). Printed: requests, failed, rotations pushed, rotations Envoy accepted
//!    (`sds.default.update_success`).
//!
//! Every loop is bounded in count and time:
//!
//!     meshplane-mtls-bench [--requests 3000] [--seconds 20] [--signings 1000]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use envoy_types::pb::envoy::config::bootstrap::v3::bootstrap::StaticResources;
use envoy_types::pb::envoy::config::bootstrap::v3::{Admin, Bootstrap};
use envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::{Address, Node, Pipe};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use meshplane_bench::http1::{get, upstream};
use meshplane_bench::procstat;
use meshplane_bench::stats::quantile;
use meshplane_ca::authority::{generate_csr, Authority};
use meshplane_ca::grpc::{
    connect_instance, IstioCertificateRequest, IstioCertificateServiceClient,
};
use meshplane_ca::root::{generate_root, self_signed_files, DEFAULT_ROOT_VALIDITY};
use meshplane_ca::spiffe::SpiffeId;
use meshplane_kube_standin::{Identity, StandIn, StandInOptions};
use meshplane_proxy::agent::{sds, Secrets, WorkloadCert};
use meshplane_xds::ads::AdsServer;
use meshplane_xds::outputs::IndexWatch;
use meshplane_xds::identity::{secure, CaDirectory, CertificateServer, ServingCert};
use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::{ProxyConfig, ProxyNode, SourceEvent};
use meshplane_xds::push::{run_push_loop, Change, ConfigGenerator, DebounceConfig, Hub, Pusher};
use meshplane_xds::tenancy::TokenReviewer;
use meshplane_xds::translate::{envoy, mtls, policy, registry::EndpointModel, traffic};
use prost::Message;
use time::OffsetDateTime;
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::watch;

const TRUST_DOMAIN: &str = "bench.mesh.local";
const NAMESPACE: &str = "shop";
const AUDIENCE: &str = "meshplane-bench";
/// The instance Service's name the callers verify (its serving certificate's DNS name).
const INSTANCE_HOST: &str = "meshplane-bench-v1.meshplane-bench.svc";
/// Callers of the certificate service at once.
const CALLERS: usize = 8;
/// CSRs generated before the signing loop and reused in turn (the service signs each anew).
const CSRS: usize = 32;
/// Rotation: a new certificate for both sidecars this often, valid this long.
const ROTATE_EVERY: Duration = Duration::from_secs(1);
const ROTATION_TTL: Duration = Duration::from_secs(3);
/// Pace of the steady load during rotation.
const ROTATION_PACE: Duration = Duration::from_millis(10);
/// Turns each latency path gets, interleaved with the others.
const ROUNDS: usize = 5;
/// How long Envoy (or the instance) may take to come up.
const STARTUP: Duration = Duration::from_secs(60);

/// Mutual TLS cost between two real Envoys, certificates signed per second by one instance's
/// certificate service, and failed requests during rotation under steady load.
#[derive(clap::Parser)]
#[command(name = "meshplane-mtls-bench")]
struct Args {
    /// Requests per latency path (split over the rounds).
    #[arg(long, default_value = "3000")]
    requests: std::num::NonZeroUsize,
    /// Upper bound of each phase, in seconds.
    #[arg(long, default_value = "20")]
    seconds: std::num::NonZeroU64,
    /// Certificates to sign per signing phase.
    #[arg(long, default_value = "1000")]
    signings: std::num::NonZeroUsize,
}

/// A fresh key and its certificate for `service_account`, as the node agent holds them.
fn workload_cert(authority: &Authority, service_account: &str, ttl: Duration) -> Result<Secrets> {
    let (key, csr) = generate_csr(None)?;
    let id = SpiffeId::new(TRUST_DOMAIN, NAMESPACE, service_account)?;
    let now = OffsetDateTime::now_utc();
    let issued = authority.issue_workload(&csr, &id, time::Duration::try_from(ttl)?, now)?;
    Ok(Secrets {
        cert: Some(Arc::new(WorkloadCert {
            chain_pem: issued.presented_chain_pem(),
            key_pem: key.serialize_pem(),
            root_pem: authority.root_pem().to_string(),
            identity: id.uri(),
            not_before: issued.not_before,
            not_after: issued.not_after,
        })),
        bundle: Some(authority.trust_bundle_pem()),
    })
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn static_cluster(name: &str, port: u16) -> Cluster {
    let mut cluster = envoy::cluster(name, DiscoveryType::Static);
    cluster.load_assignment = Some(envoy::load_assignment(
        name,
        &[EndpointModel {
            address: "127.0.0.1".into(),
            port: u32::from(port),
            ..EndpointModel::default()
        }],
    ));
    cluster
}

/// The static cluster on the agent's SDS socket, as the launcher's bootstrap has it.
fn sds_cluster(socket: &Path) -> Cluster {
    let mut cluster = envoy::with_http2(envoy::cluster(
        meshplane_proxy::bootstrap::SDS_CLUSTER,
        DiscoveryType::Static,
    ));
    cluster.load_assignment = Some(ClusterLoadAssignment {
        cluster_name: meshplane_proxy::bootstrap::SDS_CLUSTER.into(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: vec![LbEndpoint {
                host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                    address: Some(Address {
                        address: Some(AddressKind::Pipe(Pipe {
                            path: socket.display().to_string(),
                            mode: 0,
                        })),
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    });
    cluster
}

/// An HTTP listener on `port` routing everything to `cluster`.
fn http_listener(name: &str, port: u16, cluster: &str, server_side: bool) -> Listener {
    let route = RouteConfiguration {
        name: name.into(),
        virtual_hosts: vec![VirtualHost {
            name: name.into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut hcm = envoy::http_connection_manager(name, RouteSpecifier::RouteConfig(route));
    if server_side {
        // What the server's sidecar does on a mutual TLS chain: the caller's identity to the app.
        hcm = mtls::forward_client_identity(hcm);
    }
    Listener {
        name: name.into(),
        address: Some(envoy::socket_address("127.0.0.1", u32::from(port))),
        filter_chains: vec![envoy::filter_chain(name, hcm)],
        ..Default::default()
    }
}

fn bootstrap(
    id: &str,
    admin: u16,
    sds_socket: &Path,
    listeners: Vec<Listener>,
    mut clusters: Vec<Cluster>,
) -> Bootstrap {
    clusters.push(sds_cluster(sds_socket));
    Bootstrap {
        node: Some(Node {
            id: id.into(),
            cluster: id.into(),
            ..Default::default()
        }),
        admin: Some(Admin {
            address: Some(envoy::socket_address("127.0.0.1", u32::from(admin))),
            ..Default::default()
        }),
        static_resources: Some(StaticResources {
            listeners,
            clusters,
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct Sidecar {
    child: tokio::process::Child,
    pid: u32,
    admin: u16,
    secrets: watch::Sender<Secrets>,
    _sds: tokio::task::JoinHandle<()>,
}

impl Sidecar {
    /// Starts the agent's SDS server with `secrets` and an Envoy on `config`.
    async fn start(
        envoy_bin: &Path,
        dir: &Path,
        name: &str,
        secrets: Secrets,
        config: impl FnOnce(&Path, u16) -> Bootstrap,
    ) -> Result<Self> {
        let socket = dir.join(format!("{name}-sds.sock"));
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).context("binding the SDS socket")?;
        let (tx, rx) = watch::channel(secrets);
        let (_stop_tx, stop_rx) = watch::channel(false);
        let sds = tokio::spawn(async move {
            let _stop = _stop_tx;
            sds::serve(listener, rx, stop_rx).await;
        });
        let admin = free_port()?;
        let file = dir.join(format!("{name}.pb"));
        std::fs::write(&file, config(&socket, admin).encode_to_vec())?;
        let child = meshplane_bench::envoy::spawn(envoy_bin, &file)?;
        let pid = child.id().context("Envoy pid")?;
        Ok(Self {
            child,
            pid,
            admin,
            secrets: tx,
            _sds: sds,
        })
    }

    /// A counter or gauge from the admin's `/stats`.
    async fn stat(&self, name: &str) -> Result<u64> {
        let mut conn = TcpStream::connect(("127.0.0.1", self.admin)).await?;
        let mut buf = Vec::new();
        let (status, body) = get(&mut conn, &mut buf, "/stats").await?;
        if status != 200 {
            bail!("Envoy admin /stats answered {status}");
        }
        let text = String::from_utf8_lossy(&body);
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0))
    }

    fn cpu_seconds(&self) -> Result<f64> {
        Ok(procstat::sample(self.pid)?.cpu_seconds)
    }
}

/// A keep-alive connection to `port` once it answers 200 (Envoy up, secrets loaded).
async fn connect_when_serving(port: u16, sidecars: &mut [&mut Sidecar]) -> Result<TcpStream> {
    let ready_by = Instant::now() + STARTUP;
    loop {
        if let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)).await {
            let mut buf = Vec::new();
            if let Ok((200, _)) = get(&mut c, &mut buf, "/").await {
                c.set_nodelay(true)?;
                return Ok(c);
            }
        }
        if Instant::now() > ready_by {
            bail!("nothing served on 127.0.0.1:{port} within {STARTUP:?}");
        }
        for s in sidecars.iter_mut() {
            if let Some(status) = s.child.try_wait()? {
                bail!("Envoy exited: {status}");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct LatencyRow {
    path: &'static str,
    requests: usize,
    p50: Option<Duration>,
    p99: Option<Duration>,
    cpu_us_per_request: f64,
    /// TLS handshakes the server's sidecar completed during the loop.
    handshakes: u64,
}

/// The three paths measured in turn, [`ROUNDS`] times, so that a change in the machine's load
/// falls on all of them alike; each path keeps its own keep-alive connection.
async fn latencies(
    paths: &[(&'static str, u16)],
    sidecars: &mut [&mut Sidecar],
    handshakes_stat: &str,
    args: &Args,
) -> Result<Vec<LatencyRow>> {
    let mut conns = Vec::new();
    for (_, port) in paths {
        let mut conn = connect_when_serving(*port, sidecars).await?;
        let mut buf = Vec::new();
        for _ in 0..200 {
            get(&mut conn, &mut buf, "/").await?;
        }
        conns.push((conn, buf));
    }
    let cpu = |s: &[&mut Sidecar]| -> Result<f64> {
        s.iter().map(|s| s.cpu_seconds()).sum::<Result<f64>>()
    };
    let per_round = (args.requests.get() / ROUNDS).max(1);
    let round_time = Duration::from_secs(args.seconds.get()) / ROUNDS as u32;
    let mut samples: Vec<(Vec<Duration>, f64, u64)> = vec![(Vec::new(), 0.0, 0); paths.len()];
    for _ in 0..ROUNDS {
        for (i, (path, _)) in paths.iter().enumerate() {
            let (conn, buf) = &mut conns[i];
            let server = sidecars.last().context("the server sidecar")?;
            let handshakes_before = server.stat(handshakes_stat).await?;
            let cpu_before = cpu(sidecars)?;
            let stop_at = Instant::now() + round_time;
            let mut n = 0;
            while n < per_round && Instant::now() < stop_at {
                let t = Instant::now();
                let (status, _) = get(conn, buf, "/").await?;
                samples[i].0.push(t.elapsed());
                n += 1;
                if status != 200 {
                    bail!("{path}: a request was answered {status}");
                }
            }
            samples[i].1 += cpu(sidecars)? - cpu_before;
            let server = sidecars.last().context("the server sidecar")?;
            samples[i].2 += server.stat(handshakes_stat).await? - handshakes_before;
        }
    }
    Ok(paths
        .iter()
        .zip(samples)
        .map(|((path, _), (mut latencies, cpu_used, handshakes))| {
            let n = latencies.len();
            LatencyRow {
                path,
                requests: n,
                p50: quantile(&mut latencies, 0.50),
                p99: quantile(&mut latencies, 0.99),
                cpu_us_per_request: cpu_used * 1e6 / n.max(1) as f64,
                handshakes,
            }
        })
        .collect())
}

struct RotationRow {
    requests: usize,
    failed: usize,
    first_failure: Option<String>,
    took: Duration,
    pushed: u64,
    accepted: (u64, u64),
}

/// Steady load on the new-handshake path while both sidecars rotate every [`ROTATE_EVERY`].
async fn rotation(
    port: u16,
    authority: &Authority,
    client: &Sidecar,
    server: &Sidecar,
    args: &Args,
) -> Result<RotationRow> {
    const UPDATES: &str = "sds.default.update_success";
    let before = (client.stat(UPDATES).await?, server.stat(UPDATES).await?);
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await?;
    conn.set_nodelay(true)?;
    let mut buf = Vec::new();
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(args.seconds.get());
    let mut pace = tokio::time::interval(ROTATION_PACE);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rotate =
        tokio::time::interval_at(tokio::time::Instant::now() + ROTATE_EVERY, ROTATE_EVERY);
    let (mut requests, mut failed, mut pushed) = (0usize, 0usize, 0u64);
    let mut first_failure = None;
    while requests < args.requests.get() && Instant::now() < stop_at {
        tokio::select! {
            _ = rotate.tick() => {
                client.secrets.send_replace(workload_cert(authority, "client", ROTATION_TTL)?);
                server.secrets.send_replace(workload_cert(authority, "web", ROTATION_TTL)?);
                pushed += 1;
            }
            _ = pace.tick() => {
                requests += 1;
                let outcome = get(&mut conn, &mut buf, "/").await;
                let ok = matches!(&outcome, Ok((200, body)) if String::from_utf8_lossy(body) == "ok");
                if !ok {
                    failed += 1;
                    let broken = outcome.is_err();
                    first_failure.get_or_insert_with(|| match outcome {
                        Ok((status, body)) => format!("#{requests}: {status} {}", String::from_utf8_lossy(&body)),
                        Err(e) => format!("#{requests}: {e}"),
                    });
                    if broken {
                        // The client Envoy closed the bench's own connection: open another.
                        conn = TcpStream::connect(("127.0.0.1", port)).await?;
                        buf.clear();
                    }
                }
            }
        }
    }
    let took = started.elapsed();
    let after = (client.stat(UPDATES).await?, server.stat(UPDATES).await?);
    Ok(RotationRow {
        requests,
        failed,
        first_failure,
        took,
        pushed,
        accepted: (
            after.0 - before.0.min(after.0),
            after.1 - before.1.min(after.1),
        ),
    })
}

/// Membership of the bench instance: `shop` only, nothing to render.
struct ShopOnly;

impl ConfigGenerator for ShopOnly {
    fn apply(&mut self, _event: SourceEvent) -> Change {
        Change::default()
    }
    fn render(&self, _node: &ProxyNode) -> Arc<ProxyConfig> {
        Arc::new(ProxyConfig::default())
    }
    fn watch(&self) -> IndexWatch {
        IndexWatch::with_members([NAMESPACE.to_string()].into())
    }
}

/// The instance's TLS port with its certificate service, on a single-threaded runtime of its
/// own thread; returns its address and a handle to run tasks on that thread.
fn start_instance(
    ca_dir: PathBuf,
    reviewer: TokenReviewer,
) -> Result<(
    std::net::SocketAddr,
    tokio::runtime::Handle,
    watch::Sender<bool>,
)> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (shutdown, shutdown_rx) = watch::channel(false);
    std::thread::Builder::new()
        .name("instance".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow::anyhow!(e)));
                    return;
                }
            };
            runtime.block_on(async move {
                let started = async {
                    let hub = Hub::new(
                        "bench",
                        "bench-v1",
                        "meshplane-bench",
                        Arc::new(Metrics::new()),
                    );
                    let pusher = Pusher::new(Arc::clone(&hub), Box::new(ShopOnly));
                    let (events, events_rx) = tokio::sync::mpsc::channel(4);
                    let debounce = DebounceConfig {
                        quiet: Duration::from_millis(1),
                        max: Duration::from_millis(5),
                        isolated_quiet: Duration::from_millis(1),
                    };
                    tokio::spawn(run_push_loop(
                        pusher,
                        events_rx,
                        debounce,
                        shutdown_rx.clone(),
                    ));
                    events.send(SourceEvent::Ready).await?;
                    tokio::time::timeout(STARTUP, hub.wait_ready()).await?;
                    let ca = Arc::new(CaDirectory::new(ca_dir));
                    let serving = Arc::new(ServingCert::new(
                        Arc::clone(&ca),
                        vec![INSTANCE_HOST.to_string()],
                        None,
                        meshplane_ca::verify::provider(),
                    ));
                    let listener = TcpListener::bind("127.0.0.1:0").await?;
                    let addr = listener.local_addr()?;
                    let ads = AdsServer::new(
                        Arc::clone(&hub),
                        Some(reviewer.clone()),
                        shutdown_rx.clone(),
                    );
                    let certs =
                        CertificateServer::new(ca, reviewer, Arc::clone(&hub), TRUST_DOMAIN);
                    let tls = secure::server_config(serving)?;
                    tokio::spawn(secure::serve_secure(
                        listener,
                        tls,
                        ads,
                        Some(certs),
                        shutdown_rx.clone(),
                    ));
                    Ok::<_, anyhow::Error>((addr, events))
                }
                .await;
                match started {
                    Ok((addr, _events)) => {
                        let _ = ready_tx.send(Ok((addr, tokio::runtime::Handle::current())));
                        let mut stop = shutdown_rx;
                        let _ = stop.wait_for(|s| *s).await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })?;
    let (addr, handle) = ready_rx
        .recv_timeout(STARTUP)
        .context("the instance did not start")??;
    Ok((addr, handle, shutdown))
}

struct SigningRow {
    mode: &'static str,
    signed: usize,
    took: Duration,
    instance_cpu: f64,
}

async fn signing(args: &Args) -> Result<Vec<SigningRow>> {
    let standin = StandIn::start(StandInOptions::default()).await?;
    let admin = standin.client(&Identity::Admin).await?;
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let sa: ServiceAccount = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "web", "namespace": NAMESPACE}}),
    )?;
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &sa)
        .await?;

    let dir = std::env::temp_dir().join(format!("meshplane-mtls-bench-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let root = generate_root(
        "bench",
        TRUST_DOMAIN,
        OffsetDateTime::now_utc(),
        DEFAULT_ROOT_VALIDITY,
    )?;
    for (name, pem) in self_signed_files(&root).entries() {
        std::fs::write(dir.join(name), pem)?;
    }
    let reviewer = TokenReviewer::new(admin, AUDIENCE);
    let (addr, instance, shutdown) = start_instance(dir.clone(), reviewer)?;
    let bundle = root.cert_pem.clone();
    let token = standin.issue_service_account_token(
        NAMESPACE,
        "web",
        &[AUDIENCE],
        Duration::from_secs(3600),
    );
    let csrs: Arc<Vec<String>> = Arc::new(
        (0..CSRS)
            .map(|_| generate_csr(None).map(|(_, csr)| csr))
            .collect::<Result<_, _>>()?,
    );
    let instance_cpu = || async {
        instance
            .spawn(async { procstat::thread_cpu_seconds() })
            .await
            .context("instance thread")?
    };

    let mut rows = Vec::new();
    for (mode, per_csr_connection, count) in [
        ("8 callers, persistent channels", false, args.signings.get()),
        (
            "8 callers, a TLS connection per CSR (the node agent's way)",
            true,
            args.signings.get() / 2,
        ),
    ] {
        let count = count.max(CALLERS);
        let deadline = Instant::now() + Duration::from_secs(args.seconds.get() * 3);
        let cpu_before = instance_cpu().await?;
        let started = Instant::now();
        let mut callers = Vec::new();
        for caller in 0..CALLERS {
            let (csrs, token, bundle) = (Arc::clone(&csrs), token.clone(), bundle.clone());
            let share = count / CALLERS;
            callers.push(tokio::spawn(async move {
                let connect = || connect_instance(&addr.to_string(), INSTANCE_HOST, &bundle);
                let mut client = IstioCertificateServiceClient::new(connect().await?);
                let mut signed = 0usize;
                for i in 0..share {
                    if Instant::now() > deadline {
                        break;
                    }
                    if per_csr_connection && i > 0 {
                        client = IstioCertificateServiceClient::new(connect().await?);
                    }
                    let mut request = tonic::Request::new(IstioCertificateRequest {
                        csr: csrs[(caller + i * CALLERS) % csrs.len()].clone(),
                        validity_duration: 3600,
                        metadata: None,
                    });
                    request.set_timeout(Duration::from_secs(30));
                    request
                        .metadata_mut()
                        .insert("authorization", format!("Bearer {token}").parse()?);
                    let chain = client
                        .create_certificate(request)
                        .await?
                        .into_inner()
                        .cert_chain;
                    if chain.len() < 2 {
                        bail!("a chain of {} certificates", chain.len());
                    }
                    signed += 1;
                }
                Ok::<_, anyhow::Error>(signed)
            }));
        }
        let mut signed = 0;
        for c in callers {
            signed += c.await??;
        }
        let took = started.elapsed();
        let cpu = instance_cpu().await? - cpu_before;
        rows.push(SigningRow {
            mode,
            signed,
            took,
            instance_cpu: cpu,
        });
    }
    let _ = shutdown.send(true);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rows)
}

fn us(d: Option<Duration>) -> String {
    d.map_or_else(
        || "n/a".to_string(),
        |d| format!("{:.0} µs", d.as_secs_f64() * 1e6),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let envoy_bin = meshplane_bench::fleet::envoy_bin(None)?;
    let dir = std::env::temp_dir().join(format!("meshplane-mtls-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&args, &envoy_bin, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(args: &Args, envoy_bin: &Path, dir: &Path) -> Result<()> {
    let root = generate_root(
        "bench",
        TRUST_DOMAIN,
        OffsetDateTime::now_utc(),
        DEFAULT_ROOT_VALIDITY,
    )?;
    let authority = Authority::load(&self_signed_files(&root), OffsetDateTime::now_utc())?;
    let server_id = SpiffeId::new(TRUST_DOMAIN, NAMESPACE, "web")?.uri();

    let up = TcpListener::bind("127.0.0.1:0").await?;
    let up_port = up.local_addr()?.port();
    let up_task = tokio::spawn(upstream(up));
    let (server_plain, server_mtls) = (free_port()?, free_port()?);
    let mut server = Sidecar::start(
        envoy_bin,
        dir,
        "server",
        workload_cert(&authority, "web", Duration::from_secs(3600))?,
        |sds, admin| {
            let mut mtls_listener = http_listener("inbound-mtls", server_mtls, "upstream", true);
            for chain in &mut mtls_listener.filter_chains {
                chain.transport_socket = Some(mtls::inbound_mtls_transport_socket(TRUST_DOMAIN));
            }
            bootstrap(
                "server",
                admin,
                sds,
                vec![
                    http_listener("inbound-plain", server_plain, "upstream", false),
                    mtls_listener,
                ],
                vec![static_cluster("upstream", up_port)],
            )
        },
    )
    .await?;

    let (plain, pooled, fresh) = (free_port()?, free_port()?, free_port()?);
    let sni = mtls::mesh_sni(8080, "", "web.shop.svc.cluster.local");
    let mut client = Sidecar::start(
        envoy_bin,
        dir,
        "client",
        workload_cert(&authority, "client", Duration::from_secs(3600))?,
        |sds, admin| {
            let socket = mtls::istio_mutual_transport_socket(
                TRUST_DOMAIN,
                std::slice::from_ref(&server_id),
                &sni,
            );
            let mut pooled_cluster = static_cluster("mtls-pooled", server_mtls);
            pooled_cluster.transport_socket = Some(socket.clone());
            let mut fresh_cluster = static_cluster("mtls-fresh", server_mtls);
            fresh_cluster.transport_socket = Some(socket);
            let one_request: traffic::EffectivePolicy = traffic::EffectivePolicy {
                connection_pool: serde_json::from_value(
                    serde_json::json!({"http": {"maxRequestsPerConnection": 1}}),
                )
                .ok(),
                ..Default::default()
            };
            policy::apply(&mut fresh_cluster, &one_request, false, None);
            bootstrap(
                "client",
                admin,
                sds,
                vec![
                    http_listener("outbound-plain", plain, "plain", false),
                    http_listener("outbound-mtls-pooled", pooled, "mtls-pooled", false),
                    http_listener("outbound-mtls-fresh", fresh, "mtls-fresh", false),
                ],
                vec![
                    static_cluster("plain", server_plain),
                    pooled_cluster,
                    fresh_cluster,
                ],
            )
        },
    )
    .await?;

    let handshakes = format!("listener.127.0.0.1_{server_mtls}.ssl.handshake");
    let rows = latencies(
        &[
            ("plaintext between the sidecars", plain),
            ("mutual TLS, pooled connections", pooled),
            ("mutual TLS, a handshake per request", fresh),
        ],
        &mut [&mut client, &mut server],
        &handshakes,
        args,
    )
    .await?;
    let rotated = rotation(fresh, &authority, &client, &server, args).await?;
    client.child.kill().await.ok();
    server.child.kill().await.ok();
    up_task.abort();
    let signings = signing(args).await?;

    println!(
        "### Added request latency of mutual TLS (two Envoys on loopback, sequential requests)"
    );
    println!();
    println!(
        "| path | requests | p50 | p99 | both Envoys' CPU per request | handshakes on the server |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.0} µs | {} |",
            r.path,
            r.requests,
            us(r.p50),
            us(r.p99),
            r.cpu_us_per_request,
            r.handshakes
        );
    }
    if let (Some(base), Some(m)) = (rows[0].p50, rows[1].p50) {
        let added = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()) * 1e6;
        println!();
        println!(
            "Added by mutual TLS: p50 {:+.0} µs (pooled), p99 {:+.0} µs (pooled); with a handshake per request p50 {:+.0} µs.",
            added(m, base),
            added(rows[1].p99.unwrap_or(m), rows[0].p99.unwrap_or(base)),
            added(rows[2].p50.unwrap_or(m), base),
        );
    }
    println!();
    println!(
        "### Certificates signed by one instance on one core (TokenReview + CSR, ECDSA P-256)"
    );
    println!();
    println!("| callers | signed | wall time | per second | instance CPU per certificate | one core's capacity |");
    println!("|---|---:|---:|---:|---:|---:|");
    for s in &signings {
        let cpu_per = s.instance_cpu / s.signed.max(1) as f64;
        println!(
            "| {} | {} | {:.2} s | {:.0} | {:.2} ms | {} |",
            s.mode,
            s.signed,
            s.took.as_secs_f64(),
            s.signed as f64 / s.took.as_secs_f64().max(1e-9),
            cpu_per * 1e3,
            if cpu_per > 0.0 {
                format!("{:.0}/s", 1.0 / cpu_per)
            } else {
                "n/a".to_string()
            }
        );
    }
    println!();
    println!(
        "Per second is what the callers saw, TokenReview round trips to the API stand-in included; one core's capacity is 1 / the instance thread's CPU per certificate (TLS, gRPC, TokenReview client, signing)."
    );
    println!();
    println!("### Failed requests during rotation under steady load (a handshake per request)");
    println!();
    println!("| requests | over | failed | rotations pushed | accepted by client / server Envoy |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {:.1} s | {} | {} | {} / {} |",
        rotated.requests,
        rotated.took.as_secs_f64(),
        rotated.failed,
        rotated.pushed,
        rotated.accepted.0,
        rotated.accepted.1
    );
    if let Some(f) = &rotated.first_failure {
        println!();
        println!("First failure: {f}");
    }
    if rotated.failed > 0 || rotated.accepted.0 < 2 || rotated.accepted.1 < 2 {
        bail!(
            "rotation under load: {} failed requests, {}/{} rotations accepted",
            rotated.failed,
            rotated.accepted.0,
            rotated.accepted.1
        );
    }
    Ok(())
}
