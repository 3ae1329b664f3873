//! The corpus of Istio-shaped manifests (`e2e/corpus/`, see its README): blue-v1 takes the
//! extension providers of `providers.yaml`; every file, with only `apiVersion` changed from
//! Istio's, is applied through the real kubectl against tenant blue's validating webhook, is
//! admitted (with a warning exactly when it uses a deprecated field), and reaches
//! `Accepted=True`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use meshplane_e2e::harness::{wait_for, Cluster};
use meshplane_pod_runner::workspace_root;

const DEADLINE: Duration = Duration::from_secs(120);
/// The member namespace the corpus is applied in (files leave `metadata.namespace` out).
const NAMESPACE: &str = "bookinfo";
/// Where the corpus lives, relative to the workspace.
const CORPUS: &str = "e2e/corpus";

/// One object of the corpus.
#[derive(Debug, Clone)]
struct Entry {
    /// The file, relative to the workspace.
    file: PathBuf,
    /// API group and kind, from the file's `apiVersion` and `kind`.
    group: String,
    kind: String,
    name: String,
    namespace: String,
}

impl Entry {
    /// `<plural>.<group>`, as kubectl takes it.
    fn resource(&self) -> String {
        format!("{}.{}", plural(&self.kind), self.group)
    }

    fn label(&self) -> String {
        format!(
            "{} {}/{} ({})",
            self.kind,
            self.namespace,
            self.name,
            self.file.display()
        )
    }
}

/// The plural of a kind name, as the API names resources.
fn plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    match lower.strip_suffix('y') {
        Some(stem) if !stem.ends_with(['a', 'e', 'i', 'o', 'u']) => format!("{stem}ies"),
        _ => format!("{lower}s"),
    }
}

/// Every corpus file (each kind's directory, sorted), read into entries.
fn corpus() -> Vec<Entry> {
    let root = workspace_root().join(CORPUS);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut entries = Vec::new();
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for path in files {
            entries.push(entry(&root, &path));
        }
    }
    entries
}

fn entry(root: &Path, path: &Path) -> Entry {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let object: serde_json::Value = serde_saphyr::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: one YAML object per file: {e}", path.display()));
    let text_of = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("{}: no {pointer}", path.display()))
    };
    let api_version = text_of("/apiVersion");
    let (group, _) = api_version.split_once('/').unwrap_or_else(|| {
        panic!(
            "{}: apiVersion {api_version:?} has no group",
            path.display()
        )
    });
    let relative = path.strip_prefix(root).unwrap_or(path);
    Entry {
        file: Path::new(CORPUS).join(relative),
        group: group.to_string(),
        kind: text_of("/kind"),
        name: text_of("/metadata/name"),
        namespace: object
            .pointer("/metadata/namespace")
            .and_then(|v| v.as_str())
            .unwrap_or(NAMESPACE)
            .to_string(),
    }
}

/// The `Warning:` lines kubectl printed.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("Warning:"))
        .collect()
}

#[test]
fn plurals_follow_the_api_names() {
    assert_eq!(plural("VirtualService"), "virtualservices");
    assert_eq!(plural("Gateway"), "gateways");
    assert_eq!(plural("AuthorizationPolicy"), "authorizationpolicies");
    assert_eq!(plural("ServiceEntry"), "serviceentries");
    assert_eq!(plural("Telemetry"), "telemetries");
}

