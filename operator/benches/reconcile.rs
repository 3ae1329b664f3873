//! Reconcile latency on the samples (blue-v1, blue-v2, green, the blue-stable tag and 40
//! labelled namespaces) against the in-memory fake API of the tests, plus the writes of a
//! steady-state resync. Prints p50/p99 per control plane; run with
//! `cargo bench -p meshplane-operator --bench reconcile`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use meshplane_crds::manifest::{parse_objects, Object};
use meshplane_crds::{names, MeshControlPlane};
use meshplane_operator::controller::{reconcile_control_plane, Context, Settings};
use meshplane_operator::metrics::Metrics;
use serde_json::json;
use support::FakeApi;

const ITERATIONS: usize = 300;

fn seed(api: &FakeApi) -> anyhow::Result<Vec<String>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let mut names_out = Vec::new();
    for file in ["blue.yaml", "blue-v2.yaml", "green.yaml"] {
        for obj in parse_objects(&std::fs::read_to_string(dir.join(file))?)? {
            match obj {
                Object::MeshControlPlane(m) => {
                    let mut v = serde_json::to_value(&*m)?;
                    v["metadata"]["finalizers"] = json!([names::FINALIZER]);
                    v["metadata"]["generation"] = json!(1);
                    names_out.push(m.metadata.name.clone().unwrap_or_default());
                    api.insert(("meshplane.io", "meshcontrolplanes"), v);
                }
                Object::MeshRevisionTag(t) => api.insert(
                    ("meshplane.io", "meshrevisiontags"),
                    serde_json::to_value(&*t)?,
                ),
                _ => {}
            }
        }
    }
    for i in 0..40 {
        let (rev, team) = match i % 4 {
            0 | 1 => ("blue-stable", "blue"),
            2 => ("blue-v2", "blue"),
            _ => ("green", "green"),
        };
        api.insert(("", "namespaces"), json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": format!("ns-{i:02}"), "labels": {names::REV_LABEL: rev, "team": team}}}));
    }
    Ok(names_out)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let api = FakeApi::default();
        let control_planes = seed(&api)?;
        let ctx = Arc::new(Context::new(
            api.client(),
            Arc::new(Metrics::default()),
            Settings::default(),
            Arc::new(time::OffsetDateTime::now_utc),
        ));
        let load = |name: &str| -> anyhow::Result<Arc<MeshControlPlane>> {
            let v = api
                .get("meshplane.io", "meshcontrolplanes", None, name)
                .ok_or_else(|| anyhow::anyhow!("missing {name}"))?;
            Ok(Arc::new(serde_json::from_value(v)?))
        };
        // Converge (first reconcile creates; a second settles status written by siblings).
        for _ in 0..2 {
            for name in &control_planes {
                reconcile_control_plane(load(name)?, ctx.clone()).await?;
            }
        }
        api.clear_writes();
        for name in &control_planes {
            let mut times = Vec::with_capacity(ITERATIONS);
            for _ in 0..ITERATIONS {
                let mcp = load(name)?;
                let started = Instant::now();
                reconcile_control_plane(mcp, ctx.clone()).await?;
                times.push(started.elapsed());
            }
            times.sort();
            println!(
                "steady-state reconcile {name:8}: p50 {:>8.2?}  p99 {:>8.2?}  ({ITERATIONS} runs)",
                percentile(&times, 0.50),
                percentile(&times, 0.99)
            );
        }
        let writes = api.writes().len() + api.events().len();
        println!(
            "writes during {} steady-state resyncs: {writes} ({} per resync)",
            ITERATIONS * control_planes.len(),
            writes as f64 / (ITERATIONS * control_planes.len()) as f64
        );
        anyhow::Ok(())
    })
}
