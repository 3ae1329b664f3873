//! The monitoring check of the day-2 scenario: a real Prometheus scrapes the running stack and
//! answers every query that `config/monitoring/` ships.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use meshplane_crds::names::ports;
use meshplane_crds::networking::ServiceEntry;
use meshplane_e2e::harness::{container_names, wait_for, Cluster};
use meshplane_e2e::prometheus::{encode, tool, Prometheus};
use meshplane_pod_runner::workspace_root;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(120);
/// The operator's metrics port (`config/manager/deployment.yaml`).
const OPERATOR_METRICS_PORT: u16 = 8080;

/// `podIP:port` of every running pod matching `selector`.
async fn targets(cluster: &Cluster, selector: &str, port: u16) -> Vec<String> {
    let pods: Api<Pod> = Api::all(cluster.client());
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list pods");
    list.items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .map(|ip| format!("{ip}:{port}"))
        .collect()
}

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Metric names an expression reads (identifiers of meshplane's and controller-runtime's
/// families, and `up`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut current = String::new();
    let flush = |current: &mut String, names: &mut BTreeSet<String>| {
        if current.starts_with("meshplane_")
            || current.starts_with("controller_runtime_")
            || current == "up"
        {
            names.insert(std::mem::take(current));
        }
        current.clear();
    };
    let mut in_string = false;
    for c in expr.chars() {
        if c == '"' {
            in_string = !in_string;
            flush(&mut current, &mut names);
            continue;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            current.push(c);
        } else {
            flush(&mut current, &mut names);
        }
    }
    flush(&mut current, &mut names);
    names
}

/// Every dashboard query, with the variables set to "all" and Grafana's interval to 1m.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let expr = expr
                    .replace("$tenant", ".*")
                    .replace("$revision", ".*")
                    .replace("$__rate_interval", "1m");
                out.push((panel["title"].as_str().unwrap_or("?").to_string(), expr));
            }
        }
    }
    out
}

