//! `meshctl describe pod`: a pod's tenant and revision, the Sidecar, EnvoyFilters and Services
//! that shape its proxy, the routes it receives, and what `analyze` says about it. Against a
//! cluster (its tenant's namespaces only) or a directory of manifests.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use meshplane_crds::networking::CaptureMode;
use meshplane_xds_core::envoyfilter;
use meshplane_xds_core::model::{type_url, Resource};
use meshplane_xds_core::translate::{protojson, registry::ServiceSource, scope};
use serde::Serialize;
use serde_json::Value;

use crate::analyze::{self, Finding};
use crate::cluster::{self, ClusterArgs};
use crate::output::{self, Format, Report};
use crate::render::{self, Workload};
use crate::state::MeshState;

/// `meshctl describe`.
#[derive(Debug, Subcommand)]
pub enum DescribeCommand {
    /// A pod: its tenant, revision, Sidecar, EnvoyFilters, routes and findings.
    Pod(DescribePodArgs),
}

/// `meshctl describe pod`.
#[derive(Debug, Args)]
pub struct DescribePodArgs {
    /// The pod (`name`, with -n, or `namespace/name`).
    pub pod: String,
    /// Its namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Read a directory of manifests instead of the cluster.
    #[arg(short = 'f', long = "filename", value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// One route of a route configuration.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteOut {
    /// Route configuration (the listener port or name).
    pub route_config: String,
    pub virtual_host: String,
    pub domains: Vec<String>,
    /// `match → destination` lines.
    pub routes: Vec<String>,
}

/// What `meshctl describe pod` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    pub pod: String,
    pub tenant: String,
    /// The revision programming its proxy.
    pub revision: String,
    /// The revision its namespace is attached to (new pods get it).
    pub namespace_revision: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected_by: Option<String>,
    pub node_id: String,
    pub capture: String,
    /// `namespace/name (why)`, or none: every host of the tenant is imported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<String>,
    pub egress: Vec<String>,
    pub outbound_traffic_policy: String,
    pub envoy_filters: Vec<String>,
    /// Services selecting the pod (its inbound side).
    pub services: Vec<String>,
    pub routes: Vec<RouteOut>,
    pub clusters: usize,
    pub listeners: usize,
    pub config_bytes: usize,
    pub findings: Vec<Finding>,
}

impl Report for PodReport {
    fn human(&self, _wide: bool) -> String {
        let mut o = String::new();
        let none = |v: &[String]| {
            if v.is_empty() {
                vec!["<none>".to_string()]
            } else {
                v.to_vec()
            }
        };
        let _ = writeln!(o, "Pod:              {}", self.pod);
        let _ = writeln!(o, "Tenant:           {}", self.tenant);
        let _ = writeln!(o, "Revision:         {}", self.revision);
        let ns_rev = match &self.tag {
            Some(tag) => format!("{} (through tag {tag})", self.namespace_revision),
            None => self.namespace_revision.clone(),
        };
        let _ = writeln!(o, "Namespace joins:  {ns_rev}");
        let _ = writeln!(
            o,
            "Injected by:      {}",
            self.injected_by.as_deref().unwrap_or("<not injected>")
        );
        let _ = writeln!(o, "Proxy node:       {}", self.node_id);
        let _ = writeln!(o, "Capture:          {}", self.capture);
        let _ = writeln!(
            o,
            "Sidecar:          {}",
            self.sidecar
                .as_deref()
                .unwrap_or("<none> (imports every host of the tenant)")
        );
        for e in &self.egress {
            let _ = writeln!(o, "  egress          {e}");
        }
        let _ = writeln!(o, "Outbound policy:  {}", self.outbound_traffic_policy);
        let _ = writeln!(o, "EnvoyFilters:");
        for f in none(&self.envoy_filters) {
            let _ = writeln!(o, "  {f}");
        }
        let _ = writeln!(o, "Services (inbound):");
        for s in none(&self.services) {
            let _ = writeln!(o, "  {s}");
        }
        let _ = writeln!(o, "Routes:");
        if self.routes.is_empty() {
            let _ = writeln!(o, "  <none>");
        }
        for r in &self.routes {
            let _ = writeln!(
                o,
                "  {} / {} [{}]",
                r.route_config,
                r.virtual_host,
                r.domains.join(", ")
            );
            for line in &r.routes {
                let _ = writeln!(o, "    {line}");
            }
        }
        let _ = writeln!(
            o,
            "Configuration:    {} clusters, {} listeners, {} bytes",
            self.clusters, self.listeners, self.config_bytes
        );
        let _ = writeln!(o, "Findings:");
        if self.findings.is_empty() {
            let _ = writeln!(o, "  <none>");
        }
        for f in &self.findings {
            let _ = writeln!(o, "  {} {} {}", f.code, f.severity.as_str(), f.message);
        }
        o
    }
}

