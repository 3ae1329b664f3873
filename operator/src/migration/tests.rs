//! The migration core, step by step, on small observed worlds.

use std::collections::BTreeMap;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use meshplane_crds::migration::{
    BatchPhase, MeshRevisionMigrationSpec, MeshRevisionMigrationStatus, MigrationPhase,
    TrafficFigures,
};

use super::gates::{gate, traffic_gates};
use super::proxies::{ConnectedProxy, Nack, TypeSync};
use super::stats::ProxyTraffic;
use super::step::{step, Effect, RevisionState, Step, TagState, World};
use super::workloads::{PodState, WorkloadKind, WorkloadState};

const T0: i64 = 1_796_140_800; // 2026-12-01T16:00:00Z

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(T0 + secs).expect("time")
}

fn spec(json: serde_json::Value) -> MeshRevisionMigrationSpec {
    let mut base = serde_json::json!({"tag": "blue-stable", "revision": "blue-v2"});
    if let (Some(b), Some(extra)) = (base.as_object_mut(), json.as_object()) {
        b.extend(extra.clone());
    }
    serde_json::from_value(base).expect("spec")
}

fn revision(tenant: &str, tags: &[&str]) -> Option<RevisionState> {
    Some(RevisionState {
        tenant: tenant.into(),
        ready: true,
        tags: tags.iter().map(|t| t.to_string()).collect(),
    })
}

fn traffic(requests: f64, errors: f64, mean_ms: f64) -> Option<ProxyTraffic> {
    Some(ProxyTraffic {
        requests,
        errors,
        time_sum_ms: requests * mean_ms,
        time_count: requests,
    })
}

fn web(ns: &str, restarted_at: Option<&str>, rev: &str, t: Option<ProxyTraffic>) -> WorkloadState {
    WorkloadState {
        kind: WorkloadKind::Deployment,
        namespace: ns.into(),
        name: "web".into(),
        restarted_at: restarted_at.map(Into::into),
        rolled_out: true,
        pods: vec![PodState {
            name: format!("web-{rev}"),
            ready: true,
            revision: Some(rev.into()),
            traffic: t,
        }],
    }
}

fn synced_proxy(ns: &str, pod: &str) -> ConnectedProxy {
    ConnectedProxy {
        namespace: ns.into(),
        pod_name: Some(pod.into()),
        types: vec![TypeSync {
            type_name: "cds".into(),
            subscribed: true,
            sent_version: Some("v1".into()),
            acked_version: Some("v1".into()),
            ..Default::default()
        }],
    }
}

/// The tag at blue-v2 and its webhooks moved; namespaces `shop` and `cart` on `rev`.
fn world(now: i64, tag_rev: &str, workloads: Vec<WorkloadState>) -> World {
    let (to_tags, from_tags): (&[&str], &[&str]) = if tag_rev == "blue-v2" {
        (&["blue-stable"], &[])
    } else {
        (&[], &["blue-stable"])
    };
    let mut by_ns: BTreeMap<String, Vec<WorkloadState>> = BTreeMap::new();
    for w in workloads {
        by_ns.entry(w.namespace.clone()).or_default().push(w);
    }
    World {
        now: at(now),
        tag: Some(TagState {
            revision: tag_rev.into(),
            tenant: Some("blue".into()),
            members: vec!["shop".into(), "cart".into()],
        }),
        target: revision("blue", to_tags),
        previous: revision("blue", from_tags),
        workloads: by_ns,
        target_proxies: Ok(Vec::new()),
    }
}

fn started(spec: &MeshRevisionMigrationSpec) -> Step {
    let s = step(spec, None, &world(0, "blue-v1", Vec::new()));
    assert_eq!(s.status.phase, MigrationPhase::Progressing);
    s
}

#[test]
fn a_migration_starts_by_fixing_its_batches_and_moving_the_tag() {
    let spec = spec(serde_json::json!({"order": ["shop"]}));
    let s = started(&spec);
    assert_eq!(s.status.from_revision.as_deref(), Some("blue-v1"));
    let batches: Vec<Vec<String>> = s
        .status
        .batches
        .iter()
        .map(|b| b.namespaces.clone())
        .collect();
    assert_eq!(
        batches,
        vec![vec!["shop".to_string()], vec!["cart".to_string()]]
    );
    assert_eq!(s.status.progress.as_deref(), Some("0/2"));
    assert_eq!(
        s.effects,
        vec![Effect::MoveTag {
            revision: "blue-v2".into()
        }]
    );
    assert_eq!(s.notices[0].reason, "Started");
}

