//! What hostile or careless ADS clients cost the instance (a bench that prints a table, not a
//! test; docs/benchmarks.md records the figures before and after the input bounds):
//!
//! 1. log bytes written for 20 refused streams whose node id is 1 MiB;
//! 2. resident memory of the instance with 1,500 streams opened on one HTTP/2 connection;
//! 3. TokenReviews sent for 100 reconnects of one proxy with the same token;
//! 4. resident memory of the instance idle, with 16 streams on one connection each sending a
//!    3.8 MB SotW name list (380,000 names), after they close, then the same with 16 delta
//!    streams each sending 3.9 MB of `initial_resource_versions` (390,000 entries).
//!
//! 1, 2 and 4 run the real `meshplane-xds` binary (directory mode) as a process; 3 runs the
//! ADS server in process against a fake API server that counts TokenReviews. With
//! `MESHPLANE_XDS_BASELINE_BIN` set to another build of `meshplane-xds`, 4 runs against it too
//! (before and after a change, in one run).
//!
//! Run: `cargo test -p meshplane-xds --locked --bench bounded_inputs`.

#[path = "../tests/token_common/mod.rs"]
mod token_common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use meshplane_xds::ads::AdsServer;
use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::{type_url, ProxyConfig, ProxyNode, SourceEvent};
use meshplane_xds::outputs::IndexWatch;
use meshplane_xds::push::{run_push_loop, Change, ConfigGenerator, DebounceConfig, Hub, Pusher};
use meshplane_xds::tenancy::TokenReviewer;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(60);
const MESH: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {meshplane.io/rev: blue}}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 198.18.0.10, ports: [{name: http, port: 80}]}\n";

/// The instance binary in directory mode, its output captured in a file.
struct Instance {
    child: Child,
    log: PathBuf,
    dir: PathBuf,
    xds: String,
}

impl Instance {
    fn start(name: &str) -> Instance {
        Self::start_bin(name, env!("CARGO_BIN_EXE_meshplane-xds"))
    }