/// `prefix /x → cluster` lines of one route in proto-JSON.
fn route_line(route: &Value) -> String {
    let m = route.get("match");
    let matcher = ["prefix", "path", "safeRegex"]
        .iter()
        .find_map(|k| {
            m.and_then(|m| m.get(*k)).map(|v| {
                let v = v.get("regex").unwrap_or(v);
                format!("{k} {}", v.as_str().unwrap_or_default())
            })
        })
        .unwrap_or_else(|| "any".to_string());
    let action = route.get("route");
    let dest = if let Some(c) = action
        .and_then(|a| a.get("cluster"))
        .and_then(Value::as_str)
    {
        c.to_string()
    } else if let Some(wc) = action
        .and_then(|a| a.pointer("/weightedClusters/clusters"))
        .and_then(Value::as_array)
    {
        wc.iter()
            .map(|c| {
                format!(
                    "{} ({})",
                    c.get("name").and_then(Value::as_str).unwrap_or_default(),
                    c.get("weight").map(ToString::to_string).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    } else if route.get("directResponse").is_some() {
        "direct response".to_string()
    } else if route.get("redirect").is_some() {
        "redirect".to_string()
    } else {
        "-".to_string()
    };
    format!("{matcher} → {dest}")
}

fn routes_of(resources: &[std::sync::Arc<Resource>]) -> anyhow::Result<Vec<RouteOut>> {
    let mut out = Vec::new();
    for r in resources {
        let json = protojson::to_json(protojson::type_name_of(type_url::ROUTE), &r.encoded)
            .with_context(|| format!("decoding route configuration {}", r.name))?;
        for vh in json
            .get("virtualHosts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.push(RouteOut {
                route_config: r.name.clone(),
                virtual_host: vh
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                domains: vh
                    .get("domains")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d.as_str().map(str::to_string))
                    .collect(),
                routes: vh
                    .get("routes")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(route_line)
                    .collect(),
            });
        }
    }
    Ok(out)
}

