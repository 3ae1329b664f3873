//! What the S1 profile found hot under churn (docs/benchmarks.md), on the 1,000-service tenant
//! of the core's translation bench: a stream wake-up with nothing to send, a stream's EDS
//! change + ACK cycle, publishing debug state, a directory read after a file event, and one
//! endpoint change pushed to 400 proxies.
//!
//! Run: `cargo bench -p meshplane-xds --bench hot_spots`.

// The translation bench uses all of it, this one not.
#[allow(dead_code)]
#[path = "../../xds-core/benches/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{manifests, node, tenant, NAMESPACES};
use criterion::{criterion_group, criterion_main, Criterion};
use meshplane_crds::networking::CaptureMode;
use meshplane_xds::ads::protocol::{Protocol, StreamState};
use meshplane_xds::ads::snapshot::{content_version, Snapshot};
use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::{type_url, ProxyConfig, ProxyNode, Resource, SourceEvent};
use meshplane_xds::push::{Hub, Pusher};
use meshplane_xds::source_dir::{load_dir, objects_from_yaml, DirState};

/// A SotW stream subscribed (wildcard) to every type, with `snapshot` sent and ACKed.
fn synced_stream(snapshot: &Snapshot) -> StreamState {
    let mut state = StreamState::new(Protocol::Sotw);
    for t in type_url::ORDER {
        state.on_sotw_request(t, "", "", &[], None);
    }
    ack_all(&mut state, snapshot);
    state
}

/// Sends what is due for `snapshot` and ACKs it until nothing is due.
fn ack_all(state: &mut StreamState, snapshot: &Snapshot) {
    loop {
        let out = state.next_responses(snapshot);
        if out.is_empty() {
            return;
        }
        for o in out {
            state.on_sotw_request(o.type_url, &o.nonce, &o.version, &[], None);
        }
    }
}

/// `config` with its first endpoint resource replaced by other content.
fn with_changed_endpoint(config: &ProxyConfig, tag: &str) -> ProxyConfig {
    let mut next = config.clone();
    let name = next.endpoints[0].name.clone();
    let encoded = bytes::Bytes::from(format!("{name}:{tag}"));
    next.endpoints[0] = Arc::new(Resource {
        name,
        type_url: type_url::ENDPOINT,
        version: content_version(&encoded),
        packed: Default::default(),
        encoded,
    });
    next
}

fn slice_upsert(generation: usize) -> SourceEvent {
    let yaml = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc0-1, namespace: ns0, labels: {{kubernetes.io/service-name: svc0}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}, {{name: tcp-db, port: 7000}}]\nendpoints: [{{addresses: [198.18.251.{}], zone: a}}]\n",
        10 + generation % 2
    );
    SourceEvent::Upsert(objects_from_yaml("slice.yaml", &yaml).remove(0))
}

fn proxy(ns: usize, i: usize) -> ProxyNode {
    ProxyNode {
        id: format!(
            "sidecar~198.18.{}.{i}~p{i}.ns{ns}~ns{ns}.svc.cluster.local",
            200 + ns
        ),
        kind: Default::default(),
        namespace: format!("ns{ns}"),
        pod_name: Some(format!("p{i}")),
        ip: Some(format!("198.18.{}.{i}", 200 + ns)),
        labels: Default::default(),
        capture_mode: CaptureMode::Default,
        loopback: None,
        sds: false,
        service_account: None,
        readable_credentials: None,
    }
}

fn hot_spots(c: &mut Criterion) {
    let config = tenant(false).render(&node());
    let snap_a = Snapshot::new(&config, Instant::now());
    let snap_b = Snapshot::new(&with_changed_endpoint(&config, "b"), Instant::now());
    let mut group = c.benchmark_group("hot_spots");
    group.sample_size(20);

    let mut state = synced_stream(&snap_a);
    group.bench_function("stream_wakeup_nothing_due_unscoped", |b| {
        b.iter(|| state.next_responses(&snap_a))
    });
    let mut state = synced_stream(&snap_a);
    let mut flip = false;
    group.bench_function("stream_one_eds_change_and_ack_unscoped", |b| {
        b.iter(|| {
            flip = !flip;
            ack_all(&mut state, if flip { &snap_b } else { &snap_a });
        })
    });

    let hub = Hub::new("acme", "blue", "meshplane-acme", Arc::new(Metrics::new()));
    let handle = hub.connect(node(), Protocol::Sotw);
    let state = synced_stream(&snap_a);
    group.bench_function("publish_debug_state_unscoped", |b| {
        b.iter(|| handle.publish(&state))
    });
    drop(handle);

    let dir = std::env::temp_dir().join(format!("meshplane-bench-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (i, file) in manifests(true).iter().enumerate() {
        std::fs::write(dir.join(format!("ns{i}.yaml")), file).expect("write manifest");
    }
    group.bench_function("dir_read_full", |b| {
        b.iter(|| load_dir(&dir).expect("load"))
    });
    // What a file event costs now: re-read the named file and diff it into events.
    let mut state = DirState::load(&dir).expect("load");
    let changed = [dir.join("ns3.yaml")];
    group.bench_function("dir_read_after_one_file_event", |b| {
        b.iter(|| state.update(&changed).expect("update"))
    });
    let _ = std::fs::remove_dir_all(&dir);

    let hub = Hub::new("acme", "blue", "meshplane-acme", Arc::new(Metrics::new()));
    let mut pusher = Pusher::new(Arc::clone(&hub), Box::new(tenant(true)));
    let handles: Vec<_> = (0..NAMESPACES)
        .flat_map(|ns| (0..20).map(move |i| proxy(ns, i)))
        .map(|n| hub.connect(n, Protocol::Sotw))
        .collect();
    pusher.apply(SourceEvent::Ready);
    let mut generation = 0;
    group.bench_function("endpoint_change_push_400_proxies_scoped", |b| {
        b.iter(|| {
            generation += 1;
            push_change(&mut pusher, slice_upsert(generation));
        })
    });
    drop(handles);
    group.finish();
}

/// Applies one event and pushes it as the push loop does after its debounce.
fn push_change(pusher: &mut Pusher, event: SourceEvent) {
    let change = pusher.apply(event);
    pusher.push(Instant::now(), &change);
}

criterion_group!(benches, hot_spots);
criterion_main!(benches);
