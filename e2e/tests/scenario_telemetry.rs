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
//! - TCP and size metrics: a call from client to `db` over a `tcp-` Service port gives
//!   `istio_tcp_connections_opened_total`, `istio_tcp_connections_closed_total`,
//!   `istio_tcp_sent_bytes_total` and `istio_tcp_received_bytes_total` from both reporters;
//!   HTTP calls give `istio_request_bytes` and `istio_response_bytes`; a tag override naming
//!   `request.host` labels `istio_requests_total` with the request's host.
//! - Tracing: the revision declares `opentelemetry` providers, a real OTLP receiver
//!   (`e2e/python/otlp_receiver.py`) in a pod of `shop`, over gRPC and over HTTP; a namespace
//!   Telemetry sampling 0% sends it no span for calls from client to web, one sampling 100%
//!   sends it the spans of both sidecars, named `client.shop` and `web.shop`. A request through
//!   the tenant's ingress gateway (traced by the tenant-wide Telemetry, exported over OTLP/HTTP)
//!   leaves the gateway's span in the same trace as web's, with Istio's span tags.
//! - Access log providers: an `envoyFileAccessLog` provider with a text format and an
//!   `envoyOtelAls` provider (the receiver's OTLP logs service) log client's outbound calls that
//!   a CEL filter accepts, and nothing else.

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

/// The port the OTLP receiver answers `GET /spans`, `GET /logs` and OTLP/HTTP on.
const SPANS_PORT: u16 = 9411;

/// Blue's providers and its ingress gateway (a ClusterIP Service, port 80 to the proxy's
/// 8080): OTLP over gRPC and over HTTP to the receiver, its OTLP logs service as an
/// `envoyOtelAls` provider, and a file provider with its own text format.
const BLUE_PATCH: &str = r#"{"spec":{"ingressGateway":{"name":"ingress","service":{"type":"ClusterIP","ports":[{"name":"http","port":80,"targetPort":8080}]}},"meshConfig":{"accessLogging":{"enabled":false,"encoding":"JSON"},"extensionProviders":[{"name":"otel","opentelemetry":{"service":"otel-collector.shop.svc.cluster.local","port":4317}},{"name":"otel-http","opentelemetry":{"service":"shop/otel-collector","port":4318,"http":{"path":"/v1/traces","timeout":"3s"}}},{"name":"als","envoyOtelAls":{"service":"otel-collector.shop.svc.cluster.local","port":4317,"logFormat":{"labels":{"path":"%REQ(:PATH)%","code":"%RESPONSE_CODE%"}}}},{"name":"client-file","envoyFileAccessLog":{"path":"/dev/stdout","logFormat":{"text":"CLIENT-FILE %REQ(:PATH)% %RESPONSE_CODE%"}}}]}}}"#;

/// Client's outbound calls to `/file-probe*` to the file and OpenTelemetry providers.
const CLIENT_LOGS: &str = r#"
apiVersion: telemetry.meshplane.io/v1alpha1
kind: Telemetry
metadata: {name: client-logs, namespace: shop}
spec:
  selector: {matchLabels: {app: client}}
  accessLogging:
    - providers: [{name: client-file}, {name: als}]
      match: {mode: CLIENT}
      filter: {expression: "request.url_path.startsWith('/file-probe')"}
"#;

/// The tenant-wide tracing (the gateway's, as shop's namespace Telemetry overrides it for
/// shop's workloads): every request over OTLP/HTTP.
const MESH_TRACING: &str = r#"
apiVersion: telemetry.meshplane.io/v1alpha1
kind: Telemetry
metadata: {name: mesh, namespace: meshplane-blue}
spec:
  tracing:
    - providers: [{name: otel-http}]
      randomSamplingPercentage: 100
"#;

/// `db`: an echo server behind a `tcp-` Service port, proxied as TCP by both sidecars.
const DB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec:
  selector: {app: db}
  ports: [{name: tcp-db, port: 5432, targetPort: 5432}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: db, namespace: shop}
