//! Telemetry of real sidecars, in blue's namespace `shop` with `web` and `client`
//! (`app_and_client`), on one cluster:
//!
//! - Access logs: the revision's switch is off and in JSON; a `Telemetry` selecting `web` turns
//!   the built-in `envoy` provider on for it. A call from client to web leaves a JSON line in
//!   web's sidecar log with Istio's default fields, and none in client's.
//! - Request metrics: a real Prometheus scrapes both sidecars' `/stats/prometheus` with the
//!   relabelling of the sidecar PodMonitor (`config/monitoring/podmonitor.yaml`) and answers
//!   `istio_requests_total` for the call with Istio's labels, from both reporters, and
//!   `istio_request_duration_milliseconds`; every panel of the workload dashboard
//!   (`config/monitoring/grafana-workload-dashboard.json`) returns data.
//! - Tracing: the revision declares an `opentelemetry` provider, a real OTLP/gRPC receiver
//!   (`e2e/python/otlp_receiver.py`) in a pod of `shop`; a namespace Telemetry sampling 0%
//!   sends it no span for calls from client to web, one sampling 100% sends it the spans of
//!   both sidecars, named `client.shop` and `web.shop`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use meshplane_e2e::harness::{app_and_client, wait_for, Cluster, WEB_PORT};
use meshplane_e2e::prometheus::Prometheus;
use meshplane_pod_runner::workspace_root;
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(120);
/// The sidecar's readiness port, which also serves `/stats/prometheus`.
const STATS_PORT: u16 = 15021;
/// The path of the probe requests: only they are looked for in the logs.
const PROBE_PATH: &str = "/telemetry-probe";

const WEB_LOGS: &str = r#"
apiVersion: telemetry.meshplane.io/v1alpha1
kind: Telemetry
metadata: {name: web-logs, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  accessLogging:
    - providers: [{name: envoy}]
"#;

/// The port the OTLP receiver answers `GET /spans` on.
const SPANS_PORT: u16 = 9411;

/// The OTLP/gRPC receiver (not meshed) and its Service, whose `grpc-` port makes the sidecars
/// export to it over HTTP/2.
fn otlp_receiver() -> String {
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = e2e.join("../.venv/bin/python");
    let python = std::path::absolute(&python).unwrap_or(python);
    let script = e2e.join("python/otlp_receiver.py");
    let (python, script) = (python.display(), script.display());
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: otel-collector, namespace: shop}}
spec:
  selector: {{app: otel-collector}}
  ports: [{{name: grpc-otlp, port: 4317, targetPort: 4317}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: otel-collector, namespace: shop, labels: {{app: otel-collector, sidecar.meshplane.io/inject: "false"}}}}
spec:
  containers:
    - name: receiver
      image: example.com/otlp:1
      command: ["{python}", "{script}", "--port", "4317", "--listen", "{SPANS_PORT}"]
      ports: [{{name: grpc-otlp, containerPort: 4317}}, {{name: http, containerPort: {SPANS_PORT}}}]
"#
    )
}

/// The namespace's tracing: every workload of shop to the `otel` provider at `percent`, with a
/// custom tag that shows which of these settings a sidecar has.
fn shop_tracing(percent: u32) -> String {
    format!(
        r#"
apiVersion: telemetry.meshplane.io/v1alpha1
kind: Telemetry
metadata: {{name: tracing, namespace: shop}}
spec:
  tracing:
    - providers: [{{name: otel}}]
      randomSamplingPercentage: {percent}
      customTags:
        sampling: {{literal: {{value: "sampled-{percent}-percent"}}}}
"#
    )
}

/// The spans the receiver holds whose attributes mention `needle`.
async fn spans_with(
    receiver: &meshplane_e2e::reach::InPod,
    needle: &str,
) -> Result<Vec<Value>, String> {
    let reply = receiver
        .http_get_at(
            SocketAddr::from((receiver.ip(), SPANS_PORT)),
            "localhost",
            "/spans",
        )
        .await
        .map_err(|e| e.to_string())?;
    if reply.status != 200 {
        return Err(format!("{reply:?}"));
    }
    let body: Value = serde_json::from_str(&reply.body).map_err(|e| e.to_string())?;
    Ok(body["spans"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s["attributes"].to_string().contains(needle))
        .collect())
}