#[test]
fn every_corpus_file_is_one_namespaced_config_object() {
    let entries = corpus();
    assert!(entries.len() > 40, "{} files", entries.len());
    for e in &entries {
        assert!(
            e.group.ends_with(".meshplane.io"),
            "{}: only apiVersion changes from Istio's, to meshplane's groups",
            e.label()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_istio_field_form_of_the_corpus_is_admitted_and_accepted() {
    let started = Instant::now();
    let cluster = Cluster::start("corpus").await.expect("cluster");
    cluster
        .install_operator()
        .await
        .expect("operator installed");
    cluster
        .kubectl(&["apply", "--server-side", "-f", "config/samples/blue.yaml"])
        .expect("blue");
    cluster
        .kubectl(&["create", "namespace", NAMESPACE])
        .expect("namespace");
    cluster
        .kubectl(&[
            "label",
            "namespace",
            NAMESPACE,
            "meshplane.io/rev=blue-stable",
        ])
        .expect("join blue");
    cluster
        .wait_for_mcp_ready("blue-v1", DEADLINE)
        .await
        .expect("blue-v1 Ready");
    // The webhook answers for the namespace once the instance knows it as a member: a dry run
    // naming one of its services is admitted then.
    let probe = format!(
        "apiVersion: networking.meshplane.io/v1alpha1\nkind: VirtualService\nmetadata: {{name: probe, namespace: {NAMESPACE}}}\nspec:\n  hosts: [probe.example.com]\n  http: [{{route: [{{destination: {{host: reviews.{NAMESPACE}.svc.cluster.local}}}}]}}]\n"
    );
    wait_for("the webhook to know the namespace", DEADLINE, || async {
        let path = std::env::temp_dir().join(format!("corpus-probe-{}.yaml", std::process::id()));
        std::fs::write(&path, &probe).map_err(|e| e.to_string())?;
        let path = path.display().to_string();
        let out = cluster
            .kubectl_output(&["apply", "--server-side", "--dry-run=server", "-f", &path])
            .map_err(|e| e.to_string())?;
        if out.success {
            Ok(Some(()))
        } else {
            Err(out.stderr)
        }
    })
    .await
    .expect("webhook ready for the namespace");
    cluster
        .kubectl(&[
            "apply",
            "--server-side",
            "-n",
            NAMESPACE,
            "-f",
            &format!("{CORPUS}/setup.yaml"),
        ])
        .expect("the corpus's Services and subsets");
    // The extension providers the Telemetries name, in Istio's shapes, admitted on blue-v1.
    cluster
        .kubectl(&[
            "patch",
            "meshcontrolplane",
            "blue-v1",
            "--type",
            "merge",
            "--patch-file",
            &format!("{CORPUS}/providers.yaml"),
        ])
        .expect("blue's extension providers are admitted");

    let entries = corpus();
    let mut refused = Vec::new();
    let mut warned_wrongly = Vec::new();
    for e in &entries {
        let file = e.file.display().to_string();
        let out = cluster
            .kubectl_output(&["apply", "--server-side", "-n", &e.namespace, "-f", &file])
            .expect("kubectl runs");
        if !out.success {
            refused.push(format!("{}: {}", e.label(), out.stderr.trim()));
            continue;
        }
        let deprecated = file.contains("deprecated");
        let warned = warnings(&out.stderr);
        if deprecated == warned.is_empty() {
            warned_wrongly.push(format!(
                "{}: {} (expected {})",
                e.label(),
                if warned.is_empty() {
                    "no warning".to_string()
                } else {
                    warned.join(" | ")
                },
                if deprecated {
                    "a deprecation warning"
                } else {
                    "none"
                }
            ));
        }
    }
    assert!(
        refused.is_empty(),
        "{} of {} corpus objects refused:\n{}",
        refused.len(),
        entries.len(),
        refused.join("\n")
    );
    assert!(
        warned_wrongly.is_empty(),
        "warnings:\n{}",
        warned_wrongly.join("\n")
    );

    // Every object Accepted=True: read each kind once per poll.
    let mut by_resource: BTreeMap<(String, String), Vec<&Entry>> = BTreeMap::new();
    for e in &entries {
        by_resource
            .entry((e.resource(), e.namespace.clone()))
            .or_default()
            .push(e);
    }
    wait_for("every corpus object to be Accepted", DEADLINE, || async {
        let mut pending = Vec::new();
        for ((resource, namespace), wanted) in &by_resource {
            let list = cluster
                .kubectl(&["get", resource, "-n", namespace, "-o", "json"])
                .map_err(|e| e.to_string())?;
            let list: serde_json::Value = serde_json::from_str(&list).map_err(|e| e.to_string())?;
            let accepted: BTreeMap<String, serde_json::Value> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| {
                    let name = o["metadata"]["name"].as_str()?.to_string();
                    let condition = o["status"]["conditions"]
                        .as_array()?
                        .iter()
                        .find(|c| c["type"] == "Accepted")?
                        .clone();
                    Some((name, condition))
                })
                .collect();
            for e in wanted {
                match accepted.get(&e.name) {
                    Some(c) if c["status"] == "True" => {}
                    Some(c) => pending.push(format!(
                        "{}: {} {}: {}",
                        e.label(),
                        c["status"].as_str().unwrap_or_default(),
                        c["reason"].as_str().unwrap_or_default(),
                        c["message"].as_str().unwrap_or_default()
                    )),
                    None => pending.push(format!("{}: no Accepted condition yet", e.label())),
                }
            }
        }
        if pending.is_empty() {
            Ok(Some(()))
        } else {
            Err(pending.join("\n"))
        }
    })
    .await
    .expect("every corpus object Accepted=True");
    eprintln!(
        "corpus: {} objects admitted and accepted in {:?}",
        entries.len(),
        started.elapsed()
    );
}