/// Builds the report for pod `namespace/name` of `state`.
pub fn describe_pod(state: &MeshState, namespace: &str, name: &str) -> anyhow::Result<PodReport> {
    let pod = state
        .pod(namespace, name)
        .with_context(|| format!("pod {namespace}/{name} not found"))?;
    let workload = Workload::from_pod(pod);
    let membership = state.membership();
    let rendered = render::render(state, &membership, &workload)?;
    let registry = rendered.index.registry();
    let node = &rendered.node;
    let proxy_scope = scope::proxy_scope(registry, &node.namespace, &node.labels);
    let sidecar = proxy_scope.sidecar.as_ref().map(|(ns, n)| {
        let selected = registry
            .sidecars
            .get(ns)
            .into_iter()
            .flatten()
            .find(|s| s.metadata.name.as_deref() == Some(n))
            .is_some_and(|s| s.spec.workload_selector.is_some());
        let why = if selected {
            "selects the pod by workloadSelector"
        } else if *ns == registry.control_namespace {
            "the tenant's default, in its control namespace"
        } else {
            "the namespace's default"
        };
        format!("{ns}/{n} ({why})")
    });
    let egress = proxy_scope
        .egress
        .iter()
        .map(|e| {
            let port = e
                .port
                .as_ref()
                .map(|p| format!("port {}", p.number))
                .unwrap_or_else(|| "every port".to_string());
            let hosts: Vec<String> = e.hosts.iter().map(|(ns, h)| format!("{ns}/{h}")).collect();
            format!("{port}: {}", hosts.join(", "))
        })
        .collect();
    let envoy_filters = envoyfilter::applicable(registry, node)
        .into_iter()
        .map(|f| {
            let id = envoyfilter::filter_id(f);
            let scope =
                if f.metadata.namespace.as_deref() == Some(registry.control_namespace.as_str()) {
                    "tenant-wide"
                } else if f.spec.workload_selector.is_some() {
                    "selects the pod"
                } else {
                    "namespace-wide"
                };
            let failed = rendered
                .patch_errors
                .iter()
                .filter(|e| e.filter == id)
                .count();
            if failed > 0 {
                format!("{id} ({scope}; {failed} patches not applied)")
            } else {
                format!("{id} ({scope})")
            }
        })
        .collect();
    let services = registry
        .services
        .iter()
        .filter(|s| s.namespace == node.namespace)
        .filter(|s| match &s.source {
            ServiceSource::Kubernetes { selector } => {
                !selector.is_empty() && selector.iter().all(|(k, v)| node.labels.get(k) == Some(v))
            }
            ServiceSource::Entry {
                workload_selector: Some(sel),
                ..
            } => sel.iter().all(|(k, v)| node.labels.get(k) == Some(v)),
            ServiceSource::Entry { .. } => false,
        })
        .map(|s| {
            let ports: Vec<String> = s
                .ports
                .iter()
                .map(|p| format!("{} {}", p.name, p.port))
                .collect();
            format!("{} ({})", s.hostname, ports.join(", "))
        })
        .collect();
    let findings: Vec<Finding> = analyze::analyze(state)
        .into_iter()
        .filter(|f| f.object == format!("Pod {namespace}/{name}"))
        .collect();
    let config = &rendered.config;
    let bytes = [
        &config.clusters,
        &config.endpoints,
        &config.listeners,
        &config.routes,
    ]
    .iter()
    .flat_map(|l| l.iter())
    .map(|r| r.encoded.len())
    .sum();
    Ok(PodReport {
        pod: format!("{namespace}/{name}"),
        tenant: rendered.serving.placement.tenant.clone(),
        revision: rendered.serving.revision.clone(),
        namespace_revision: rendered.serving.placement.revision.clone(),
        tag: rendered.serving.placement.tag.clone(),
        injected_by: workload.injected_by.clone(),
        node_id: node.id.clone(),
        capture: match node.capture_mode {
            CaptureMode::None => "NONE (bound listeners)".to_string(),
            _ => "iptables (transparent)".to_string(),
        },
        sidecar,
        egress,
        outbound_traffic_policy: format!("{:?}", proxy_scope.outbound_policy),
        envoy_filters,
        services,
        routes: routes_of(&config.routes)?,
        clusters: config.clusters.len(),
        listeners: config.listeners.len(),
        config_bytes: bytes,
        findings,
    })
}

/// Runs `meshctl describe`.
pub async fn run(
    command: &DescribeCommand,
    cluster: &ClusterArgs,
    format: Format,
) -> anyhow::Result<()> {
    match command {
        DescribeCommand::Pod(args) => {
            let (namespace, name) = match args.pod.split_once('/') {
                Some((ns, n)) => (ns.to_string(), n.to_string()),
                None => (args.namespace.clone(), args.pod.clone()),
            };
            let state = match &args.dir {
                Some(dir) => MeshState::from_dir(dir)?,
                None => {
                    let client = cluster.client().await?;
                    cluster::read_tenant_of(&client, &namespace).await?
                }
            };
            output::print(&describe_pod(&state, &namespace, &name)?, format)
        }
    }
}