#[test]
fn refused_across_tenants_and_when_the_tag_is_already_there() {
    let spec = spec(serde_json::json!({}));
    let mut w = world(0, "blue-v1", Vec::new());
    w.target = revision("green", &[]);
    let s = step(&spec, None, &w);
    assert_eq!(s.status.phase, MigrationPhase::Failed);
    assert!(s.effects.is_empty());
    assert!(s
        .status
        .message
        .unwrap_or_default()
        .contains("across tenants"));
    let s = step(&spec, None, &world(0, "blue-v2", Vec::new()));
    assert_eq!(s.status.phase, MigrationPhase::Failed);
    assert!(s.effects.is_empty());
}

#[test]
fn no_restart_before_the_webhooks_follow_the_tag() {
    let spec = spec(serde_json::json!({"order": ["shop"]}));
    let s = started(&spec);
    // The tag moved, but blue-v1 still lists it.
    let mut w = world(
        1,
        "blue-v2",
        vec![web("shop", None, "blue-v1", traffic(100.0, 0.0, 2.0))],
    );
    w.previous = revision("blue", &["blue-stable"]);
    let s = step(&spec, Some(&s.status), &w);
    assert!(s.effects.is_empty(), "{:?}", s.effects);
    assert_eq!(s.status.batches[0].phase, BatchPhase::Pending);
}

/// Started, batch 1 (shop) restarted at t=1 with its figures before.
fn batch_one_restarted(spec: &MeshRevisionMigrationSpec) -> MeshRevisionMigrationStatus {
    let s = started(spec);
    let w = world(
        1,
        "blue-v2",
        vec![web("shop", None, "blue-v1", traffic(100.0, 1.0, 2.0))],
    );
    let s = step(spec, Some(&s.status), &w);
    assert_eq!(s.status.batches[0].phase, BatchPhase::Gating);
    let restarted_at = at(1).to_string();
    assert_eq!(
        s.status.batches[0].restarted_at.as_deref(),
        Some(restarted_at.as_str())
    );
    assert_eq!(
        s.effects,
        vec![Effect::Restart {
            workloads: vec![(WorkloadKind::Deployment, "shop".into(), "web".into())],
            restarted_at,
        }]
    );
    assert_eq!(
        s.status.batches[0].before,
        Some(TrafficFigures {
            requests: 100,
            errors: 1,
            mean_latency_ms: Some(2.0)
        })
    );
    assert_eq!(s.status.progress.as_deref(), Some("1/2"));
    s.status
}

#[test]
fn batches_pass_one_after_the_other_then_the_migration_succeeds() {
    let spec = spec(
        serde_json::json!({"order": ["shop"], "gates": {"observeSeconds": 5, "minRequests": 10}}),
    );
    let status = batch_one_restarted(&spec);
    let r1 = at(1).to_string();
    // Restarted, pods on blue-v2, proxy not connected yet: waiting on ProxiesConnected.
    let new_pods = vec![web("shop", Some(&r1), "blue-v2", traffic(50.0, 0.0, 2.2))];
    let s = step(&spec, Some(&status), &world(2, "blue-v2", new_pods.clone()));
    assert_eq!(
        s.status.batches[0].gate.as_ref().map(|g| g.gate.as_str()),
        Some(gate::PROXIES_CONNECTED)
    );
    assert!(s.effects.is_empty());
    // Connected and synced: the observation window opens.
    let mut w = world(3, "blue-v2", new_pods.clone());
    w.target_proxies = Ok(vec![synced_proxy("shop", "web-blue-v2")]);
    let s = step(&spec, Some(&s.status), &w);
    assert_eq!(
        s.status.batches[0].gate.as_ref().map(|g| g.gate.as_str()),
        Some(gate::OBSERVE)
    );
    assert_eq!(s.status.batches[0].healthy_since, Some(at(3).to_string()));
    // Window over: traffic judged, batch passed.
    w.now = at(9);
    let s = step(&spec, Some(&s.status), &w);
    assert_eq!(
        s.status.batches[0].phase,
        BatchPhase::Passed,
        "{:?}",
        s.status.message
    );
    assert_eq!(s.notices[0].reason, "BatchPassed");
    assert_eq!(s.status.progress.as_deref(), Some("1/2"));
    // Batch 2 (cart) starts on the next step.
    let mut w = world(10, "blue-v2", vec![web("cart", None, "blue-v1", None)]);
    w.target_proxies = Ok(vec![synced_proxy("shop", "web-blue-v2")]);
    let s = step(&spec, Some(&s.status), &w);
    assert_eq!(s.status.batches[1].phase, BatchPhase::Gating);
    assert_eq!(s.status.progress.as_deref(), Some("2/2"));
    let r2 = at(10).to_string();
    let mut w = world(30, "blue-v2", vec![web("cart", Some(&r2), "blue-v2", None)]);
    w.target_proxies = Ok(vec![synced_proxy("cart", "web-blue-v2")]);
    let s = step(&spec, Some(&s.status), &w);
    w.now = at(40);
    let s = step(&spec, Some(&s.status), &w);
    // Without statistics the traffic gate cannot judge; no statistics → it waits.
    assert_eq!(s.status.batches[1].phase, BatchPhase::Gating);
    let mut w = world(
        41,
        "blue-v2",
        vec![web("cart", Some(&r2), "blue-v2", traffic(0.0, 0.0, 0.0))],
    );
    w.target_proxies = Ok(vec![synced_proxy("cart", "web-blue-v2")]);
    let s = step(&spec, Some(&s.status), &w);
    assert_eq!(s.status.batches[1].phase, BatchPhase::Passed);
    let s = step(&spec, Some(&s.status), &w);
    assert_eq!(s.status.phase, MigrationPhase::Succeeded);
    assert_eq!(s.status.progress.as_deref(), Some("2/2"));
    assert_eq!(s.status.conditions[0].status, "True");
}

