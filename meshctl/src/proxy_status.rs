//! `meshctl proxy-status`: every proxy connected to every instance of every revision (or of one
//! tenant or revision), with its sync state per resource type, as the instances' debug
//! endpoints report it ([`crate::instances`]).

use std::collections::BTreeSet;

use clap::Args;
use serde::Serialize;

use crate::cluster::ClusterArgs;
use crate::instances::{self, ConnectedProxy, Filter, Instance, SyncState, TypeSync};
use crate::output::{self, Format, Report, Table};

/// `meshctl proxy-status`.
#[derive(Debug, Args)]
pub struct ProxyStatusArgs {
    /// Only the revisions of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this revision.
    #[arg(long)]
    pub revision: Option<String>,
    /// Only proxies of this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

/// One type of one proxy.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeOut {
    #[serde(rename = "type")]
    pub type_name: String,
    pub state: SyncState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acked_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nack: Option<String>,
}

impl TypeOut {
    fn of(t: &TypeSync) -> Self {
        let state = t.state();
        TypeOut {
            type_name: t.type_name.clone(),
            state,
            sent_version: t.sent_version.clone(),
            acked_version: t.acked_version.clone(),
            nack: t
                .last_nack
                .as_ref()
                .filter(|_| state == SyncState::Nacked)
                .map(|n| n.message.clone()),
        }
    }
}

/// One proxy.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyRow {
    /// `pod.namespace`, or the node id of a proxy without a pod.
    pub name: String,
    pub namespace: String,
    pub tenant: String,
    pub revision: String,
    /// The revision's declared version.
    pub version: String,
    /// `pod.namespace` of the instance it is connected to.
    pub instance: String,
    pub node_id: String,
    pub protocol: String,
    pub config_bytes: usize,
    pub types: Vec<TypeOut>,
}

impl ProxyRow {
    fn of(instance: &Instance, p: &ConnectedProxy) -> Self {
        ProxyRow {
            name: match &p.pod_name {
                Some(pod) => format!("{pod}.{}", p.namespace),
                None => p.id.clone(),
            },
            namespace: p.namespace.clone(),
            tenant: instance.tenant.clone(),
            revision: instance.revision.clone(),
            version: instance.version.clone(),
            instance: format!("{}.{}", instance.pod, instance.namespace),
            node_id: p.id.clone(),
            protocol: p.protocol.clone(),
            config_bytes: p.config_bytes,
            types: p.types.iter().map(TypeOut::of).collect(),
        }
    }

    /// Whether any type is NACKed.
    pub fn nacked(&self) -> bool {
        self.types.iter().any(|t| t.state == SyncState::Nacked)
    }
}

/// An instance that could not be read.
#[derive(Debug, Serialize)]
pub struct Unreachable {
    pub instance: String,
    pub revision: String,
    pub error: String,
}

/// What `meshctl proxy-status` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatusReport {
    pub proxies: Vec<ProxyRow>,
    /// Instances read.
    pub instances: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<Unreachable>,
}

/// Column order of the types, as istioctl prints them; unknown types follow by name.
fn type_order(t: &str) -> (usize, String) {
    let known = ["cds", "lds", "eds", "rds", "vhds"];
    (
        known.iter().position(|k| *k == t).unwrap_or(known.len()),
        t.to_string(),
    )
}

impl Report for ProxyStatusReport {
    fn human(&self, wide: bool) -> String {
        let types: BTreeSet<(usize, String)> = self
            .proxies
            .iter()
            .flat_map(|p| p.types.iter().map(|t| type_order(&t.type_name)))
            .collect();
        let mut headers: Vec<String> = ["name", "tenant", "revision", "version", "instance"]
            .map(String::from)
            .to_vec();
        headers.extend(types.iter().map(|(_, t)| t.clone()));
        if wide {
            headers.extend(["protocol", "bytes", "node id"].map(String::from));
        }
        let mut table = Table::new(headers);
        for p in &self.proxies {
            let mut row = vec![
                p.name.clone(),
                p.tenant.clone(),
                p.revision.clone(),
                output::or_dash(&p.version),
                p.instance.clone(),
            ];
            for (_, t) in &types {
                row.push(
                    p.types
                        .iter()
                        .find(|x| x.type_name == *t)
                        .map_or("-", |x| x.state.as_str())
                        .to_string(),
                );
            }
            if wide {
                row.extend([
                    p.protocol.clone(),
                    p.config_bytes.to_string(),
                    p.node_id.clone(),
                ]);
            }
            table.row(row);
        }
        let mut out = if table.is_empty() {
            format!(
                "no proxies connected to the {} instances read\n",
                self.instances
            )
        } else {
            table.render()
        };
        for p in &self.proxies {
            for t in &p.types {
                if let Some(msg) = &t.nack {
                    out.push_str(&format!("{} {} NACK: {msg}\n", p.name, t.type_name));
                }
            }
        }
        for u in &self.unreachable {
            out.push_str(&format!(
                "warning: instance {} (revision {}) not read: {}\n",
                u.instance, u.revision, u.error
            ));
        }
        out
    }
}

/// The report from instances already read.
pub fn report(instances: &[Instance], namespace: Option<&str>) -> ProxyStatusReport {
    let mut proxies: Vec<ProxyRow> = instances
        .iter()
        .flat_map(|i| i.proxies.iter().map(move |p| (i, p)))
        .filter(|(_, p)| namespace.is_none_or(|n| p.namespace == n))
        .map(|(i, p)| ProxyRow::of(i, p))
        .collect();
    proxies.sort_by(|a, b| {
        (&a.namespace, &a.name, &a.instance).cmp(&(&b.namespace, &b.name, &b.instance))
    });
    ProxyStatusReport {
        proxies,
        instances: instances.len(),
        unreachable: instances
            .iter()
            .filter_map(|i| {
                Some(Unreachable {
                    instance: format!("{}.{}", i.pod, i.namespace),
                    revision: i.revision.clone(),
                    error: i.error.clone()?,
                })
            })
            .collect(),
    }
}

/// Runs `meshctl proxy-status`.
pub async fn run(
    args: &ProxyStatusArgs,
    cluster: &ClusterArgs,
    format: Format,
) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let filter = Filter {
        tenant: args.tenant.clone(),
        revision: args.revision.clone(),
        debug_token: cluster.debug_token.clone(),
    };
    let instances = instances::read(&client, &filter).await?;
    output::print(&report(&instances, args.namespace.as_deref()), format)
}
