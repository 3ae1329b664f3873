//! Translation cost and config size per proxy on a 1,000-service directory-style tenant
//! (20 namespaces × 50 Services, 3 endpoints each), without Sidecars (every proxy imports the
//! whole tenant) and with a namespace Sidecar importing `./*` (scoped).
//!
//! Run: `cargo bench -p meshplane-xds --bench translate`. The config sizes are printed once
//! before the timings.

use criterion::{criterion_group, criterion_main, Criterion};
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::MeshConfig;
use meshplane_xds::index::TenantIndex;
use meshplane_xds::model::{ProxyConfig, ProxyNode, SourceEvent};
use meshplane_xds::source_dir::{objects_from_yaml, KINDS};

const NAMESPACES: usize = 20;
const SERVICES_PER_NAMESPACE: usize = 50;

/// One manifest file per namespace, as a directory source would read them.
fn manifests(scoped: bool) -> Vec<String> {
    let mut files = Vec::new();
    for n in 0..NAMESPACES {
        let mut y = String::new();
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: ns{n}, labels: {{meshplane.io/rev: blue}}}}\n"
        ));
        if scoped {
            y.push_str(&format!(
                "---\napiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {{name: default, namespace: ns{n}}}\nspec: {{egress: [{{hosts: [\"./*\"]}}]}}\n"
            ));
        }
        for s in 0..SERVICES_PER_NAMESPACE {
            let ip = format!("10.{n}.{s}.1");
            y.push_str(&format!(
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc{s}, namespace: ns{n}}}\nspec: {{clusterIP: {ip}, selector: {{app: svc{s}}}, ports: [{{name: http, port: 80, targetPort: 8080}}, {{name: tcp-db, port: {}}}]}}\n",
                7000 + s
            ));
            y.push_str(&format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc{s}-1, namespace: ns{n}, labels: {{kubernetes.io/service-name: svc{s}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}, {{name: tcp-db, port: {}}}]\nendpoints: [{{addresses: [10.{n}.{s}.10], zone: a}}, {{addresses: [10.{n}.{s}.11], zone: b}}, {{addresses: [10.{n}.{s}.12], zone: c}}]\n",
                7000 + s
            ));
        }
        files.push(y);
    }
    files
}

fn tenant(scoped: bool) -> TenantIndex {
    let mut index = TenantIndex::new("acme", "blue", "meshplane-acme", MeshConfig::default());
    index.apply(SourceEvent::Resync {
        namespace: None,
        kinds: KINDS.to_vec(),
    });
    for (i, file) in manifests(scoped).iter().enumerate() {
        for obj in objects_from_yaml(&format!("ns{i}.yaml"), file) {
            index.apply(SourceEvent::Upsert(obj));
        }
    }
    index.apply(SourceEvent::Synced);
    index
}

fn node() -> ProxyNode {
    ProxyNode {
        id: "sidecar~10.0.0.1~svc0-x.ns0~ns0.svc.cluster.local".into(),
        namespace: "ns0".into(),
        pod_name: Some("svc0-x".into()),
        ip: Some("10.0.0.1".into()),
        labels: [("app".to_string(), "svc0".to_string())].into(),
        capture_mode: CaptureMode::Default,
        loopback: None,
    }
}

fn bytes(config: &ProxyConfig) -> (usize, usize) {
    let all = [
        &config.clusters,
        &config.endpoints,
        &config.listeners,
        &config.routes,
    ];
    let count = all.iter().map(|l| l.len()).sum();
    let size = all
        .iter()
        .flat_map(|l| l.iter())
        .map(|r| r.encoded.len())
        .sum();
    (count, size)
}

fn bench(c: &mut Criterion) {
    let unscoped = tenant(false);
    let scoped = tenant(true);
    assert_eq!(
        unscoped.registry().services.len(),
        NAMESPACES * SERVICES_PER_NAMESPACE
    );
    let (n_u, b_u) = bytes(&unscoped.render_proxy(&node()));
    let (n_s, b_s) = bytes(&scoped.render_proxy(&node()));
    println!(
        "config per proxy, 1,000 services: unscoped {n_u} resources / {b_u} bytes; scoped (./*) {n_s} resources / {b_s} bytes ({:.1}x smaller)",
        b_u as f64 / b_s.max(1) as f64
    );
    let mut group = c.benchmark_group("render_proxy_1000_services");
    group.sample_size(20);
    group.bench_function("unscoped", |b| {
        b.iter(|| unscoped.render_proxy_uncached(&node()))
    });
    group.bench_function("scoped", |b| {
        b.iter(|| scoped.render_proxy_uncached(&node()))
    });
    group.bench_function("cached_same_scope", |b| {
        b.iter(|| unscoped.render_proxy(&node()))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