pub async fn check_dashboards_and_alerts(cluster: &Cluster) {
    let Ok(node) = cluster.on_node() else {
        eprintln!("monitoring check skipped: against a real cluster (E2E_KUBECONFIG) the pods' addresses are not reachable from the test");
        return;
    };
    let root = workspace_root();
    let rule_doc = yaml_file(&root.join("config/monitoring/prometheusrule.yaml"));
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("config/monitoring/grafana-dashboard.json"))
            .expect("dashboard"),
    )
    .expect("dashboard JSON");
    let work = std::env::temp_dir().join(format!("meshplane-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");

    // The rule groups as a Prometheus rule file; promtool must accept them.
    let rules_file = write_rule_file(&work);
    let check = Command::new(tool("promtool"))
        .arg("check")
        .arg("rules")
        .arg(&rules_file)
        .output()
        .expect("promtool runs");
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    exercise_webhooks(cluster).await;

    // Scrape every instance and operator pod every second.
    let xds = targets(
        cluster,
        "app.kubernetes.io/name=meshplane-xds",
        ports::HTTP_MONITORING,
    )
    .await;
    let operator = targets(
        cluster,
        "app.kubernetes.io/name=meshplane-operator",
        OPERATOR_METRICS_PORT,
    )
    .await;
    assert_eq!(xds.len(), 2, "blue's and green's instances: {xds:?}");
    assert!(!operator.is_empty(), "the operator's pods");
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [rules_file],
        "scrape_configs": [
            {"job_name": "meshplane-system/meshplane-xds", "static_configs": [{"targets": xds}]},
            {"job_name": "meshplane-system/meshplane-operator", "static_configs": [{"targets": operator}]},
        ],
    });
    // Prometheus runs on the node: it reaches the pods' addresses, and the test reaches it on
    // the node's loopback.
    let prometheus = Prometheus::start(node, &config, &work);

    // Every target up.
    let expected = xds.len() + operator.len();
    wait_for(
        "every meshplane target up in Prometheus",
        DEADLINE,
        || async {
            let up = prometheus.query("up == 1").await?;
            if up.len() == expected {
                Ok(Some(()))
            } else {
                Err(format!("{} of {expected} up: {up:?}", up.len()))
            }
        },
    )
    .await
    .expect("targets up");

    // Every metric a rule reads has series, and every rule evaluates without error.
    let rules: Vec<(String, String)> = rule_doc["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or("?").to_string(),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(rules.len() >= 6, "{rules:?}");
    let mut names = BTreeSet::new();
    for (_, expr) in &rules {
        names.extend(metric_names(expr));
    }
    for (_, expr) in dashboard_queries(&dashboard) {
        names.extend(metric_names(&expr));
    }
    // The CA's expiry exists only on instances that serve TLS with a tenant CA
    // (`--xds-tls-addr`); on instances without one its alerts are proven by `promtool test
    // rules` (alerts_fire_on_the_series_they_are_written_for) instead, and its panel is not
    // asked for data.
    let with_ca = instances_serve_tls(cluster).await;
    if !with_ca {
        names.remove(CA_EXPIRY);
    }
    for name in &names {
        let series = prometheus
            .get(&format!("/api/v1/series?match[]={}", encode(name)))
            .await
            .expect("series");
        assert!(
            series.as_array().is_some_and(|s| !s.is_empty()),
            "no series of {name}, which the dashboard or a rule reads"
        );
    }
    let expected_rules = rules.len();
    wait_for("every rule evaluated without error", DEADLINE, || async {
        let data = prometheus.get("/api/v1/rules").await?;
        let rules: Vec<Value> = data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let bad: Vec<String> = rules
            .iter()
            .filter(|r| r["health"] != "ok")
            .map(|r| format!("{}: {} {}", r["name"], r["health"], r["lastError"]))
            .collect();
        if rules.len() == expected_rules && bad.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("{} rules loaded, not ok: {bad:?}", rules.len()))
        }
    })
    .await
    .expect("rules healthy");

    // Every dashboard query returns data (rates need two scrapes in their window: awaited).
    for (title, expr) in dashboard_queries(&dashboard) {
        if !with_ca && metric_names(&expr).contains(CA_EXPIRY) {
            continue;
        }
        wait_for(&format!("data for panel {title:?}"), DEADLINE, || async {
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
    let tenants = prometheus
        .get(&format!(
            "/api/v1/label/tenant/values?match[]={}",
            encode("meshplane_xds_build_info")
        ))
        .await
        .expect("tenant values");
    assert_eq!(
        tenants,
        serde_json::json!(["blue", "green"]),
        "the dashboard's tenant variable"
    );
    // Shop's two proxies are on blue, none on green, as the instances' gauges say.
    let connected = by_tenant(&prometheus, "meshplane_xds_connected_proxies").await;
    assert_eq!(connected.get("blue"), Some(&2.0), "{connected:?}");
    // The push loop's own measures saw the mesh come up: shop's pods and their EndpointSlices
    // triggered pushes on blue, batches waited in the debouncer, and each proxy's first
    // config was timed from its connection.
    let triggers = by_tenant(
        &prometheus,
        r#"meshplane_xds_push_triggers_total{reason="endpointslice"}"#,
    )
    .await;
    assert!(triggers.get("blue") >= Some(&1.0), "{triggers:?}");
    let debounced = by_tenant(&prometheus, "meshplane_xds_push_debounce_seconds_count").await;
    assert!(debounced.get("blue") >= Some(&1.0), "{debounced:?}");
    let queued = by_tenant(&prometheus, "meshplane_xds_proxy_queue_seconds_count").await;
    assert!(queued.get("blue") >= Some(&2.0), "{queued:?}");
    // The admission webhooks counted the dry runs above: blue's injector put the sidecar into
    // the pod and timed its answer, blue's validating webhook admitted one ServiceEntry and
    // refused the other for its foreign namespace.
    for (selector, at_least) in [
        ("meshplane_xds_sidecar_injections_total", 1.0),
        (
            r#"meshplane_xds_webhook_requests_total{webhook="inject",outcome="allowed"}"#,
            1.0,
        ),
        (
            r#"meshplane_xds_webhook_duration_seconds_count{webhook="inject"}"#,
            1.0,
        ),
        (
            r#"meshplane_xds_webhook_requests_total{webhook="validate",outcome="allowed"}"#,
            1.0,
        ),
        (
            r#"meshplane_xds_webhook_denials_total{webhook="validate",reason="foreign_namespace"}"#,
            1.0,
        ),
    ] {
        let counted = by_tenant(&prometheus, selector).await;
        assert!(
            counted.get("blue") >= Some(&at_least),
            "{selector}: {counted:?}"
        );
    }
    // The operator's check admitted the scenario's control planes and tags, and timed them.
    for selector in [
        r#"meshplane_operator_webhook_requests_total{webhook="validate-meshplane",outcome="allowed"}"#,
        r#"meshplane_operator_webhook_duration_seconds_count{webhook="validate-meshplane"}"#,
    ] {
        let result = prometheus
            .query(&format!("sum({selector})"))
            .await
            .expect("query");
        let counted: f64 = result
            .first()
            .and_then(|s| s["value"][1].as_str()?.parse().ok())
            .unwrap_or_default();
        assert!(counted >= 1.0, "{selector}: {result:?}");
    }
    drop(prometheus);
    let _ = std::fs::remove_dir_all(&work);
}

/// Admission through the webhooks of the instances as they run now (a rollout earlier in the
/// scenario restarted blue's counters), as dry runs: nothing is stored or started. A pod in shop
/// is injected; a ServiceEntry is admitted, one exported to a namespace outside the tenant is
/// refused.
async fn exercise_webhooks(cluster: &Cluster) {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "shop");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "admission-check", "labels": {"app": "admission-check"}},
        "spec": {"containers": [{"name": "app", "image": "example.com/echo:1"}]}
    }))
    .expect("a pod");
    let created = pods.create(&dry_run, &pod).await.expect("the dry run");
    assert!(
        container_names(&created)
            .iter()
            .any(|c| c == "meshplane-proxy"),
        "injected: {:?}",
        container_names(&created)
    );
    let entries: Api<ServiceEntry> = Api::namespaced(cluster.client(), "shop");
    let entry = |name: &str, export_to: &str| -> ServiceEntry {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "ServiceEntry",
            "metadata": {"name": name},
            "spec": {"hosts": [format!("{name}.example.com")],
                     "ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
                     "resolution": "DNS", "exportTo": [export_to]}
        }))
        .expect("a ServiceEntry")
    };
    entries
        .create(&dry_run, &entry("admitted", "."))
        .await
        .expect("a ServiceEntry of the tenant is admitted");
    let refused = entries
        .create(&dry_run, &entry("refused", "elsewhere"))
        .await
        .expect_err("a ServiceEntry exported outside the tenant is refused");
    assert!(
        refused.to_string().contains("is not a member of tenant"),
        "{refused}"
    );
}