#[test]
fn a_nack_fails_the_batch_at_once_and_the_rollback_restarts_it_on_the_old_revision() {
    let spec = spec(serde_json::json!({"order": ["shop"]}));
    let status = batch_one_restarted(&spec);
    let r1 = at(1).to_string();
    let mut w = world(2, "blue-v2", vec![web("shop", Some(&r1), "blue-v2", None)]);
    let mut proxy = synced_proxy("shop", "web-blue-v2");
    proxy.types.push(TypeSync {
        type_name: "lds".into(),
        subscribed: true,
        // What the instance reports after a first response was rejected: nothing held.
        sent_version: None,
        acked_version: None,
        rejected: true,
        last_nack: Some(Nack {
            version: "v9".into(),
            message: "Didn't find a registered implementation for 'envoy.filters.http.nope'".into(),
        }),
        ..Default::default()
    });
    w.target_proxies = Ok(vec![proxy]);
    let s = step(&spec, Some(&status), &w);
    assert_eq!(s.status.phase, MigrationPhase::RollingBack);
    let failed = s.status.failed_gate.clone().expect("failed gate");
    assert_eq!(failed.gate, gate::NO_NACKS);
    assert!(
        failed.message.contains("lds version v9"),
        "{}",
        failed.message
    );
    assert_eq!(
        s.effects,
        vec![Effect::MoveTag {
            revision: "blue-v1".into()
        }]
    );
    assert!(s
        .notices
        .iter()
        .any(|n| n.warning && n.reason == "GateFailed"));
    assert_eq!(s.status.batches[0].phase, BatchPhase::Failed);
    // Tag back and reflected: the restarted batch restarts with the rollback's time.
    let rb = s.status.rollback_started_at.clone().expect("rollback time");
    let s = step(
        &spec,
        Some(&s.status),
        &world(3, "blue-v1", vec![web("shop", Some(&r1), "blue-v2", None)]),
    );
    assert_eq!(
        s.effects,
        vec![Effect::Restart {
            workloads: vec![(WorkloadKind::Deployment, "shop".into(), "web".into())],
            restarted_at: rb.clone(),
        }]
    );
    assert_eq!(s.status.phase, MigrationPhase::RollingBack);
    // The never-started batch (cart) is not touched; once shop's pods run on blue-v1, done.
    let s = step(
        &spec,
        Some(&s.status),
        &world(8, "blue-v1", vec![web("shop", Some(&rb), "blue-v1", None)]),
    );
    assert!(s.effects.is_empty());
    assert_eq!(s.status.phase, MigrationPhase::RolledBack);
    assert_eq!(s.status.batches[0].phase, BatchPhase::RolledBack);
    assert_eq!(s.status.batches[1].phase, BatchPhase::Pending);
    // `kubectl get mrm` keeps showing the batch that failed.
    assert_eq!(s.status.progress.as_deref(), Some("1/2"));
    assert_eq!(s.status.rollback_completed_at, Some(at(8).to_string()));
    assert!(s
        .status
        .message
        .unwrap_or_default()
        .contains("6s after gate NoNacks failed"));
}

#[test]
fn a_gate_still_waiting_at_the_timeout_fails_with_its_figures() {
    let spec = spec(serde_json::json!({"order": ["shop"], "gates": {"timeoutSeconds": 60}}));
    let status = batch_one_restarted(&spec);
    let r1 = at(1).to_string();
    let mut pods = web("shop", Some(&r1), "blue-v2", None);
    pods.pods[0].ready = false;
    let s = step(
        &spec,
        Some(&status),
        &world(30, "blue-v2", vec![pods.clone()]),
    );
    assert_eq!(s.status.phase, MigrationPhase::Progressing);
    let s = step(&spec, Some(&s.status), &world(61, "blue-v2", vec![pods]));
    assert_eq!(s.status.phase, MigrationPhase::RollingBack);
    let failed = s.status.failed_gate.expect("failed");
    assert_eq!(failed.gate, gate::PODS_READY);
    assert!(
        failed
            .message
            .starts_with("timed out after 60s: Deployment/shop/web: 0/1 pods Ready"),
        "{}",
        failed.message
    );
}