/// The sidecar PodMonitor's `metricRelabelings` as Prometheus `metric_relabel_configs`.
fn sidecar_metric_relabelings() -> Value {
    let docs = std::fs::read_to_string(workspace_root().join("config/monitoring/podmonitor.yaml"))
        .expect("podmonitor.yaml");
    let monitor = docs
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str::<Value>(d).expect("a PodMonitor"))
        .find(|d| d["metadata"]["name"] == "meshplane-sidecars")
        .expect("the sidecar PodMonitor");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/stats/prometheus");
    let relabelings = endpoint["metricRelabelings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Value::Array(
        relabelings
            .into_iter()
            .map(|r| {
                let mut out = serde_json::Map::new();
                for (k, v) in r.as_object().cloned().unwrap_or_default() {
                    let key = match k.as_str() {
                        "sourceLabels" => "source_labels",
                        "targetLabel" => "target_label",
                        other => other,
                    };
                    out.insert(key.to_string(), v);
                }
                Value::Object(out)
            })
            .collect(),
    )
}

/// Every query of a dashboard, with its variables set to "all" and Grafana's interval to 1m.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let expr = expr
                    .replace("$namespace", ".*")
                    .replace("$workload", ".*")
                    .replace("$__rate_interval", "1m");
                out.push((panel["title"].as_str().unwrap_or("?").to_string(), expr));
            }
        }
    }
    out
}

