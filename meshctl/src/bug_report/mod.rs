//! `meshctl bug-report`: one archive with what a maintainer asks for first, read with the
//! caller's credentials: versions, every MeshControlPlane, tag and migration, the config the
//! mesh reads (Secrets never read), `analyze`'s findings, every instance's view of its proxies,
//! the operator's and instances' logs, and for each proxy (up to `--max-proxies`) its config
//! dump, stats, endpoints and log. Every file passes through [`redact`]; what could not be
//! collected is listed in `errors.txt`, not fatal.

pub mod archive;
pub mod redact;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use kube::Resource;
use meshplane_crds::{MeshControlPlane, MeshRevisionMigration, MeshRevisionTag};
use serde::Serialize;
use serde_json::Value;

use crate::analyze;
use crate::cluster::{self, ClusterArgs, Scope};
use crate::envoy_admin::EnvoyAdmin;
use crate::instances::{self, Instance};
use crate::output::{self, Format, Report};
use crate::proxy_status;
use crate::version::{self, OPERATOR_SELECTOR};
use archive::Archive;

/// The injected proxy's container.
const PROXY_CONTAINER: &str = meshplane_webhooks::inject::PROXY_CONTAINER;

/// `meshctl bug-report`.
#[derive(Debug, Args)]
pub struct BugReportArgs {
    /// Where to write the archive (default `meshplane-bug-report-<unix time>.tar.gz`).
    #[arg(long, value_name = "FILE")]
    pub archive: Option<PathBuf>,
    /// Only this tenant's instances and proxies.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only proxies of these namespaces (repeatable).
    #[arg(short = 'n', long = "namespace")]
    pub namespaces: Vec<String>,
    /// Proxies whose config dump, stats and log are collected, at most.
    #[arg(long, default_value_t = 50)]
    pub max_proxies: usize,
    /// Lines of each container log, from the end.
    #[arg(long, default_value_t = 5000)]
    pub tail: i64,
}

/// What was written.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BugReportSummary {
    pub archive: String,
    pub files: Vec<String>,
    pub errors: Vec<String>,
}

impl Report for BugReportSummary {
    fn human(&self, _wide: bool) -> String {
        let mut out = format!("wrote {} ({} files)\n", self.archive, self.files.len());
        if !self.errors.is_empty() {
            out.push_str(&format!(
                "{} item(s) could not be collected (errors.txt in the archive):\n",
                self.errors.len()
            ));
            for e in &self.errors {
                out.push_str(&format!("  {e}\n"));
            }
        }
        out
    }
}

/// The report being gathered: files, and what failed.
struct Gathered {
    archive: Archive,
    errors: Vec<String>,
}

impl Gathered {
    /// Adds a text file, redacted (left out if redaction is not possible).
    fn text(&mut self, path: String, text: &str) {
        match redact::redact(text) {
            Some(clean) => self.archive.add(path, clean),
            None => self.errors.push(format!(
                "{path}: left out (the redaction patterns did not build)"
            )),
        }
    }

    fn json<T: Serialize>(&mut self, path: &str, value: &T) {
        match serde_json::to_string_pretty(value) {
            Ok(text) => self.text(path.to_string(), &text),
            Err(e) => self.errors.push(format!("{path}: {e}")),
        }
    }

    fn yaml_documents(&mut self, path: &str, documents: &[Value]) {
        let mut text = String::new();
        for doc in documents {
            match serde_saphyr::to_string(doc) {
                Ok(y) => {
                    text.push_str("---\n");
                    text.push_str(&y);
                }
                Err(e) => self.errors.push(format!("{path}: {e}")),
            }
        }
        self.text(path.to_string(), &text);
    }

    fn failed(&mut self, what: &str, error: impl std::fmt::Display) {
        self.errors.push(format!("{what}: {error:#}"));
    }
}

/// An object as YAML wants it: `managedFields` dropped (noise), kind and apiVersion set.
fn document<K: Resource<DynamicType = ()> + Serialize>(object: &K) -> Option<Value> {
    let mut doc = serde_json::to_value(object).ok()?;
    if let Some(fields) = doc.as_object_mut() {
        fields.insert("apiVersion".into(), Value::from(K::api_version(&())));
        fields.insert("kind".into(), Value::from(K::kind(&())));
        if let Some(meta) = fields.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    }
    Some(doc)
}

async fn list_all<K>(client: &kube::Client, gathered: &mut Gathered, path: &str)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            let docs: Vec<Value> = list.items.iter().filter_map(document).collect();
            gathered.yaml_documents(path, &docs);
        }
        Err(e) => gathered.failed(path, e),
    }
}

/// Every container log of `pod` (init containers included), as `logs/<ns>/<pod>/<c>.log`.
async fn pod_logs(client: &kube::Client, pod: &Pod, tail: i64, gathered: &mut Gathered) {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let spec = pod.spec.clone().unwrap_or_default();
    let containers = spec
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .chain(spec.containers)
        .map(|c| c.name);
    for container in containers {
        container_log(&pods, &namespace, &name, &container, tail, gathered).await;
    }
}

async fn container_log(
    pods: &Api<Pod>,
    namespace: &str,
    pod: &str,
    container: &str,
    tail: i64,
    gathered: &mut Gathered,
) {
    let path = format!("logs/{namespace}/{pod}/{container}.log");
    let params = LogParams {
        container: Some(container.to_string()),
        tail_lines: Some(tail),
        ..LogParams::default()
    };
    match pods.logs(pod, &params).await {
        Ok(text) => gathered.text(path, &text),
        Err(e) => gathered.failed(&path, e),
    }
}

