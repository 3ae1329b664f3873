//! Health-gated revision migration (`MeshRevisionMigration`, docs/migration.md) on one cluster:
//! tenant blue runs namespaces shop, cart and pay on tag `blue-stable` → blue-v1; tenant green
//! runs garden. Real Envoys serve traffic the test sends from the node the whole time.
//!
//! 1. A broken canary: an EnvoyFilter labelled `meshplane.io/rev: blue-v2` (so only blue-v2's
//!    instances use it) that Envoy rejects. The migration to blue-v2 restarts its first batch
//!    (shop), whose new proxies NACK; gate `NoNacks` fails, the tag returns to blue-v1, shop is
//!    restarted on it, and the migration ends `RolledBack` with every pod on blue-v1. Cart and
//!    pay, never started, are never restarted.
//! 2. The filter removed, a second migration moves the tag batch by batch (shop + cart, then
//!    pay), each batch's pods injected by blue-v2, connected, synced, with traffic figures
//!    before and after read from the proxies' own statistics. A pause set while batch 1 gates
//!    holds the migration before batch 2 (pay untouched); resuming finishes it.
//!
//! Green's pods are never restarted and green's tag never moves. The time per batch and from the
//! failed gate to every pod back on blue-v1 are printed (docs/benchmarks.md quotes them).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use meshplane_crds::migration::{BatchPhase, MigrationPhase};
use meshplane_crds::{names, MeshRevisionMigration, MeshRevisionTag};
use meshplane_e2e::harness::{pod_is_ready, wait_for, Cluster, ToldEvent, WEB_PORT};

const DEADLINE: Duration = Duration::from_secs(120);
/// A migration's whole run: restarts, gates, rollback, on a loaded 2-core machine.
const MIGRATION_DEADLINE: Duration = Duration::from_secs(240);
/// Blue's namespaces on the tag, in the order the migrations restart them.
const BLUE: [&str; 3] = ["shop", "cart", "pay"];
/// Most requests the traffic loop sends (it also stops when the scenario ends).
const MAX_REQUESTS: u64 = 20_000;

/// Service `web` and a one-replica Deployment `web` (echo image) in `namespace`.
fn web_app(namespace: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {namespace}}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: {WEB_PORT}, targetPort: http}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {namespace}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
        - {{name: web, image: example.com/echo:1, ports: [{{name: http, containerPort: {WEB_PORT}}}]}}
"#
    )
}

/// A migration of `blue-stable` to blue-v2. The gates are those of the sample, shortened for a
/// test: a 3 s observation window, 5 requests on each side to judge. The latency bound is wide
/// because a loaded CI machine's latency varies by multiples between two reads; the verdict
/// logic of both traffic gates is unit-tested (`operator/src/migration/tests.rs`).
fn migration(name: &str, batch_size: u32) -> String {
    format!(
        r#"
apiVersion: meshplane.io/v1alpha1
kind: MeshRevisionMigration
metadata: {{name: {name}}}
spec:
  tag: blue-stable
  revision: blue-v2
  batchSize: {batch_size}
  order: [shop]
  gates:
    timeoutSeconds: 150
    observeSeconds: 3
    maxErrorRateIncreasePercent: 5
    maxLatencyIncreasePercent: 2000
    minRequests: 5
"#
    )
}

/// An EnvoyFilter only blue-v2's instances use (revision-scoped config), which Envoy rejects:
/// a cluster's `connect_timeout` must be positive (a proto constraint Envoy checks on every
/// CDS update), so every proxy of shop served by blue-v2 NACKs its clusters.
const BROKEN_CANARY_FILTER: &str = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata:
  name: v2-only-timeouts
  namespace: shop
  labels: {meshplane.io/rev: blue-v2}
spec:
  configPatches:
    - applyTo: CLUSTER
      match: {cluster: {name: PassthroughCluster}}
      patch:
        operation: MERGE
        value: {connect_timeout: 0s}