/// The JSON access log lines of a pod's sidecar for the probe path.
fn probe_lines(cluster: &Cluster, pod: &str) -> Vec<Value> {
    let log = cluster
        .kubectl(&["logs", "-n", "shop", pod, "-c", "meshplane-proxy"])
        .unwrap_or_default();
    log.lines()
        .filter(|l| l.contains(PROBE_PATH))
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_logs_counts_and_times_requests_between_workloads() {
    let started = Instant::now();
    let cluster = Cluster::start_two_tenants("telemetry", DEADLINE)
        .await
        .expect("two tenants Ready");
    // The revision's switch: off, and JSON for whatever a Telemetry turns on.
    cluster
        .kubectl(&[
            "patch",
            "meshcontrolplane",
            "blue-v1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"meshConfig":{"accessLogging":{"enabled":false,"encoding":"JSON"},"extensionProviders":[{"name":"otel","opentelemetry":{"service":"otel-collector.shop.svc.cluster.local","port":4317}}]}}}"#,
        ])
        .expect("patch blue's access logging and tracing provider");
    cluster.apply_manifest(WEB_LOGS).expect("web's Telemetry");
    cluster
        .apply_manifest(&app_and_client("shop"))
        .expect("workloads");
    cluster
        .apply_manifest(&otlp_receiver())
        .expect("the OTLP receiver");
    cluster
        .apply_manifest(&shop_tracing(0))
        .expect("shop's tracing at 0%");
    let web = cluster
        .wait_for_ready_pods("shop", "app=web", 1, DEADLINE)
        .await
        .expect("web Ready")[0]
        .clone();
    let client = cluster
        .wait_for_ready_pods("shop", "app=client", 1, DEADLINE)
        .await
        .expect("client Ready")[0]
        .clone();
    let web_name = web.metadata.name.clone().unwrap_or_default();
    let client_name = client.metadata.name.clone().unwrap_or_default();

    // The instance accepts the Telemetries (the tracing one: its provider resolves).
    for name in ["web-logs", "tracing"] {
        wait_for(&format!("{name} Accepted=True"), DEADLINE, || async {
            let out = cluster
                .kubectl(&["get", "telemetry", "-n", "shop", name, "-o", "json"])
                .map_err(|e| e.to_string())?;
            let object: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            match meshplane_e2e::harness::condition_status(&object, "Accepted").as_deref() {
                Some("True") => Ok(Some(())),
                _ => Err(format!("status: {}", object["status"])),
            }
        })
        .await
        .expect("Telemetry accepted");
    }

    if cluster.network().is_none() {
        eprintln!(
            "the traffic checks reach pods through the local test network; E2E_KUBECONFIG is set"
        );
        return;
    }
    let caller = cluster.in_pod("shop", &client_name).expect("client pod");
    let url = format!("http://web.shop.svc.cluster.local:{WEB_PORT}{PROBE_PATH}");

    // A call from client to web is logged in JSON by web's sidecar (once its listeners carry
    // the Telemetry's log), and never by client's.
    let line = wait_for(
        "a JSON access log line in web's sidecar",
        DEADLINE,
        || async {
            let reply = caller.http_get(&url).await.map_err(|e| e.to_string())?;
            if reply.status != 200 {
                return Err(format!("{reply:?}"));
            }
            let lines = probe_lines(&cluster, &web_name);
            match lines.into_iter().next() {
                Some(l) => Ok(Some(l)),
                None => Err("no JSON line for the probe yet".into()),
            }
        },
    )
    .await
    .expect("web logs the probe");
    for field in [
        "start_time",
        "method",
        "path",
        "protocol",
        "response_code",
        "response_flags",
        "response_code_details",
        "connection_termination_details",
        "upstream_transport_failure_reason",
        "bytes_received",
        "bytes_sent",
        "duration",
        "upstream_service_time",
        "x_forwarded_for",
        "user_agent",
        "request_id",
        "authority",
        "upstream_host",
        "upstream_cluster",
        "upstream_local_address",
        "downstream_local_address",
        "downstream_remote_address",
        "requested_server_name",
        "route_name",
    ] {
        assert!(line.get(field).is_some(), "{field} in {line}");
    }
    assert_eq!(line["path"], PROBE_PATH, "{line}");
    assert_eq!(line["method"], "GET", "{line}");
    assert_eq!(line["response_code"], json!(200), "{line}");
    assert!(
        line["upstream_cluster"]
            .as_str()
            .is_some_and(|c| c.starts_with("inbound|")),
        "web's sidecar logs its inbound side: {line}"
    );
    let client_log = cluster
        .kubectl(&["logs", "-n", "shop", &client_name, "-c", "meshplane-proxy"])
        .expect("client's sidecar log");
    assert!(
        !client_log.contains(PROBE_PATH),
        "client's sidecar writes no access log: {client_log}"
    );

    // Request metrics, scraped by a real Prometheus with the sidecar PodMonitor's relabelling.
    let node = cluster.on_node().expect("the node");
    let work = std::env::temp_dir().join(format!("meshplane-telemetry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");
    let ip =
        |p: &k8s_openapi::api::core::v1::Pod| meshplane_e2e::harness::pod_ip(p).expect("pod IP");
    let config = json!({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{
            "job_name": "meshplane-system/meshplane-sidecars",
            "metrics_path": "/stats/prometheus",
            "static_configs": [{"targets": [
                format!("{}:{STATS_PORT}", ip(&web)),
                format!("{}:{STATS_PORT}", ip(&client)),
            ]}],
            "metric_relabel_configs": sidecar_metric_relabelings(),
        }],
    });
    let prometheus = Prometheus::start(node, &config, &work);
    let source = r#"istio_requests_total{reporter="source", source_workload="client", source_workload_namespace="shop", destination_workload="web", destination_workload_namespace="shop", destination_service="web.shop.svc.cluster.local", destination_service_name="web", destination_service_namespace="shop", response_code="200"}"#;
    let destination = r#"istio_requests_total{reporter="destination", destination_workload="web", destination_workload_namespace="shop", destination_service="web.shop.svc.cluster.local", response_code="200"}"#;
    let duration = r#"istio_request_duration_milliseconds_count{reporter="source", source_workload="client", destination_workload="web"}"#;
    for expr in [source, destination, duration] {
        let series = wait_for(&format!("series {expr}"), DEADLINE, || async {
            // Keep calling: Envoy writes histograms at its stats flush.
            let _ = caller.http_get(&url).await;
            let result = prometheus.query(expr).await?;
            if result.is_empty() {
                Err("no series yet".into())
            } else {
                Ok(Some(result))
            }
        })
        .await
        .expect("the series");
        let value: f64 = series[0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        assert!(value >= 1.0, "{expr}: {series:?}");
    }
    // With mutual TLS between the sidecars each side names the other's identity.
    let principals = prometheus
        .query(r#"istio_requests_total{reporter="destination", destination_workload="web"}"#)
        .await
        .expect("query");
    assert!(
        principals
            .iter()
            .any(|s| s["metric"]["source_principal"]
                == "spiffe://blue.mesh.local/ns/shop/sa/default"),
        "web's sidecar names client's identity: {principals:?}"
    );

    // Every panel of the workload dashboard has data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            workspace_root().join("config/monitoring/grafana-workload-dashboard.json"),
        )
        .expect("workload dashboard"),
    )
    .expect("dashboard JSON");
    for (title, expr) in dashboard_queries(&dashboard) {
        wait_for(&format!("data for panel {title:?}"), DEADLINE, || async {
            let _ = caller.http_get(&url).await;
            let result = prometheus.query(&expr).await?;
            if result.is_empty() {
                Err(format!("{expr}: no data yet"))
            } else {
                Ok(Some(()))
            }
        })
        .await
        .expect("panel query");
    }
    let namespaces = prometheus
        .get(&format!(
            "/api/v1/label/destination_workload_namespace/values?match[]={}",
            meshplane_e2e::prometheus::encode("istio_requests_total")
        ))
        .await
        .expect("namespace values");
    assert!(
        namespaces
            .as_array()
            .is_some_and(|v| v.contains(&json!("shop"))),
        "the dashboard's namespace variable: {namespaces}"
    );
    drop(prometheus);
    let _ = std::fs::remove_dir_all(&work);

    // Tracing. At 0% (the tracer and the tag are on both sidecars): calls leave no span.
    let receiver_pod = cluster
        .wait_for_ready_pods("shop", "app=otel-collector", 1, DEADLINE)
        .await
        .expect("receiver Ready")[0]
        .clone();
    let receiver = cluster
        .in_pod(
            "shop",
            receiver_pod.metadata.name.as_deref().unwrap_or_default(),
        )
        .expect("receiver pod");
    let server = cluster.in_pod("shop", &web_name).expect("web pod");
    for (name, pod) in [("client", &caller), ("web", &server)] {
        wait_for(
            &format!("the 0% tracer on {name}'s sidecar"),
            DEADLINE,
            || async {
                let dump = pod
                    .envoy_admin("/config_dump?resource=dynamic_listeners")
                    .await
                    .map_err(|e| e.to_string())?;
                (dump.contains("envoy.tracers.opentelemetry") && dump.contains("sampled-0-percent"))
                    .then_some(Some(()))
                    .ok_or_else(|| "not yet".to_owned())
            },
        )
        .await
        .expect("the tracer reaches the sidecar");
    }
    let unsampled = format!("http://web.shop.svc.cluster.local:{WEB_PORT}/trace-probe-unsampled");
    for _ in 0..20 {
        let reply = caller.http_get(&unsampled).await.expect("call");
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    // At 100%: a call leaves the spans of both sidecars. The earlier calls' spans, had there
    // been any, would have been exported before these.
    cluster
        .apply_manifest(&shop_tracing(100))
        .expect("shop's tracing at 100%");
    let sampled = format!("http://web.shop.svc.cluster.local:{WEB_PORT}/trace-probe-sampled");
    let spans = wait_for("spans of client and web", DEADLINE, || async {
        let _ = caller.http_get(&sampled).await;
        let spans = spans_with(&receiver, "trace-probe-sampled").await?;
        let services: Vec<&str> = spans
            .iter()
            .filter_map(|s| s["service_name"].as_str())
            .collect();
        if services.contains(&"client.shop") && services.contains(&"web.shop") {
            Ok(Some(spans.clone()))
        } else {
            Err(format!("services so far: {services:?}"))
        }
    })
    .await
    .expect("spans reach the receiver");
    assert!(
        spans
            .iter()
            .any(|s| s["attributes"]["sampling"] == "sampled-100-percent"),
        "the custom tag: {spans:?}"
    );
    // One trace: web's span continues client's.
    let client_span = spans
        .iter()
        .find(|s| s["service_name"] == "client.shop")
        .expect("client's span");
    assert!(
        spans
            .iter()
            .any(|s| s["service_name"] == "web.shop" && s["trace_id"] == client_span["trace_id"]),
        "one trace: {spans:?}"
    );
    let none = spans_with(&receiver, "trace-probe-unsampled")
        .await
        .expect("spans");
    assert!(none.is_empty(), "spans of calls sampled at 0%: {none:?}");
    eprintln!("telemetry scenario took {:?}", started.elapsed());
}