spec:
  replicas: 1
  selector:
    matchLabels: {app: db}
  template:
    metadata:
      labels: {app: db}
    spec:
      containers:
        - name: db
          image: example.com/echo:1
          ports: [{name: tcp-db, containerPort: 5432}]
"#;

/// The gateway's route for `shop.example.com` to web.
const GATEWAY_ROUTES: &str = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: Gateway
metadata: {name: shop, namespace: meshplane-blue}
spec:
  selector: {meshplane.io/gateway: ingress}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: [shop.example.com]}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: shop-ingress, namespace: meshplane-blue}
spec:
  hosts: [shop.example.com]
  gateways: [shop]
  http: [{route: [{destination: {host: web.shop.svc.cluster.local, port: {number: 8080}}}]}]
"#;

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
  ports: [{{name: grpc-otlp, port: 4317, targetPort: 4317}}, {{name: http-otlp, port: 4318, targetPort: {SPANS_PORT}}}]
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
/// custom tag that shows which of these settings a sidecar has; and a tag override labelling
/// the request count with the request's host.
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
  metrics:
    - overrides:
        - match: {{metric: REQUEST_COUNT}}
          tagOverrides:
            request_host: {{value: request.host}}
"#
    )
}

/// The log records the receiver holds.
async fn received_logs(receiver: &meshplane_e2e::reach::InPod) -> Result<Vec<Value>, String> {
    let reply = receiver
        .http_get_at(
            SocketAddr::from((receiver.ip(), SPANS_PORT)),
            "localhost",
            "/logs",
        )
        .await
        .map_err(|e| e.to_string())?;
    if reply.status != 200 {
        return Err(format!("{reply:?}"));
    }
    let body: Value = serde_json::from_str(&reply.body).map_err(|e| e.to_string())?;
    Ok(body["logs"].as_array().cloned().unwrap_or_default())
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
            BLUE_PATCH,
        ])
        .expect("patch blue's access logging, providers and gateway");
    cluster.apply_manifest(WEB_LOGS).expect("web's Telemetry");
    cluster
        .apply_manifest(CLIENT_LOGS)
        .expect("client's Telemetry");
    cluster
        .apply_manifest(MESH_TRACING)
        .expect("the tenant's tracing");
    cluster.apply_manifest(DB).expect("db");
    cluster
        .apply_manifest(GATEWAY_ROUTES)
        .expect("the gateway's routes");
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
    let db = cluster
        .wait_for_ready_pods("shop", "app=db", 1, DEADLINE)
        .await
        .expect("db Ready")[0]
        .clone();
    let web_name = web.metadata.name.clone().unwrap_or_default();
    let client_name = client.metadata.name.clone().unwrap_or_default();

    // The instance accepts the Telemetries (the tracing one: its provider resolves).
    for (namespace, name) in [
        ("shop", "web-logs"),
        ("shop", "tracing"),
        ("shop", "client-logs"),
        ("meshplane-blue", "mesh"),
    ] {
        wait_for(&format!("{name} Accepted=True"), DEADLINE, || async {
            let out = cluster
                .kubectl(&["get", "telemetry", "-n", namespace, name, "-o", "json"])
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
    let tcp_url = "http://db.shop.svc.cluster.local:5432/tcp-probe";

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
                format!("{}:{STATS_PORT}", ip(&db)),
            ]}],
            "metric_relabel_configs": sidecar_metric_relabelings(),
        }],
    });
    let prometheus = Prometheus::start(node, &config, &work);
    let source = r#"istio_requests_total{reporter="source", source_workload="client", source_workload_namespace="shop", destination_workload="web", destination_workload_namespace="shop", destination_service="web.shop.svc.cluster.local", destination_service_name="web", destination_service_namespace="shop", response_code="200"}"#;
    let destination = r#"istio_requests_total{reporter="destination", destination_workload="web", destination_workload_namespace="shop", destination_service="web.shop.svc.cluster.local", response_code="200"}"#;
    let duration = r#"istio_request_duration_milliseconds_count{reporter="source", source_workload="client", destination_workload="web"}"#;
    // The tag override: the request count labelled with the request's host.
    let host = format!(
        r#"istio_requests_total{{reporter="source", destination_workload="web", request_host="web.shop.svc.cluster.local:{WEB_PORT}"}}"#
    );
    let request_bytes = r#"istio_request_bytes_count{reporter="source", source_workload="client", destination_workload="web"}"#;
    let response_bytes = r#"istio_response_bytes_sum{reporter="destination", destination_workload="web", destination_service="web.shop.svc.cluster.local"}"#;
    // TCP: client's outbound and db's inbound TCP proxies.
    let opened = r#"istio_tcp_connections_opened_total{reporter="source", source_workload="client", source_workload_namespace="shop", destination_workload="db", destination_workload_namespace="shop", destination_service="db.shop.svc.cluster.local", destination_service_name="db", destination_service_namespace="shop"}"#;
    let closed = r#"istio_tcp_connections_closed_total{reporter="destination", destination_workload="db", destination_workload_namespace="shop", destination_service="db.shop.svc.cluster.local", source_principal="spiffe://blue.mesh.local/ns/shop/sa/default"}"#;
    let sent = r#"istio_tcp_sent_bytes_total{reporter="source", source_workload="client", destination_workload="db"}"#;
    let received =
        r#"istio_tcp_received_bytes_total{reporter="destination", destination_workload="db"}"#;
    let opened_at_db =
        r#"istio_tcp_connections_opened_total{reporter="destination", destination_workload="db"}"#;
    for expr in [
        source,
        destination,
        duration,
        &host,
        request_bytes,
        response_bytes,
        opened,
        closed,
        sent,
        received,
        opened_at_db,
    ] {
        let series = wait_for(&format!("series {expr}"), DEADLINE, || async {
            // Keep calling: Envoy writes histograms at its stats flush.
            let _ = caller.http_get(&url).await;
            let _ = caller.http_get(tcp_url).await;
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
    // The two sidecars export independently: wait until both spans of one call are in.
    let spans = wait_for(
        "the spans of client and web in one trace",
        DEADLINE,
        || async {
            let _ = caller.http_get(&sampled).await;
            let spans = spans_with(&receiver, "trace-probe-sampled").await?;
            let traces = |service: &str| -> Vec<Value> {
                spans
                    .iter()
                    .filter(|s| s["service_name"] == service)
                    .map(|s| s["trace_id"].clone())
                    .collect()
            };
            let (client_traces, web_traces) = (traces("client.shop"), traces("web.shop"));
            if client_traces.iter().any(|t| web_traces.contains(t)) {
                Ok(Some(spans.clone()))
            } else {
                Err(format!(
                    "{} spans of client, {} of web, none of one trace yet",
                    client_traces.len(),
                    web_traces.len()
                ))
            }
        },
    )
    .await
    .expect("spans reach the receiver");
    assert!(
        spans
            .iter()
            .any(|s| s["attributes"]["sampling"] == "sampled-100-percent"),
        "the custom tag: {spans:?}"
    );
    let none = spans_with(&receiver, "trace-probe-unsampled")
        .await
        .expect("spans");
    assert!(none.is_empty(), "spans of calls sampled at 0%: {none:?}");

    // The gateway: a request from the node through blue's ingress gateway is traced by the
    // tenant-wide Telemetry (100%, OTLP/HTTP); web's sidecar follows the gateway's decision,
    // so the gateway's span and web's are one trace.
    let node = cluster.on_node().expect("the node");
    let gateway_ip: std::net::Ipv4Addr = cluster
        .kubectl(&[
            "get",
            "service",
            "-n",
            "meshplane-blue",
            "ingress",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .expect("the gateway's Service")
        .trim()
        .parse()
        .expect("a ClusterIP");
    let gateway = SocketAddr::from((gateway_ip, 80));
    let spans = wait_for(
        "the gateway's span and web's in one trace",
        DEADLINE,
        || async {
            let _ = node
                .http_get(gateway, "shop.example.com", "/gateway-trace-probe")
                .await;
            let spans = spans_with(&receiver, "gateway-trace-probe").await?;
            let of = |service: &str| -> Vec<&Value> {
                spans
                    .iter()
                    .filter(|s| s["service_name"] == service)
                    .collect()
            };
            let (gateway_spans, web_spans) = (of("ingress.meshplane-blue"), of("web.shop"));
            let joined = gateway_spans
                .iter()
                .any(|g| web_spans.iter().any(|w| w["trace_id"] == g["trace_id"]));
            if joined {
                Ok(Some(spans.clone()))
            } else {
                Err(format!(
                    "{} spans of the gateway, {} of web, none of one trace yet",
                    gateway_spans.len(),
                    web_spans.len()
                ))
            }
        },
    )
    .await
    .expect("the gateway's span reaches the receiver");
    let gateway_span = spans
        .iter()
        .find(|s| s["service_name"] == "ingress.meshplane-blue")
        .expect("the gateway's span");
    assert_eq!(
        gateway_span["transport"], "http",
        "OTLP/HTTP: {gateway_span}"
    );
    let tags = &gateway_span["attributes"];
    assert_eq!(tags["istio.namespace"], "meshplane-blue", "{gateway_span}");
    assert_eq!(tags["istio.canonical_service"], "ingress", "{gateway_span}");
    assert_eq!(tags["istio.canonical_revision"], "latest", "{gateway_span}");
    assert_eq!(tags["istio.mesh_id"], "blue.mesh.local", "{gateway_span}");
    assert_eq!(tags["istio.cluster_id"], "Kubernetes", "{gateway_span}");
    let web_span = spans
        .iter()
        .find(|s| s["service_name"] == "web.shop")
        .expect("web's span");
    assert_eq!(web_span["transport"], "grpc", "OTLP/gRPC: {web_span}");
    assert_eq!(web_span["attributes"]["istio.canonical_service"], "web");

    // Access log providers: client's outbound calls to /file-probe go to its file provider
    // (its own text format) and to the receiver's OTLP logs service; other calls to neither.
    let file_url = format!("http://web.shop.svc.cluster.local:{WEB_PORT}/file-probe");
    let line = wait_for("client's file provider line", DEADLINE, || async {
        let reply = caller
            .http_get(&file_url)
            .await
            .map_err(|e| e.to_string())?;
        if reply.status != 200 {
            return Err(format!("{reply:?}"));
        }
        let log = cluster
            .kubectl(&["logs", "-n", "shop", &client_name, "-c", "meshplane-proxy"])
            .map_err(|e| e.to_string())?;
        log.lines()
            .find(|l| l.starts_with("CLIENT-FILE /file-probe"))
            .map(|l| Some(l.to_string()))
            .ok_or_else(|| "no line yet".to_string())
    })
    .await
    .expect("the file provider logs");
    assert_eq!(line.trim(), "CLIENT-FILE /file-probe 200");
    let records = wait_for("client's OpenTelemetry log records", DEADLINE, || async {
        let _ = caller.http_get(&file_url).await;
        let records: Vec<Value> = received_logs(&receiver)
            .await?
            .into_iter()
            .filter(|r| r["attributes"]["path"] == "/file-probe")
            .collect();
        if records.is_empty() {
            Err("no record yet".to_string())
        } else {
            Ok(Some(records))
        }
    })
    .await
    .expect("the OpenTelemetry access log provider logs");
    assert_eq!(records[0]["attributes"]["code"], "200", "{records:?}");
    assert!(
        records[0]["body"]
            .as_str()
            .is_some_and(|b| b.contains("\"GET /file-probe HTTP/1.1\" 200")),
        "Istio's default text format as the body: {records:?}"
    );
    let client_log = cluster
        .kubectl(&["logs", "-n", "shop", &client_name, "-c", "meshplane-proxy"])
        .expect("client's sidecar log");
    assert!(
        !client_log.contains("CLIENT-FILE /telemetry-probe"),
        "the CEL filter keeps other calls out"
    );
    let other = received_logs(&receiver).await.expect("log records");
    assert!(
        other
            .iter()
            .all(|r| r["attributes"]["path"] == "/file-probe"),
        "only what the filter accepts: {other:?}"
    );
    eprintln!("telemetry scenario took {:?}", started.elapsed());
}
