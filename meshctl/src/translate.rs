//! `meshctl translate`: the Envoy configuration a workload would receive, offline, from a
//! directory of manifests: the xds-server's directory decoding, its `TenantIndex` and its pure
//! translation, so the output is what the instance sends (same resources, same versions).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use meshplane_xds_core::model::Resource;
use meshplane_xds_core::translate::protojson;
use serde::Serialize;
use serde_json::Value;

use crate::output::{self, Format, Report, Table};
use crate::render::{self, Serving, Workload};
use crate::state::MeshState;

/// `meshctl translate`.
#[derive(Debug, Args)]
pub struct TranslateArgs {
    /// Directory of manifests (read recursively, as `meshplane-xds --source dir:PATH` reads it).
    #[arg(short = 'f', long = "filename", value_name = "DIR")]
    pub dir: PathBuf,
    /// The Pod (`namespace/name`) whose configuration to show.
    #[arg(long, value_name = "NAMESPACE/NAME", conflicts_with_all = ["namespace", "labels"])]
    pub pod: Option<String>,
    /// Namespace of a workload that is not in the manifests (with --labels).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Labels of that workload (`key=value`, repeatable or comma-separated).
    #[arg(short = 'l', long = "labels", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Only these resource types (repeatable; default all).
    #[arg(short = 't', long = "type", value_enum)]
    pub types: Vec<ResourceType>,
}

/// Envoy resource types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceType {
    #[value(alias = "cds")]
    Clusters,
    #[value(alias = "eds")]
    Endpoints,
    #[value(alias = "lds")]
    Listeners,
    #[value(alias = "rds")]
    Routes,
}

impl ResourceType {
    fn as_str(self) -> &'static str {
        match self {
            ResourceType::Clusters => "cluster",
            ResourceType::Endpoints => "endpoints",
            ResourceType::Listeners => "listener",
            ResourceType::Routes => "route",
        }
    }
}

/// One Envoy resource, in proto-JSON.
#[derive(Debug, Serialize)]
pub struct ResourceOut {
    pub name: String,
    /// Content hash: the version the instance sends it with.
    pub version: String,
    pub config: Value,
}

/// The workload a configuration is for.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyOut {
    pub workload: String,
    pub node_id: String,
    pub tenant: String,
    /// The revision whose instance programs the proxy.
    pub revision: String,
    /// The revision the namespace is attached to (new pods get it).
    pub namespace_revision: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    pub control_namespace: String,
}

impl ProxyOut {
    fn new(workload: &Workload, node_id: &str, serving: &Serving) -> Self {
        ProxyOut {
            workload: workload.describe(),
            node_id: node_id.to_string(),
            tenant: serving.placement.tenant.clone(),
            revision: serving.revision.clone(),
            namespace_revision: serving.placement.revision.clone(),
            tag: serving.placement.tag.clone(),
            control_namespace: serving.placement.control_namespace.clone(),
        }
    }
}

/// What `meshctl translate` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TranslateReport {
    pub proxy: ProxyOut,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clusters: Option<Vec<ResourceOut>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<ResourceOut>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listeners: Option<Vec<ResourceOut>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<ResourceOut>>,
    /// EnvoyFilter patches that did not apply to this workload.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub envoy_filter_errors: Vec<String>,
}

impl Report for TranslateReport {
    fn human(&self, wide: bool) -> String {
        let mut out = format!(
            "workload {} of tenant {}, served by revision {}\n",
            self.proxy.workload, self.proxy.tenant, self.proxy.revision
        );
        let mut table = Table::new(["type", "name", "version"]);
        let lists = [
            (ResourceType::Clusters, &self.clusters),
            (ResourceType::Endpoints, &self.endpoints),
            (ResourceType::Listeners, &self.listeners),
            (ResourceType::Routes, &self.routes),
        ];
        for (kind, list) in lists {
            for r in list.iter().flatten() {
                let version = if wide {
                    r.version.clone()
                } else {
                    r.version.chars().take(12).collect()
                };
                table.row([kind.as_str().to_string(), r.name.clone(), version]);
            }
        }
        out.push_str(&table.render());
        for e in &self.envoy_filter_errors {
            out.push_str(&format!("warning: {e}\n"));
        }
        out
    }
}

fn parse_labels(labels: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    labels
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("--labels: {l:?} is not key=value"),
        })
        .collect()
}

/// The workload `args` name in `state`.
pub fn workload(
    state: &MeshState,
    pod: Option<&str>,
    namespace: Option<&str>,
    labels: &[String],
) -> anyhow::Result<Workload> {
    match (pod, namespace) {
        (Some(pod), _) => {
            let Some((ns, name)) = pod.split_once('/') else {
                bail!("--pod: {pod:?} is not namespace/name");
            };
            let pod = state
                .pod(ns, name)
                .with_context(|| format!("no Pod {ns}/{name} in the manifests"))?;
            Ok(Workload::from_pod(pod))
        }
        (None, Some(ns)) => Ok(Workload::hypothetical(ns, parse_labels(labels)?)),
        (None, None) => {
            bail!("name a workload: --pod NAMESPACE/NAME, or --namespace NS [--labels k=v,...]")
        }
    }
}

fn resources(list: &[std::sync::Arc<Resource>]) -> anyhow::Result<Vec<ResourceOut>> {
    list.iter()
        .map(|r| {
            let config = protojson::to_json(protojson::type_name_of(r.type_url), &r.encoded)
                .with_context(|| format!("decoding {} {}", r.type_url, r.name))?;
            Ok(ResourceOut {
                name: r.name.clone(),
                version: r.version.clone(),
                config,
            })
        })
        .collect()
}

/// Builds the report of `meshctl translate`.
pub fn translate(args: &TranslateArgs) -> anyhow::Result<TranslateReport> {
    let state = MeshState::from_dir(&args.dir)?;
    for (file, reason) in &state.unreadable {
        tracing::warn!(file, reason, "manifest file skipped");
    }
    let workload = workload(
        &state,
        args.pod.as_deref(),
        args.namespace.as_deref(),
        &args.labels,
    )?;
    let membership = state.membership();
    let rendered = render::render(&state, &membership, &workload)?;
    let wanted = |t: ResourceType| args.types.is_empty() || args.types.contains(&t);
    let pick = |t: ResourceType, list: &[std::sync::Arc<Resource>]| -> anyhow::Result<_> {
        Ok(if wanted(t) {
            Some(resources(list)?)
        } else {
            None
        })
    };
    Ok(TranslateReport {
        proxy: ProxyOut::new(&workload, &rendered.node.id, &rendered.serving),
        clusters: pick(ResourceType::Clusters, &rendered.config.clusters)?,
        endpoints: pick(ResourceType::Endpoints, &rendered.config.endpoints)?,
        listeners: pick(ResourceType::Listeners, &rendered.config.listeners)?,
        routes: pick(ResourceType::Routes, &rendered.config.routes)?,
        envoy_filter_errors: rendered
            .patch_errors
            .iter()
            .map(ToString::to_string)
            .collect(),
    })
}

/// Runs `meshctl translate`.
pub fn run(args: &TranslateArgs, format: Format) -> anyhow::Result<()> {
    output::print(&translate(args)?, format)
}