"#;

/// The revision that injected a pod's proxy.
fn injected_by(pod: &Pod) -> Option<&str> {
    pod.annotations()
        .get(names::INJECTED_REVISION_ANNOTATION)
        .map(String::as_str)
}

/// Uid of every pod in `namespace`, by name.
async fn pod_uids(client: &kube::Client, namespace: &str) -> BTreeMap<String, String> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("pods of {namespace}: {e}"))
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect()
}

/// Waits until `namespace` has exactly one pod of `web`, Ready and injected by `revision`;
/// returns its name.
async fn wait_for_web_on(cluster: &Cluster, namespace: &str, revision: &str) -> String {
    let api: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    wait_for(
        &format!("web in {namespace} Ready on {revision}"),
        DEADLINE,
        || async {
            let pods = api
                .list(&ListParams::default().labels("app=web"))
                .await
                .map_err(|e| e.to_string())?
                .items;
            let live: Vec<&Pod> = pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            match live.as_slice() {
                [pod] if pod_is_ready(pod) && injected_by(pod) == Some(revision) => {
                    Ok(Some(pod.name_any()))
                }
                _ => Err(format!(
                    "{:?}",
                    live.iter()
                        .map(|p| format!(
                            "{} ready={} on {:?}",
                            p.name_any(),
                            pod_is_ready(p),
                            injected_by(p)
                        ))
                        .collect::<Vec<_>>()
                )),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until migration `name` satisfies `done`; returns it.
async fn wait_for_migration(
    api: &Api<MeshRevisionMigration>,
    name: &str,
    what: &str,
    done: impl Fn(&MeshRevisionMigration) -> bool,
) -> MeshRevisionMigration {
    wait_for(
        &format!("migration {name}: {what}"),
        MIGRATION_DEADLINE,
        || async {
            let m = api.get(name).await.map_err(|e| e.to_string())?;
            if done(&m) {
                Ok(Some(m))
            } else {
                Err(serde_json::to_string(&m.status).unwrap_or_default())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn phase(m: &MeshRevisionMigration) -> MigrationPhase {
    m.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn seconds_between(from: Option<&str>, to: Option<&str>) -> f64 {
    let parse = |v: Option<&str>| v.and_then(|t| t.parse::<Timestamp>().ok());
    match (parse(from), parse(to)) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => panic!("missing timestamps {from:?} → {to:?}"),
    }
}

/// Reasons of the Events published on migration `name`, in order.
async fn event_reasons(client: &kube::Client, name: &str) -> Vec<(String, String, String)> {
    let mut events: Vec<Event> = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("MeshRevisionMigration")
                    && r.name.as_deref() == Some(name)
            })
        })
        .collect();
    events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    events
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// Requests from the node to every blue namespace's `web` Service, until stopped or
/// [`MAX_REQUESTS`] are sent: the traffic the gates judge.
fn send_traffic(
    cluster: &Cluster,
    targets: Vec<(SocketAddr, String)>,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let node = cluster.on_node().expect("the test network");
    tokio::spawn(async move {
        let mut sent = 0;
        while !stop.load(Ordering::Relaxed) && sent < MAX_REQUESTS {
            for (address, host) in &targets {
                sent += 1;
                if let Ok(reply) = node.http_get(*address, host, "/").await {
                    if reply.status == 200 {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // Pacing of the load (about 10 rounds a second), not a wait for a condition.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_rolls_back_a_nacking_revision_then_moves_batch_by_batch_with_a_pause() {
    let started = Instant::now();
    let cluster = Cluster::start_two_tenants("migration", DEADLINE)
        .await
        .expect("two tenants Ready");
    let client = cluster.client();
    for ns in &BLUE[1..] {
        cluster.kubectl(&["create", "namespace", ns]).expect("ns");
        cluster
            .kubectl(&["label", "namespace", ns, "meshplane.io/rev=blue-stable"])
            .expect("join blue");
    }
    cluster
        .apply_manifest(
            "apiVersion: meshplane.io/v1alpha1\nkind: MeshRevisionTag\nmetadata: {name: green-stable}\nspec: {revision: green}\n",
        )
        .expect("green's tag");
    for ns in BLUE.iter().chain(["garden"].iter()) {
        cluster.apply_manifest(&web_app(ns)).expect("web");
    }
    for ns in BLUE {
        wait_for_web_on(&cluster, ns, "blue-v1").await;
    }
    wait_for_web_on(&cluster, "garden", "green").await;
    let green_pods = pod_uids(&client, "garden").await;
    let tags: Api<MeshRevisionTag> = Api::all(client.clone());
    let green_tag = tags.get("green-stable").await.expect("green-stable");

    cluster
        .kubectl(&[
            "apply",
            "--server-side",
            "-f",
            "config/samples/blue-v2.yaml",
        ])
        .expect("blue-v2");
    cluster
        .wait_for_mcp_ready("blue-v2", DEADLINE)
        .await
        .expect("blue-v2 Ready");

    let mut targets = Vec::new();
    for ns in BLUE {
        let svc = Api::<Service>::namespaced(client.clone(), ns)
            .get("web")
            .await
            .expect("web Service");
        let ip: IpAddr = svc
            .spec
            .and_then(|s| s.cluster_ip)
            .and_then(|ip| ip.parse().ok())
            .expect("a ClusterIP");
        targets.push((
            SocketAddr::new(ip, WEB_PORT),
            format!("web.{ns}.svc.cluster.local"),
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let traffic = send_traffic(&cluster, targets, stop.clone(), answered.clone());
    eprintln!("migration: cluster ready in {:?}", started.elapsed());

    // 1. The canary's config is broken: the first batch NACKs and everything returns to blue-v1.
    cluster
        .apply_manifest(BROKEN_CANARY_FILTER)
        .expect("the broken filter");
    let untouched: BTreeMap<&str, BTreeMap<String, String>> = [
        ("cart", pod_uids(&client, "cart").await),
        ("pay", pod_uids(&client, "pay").await),
    ]
    .into();
    let migrations: Api<MeshRevisionMigration> = Api::all(client.clone());
    cluster
        .apply_manifest(&migration("blue-v2-broken", 1))
        .expect("migration");
    let failed = wait_for_migration(&migrations, "blue-v2-broken", "RolledBack", |m| {
        phase(m).is_final()
    })
    .await;
    let status = failed.status.clone().expect("status");
    assert_eq!(status.phase, MigrationPhase::RolledBack, "{status:?}");
    let gate = status.failed_gate.clone().expect("the failed gate");
    assert_eq!(gate.gate, "NoNacks", "{gate:?}");
    assert!(
        gate.message.contains("shop/web") && gate.message.contains("blue-v2"),
        "the gate names the NACKing pod and the revision: {}",
        gate.message
    );
    assert!(
        gate.message.to_lowercase().contains("connect_timeout")
            || gate.message.to_lowercase().contains("connecttimeout"),
        "the gate carries Envoy's own reason: {}",
        gate.message
    );
    assert_eq!(status.batches.len(), 3, "{:?}", status.batches);
    assert_eq!(
        status.progress.as_deref(),
        Some("1/3"),
        "the batch that failed"
    );
    assert_eq!(status.batches[0].namespaces, vec!["shop".to_string()]);
    assert_eq!(status.batches[0].phase, BatchPhase::RolledBack);
    for b in &status.batches[1..] {
        assert_eq!(b.phase, BatchPhase::Pending, "{b:?}");
        assert!(b.restarted_at.is_none(), "{b:?}");
    }
    assert_eq!(
        tags.get("blue-stable").await.expect("tag").spec.revision,
        "blue-v1"
    );
    for ns in BLUE {
        wait_for_web_on(&cluster, ns, "blue-v1").await;
    }
    for (ns, before) in &untouched {
        assert_eq!(
            &pod_uids(&client, ns).await,
            before,
            "{ns} was never part of a started batch: its pods were not restarted"
        );
    }
    let reasons = event_reasons(&client, "blue-v2-broken").await;
    let warning = reasons
        .iter()
        .find(|(_, reason, _)| reason == "GateFailed")
        .unwrap_or_else(|| panic!("a GateFailed Event: {reasons:?}"));
    assert_eq!(warning.0, "Warning", "{warning:?}");
    assert!(warning.2.contains("NoNacks"), "{warning:?}");
    assert!(
        reasons.iter().any(|(_, r, _)| r == "RolledBack"),
        "{reasons:?}"
    );
    let detect = seconds_between(
        status.batches[0].restarted_at.as_deref(),
        status.rollback_started_at.as_deref(),
    );
    let back = seconds_between(
        status.rollback_started_at.as_deref(),
        status.rollback_completed_at.as_deref(),
    );
    eprintln!(
        "migration: restart → gate NoNacks failed: {detect:.1}s; failed gate → every pod back on blue-v1: {back:.1}s"
    );
    println!(
        "{}",
        cluster.kubectl(&["get", "mrm"]).expect("kubectl get mrm")
    );

    // 2. Fixed: batch by batch, with a pause between the batches.
    cluster
        .kubectl(&["delete", "envoyfilter", "-n", "shop", "v2-only-timeouts"])
        .expect("remove the filter");
    let pay_before = pod_uids(&client, "pay").await;
    cluster
        .apply_manifest(&migration("blue-v2", 2))
        .expect("migration");
    wait_for_migration(&migrations, "blue-v2", "batch 1 gating", |m| {
        m.status
            .as_ref()
            .and_then(|s| s.batches.first())
            .is_some_and(|b| b.phase == BatchPhase::Gating)
    })
    .await;
    migrations
        .patch(
            "blue-v2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": true}})),
        )
        .await
        .expect("pause");
    let paused = wait_for_migration(&migrations, "blue-v2", "Paused", |m| {
        phase(m) == MigrationPhase::Paused
    })
    .await;
    let status = paused.status.clone().expect("status");
    assert_eq!(status.batches.len(), 2, "{:?}", status.batches);
    assert_eq!(status.batches[0].namespaces, vec!["shop", "cart"]);
    assert_eq!(status.batches[0].phase, BatchPhase::Passed);
    assert_eq!(status.batches[1].phase, BatchPhase::Pending);
    assert_eq!(status.progress.as_deref(), Some("1/2"));
    for ns in ["shop", "cart"] {
        wait_for_web_on(&cluster, ns, "blue-v2").await;
    }
    // The pause holds: over more than one requeue period of a paused migration (5 s), batch 2
    // is not started and pay's pod stays the one from before.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "pay");
    let hold = Instant::now();
    while hold.elapsed() < Duration::from_secs(7) {
        let m = migrations.get("blue-v2").await.expect("migration");
        assert_eq!(phase(&m), MigrationPhase::Paused);
        let template_restart = deployments
            .get("web")
            .await
            .expect("pay/web")
            .spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .and_then(|a| a.get(names::RESTARTED_AT_ANNOTATION).cloned());
        assert_eq!(template_restart, None, "pay is not restarted while paused");
        assert_eq!(pod_uids(&client, "pay").await, pay_before);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    migrations
        .patch(
            "blue-v2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
        )
        .await
        .expect("resume");
    let done =
        wait_for_migration(&migrations, "blue-v2", "Succeeded", |m| phase(m).is_final()).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, MigrationPhase::Succeeded, "{status:?}");
    assert!(status.failed_gate.is_none());
    for ns in BLUE {
        wait_for_web_on(&cluster, ns, "blue-v2").await;
    }
    assert_eq!(
        tags.get("blue-stable").await.expect("tag").spec.revision,
        "blue-v2"
    );
    for (i, b) in status.batches.iter().enumerate() {
        assert_eq!(b.phase, BatchPhase::Passed, "{b:?}");
        // The statistics gates ran on figures read from the proxies themselves: before the
        // restart from blue-v1's (the test's traffic), after it from blue-v2's. How much of the
        // traffic reaches the new pods within the short window depends on how soon the node's
        // Service rules follow the new endpoints, so only "before" is bounded here.
        let before = b.before.as_ref().expect("figures before the restart");
        let after = b.after.as_ref().expect("figures after the restart");
        assert!(before.requests >= 5, "batch {}: {before:?}", i + 1);
        let gate = b.gate.as_ref().expect("the last gate");
        assert!(
            gate.gate == "Latency" || gate.gate == "ErrorRate",
            "batch {}: {gate:?}",
            i + 1
        );
        eprintln!(
            "migration: batch {}/{} ({}): restart → every gate passed in {:.1}s; before {before:?}, after {after:?}",
            i + 1,
            status.batches.len(),
            b.namespaces.join(", "),
            seconds_between(b.restarted_at.as_deref(), b.passed_at.as_deref())
        );
    }
    let reasons: Vec<String> = event_reasons(&client, "blue-v2")
        .await
        .into_iter()
        .map(|(_, r, _)| r)
        .collect();
    for reason in [
        "Started",
        "BatchStarted",
        "BatchPassed",
        "Paused",
        "Resumed",
        "Succeeded",
    ] {
        assert!(reasons.iter().any(|r| r == reason), "{reason}: {reasons:?}");
    }
    // As `kubectl get events` lists them: one Event per batch started and passed, each
    // occurring once (the steps in between, every 2 s, repeat none).
    let told = cluster
        .events_about("MeshRevisionMigration", "blue-v2")
        .expect("kubectl get events");
    for reason in ["BatchStarted", "BatchPassed"] {
        let per_batch: Vec<&ToldEvent> = told.iter().filter(|e| e.reason == reason).collect();
        assert_eq!(per_batch.len(), status.batches.len(), "{reason}: {told:?}");
        assert!(per_batch.iter().all(|e| e.count == 1), "{told:?}");
        for i in 1..=status.batches.len() {
            let batch = format!("batch {i}/{}", status.batches.len());
            assert!(
                per_batch.iter().any(|e| e.message.contains(&batch)),
                "{reason} of {batch}: {told:?}"
            );
        }
    }
    // The tag moved to blue-v2 by each migration and back by the rollback: TagMoved Events
    // on the tag count each move once.
    let moves = cluster
        .events_about("MeshRevisionTag", "blue-stable")
        .expect("kubectl get events");
    let moved = |from: &str, to: &str| -> i64 {
        let prefix = format!("tag blue-stable moved from revision {from} to {to}");
        moves
            .iter()
            .filter(|e| e.reason == "TagMoved" && e.message.starts_with(&prefix))
            .map(|e| e.count)
            .sum()
    };
    assert_eq!(
        (moved("blue-v1", "blue-v2"), moved("blue-v2", "blue-v1")),
        (2, 1),
        "{moves:?}"
    );
    println!(
        "{}",
        cluster.kubectl(&["get", "mrm"]).expect("kubectl get mrm")
    );

    // Green: nothing restarted, its tag never moved.
    assert_eq!(pod_uids(&client, "garden").await, green_pods);
    let green_tag_after = tags.get("green-stable").await.expect("green-stable");
    assert_eq!(green_tag_after.spec.revision, "green");
    assert_eq!(
        green_tag_after.resource_version(),
        green_tag.resource_version(),
        "green's tag was not written"
    );
    stop.store(true, Ordering::Relaxed);
    traffic.await.expect("traffic loop");
    assert!(answered.load(Ordering::Relaxed) > 0);
    eprintln!("scenario migration took {:?}", started.elapsed());
}