#[test]
fn pause_holds_between_batches_and_resume_continues() {
    let mut spec = spec(serde_json::json!({"order": ["shop"], "paused": true}));
    let s = started(&spec);
    let w = world(1, "blue-v2", vec![web("shop", None, "blue-v1", None)]);
    let s = step(&spec, Some(&s.status), &w);
    assert_eq!(s.status.phase, MigrationPhase::Paused);
    assert!(s.effects.is_empty());
    assert_eq!(s.notices[0].reason, "Paused");
    let s = step(&spec, Some(&s.status), &w);
    assert!(s.notices.is_empty(), "a pause is announced once");
    spec.paused = false;
    let s = step(&spec, Some(&s.status), &w);
    assert_eq!(s.status.phase, MigrationPhase::Progressing);
    assert_eq!(s.notices[0].reason, "Resumed");
    assert!(matches!(s.effects.as_slice(), [Effect::Restart { .. }]));
}

#[test]
fn abort_rolls_back_without_a_warning() {
    let mut spec = spec(serde_json::json!({"order": ["shop"]}));
    let status = batch_one_restarted(&spec);
    spec.abort = true;
    let s = step(&spec, Some(&status), &world(2, "blue-v2", Vec::new()));
    assert_eq!(s.status.phase, MigrationPhase::RollingBack);
    assert_eq!(
        s.status.failed_gate.map(|g| g.gate),
        Some(gate::ABORTED.to_string())
    );
    assert!(s.notices.iter().all(|n| !n.warning));
}

#[test]
fn the_traffic_gates_compare_with_before() {
    let settings = serde_json::from_value(serde_json::json!({"maxErrorRateIncreasePercent": 1.0, "maxLatencyIncreasePercent": 50.0, "minRequests": 20})).expect("settings");
    let fig = |requests, errors, ms| TrafficFigures {
        requests,
        errors,
        mean_latency_ms: Some(ms),
    };
    let before = fig(1000, 5, 4.0);
    assert!(traffic_gates(Some(&before), &fig(200, 2, 5.0), &settings).passed);
    let worse = traffic_gates(Some(&before), &fig(200, 10, 4.0), &settings);
    assert_eq!(
        (worse.gate.as_str(), worse.passed),
        (gate::ERROR_RATE, false)
    );
    assert!(
        worse.message.contains("5.00% (10 of 200)"),
        "{}",
        worse.message
    );
    let slow = traffic_gates(Some(&before), &fig(200, 1, 6.5), &settings);
    assert_eq!((slow.gate.as_str(), slow.passed), (gate::LATENCY, false));
    let thin = traffic_gates(Some(&before), &fig(5, 5, 90.0), &settings);
    assert!(thin.passed && thin.message.contains("too thin"));
    let _ = SignedDuration::ZERO;
}

#[test]
fn requests_without_published_durations_wait_on_latency_until_they_appear() {
    let spec = spec(
        serde_json::json!({"order": ["shop"], "gates": {"observeSeconds": 2, "minRequests": 10}}),
    );
    let status = batch_one_restarted(&spec);
    let r1 = at(1).to_string();
    // Counted but not flushed: Envoy publishes request durations only at its stats flush.
    let unflushed = Some(ProxyTraffic {
        requests: 40.0,
        errors: 0.0,
        time_sum_ms: 0.0,
        time_count: 0.0,
    });
    let mut w = world(
        3,
        "blue-v2",
        vec![web("shop", Some(&r1), "blue-v2", unflushed)],
    );
    w.target_proxies = Ok(vec![synced_proxy("shop", "web-blue-v2")]);
    let s = step(&spec, Some(&status), &w);
    assert_eq!(
        s.status.batches[0].gate.as_ref().map(|g| g.gate.as_str()),
        Some(gate::OBSERVE)
    );
    w.now = at(6);
    let s = step(&spec, Some(&s.status), &w);
    let waiting = s.status.batches[0].gate.clone().expect("a gate");
    assert_eq!(s.status.batches[0].phase, BatchPhase::Gating);
    assert_eq!(waiting.gate, gate::LATENCY, "{waiting:?}");
    assert!(waiting.message.contains("not published"), "{waiting:?}");
    // Flushed: judged, and passed.
    let flushed = vec![web("shop", Some(&r1), "blue-v2", traffic(40.0, 0.0, 2.1))];
    let mut w = world(8, "blue-v2", flushed);
    w.target_proxies = Ok(vec![synced_proxy("shop", "web-blue-v2")]);
    let s = step(&spec, Some(&s.status), &w);
    assert_eq!(
        s.status.batches[0].phase,
        BatchPhase::Passed,
        "{:?}",
        s.status.message
    );
}