/// The CA expiry metric (absent on instances without a tenant CA).
const CA_EXPIRY: &str = "meshplane_xds_ca_expiry_timestamp_seconds";

/// Whether the instances run with a tenant CA (the TLS port for ADS and certificates).
async fn instances_serve_tls(cluster: &Cluster) -> bool {
    let pods: Api<Pod> = Api::all(cluster.client());
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=meshplane-xds"))
        .await
        .expect("list pods");
    list.items.iter().any(|p| {
        p.spec.iter().flat_map(|s| &s.containers).any(|c| {
            c.args
                .iter()
                .flatten()
                .any(|a| a.starts_with("--xds-tls-addr"))
        })
    })
}

/// `sum by (tenant) (<selector>)`, by tenant.
async fn by_tenant(prometheus: &Prometheus, selector: &str) -> BTreeMap<String, f64> {
    let expr = format!("sum by (tenant) ({selector})");
    let result = prometheus.query(&expr).await.expect("query");
    result
        .iter()
        .filter_map(|s| {
            let tenant = s["metric"]["tenant"].as_str()?.to_string();
            let value = s["value"][1].as_str()?.parse().ok()?;
            Some((tenant, value))
        })
        .collect()
}

/// Writes the PrometheusRule's groups as a Prometheus rule file `rules.json` into `dir`.
fn write_rule_file(dir: &Path) -> PathBuf {
    let rule_doc = yaml_file(&workspace_root().join("config/monitoring/prometheusrule.yaml"));
    let rules_file = dir.join("rules.json");
    std::fs::write(
        &rules_file,
        serde_json::to_string(&rule_doc["spec"]).expect("rules"),
    )
    .expect("write rules");
    rules_file
}

/// promtool's rule unit tests (`alerts_test.yaml`): each alert fires on the synthetic series
/// it is written for, with its labels and annotations, and stays quiet on the others; the
/// certificate-expiry alerts among them, whose series the e2e stack has only with a tenant CA.
#[test]
fn alerts_fire_on_the_series_they_are_written_for() {
    let dir = std::env::temp_dir().join(format!(
        "meshplane-promtool-{}-{}",
        std::process::id(),
        line!()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work dir");
    write_rule_file(&dir);
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/monitoring/alerts_test.yaml"),
        dir.join("alerts_test.yaml"),
    )
    .expect("copy the rule tests");
    let run = Command::new(tool("promtool"))
        .args(["test", "rules", "alerts_test.yaml"])
        .current_dir(&dir)
        .output()
        .expect("promtool runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        run.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn metric_names_are_found_outside_strings_only() {
    let names = metric_names(
        r#"sum by (tenant) (rate(meshplane_xds_nacks_total{job=~"meshplane_x.*"}[5m])) > up"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["meshplane_xds_nacks_total", "up"]
    );
}
