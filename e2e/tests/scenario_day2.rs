//! Day-2 operations on one running mesh (two tenants, shop's pods on blue):
//!
//! - `meshctl`, run as the binary with a real kubeconfig, for every subcommand: `version` lists
//!   the revisions; `proxy-status` reads both tenants' instances through the API server's
//!   `pods/proxy` and shows shop's proxies synced on blue; another identity without RBAC is
//!   refused; `tag list|set|remove` show the pods behind a tag, refuse a cross-tenant move with
//!   the operator's message and keep a tag in use; `describe pod` reads the pod's tenant;
//!   `analyze` is clean, then fails on a mislabelled namespace with its code.
//! - monitoring: a real Prometheus (Debian's, `make host-tools`), run on the cluster's node
//!   where pod addresses are reachable, scrapes the instances and the operator; `promtool`
//!   accepts `config/monitoring/prometheusrule.yaml`, Prometheus evaluates every rule without
//!   error, every metric a rule reads has series, every query of the Grafana dashboard returns
//!   data, and its tenant variable lists both tenants; the admission webhooks' metrics count
//!   an injected pod, an admitted and a refused ServiceEntry (dry runs), and the operator's
//!   check of the control planes and tags.

mod monitoring;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use meshplane_e2e::harness::{app_and_client, wait_for, Cluster};
use meshplane_kube_standin::Identity;
use meshplane_pod_runner::{default_bin_dir, locate_binary};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(120);

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn meshctl(kubeconfig: &std::path::Path, args: &[&str]) -> Run {
    let binary: PathBuf = locate_binary(&default_bin_dir(), "meshctl").expect("meshctl is built");
    let out = Command::new(binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("meshctl runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn json(run: &Run) -> Value {
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// An EnvoyFilter the instance admits and Envoy rejects: a negative connect timeout on the
/// proxies' cluster of web.
const NEGATIVE_TIMEOUT_FILTER: &str = r#"apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata: {name: negative-timeout, namespace: shop}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: web.shop.svc.cluster.local}}
    patch: {operation: MERGE, value: {connect_timeout: -1s}}
"#;

/// `meshctl bug-report`: the archive holds what a maintainer asks for, for the mesh as it runs,
/// and no private key or token (the debug token this test holds, any JWT-shaped token).
fn bug_report_collects_without_secrets(kubeconfig: &std::path::Path, pod: &str, token: &str) {
    use std::io::Read as _;
    let archive =
        std::env::temp_dir().join(format!("meshctl-bug-report-{}.tar.gz", std::process::id()));
    let archive_arg = archive.display().to_string();
    let summary = json(&meshctl(
        kubeconfig,
        &[
            "bug-report",
            "--archive",
            &archive_arg,
            "--debug-token",
            token,
            "-o",
            "json",
        ],
    ));
    let mut files = std::collections::BTreeMap::new();
    let mut read = tar::Archive::new(flate2::read::GzDecoder::new(
        std::fs::File::open(&archive).expect("the archive is written"),
    ));
    for entry in read.entries().expect("a tar archive") {
        let mut entry = entry.expect("an entry");
        let path = entry.path().expect("a path").display().to_string();
        let (_, inside) = path.split_once('/').expect("under the report's directory");
        let inside = inside.to_string();
        let mut text = String::new();
        entry.read_to_string(&mut text).expect("text");
        files.insert(inside, text);
    }
    let _ = std::fs::remove_file(&archive);
    assert_eq!(
        summary["errors"],
        serde_json::json!([]),
        "everything is collected"
    );
    let listed: Vec<&str> = summary["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(listed, files.keys().map(String::as_str).collect::<Vec<_>>());
    let (name, namespace) = pod.rsplit_once('.').expect("pod.namespace");
    for expected in [
        "version.json".to_string(),
        "cluster/meshcontrolplanes.yaml".to_string(),
        "cluster/meshrevisiontags.yaml".to_string(),
        "cluster/meshrevisionmigrations.yaml".to_string(),
        "config/objects.yaml".to_string(),
        "analyze.json".to_string(),
        "proxy-status.json".to_string(),
        "errors.txt".to_string(),
        format!("proxies/{namespace}/{name}/config_dump.json"),
        format!("proxies/{namespace}/{name}/stats.txt"),
        format!("proxies/{namespace}/{name}/clusters.json"),
        format!("logs/{namespace}/{name}/meshplane-proxy.log"),
    ] {
        assert!(
            files.contains_key(&expected),
            "{expected} in {:?}",
            files.keys()
        );
    }
    assert!(files["cluster/meshcontrolplanes.yaml"].contains("blue-v1"));
    assert!(
        files["proxy-status.json"].contains(pod),
        "the proxies' sync states: {}",
        files["proxy-status.json"]
    );
    assert!(files[&format!("proxies/{namespace}/{name}/stats.txt")].contains("cluster_manager"));
    let logs = |prefix: &str| {
        files
            .iter()
            .filter(|(p, text)| p.starts_with(prefix) && p.ends_with(".log") && !text.is_empty())
            .count()
    };
    assert!(
        logs("logs/meshplane-system/") > 0,
        "the operator's logs: {:?}",
        files.keys()
    );
    assert!(
        logs("logs/meshplane-blue/") > 0,
        "blue's instance logs: {:?}",
        files.keys()
    );
    for (path, text) in &files {
        assert!(!text.contains("PRIVATE KEY"), "a private key in {path}");
        assert!(!text.contains(token), "the debug token in {path}");
        assert!(!text.contains("eyJhbGci"), "a token in {path}");
    }
}

/// One request to a proxy's Envoy admin, read by the test itself through a kube-rs port-forward
/// (not meshctl's code): the body as text.
async fn envoy_admin(cluster: &Cluster, pod: &str, method: &str, path: &str) -> String {
    use http_body_util::BodyExt;
    let (name, namespace) = pod.rsplit_once('.').expect("pod.namespace");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(cluster.client(), namespace);
    let mut forward = pods
        .portforward(name, &[15000])
        .await
        .expect("port-forward");
    let stream = forward.take_stream(15000).expect("a stream");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP to the admin");
    let connection = tokio::spawn(connection);
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("an answer");
    assert!(
        response.status().is_success(),
        "{method} {path}: {}",
        response.status()
    );
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    connection.abort();
    forward.abort();
    String::from_utf8_lossy(&body).into_owned()
}

/// The names of an array of resources.
fn names(list: &Value) -> Vec<String> {
    let mut out: Vec<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect();
    out.sort();
    out
}

/// The names of the resources of one config-dump section, every state included.
fn dump_names(dump: &Value, type_suffix: &str, lists: &[(&str, &str)]) -> Vec<String> {
    let section = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| {
            c["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with(type_suffix))
        })
        .unwrap_or_else(|| panic!("no {type_suffix} in the dump"));
    let mut out = Vec::new();
    for (list, pointer) in lists {
        for item in section[*list].as_array().into_iter().flatten() {
            if let Some(name) = item.pointer(pointer).and_then(Value::as_str) {
                out.push(name.to_string());
            }
        }
    }
    out.sort();
    out
}

/// `meshctl proxy-config` of each kind on shop's web proxy against that Envoy's own config
/// dump, and `log --level` changing the Envoy's levels.
async fn proxy_config_shows_what_the_envoy_holds(
    cluster: &Cluster,
    kubeconfig: &std::path::Path,
    pod: &str,
) {
    let dump: Value = serde_json::from_str(&envoy_admin(cluster, pod, "GET", "/config_dump").await)
        .expect("a config dump");
    let clusters = json(&meshctl(
        kubeconfig,
        &["proxy-config", "cluster", pod, "-o", "json"],
    ));
    assert_eq!(
        names(&clusters),
        dump_names(
            &dump,
            ".ClustersConfigDump",
            &[
                ("static_clusters", "/cluster/name"),
                ("dynamic_active_clusters", "/cluster/name"),
                ("dynamic_warming_clusters", "/cluster/name")
            ]
        )
    );
    assert!(
        names(&clusters)
            .iter()
            .any(|n| n == "outbound|8080||web.shop.svc.cluster.local"),
        "{clusters}"
    );
    let table = meshctl(
        kubeconfig,
        &[
            "proxy-config",
            "cluster",
            pod,
            "--fqdn",
            "web.shop",
            "--direction",
            "outbound",
        ],
    );
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    let rows: Vec<&str> = table.stdout.lines().skip(1).collect();
    assert!(
        !rows.is_empty()
            && rows
                .iter()
                .all(|r| r.starts_with("web.shop.svc.cluster.local ")),
        "{}",
        table.stdout
    );

    let listeners = json(&meshctl(
        kubeconfig,
        &["proxy-config", "listener", pod, "-o", "json"],
    ));
    let mut held = dump_names(
        &dump,
        ".ListenersConfigDump",
        &[
            ("static_listeners", "/listener/name"),
            ("dynamic_listeners", "/active_state/listener/name"),
            ("dynamic_listeners", "/warming_state/listener/name"),
            ("dynamic_listeners", "/draining_state/listener/name"),
        ],
    );
    held.dedup();
    let mut shown = names(&listeners);
    shown.dedup();
    assert_eq!(shown, held);

    let routes = json(&meshctl(
        kubeconfig,
        &["proxy-config", "route", pod, "-o", "json"],
    ));
    assert_eq!(
        names(&routes),
        dump_names(
            &dump,
            ".RoutesConfigDump",
            &[
                ("static_route_configs", "/route_config/name"),
                ("dynamic_route_configs", "/route_config/name")
            ]
        )
    );

    let secrets = json(&meshctl(
        kubeconfig,
        &["proxy-config", "secret", pod, "-o", "json"],
    ));
    assert_eq!(
        names(&secrets),
        dump_names(
            &dump,
            ".SecretsConfigDump",
            &[
                ("static_secrets", "/secret/name"),
                ("dynamic_active_secrets", "/secret/name"),
                ("dynamic_warming_secrets", "/secret/name")
            ]
        )
    );
    assert!(!secrets.to_string().contains("PRIVATE KEY"), "{secrets}");
    let table = meshctl(kubeconfig, &["proxy-config", "secret", pod]);
    assert!(
        table.stdout.contains("spiffe://") && table.stdout.contains(" true "),
        "the workload certificate is valid now: {}",
        table.stdout
    );

    let endpoints = json(&meshctl(
        kubeconfig,
        &[
            "proxy-config",
            "endpoint",
            pod,
            "--cluster",
            "outbound|8080||web.shop.svc.cluster.local",
            "-o",
            "json",
        ],
    ));
    let healthy = endpoints
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["health_status"]["eds_health_status"] == "HEALTHY")
        .count();
    assert_eq!(healthy, 1, "web's one pod: {endpoints}");

    let bootstrap = json(&meshctl(
        kubeconfig,
        &["proxy-config", "bootstrap", pod, "-o", "json"],
    ));
    let dumped_bootstrap = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| {
            c["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with(".BootstrapConfigDump"))
        })
        .map(|c| c["bootstrap"].clone())
        .expect("the dump's bootstrap");
    assert_eq!(bootstrap, dumped_bootstrap);

    // --diff: what the proxy accepted against what its instance intends, field by field. The
    // loops below poll with one debug token (each meshctl run would otherwise request a new one,
    // and the instance reviews only so many new tokens per caller and minute).
    let token = cluster
        .kubectl(&[
            "create",
            "token",
            "meshplane-debug",
            "-n",
            "meshplane-blue",
            "--audience",
            "meshplane-blue-debug",
        ])
        .expect("a debug token");
    let token = token.trim().to_string();
    let synced = meshctl_until(
        kubeconfig,
        &[
            "proxy-config",
            "all",
            pod,
            "--diff",
            "--debug-token",
            &token,
        ],
        0,
    )
    .await;
    assert!(synced.contains("holds what"), "{synced}");
    // A cluster Envoy rejects: the proxy NACKs and keeps its last good one, which --diff shows.
    cluster
        .apply_manifest(NEGATIVE_TIMEOUT_FILTER)
        .expect("the EnvoyFilter is admitted (only Envoy refuses it)");
    let differs = meshctl_until(
        kubeconfig,
        &[
            "proxy-config",
            "cluster",
            pod,
            "--diff",
            "-o",
            "json",
            "--debug-token",
            &token,
        ],
        3,
    )
    .await;
    let differs: Value = serde_json::from_str(&differs).expect("JSON");
    assert_eq!(
        differs["differences"],
        serde_json::json!([{
            "type": "cds",
            "name": "outbound|8080||web.shop.svc.cluster.local",
            "state": "DIFFERS",
            "fields": ["connect_timeout"],
        }]),
        "{differs}"
    );
    cluster
        .kubectl(&["delete", "envoyfilter", "negative-timeout", "-n", "shop"])
        .expect("the EnvoyFilter is removed");
    // Back in sync once the EnvoyFilter is gone.
    meshctl_until(
        kubeconfig,
        &[
            "proxy-config",
            "cluster",
            pod,
            "--diff",
            "--debug-token",
            &token,
        ],
        0,
    )
    .await;

    bug_report_collects_without_secrets(kubeconfig, pod, &token);

    // log: every logger to debug, seen by the Envoy itself; then back to warning.
    let set = json(&meshctl(
        kubeconfig,
        &["proxy-config", "log", pod, "--level", "debug", "-o", "json"],
    ));
    let levels = |v: &Value| -> Vec<String> {
        v["loggers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["level"].as_str().map(str::to_string))
            .collect()
    };
    assert!(
        !levels(&set).is_empty() && levels(&set).iter().all(|l| l == "debug"),
        "{set}"
    );
    let listed = envoy_admin(cluster, pod, "POST", "/logging").await;
    assert!(
        listed.contains("  http: debug") && !listed.contains(": info"),
        "{listed}"
    );
    let reset = json(&meshctl(
        kubeconfig,
        &["proxy-config", "log", pod, "--reset", "-o", "json"],
    ));
    assert!(levels(&reset).iter().all(|l| l == "warning"), "{reset}");
    let listed = envoy_admin(cluster, pod, "POST", "/logging").await;
    assert!(
        listed.contains("  http: warning") && !listed.contains(": debug"),
        "{listed}"
    );
}

/// Runs meshctl with `args` until it exits with `code` (proxies converge on their own
/// schedule): its standard output then.
async fn meshctl_until(kubeconfig: &std::path::Path, args: &[&str], code: i32) -> String {
    let what = format!("meshctl {} to exit {code}", args.join(" "));
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    wait_for(&what, DEADLINE, || {
        let kubeconfig = kubeconfig.to_path_buf();
        let args = args.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let run = meshctl(&kubeconfig, &args);
            if run.code == Some(code) {
                Ok(Some(run.stdout))
            } else {
                Err(format!("exit {:?}: {}{}", run.code, run.stdout, run.stderr))
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:?}"))
}

/// Where tag `name` points, as kubectl reads it.
fn tag_revision(cluster: &Cluster, name: &str) -> String {
    cluster
        .kubectl(&[
            "get",
            "meshrevisiontag",
            name,
            "-o",
            "jsonpath={.spec.revision}",
        ])
        .unwrap_or_else(|e| panic!("tag {name}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshctl_reads_and_changes_the_mesh_with_the_callers_credentials() {
    let cluster = Cluster::start_two_tenants("meshctl", DEADLINE)
        .await
        .expect("two tenants Ready");
    let kubeconfig = cluster.kubeconfig().to_path_buf();
    cluster
        .apply_manifest(&app_and_client("shop"))
        .expect("workloads");
    for app in ["app=web", "app=client"] {
        cluster
            .wait_for_ready_pods("shop", app, 1, DEADLINE)
            .await
            .expect("shop's pods");
    }

    // version: this client and the revisions the cluster runs.
    let version = json(&meshctl(&kubeconfig, &["version", "-o", "json"]));
    let revisions: Vec<&str> = version["revisions"]
        .as_array()
        .expect("revisions")
        .iter()
        .filter_map(|r| r["revision"].as_str())
        .collect();
    assert_eq!(revisions, ["blue-v1", "green"], "{version}");

    // proxy-status: shop's two proxies, on blue's instance, synced (awaited: the proxies connect
    // and ACK on their own schedule).
    let status = wait_for(
        "shop's proxies SYNCED in meshctl proxy-status",
        DEADLINE,
        || {
            let kubeconfig = kubeconfig.clone();
            async move {
                let run = meshctl(&kubeconfig, &["proxy-status", "-o", "json"]);
                if run.code != Some(0) {
                    return Err(format!("exit {:?}: {}", run.code, run.stderr));
                }
                let v: Value = serde_json::from_str(&run.stdout).map_err(|e| e.to_string())?;
                let proxies = v["proxies"].as_array().cloned().unwrap_or_default();
                let synced = proxies
                    .iter()
                    .filter(|p| p["namespace"] == "shop")
                    .filter(|p| {
                        let state = |t: &str| {
                            p["types"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .find(|x| x["type"] == t)
                                .map(|x| x["state"].clone())
                        };
                        state("cds") == Some(Value::from("SYNCED"))
                            && state("lds") == Some(Value::from("SYNCED"))
                    })
                    .count();
                if synced == 2 {
                    Ok(Some(v))
                } else {
                    Err(run.stdout)
                }
            }
        },
    )
    .await
    .expect("proxy-status");
    assert_eq!(
        status["instances"], 2,
        "blue's and green's instances are read: {status}"
    );
    assert!(status.get("unreachable").is_none(), "{status}");
    for p in status["proxies"].as_array().expect("proxies") {
        assert_eq!(p["tenant"], "blue", "only shop has pods: {p}");
        assert_eq!(p["revision"], "blue-v1", "{p}");
        assert!(
            p["instance"].as_str().is_some_and(
                |i| i.starts_with("meshplane-blue-v1-") && i.ends_with(".meshplane-blue")
            ),
            "{p}"
        );
    }
    let table = meshctl(&kubeconfig, &["proxy-status"]);
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    let header = table.stdout.lines().next().unwrap_or_default();
    for column in [
        "NAME", "TENANT", "REVISION", "INSTANCE", "CDS", "LDS", "EDS", "RDS",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let green = json(&meshctl(
        &kubeconfig,
        &["proxy-status", "--tenant", "green", "-o", "json"],
    ));
    assert_eq!(green["instances"], 1, "{green}");
    assert_eq!(
        green["proxies"].as_array().map(Vec::len),
        Some(0),
        "{green}"
    );

    // Another identity, without RBAC for any of it, is refused by the API server.
    if let Some(standin) = cluster.standin() {
        let stranger = standin
            .kubeconfig(&Identity::ServiceAccount {
                namespace: "shop".into(),
                name: "default".into(),
            })
            .expect("kubeconfig");
        let refused = meshctl(&stranger, &["proxy-status"]);
        assert_eq!(refused.code, Some(1), "{}", refused.stdout);
        assert!(refused.stderr.contains("forbidden"), "{}", refused.stderr);
        // Nor may it reach a proxy's admin (`create pods/portforward`).
        let refused = meshctl(&stranger, &["proxy-config", "cluster", "-n", "shop", "web"]);
        assert_eq!(refused.code, Some(1), "{}", refused.stdout);
        assert!(refused.stderr.contains("portforward"), "{}", refused.stderr);
    }

    let web = status["proxies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str())
        .find(|n| n.starts_with("web-"))
        .expect("shop's web proxy")
        .to_string();
    proxy_config_shows_what_the_envoy_holds(&cluster, &kubeconfig, &web).await;

    // /debug on the instances (contract 12): through pods/proxy, a caller that may reach the
    // pod still needs a token of the control namespace's meshplane-debug ServiceAccount for
    // the tenant's debug audience; metrics stay open. (Above, meshctl requested one itself.)
    let instance_pod = status["proxies"][0]["instance"]
        .as_str()
        .and_then(|i| i.strip_suffix(".meshplane-blue"))
        .expect("blue's instance pod")
        .to_string();
    let raw = |path: &str| {
        format!("/api/v1/namespaces/meshplane-blue/pods/{instance_pod}:15014/proxy{path}")
    };
    let metrics = cluster
        .kubectl(&["get", "--raw", &raw("/metrics")])
        .expect("metrics stay open");
    assert!(metrics.contains("meshplane_xds"), "{metrics}");
    let open = cluster
        .kubectl_output(&["get", "--raw", &raw("/debug/proxies")])
        .expect("kubectl runs");
    assert!(
        !open.success && !open.stdout.contains("shop"),
        "no token, no proxy list: {} {}",
        open.stdout,
        open.stderr
    );
    let unreachable = |run: &Run| -> String {
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let v: Value = serde_json::from_str(&run.stdout).expect("JSON");
        assert_eq!(
            v["proxies"].as_array().map(Vec::len),
            Some(0),
            "nothing read: {v}"
        );
        v["unreachable"][0]["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let wrong = unreachable(&meshctl(
        &kubeconfig,
        &[
            "proxy-status",
            "--tenant",
            "blue",
            "--debug-token",
            "not-a-token",
            "-o",
            "json",
        ],
    ));
    assert!(wrong.contains("401"), "{wrong}");
    // Green's debug token does not open blue's instance.
    let green_token = cluster
        .kubectl(&[
            "create",
            "token",
            "meshplane-debug",
            "-n",
            "meshplane-green",
            "--audience",
            "meshplane-green-debug",
        ])
        .expect("green's debug token");
    let across = unreachable(&meshctl(
        &kubeconfig,
        &[
            "proxy-status",
            "--tenant",
            "blue",
            "--debug-token",
            green_token.trim(),
            "-o",
            "json",
        ],
    ));
    assert!(
        across.contains("401") || across.contains("403"),
        "another tenant's debug token is refused: {across}"
    );

    // tag list: blue-stable points at blue-v1, shop carries it, shop's pods are behind it.
    let tags = json(&meshctl(&kubeconfig, &["tag", "list", "-o", "json"]));
    let stable = tags["tags"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["tag"] == "blue-stable"))
        .cloned()
        .expect("blue-stable listed");
    assert_eq!(stable["revision"], "blue-v1");
    assert_eq!(stable["tenant"], "blue");
    assert_eq!(stable["inUse"], true);
    assert_eq!(stable["namespaces"], serde_json::json!(["shop"]));
    assert_eq!(stable["pods"].as_array().map(Vec::len), Some(2), "{stable}");
    assert!(stable["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|p| p["injectedBy"] == "blue-v1"));

    // tag set: a move to green's revision is refused with the operator's reason; nothing moves.
    let across = meshctl(
        &kubeconfig,
        &[
            "tag",
            "set",
            "blue-stable",
            "--revision",
            "green",
            "--overwrite",
        ],
    );
    assert_eq!(across.code, Some(1));
    assert!(
        across.stderr.contains("a tag never moves across tenants"),
        "{}",
        across.stderr
    );
    assert_eq!(tag_revision(&cluster, "blue-stable"), "blue-v1");
    // Without --overwrite an existing tag is left alone.
    let no_overwrite = meshctl(
        &kubeconfig,
        &["tag", "set", "blue-stable", "--revision", "green"],
    );
    assert_eq!(no_overwrite.code, Some(1));
    assert!(
        no_overwrite.stderr.contains("--overwrite"),
        "{}",
        no_overwrite.stderr
    );

    // tag set creates, tag remove deletes; a tag in use is kept unless forced.
    let created = meshctl(
        &kubeconfig,
        &["tag", "set", "blue-next", "--revision", "blue-v1"],
    );
    assert_eq!(created.code, Some(0), "{}", created.stderr);
    assert!(
        created.stdout.contains("meshrevisiontag/blue-next created"),
        "{}",
        created.stdout
    );
    assert_eq!(tag_revision(&cluster, "blue-next"), "blue-v1");
    let in_use = meshctl(&kubeconfig, &["tag", "remove", "blue-stable"]);
    assert_eq!(in_use.code, Some(1));
    assert!(
        in_use.stderr.contains("namespaces shop are labelled"),
        "{}",
        in_use.stderr
    );
    let removed = meshctl(&kubeconfig, &["tag", "remove", "blue-next"]);
    assert_eq!(removed.code, Some(0), "{}", removed.stderr);
    let gone = cluster
        .kubectl_output(&["get", "meshrevisiontag", "blue-next"])
        .expect("kubectl runs");
    assert!(
        !gone.success && gone.stderr.contains("NotFound"),
        "{}",
        gone.stderr
    );

    // describe pod, against the cluster.
    let web = cluster
        .kubectl(&[
            "get",
            "pods",
            "-n",
            "shop",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ])
        .expect("web's name");
    let described = json(&meshctl(
        &kubeconfig,
        &["describe", "pod", &web, "-n", "shop", "-o", "json"],
    ));
    assert_eq!(described["tenant"], "blue", "{described}");
    assert_eq!(described["revision"], "blue-v1");
    assert_eq!(described["tag"], "blue-stable");
    assert!(
        described["services"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s
                .as_str()
                .is_some_and(|s| s.starts_with("web.shop.svc.cluster.local"))),
        "{described}"
    );

    // analyze: the cluster is consistent (proxies included), then a namespace asks for a
    // revision that does not exist.
    let clean = meshctl(&kubeconfig, &["analyze", "-o", "json"]);
    let report = json(&clean);
    let errors: Vec<&Value> = report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["severity"] == "Error")
        .collect();
    assert!(errors.is_empty(), "{report}");
    assert!(report.get("skipped").is_none(), "every check ran: {report}");
    cluster
        .kubectl(&["create", "namespace", "typo"])
        .expect("namespace");
    cluster
        .kubectl(&["label", "namespace", "typo", "meshplane.io/rev=bleu"])
        .expect("label");
    let failing = meshctl(&kubeconfig, &["analyze"]);
    assert_eq!(
        failing.code,
        Some(3),
        "{}{}",
        failing.stdout,
        failing.stderr
    );
    assert!(
        failing
            .stdout
            .lines()
            .any(|l| l.starts_with("MP0302") && l.contains("Namespace typo")),
        "{}",
        failing.stdout
    );

    // status.connectedProxies across a rollout of blue's instance (contract 3): the old pod's
    // key of the proxies ConfigMap goes with the pod, so the count is shop's 2 proxies on the
    // new pod, never old + new.
    let rollout_started = std::time::Instant::now();
    cluster
        .kubectl(&[
            "rollout",
            "restart",
            "deployment/meshplane-blue-v1",
            "-n",
            "meshplane-blue",
        ])
        .expect("rollout restart");
    let settled = wait_for(
        "blue-v1's count on its new instance pod only",
        DEADLINE,
        || {
            let cluster = &cluster;
            let old = instance_pod.clone();
            async move {
                let pods = cluster
                    .kubectl(&[
                        "get",
                        "pods",
                        "-n",
                        "meshplane-blue",
                        "-l",
                        "app.kubernetes.io/name=meshplane-xds,meshplane.io/revision=blue-v1",
                        "-o",
                        "jsonpath={.items[*].metadata.name}",
                    ])
                    .map_err(|e| e.to_string())?;
                let pods: Vec<&str> = pods.split_whitespace().collect();
                let counts: Value = serde_json::from_str(
                    &cluster
                        .kubectl(&[
                            "get",
                            "configmap",
                            "meshplane-blue-v1-proxies",
                            "-n",
                            "meshplane-blue",
                            "-o",
                            "json",
                        ])
                        .map_err(|e| e.to_string())?,
                )
                .map_err(|e| e.to_string())?;
                let keys: Vec<String> = counts["data"]
                    .as_object()
                    .map(|d| d.keys().cloned().collect())
                    .unwrap_or_default();
                let connected = cluster
                    .kubectl(&[
                        "get",
                        "meshcontrolplane",
                        "blue-v1",
                        "-o",
                        "jsonpath={.status.connectedProxies}",
                    ])
                    .map_err(|e| e.to_string())?;
                let state = format!("pods {pods:?}, keys {keys:?}, connectedProxies {connected}");
                match pods.as_slice() {
                    [new] if *new != old && keys == [new.to_string()] && connected == "2" => {
                        Ok(Some(state))
                    }
                    _ => Err(state),
                }
            }
        },
    )
    .await
    .expect("the count follows the rollout");
    eprintln!(
        "day2: instance rollout settled in {:?}: {settled}",
        rollout_started.elapsed()
    );

    // Monitoring, on the same stack.
    monitoring::check_dashboards_and_alerts(&cluster).await;
}
