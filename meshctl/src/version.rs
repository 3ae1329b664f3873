//! `meshctl version`: this client's version and, unless `--client`, the versions the cluster
//! runs: each revision's declared version and images, and the operator's image.

use clap::Args;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};
use meshplane_crds::MeshControlPlane;
use serde::Serialize;

use crate::cluster::ClusterArgs;
use crate::output::{self, Format, Report, Table};

/// The operator Deployment's label.
pub const OPERATOR_SELECTOR: &str = "app.kubernetes.io/name=meshplane-operator";

/// `meshctl version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Only this client's version (no cluster access).
    #[arg(long)]
    pub client: bool,
}

/// One revision's version.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionVersion {
    pub tenant: String,
    pub revision: String,
    pub version: String,
    pub xds_image: String,
    pub proxy_image: String,
}

/// What `meshctl version` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionReport {
    pub client: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub operator_images: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<RevisionVersion>,
}

impl Report for VersionReport {
    fn human(&self, wide: bool) -> String {
        let mut out = format!("meshctl {}\n", self.client);
        for image in &self.operator_images {
            out.push_str(&format!("operator {image}\n"));
        }
        if !self.revisions.is_empty() {
            let mut t = if wide {
                Table::new(["tenant", "revision", "version", "xds image", "proxy image"])
            } else {
                Table::new(["tenant", "revision", "version"])
            };
            for r in &self.revisions {
                t.row([
                    r.tenant.clone(),
                    r.revision.clone(),
                    r.version.clone(),
                    r.xds_image.clone(),
                    r.proxy_image.clone(),
                ]);
            }
            out.push_str(&t.render());
        }
        out
    }
}

/// This binary's version.
pub fn client_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// The versions the cluster runs: the operator's images and every revision's.
pub async fn cluster_report(client: &kube::Client) -> anyhow::Result<VersionReport> {
    let mut report = VersionReport {
        client: client_version(),
        operator_images: Vec::new(),
        revisions: Vec::new(),
    };
    let deployments: Api<Deployment> = Api::all(client.clone());
    let operators = deployments
        .list(&ListParams::default().labels(OPERATOR_SELECTOR))
        .await?;
    for d in operators.items {
        let images = d
            .spec
            .template
            .spec
            .map(|s| {
                s.containers
                    .into_iter()
                    .filter_map(|c| c.image)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        report.operator_images.extend(images);
    }
    let mcps: Api<MeshControlPlane> = Api::all(client.clone());
    let mut revisions: Vec<RevisionVersion> = mcps
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|m| RevisionVersion {
            tenant: m.spec.tenant.clone(),
            revision: m.revision(),
            version: m.spec.version.clone(),
            xds_image: m.xds_image(),
            proxy_image: m.proxy_image(),
        })
        .collect();
    revisions.sort_by(|a, b| (&a.tenant, &a.revision).cmp(&(&b.tenant, &b.revision)));
    report.revisions = revisions;
    Ok(report)
}

/// Runs `meshctl version`.
pub async fn run(args: &VersionArgs, cluster: &ClusterArgs, format: Format) -> anyhow::Result<()> {
    let report = if args.client {
        VersionReport {
            client: client_version(),
            operator_images: Vec::new(),
            revisions: Vec::new(),
        }
    } else {
        cluster_report(&cluster.client().await?).await?
    };
    output::print(&report, format)
}