/// The operator's pods, wherever it runs.
async fn operator_pods(client: &kube::Client) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::all(client.clone());
    Ok(pods
        .list(&ListParams::default().labels(OPERATOR_SELECTOR))
        .await
        .context("listing the operator's pods")?
        .items)
}

/// One proxy's admin: config dump, stats, endpoints; then its log.
async fn proxy_files(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    tail: i64,
    gathered: &mut Gathered,
) {
    let admin = EnvoyAdmin::new(client.clone(), namespace, pod);
    for (file, path) in [
        ("config_dump.json", "/config_dump"),
        ("stats.txt", "/stats"),
        ("clusters.json", "/clusters?format=json"),
    ] {
        let target = format!("proxies/{namespace}/{pod}/{file}");
        match admin.get(path).await {
            Ok(body) => gathered.text(target, &String::from_utf8_lossy(&body)),
            Err(e) => gathered.failed(&target, e),
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    container_log(&pods, namespace, pod, PROXY_CONTAINER, tail, gathered).await;
}

/// The proxies to look into: connected ones with a pod, in the namespaces asked for.
fn proxies_of<'a>(
    read: &'a [Instance],
    namespaces: &'a [String],
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    read.iter()
        .flat_map(|i| i.proxies.iter())
        .filter(move |p| namespaces.is_empty() || namespaces.contains(&p.namespace))
        .filter_map(|p| Some((p.namespace.as_str(), p.pod_name.as_deref()?)))
}

/// Runs `meshctl bug-report`.
pub async fn run(
    args: &BugReportArgs,
    cluster_args: &ClusterArgs,
    format: Format,
) -> anyhow::Result<()> {
    let client = cluster_args.client().await?;
    let mut g = Gathered {
        archive: Archive::default(),
        errors: Vec::new(),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());

    match version::cluster_report(&client).await {
        Ok(report) => g.json("version.json", &report),
        Err(e) => g.failed("version.json", e),
    }
    list_all::<MeshControlPlane>(&client, &mut g, "cluster/meshcontrolplanes.yaml").await;
    list_all::<MeshRevisionTag>(&client, &mut g, "cluster/meshrevisiontags.yaml").await;
    list_all::<MeshRevisionMigration>(&client, &mut g, "cluster/meshrevisionmigrations.yaml").await;

    // The config the mesh reads (Secrets are never read), and what analyze makes of it.
    let state = cluster::read_state(&client, &Scope::All).await;
    let filter = instances::Filter {
        tenant: args.tenant.clone(),
        debug_token: cluster_args.debug_token.clone(),
        ..instances::Filter::default()
    };
    let read = instances::read(&client, &filter).await;
    match &state {
        Ok(state) => {
            let docs: Vec<Value> = state.entries.iter().map(|e| e.raw.clone()).collect();
            g.yaml_documents("config/objects.yaml", &docs);
            let mut findings = analyze::analyze(state);
            if let Ok(read) = &read {
                findings.extend(analyze::proxies::check(state, read));
            }
            analyze::sort(&mut findings);
            g.json("analyze.json", &findings);
        }
        Err(e) => g.failed("config/objects.yaml and analyze.json", e),
    }

    // Instances: their view of the proxies, their logs, then the proxies themselves.
    let read = match read {
        Ok(read) => read,
        Err(e) => {
            g.failed("proxy-status.json", &e);
            Vec::new()
        }
    };
    // What `meshctl proxy-status -o json` prints: every instance and each proxy's sync state.
    g.json("proxy-status.json", &proxy_status::report(&read, None));
    match operator_pods(&client).await {
        Ok(pods) => {
            for pod in &pods {
                pod_logs(&client, pod, args.tail, &mut g).await;
            }
        }
        Err(e) => g.failed("logs of the operator", e),
    }
    for instance in &read {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &instance.namespace);
        match pods.get(&instance.pod).await {
            Ok(pod) => pod_logs(&client, &pod, args.tail, &mut g).await,
            Err(e) => g.failed(
                &format!("logs of instance {}/{}", instance.namespace, instance.pod),
                e,
            ),
        }
    }
    let proxies: Vec<(String, String)> = proxies_of(&read, &args.namespaces)
        .map(|(ns, pod)| (ns.to_string(), pod.to_string()))
        .collect();
    if proxies.len() > args.max_proxies {
        g.errors.push(format!(
            "{} proxies are connected; the first {} (by namespace and name) are in the report (--max-proxies)",
            proxies.len(),
            args.max_proxies
        ));
    }
    let mut chosen = proxies;
    chosen.sort();
    chosen.truncate(args.max_proxies);
    for (namespace, pod) in &chosen {
        proxy_files(&client, namespace, pod, args.tail, &mut g).await;
    }

    let errors = g.errors.clone();
    g.text("errors.txt".to_string(), &(errors.join("\n") + "\n"));
    let root = format!("meshplane-bug-report-{now}");
    let out = args
        .archive
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{root}.tar.gz")));
    g.archive.write_tar_gz(&root, &out)?;
    let summary = BugReportSummary {
        archive: out.display().to_string(),
        files: g.archive.paths().map(str::to_string).collect(),
        errors,
    };
    output::print(&summary, format)
}
