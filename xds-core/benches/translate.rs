//! Translation cost and config size per proxy on a 1,000-service directory-style tenant
//! (20 namespaces × 50 Services, 3 endpoints each), without Sidecars (every proxy imports the
//! whole tenant) and with a namespace Sidecar importing `./*` (scoped).
//!
//! Run: `cargo bench -p meshplane-xds-core --bench translate`. The config sizes are printed
//! once before the timings. What the same tenant costs the ADS streams and the push loop is
//! the xds-server's `hot_spots` bench.

mod common;

use common::{node, tenant, NAMESPACES, SERVICES_PER_NAMESPACE};
use criterion::{criterion_group, criterion_main, Criterion};
use meshplane_xds_core::model::ProxyConfig;

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
    let (n_u, b_u) = bytes(&unscoped.render(&node()));
    let (n_s, b_s) = bytes(&scoped.render(&node()));
    println!(
        "config per proxy, 1,000 services: unscoped {n_u} resources / {b_u} bytes; scoped (./*) {n_s} resources / {b_s} bytes ({:.1}x smaller)",
        b_u as f64 / b_s.max(1) as f64
    );
    let mut group = c.benchmark_group("render_proxy_1000_services");
    group.sample_size(20);
    group.bench_function("unscoped", |b| {
        b.iter(|| unscoped.render_checked(&node()).0)
    });
    group.bench_function("scoped", |b| b.iter(|| scoped.render_checked(&node()).0));
    group.bench_function("cached_same_scope", |b| b.iter(|| unscoped.render(&node())));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