    fn start_bin(name: &str, bin: &str) -> Instance {
        let dir =
            std::env::temp_dir().join(format!("meshplane-bounds-{}-{name}", std::process::id()));
        let manifests = dir.join("mesh");
        std::fs::create_dir_all(&manifests).expect("temp dir");
        std::fs::write(manifests.join("mesh.yaml"), MESH).expect("manifest");
        let log = dir.join("instance.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin)
            .args(["--tenant", "acme", "--revision", "blue", "--source"])
            .arg(format!("dir:{}", manifests.display()))
            .args([
                "--xds-addr",
                "127.0.0.1:0",
                "--webhook-addr",
                "127.0.0.1:0",
                "--monitoring-addr",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("MESHPLANE_PROXY_IMAGE")
            .stdout(Stdio::from(out.try_clone().expect("log file")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("start meshplane-xds");
        let mut instance = Instance {
            child,
            log,
            dir,
            xds: String::new(),
        };
        let end = Instant::now() + DEADLINE;
        instance.xds = loop {
            let text = std::fs::read_to_string(&instance.log).unwrap_or_default();
            if let Some(addr) = text.split("xds=").nth(1).map(|rest| {
                rest.chars()
                    .skip_while(|c| !c.is_ascii_digit())
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect::<String>()
            }) {
                break addr;
            }
            assert!(Instant::now() < end, "instance did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        };
        instance
    }

    fn log_bytes(&self) -> u64 {
        std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0)
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id())
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.xds))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn node(id: String) -> Node {
    Node {
        id,
        cluster: "bench".into(),
        ..Default::default()
    }
}

fn shop_node(i: usize) -> Node {
    node(format!(
        "sidecar~198.18.1.{}~p-{i}.shop~shop.svc.cluster.local",
        i % 250
    ))
}

type Open = (
    mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<DiscoveryResponse>,
);

async fn open(channel: Channel, node: Node, token: Option<&str>) -> Result<Open, tonic::Status> {
    let (tx, rx) = mpsc::channel(2);
    tx.send(DiscoveryRequest {
        node: Some(node),
        type_url: type_url::CLUSTER.into(),
        ..Default::default()
    })
    .await
    .map_err(|_| tonic::Status::internal("queue"))?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(t) = token {
        request.metadata_mut().insert(
            "authorization",
            format!(
                "Bearer {}",
                token_common::jwt_for(t, "shop", "meshplane-acme")
            )
            .parse()
            .expect("ascii"),
        );
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024);
    let stream = client.stream_aggregated_resources(request).await?;
    Ok((tx, stream.into_inner()))
}

/// 1. Log bytes for 20 streams refused for a 1 MiB node id.
async fn log_bytes_for_huge_node_ids() -> (u64, usize) {
    let instance = Instance::start("log");
    let channel = instance.channel().await;
    // Wait for readiness: a valid proxy gets its clusters.
    let (_tx, mut ok) = open(channel.clone(), shop_node(0), None)
        .await
        .expect("valid proxy admitted");
    ok.message().await.expect("response").expect("open");
    let before = instance.log_bytes();
    let mut status_bytes = 0;
    for i in 0..20 {
        let id = format!("{i}{}", "x".repeat(1024 * 1024));
        let err = match open(channel.clone(), node(id), None).await {
            Ok((_tx, mut s)) => match s.message().await {
                Err(status) => status,
                Ok(_) => panic!("a 1 MiB node id was served"),
            },
            Err(status) => status,
        };
        status_bytes = status_bytes.max(err.message().len());
    }
    // Logging is synchronous on the stream's task: the lines are written before the status.
    (instance.log_bytes() - before, status_bytes)
}

/// 2. RSS of the instance before and with 1,500 streams requested on one connection; how many
///    streams were answered.
async fn rss_with_streams_on_one_connection() -> (u64, u64, usize) {
    let instance = Instance::start("rss");
    let channel = instance.channel().await;
    let (_tx, mut ok) = open(channel.clone(), shop_node(0), None)
        .await
        .expect("valid proxy admitted");
    ok.message().await.expect("response").expect("open");
    let idle = instance.rss_kib();
    let answered = Arc::new(AtomicUsize::new(0));
    let mut held = Vec::new();
    for i in 1..=1500 {
        let (channel, answered) = (channel.clone(), Arc::clone(&answered));
        held.push(tokio::spawn(async move {
            if let Ok((tx, mut s)) = open(channel, shop_node(i), None).await {
                if matches!(s.message().await, Ok(Some(_))) {
                    answered.fetch_add(1, Ordering::Relaxed);
                    // Keep the stream open until the measurement is done.
                    std::future::pending::<()>().await;
                }
                drop(tx);
            }
        }));
    }
    // Streams beyond the server's limit wait in the client; measure once the count is stable.
    let end = Instant::now() + DEADLINE;
    let mut last = (usize::MAX, Instant::now());
    loop {
        let now = answered.load(Ordering::Relaxed);
        if now == 1500 {
            break;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(3) {
            break;
        }
        if Instant::now() > end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let loaded = instance.rss_kib();
    for h in held {
        h.abort();
    }
    (idle, loaded, answered.load(Ordering::Relaxed))
}

/// A stream that was answered (`true`) or is left open unanswered, kept open; `None`: it
/// ended.
async fn answered<Q, R>(
    tx: mpsc::Sender<Q>,
    mut s: tonic::Streaming<R>,
) -> Option<(mpsc::Sender<Q>, tonic::Streaming<R>, bool)> {
    match tokio::time::timeout(Duration::from_secs(30), s.message()).await {
        Ok(Ok(Some(_))) => Some((tx, s, true)),
        Ok(_) => None,
        Err(_) => Some((tx, s, false)),
    }
}

/// Streams per attack: as many as one connection may open.
const ATTACK_STREAMS: usize = 16;

/// RSS of the instance at `bin`, in KiB: idle, with 16 streams sending 3.8 MB SotW name lists,
/// after they close, with 16 delta streams sending 3.9 MB of initial versions, after they
/// close; and how many of the 32 streams were served.
async fn rss_under_large_requests(bin: &str, name: &str) -> ([u64; 5], usize) {
    let instance = Instance::start_bin(name, bin);
    // Readiness on a connection of its own: the attacks take every stream of theirs.
    let (tx, mut ok) = open(instance.channel().await, shop_node(0), None)
        .await
        .expect("valid proxy admitted");
    ok.message().await.expect("response").expect("open");
    drop((tx, ok));
    let channel = instance.channel().await;
    let idle = instance.rss_kib();
    // 8-byte names: 10 bytes each encoded.
    let names: Vec<String> = (0..380_000).map(|i| format!("n{i:07}")).collect();
    let mut served = 0;
    let mut sotw = Vec::new();
    for i in 0..ATTACK_STREAMS {
        let (channel, names) = (channel.clone(), names.clone());
        sotw.push(tokio::spawn(async move {
            let (tx, rx) = mpsc::channel(1);
            let first = DiscoveryRequest {
                node: Some(shop_node(100 + i)),
                type_url: type_url::CLUSTER.into(),
                resource_names: names,
                ..Default::default()
            };
            tx.send(first).await.ok()?;
            let mut client = AggregatedDiscoveryServiceClient::new(channel);
            let opened = client.stream_aggregated_resources(ReceiverStream::new(rx));
            let s = tokio::time::timeout(Duration::from_secs(60), opened)
                .await
                .ok()?
                .ok()?
                .into_inner();
            answered(tx, s).await
        }));
    }
    let mut open_sotw = Vec::new();
    for t in sotw {
        if let Some((tx, s, answered)) = t.await.expect("task") {
            served += usize::from(answered);
            open_sotw.push((tx, s));
        }
    }
    let sotw_loaded = instance.rss_kib();
    drop(open_sotw);
    // Streams end and freed memory decays (jemalloc returns it within about a second).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sotw_after = instance.rss_kib();
    // 6-byte names with empty versions: 10 bytes per entry encoded.
    let initial: std::collections::HashMap<String, String> = (0..390_000)
        .map(|i| (format!("{i:06x}"), String::new()))
        .collect();
    let mut delta = Vec::new();
    for i in 0..ATTACK_STREAMS {
        let (channel, initial) = (channel.clone(), initial.clone());
        delta.push(tokio::spawn(async move {
            let (tx, rx) = mpsc::channel(1);
            let first = DeltaDiscoveryRequest {
                node: Some(shop_node(200 + i)),
                type_url: type_url::CLUSTER.into(),
                initial_resource_versions: initial,
                ..Default::default()
            };
            tx.send(first).await.ok()?;
            let mut client = AggregatedDiscoveryServiceClient::new(channel);
            let opened = client.delta_aggregated_resources(ReceiverStream::new(rx));
            let s = tokio::time::timeout(Duration::from_secs(60), opened)
                .await
                .ok()?
                .ok()?
                .into_inner();
            answered(tx, s).await
        }));
    }
    let mut open_delta = Vec::new();
    for t in delta {
        if let Some((tx, s, answered)) = t.await.expect("task") {
            served += usize::from(answered);
            open_delta.push((tx, s));
        }
    }
    let delta_loaded = instance.rss_kib();
    drop(open_delta);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let delta_after = instance.rss_kib();
    (
        [idle, sotw_loaded, sotw_after, delta_loaded, delta_after],
        served,
    )
}

/// A generator with one member namespace, for the in-process server.
struct Shop;

impl ConfigGenerator for Shop {
    fn apply(&mut self, _event: SourceEvent) -> Change {
        Change::default()
    }
    fn render(&self, _node: &ProxyNode) -> Arc<ProxyConfig> {
        Arc::new(ProxyConfig::default())
    }
    fn watch(&self) -> IndexWatch {
        IndexWatch::with_members(["shop".to_string()].into())
    }
}

/// A kube client whose API server accepts `shop-token` and counts TokenReviews.
fn counting_kube(reviews: Arc<AtomicUsize>) -> kube::Client {
    use http_body_util::BodyExt;
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let reviews = Arc::clone(&reviews);
        async move {
            reviews.fetch_add(1, Ordering::Relaxed);
            let body = req.into_body().collect().await.expect("body").to_bytes();
            let mut review: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            review["status"] = serde_json::json!({
                "authenticated": token_common::jwt_name(review["spec"]["token"].as_str().unwrap_or_default()) == "shop-token",
                "audiences": ["meshplane-acme"],
                "user": {"username": "system:serviceaccount:shop:default"},
            });
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&review).expect("encode"),
                    ))
                    .expect("response"),
            )
        }
    });
    kube::Client::new(service, "default")
}

/// 3. TokenReviews for 100 reconnects of one proxy with one token.
async fn token_reviews_per_reconnects() -> usize {
    let reviews = Arc::new(AtomicUsize::new(0));
    let hub = Hub::new("acme", "blue", "meshplane-acme", Arc::new(Metrics::new()));
    let (_shutdown, shutdown_rx) = watch::channel(false);
    let (events, events_rx) = mpsc::channel(4);
    tokio::spawn(run_push_loop(
        Pusher::new(Arc::clone(&hub), Box::new(Shop)),
        events_rx,
        DebounceConfig::default(),
        shutdown_rx.clone(),
    ));
    events.send(SourceEvent::Ready).await.expect("push loop");
    tokio::time::timeout(DEADLINE, hub.wait_ready())
        .await
        .expect("ready");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let reviewer = TokenReviewer::new(counting_kube(Arc::clone(&reviews)), "meshplane-acme");
    tokio::spawn(AdsServer::new(hub, Some(reviewer), shutdown_rx).serve(listener));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    for i in 0..100 {
        let (tx, mut s) = open(channel.clone(), shop_node(1), Some("shop-token"))
            .await
            .unwrap_or_else(|e| panic!("reconnect {i} refused: {e}"));
        s.message().await.expect("response").expect("open");
        drop(tx);
    }
    reviews.load(Ordering::Relaxed)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (log, status) = log_bytes_for_huge_node_ids().await;
        let (idle, loaded, answered) = rss_with_streams_on_one_connection().await;
        let reviews = token_reviews_per_reconnects().await;
        let mut memory = Vec::new();
        if let Ok(baseline) = std::env::var("MESHPLANE_XDS_BASELINE_BIN") {
            memory.push(("baseline", rss_under_large_requests(&baseline, "baseline").await));
        }
        let this = env!("CARGO_BIN_EXE_meshplane-xds");
        memory.push(("this build", rss_under_large_requests(this, "memory").await));
        println!("| input | figure |");
        println!("|---|---|");
        println!("| 20 streams refused for a 1 MiB node id | {log} log bytes, status message {status} bytes |");
        println!(
            "| 1,500 streams requested on one HTTP/2 connection | RSS {} MiB idle, {} MiB loaded, {answered} streams answered |",
            idle / 1024,
            loaded / 1024
        );
        println!("| 100 reconnects with one token | {reviews} TokenReviews |");
        println!();
        println!("| binary | RSS idle | 16 × 3.8 MB SotW names: loaded → after close | 16 × 3.9 MB delta initial versions: loaded → after close | streams answered of 32 |");
        println!("|---|---|---|---|---|");
        let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
        for (name, (rss, served)) in memory {
            println!(
                "| {name} | {} | {} → {} | {} → {} | {served} |",
                mib(rss[0]),
                mib(rss[1]),
                mib(rss[2]),
                mib(rss[3]),
                mib(rss[4])
            );
        }
    });
}
