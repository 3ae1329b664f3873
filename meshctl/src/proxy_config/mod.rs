//! `meshctl proxy-config`: what a running proxy holds, read from its Envoy admin endpoint
//! ([`crate::envoy_admin`], through the API server's `pods/portforward`), or from a saved
//! config dump (`--file`). istioctl's `proxy-config` kinds and columns; `-o json|yaml` prints
//! the resources as Envoy printed them. `describe` and `translate` show what the instance
//! would send; this shows what the proxy accepted.

pub mod clusters;
pub mod diff;
pub mod dump;
pub mod endpoints;
pub mod listeners;
pub mod logging;
pub mod routes;
pub mod secrets;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::Value;

use crate::cli::EXIT_FINDINGS;
use crate::cluster::ClusterArgs;
use crate::envoy_admin::EnvoyAdmin;
use crate::instances;
use crate::output::{self, Format, Report, Table};
use clusters::{ClusterFilter, Direction};
use diff::{DiffReport, DumpedType, Intended};
use dump::ConfigDump;
use endpoints::EndpointFilter;
use listeners::ListenerFilter;
use routes::RouteFilter;

/// Which proxy, or which saved dump.
#[derive(Debug, Args)]
pub struct ProxyTarget {
    /// The pod: `name` (with -n), `name.namespace` or `namespace/name`.
    #[arg(required_unless_present = "file")]
    pub pod: Option<String>,
    /// The pod's namespace (default: `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Read a saved admin answer instead of a pod: a `/config_dump` (for `endpoint`, a
    /// `/clusters?format=json`).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "pod"
    )]
    pub file: Option<PathBuf>,
    /// Compare what the proxy holds with what its instance intends it to hold (cluster,
    /// listener, route, all); exits 3 when they differ.
    #[arg(long, conflicts_with = "file")]
    pub diff: bool,
}

impl ProxyTarget {
    /// `(namespace, pod)`; a namespace is a DNS label, so the last `.` separates it.
    pub fn pod(&self) -> anyhow::Result<(String, String)> {
        let pod = self.pod.as_deref().context("name a pod or give --file")?;
        if let Some((ns, name)) = pod.split_once('/') {
            return Ok((ns.to_string(), name.to_string()));
        }
        if let Some(ns) = &self.namespace {
            return Ok((ns.clone(), pod.to_string()));
        }
        Ok(match pod.rsplit_once('.') {
            Some((name, ns)) => (ns.to_string(), name.to_string()),
            None => ("default".to_string(), pod.to_string()),
        })
    }
}

/// `meshctl proxy-config`.
#[derive(Debug, Subcommand)]
pub enum ProxyConfigCommand {
    /// Clusters: service FQDN, port, subset, direction, type.
    Cluster {
        #[command(flatten)]
        target: ProxyTarget,
        /// Only clusters of this service (an FQDN, or the start of one: `reviews.shop`).
        #[arg(long)]
        fqdn: Option<String>,
        /// Only clusters of this port.
        #[arg(long)]
        port: Option<u32>,
        /// Only clusters of this subset.
        #[arg(long)]
        subset: Option<String>,
        /// Only inbound or outbound clusters.
        #[arg(long, value_enum)]
        direction: Option<Direction>,
    },
    /// Listeners, one row per filter chain: address, port, match, destination.
    Listener {
        #[command(flatten)]
        target: ProxyTarget,
        /// Only listeners on this port.
        #[arg(long)]
        port: Option<u32>,
        /// Only listeners on this address.
        #[arg(long)]
        address: Option<String>,
    },
    /// Routes, one row per route of each virtual host.
    Route {
        #[command(flatten)]
        target: ProxyTarget,
        /// Only this route configuration.
        #[arg(long)]
        name: Option<String>,
    },
    /// Endpoints of every cluster as the proxy sees them now: health, outlier ejection.
    Endpoint {
        #[command(flatten)]
        target: ProxyTarget,
        /// Only endpoints of this cluster (its full name).
        #[arg(long)]
        cluster: Option<String>,
        /// Only endpoints on this port.
        #[arg(long)]
        port: Option<u32>,
        /// Only endpoints in this health status (`healthy`, `unhealthy`, …).
        #[arg(long)]
        status: Option<String>,
    },
    /// Certificates (SDS): identity, validity, serial number.
    Secret {
        #[command(flatten)]
        target: ProxyTarget,
    },
    /// The bootstrap the proxy started with.
    Bootstrap {
        #[command(flatten)]
        target: ProxyTarget,
    },
    /// Logger levels; `--level` or `--reset` changes them.
    Log {
        #[command(flatten)]
        target: ProxyTarget,
        /// `debug` for every logger, or `http:debug,upstream:trace` for some.
        #[arg(long, conflicts_with = "reset")]
        level: Option<String>,
        /// Every logger back to `warning`.
        #[arg(long)]
        reset: bool,
    },
    /// Clusters, listeners, routes and secrets (`-o json`: the whole config dump).
    All {
        #[command(flatten)]
        target: ProxyTarget,
    },
}

/// Resources as a table for people, and as Envoy printed them for `-o json|yaml`.
#[derive(Debug)]
pub struct ConfigReport {
    pub configs: Vec<Value>,
    table: Table,
}

impl ConfigReport {
    pub fn new(table: Table, configs: Vec<Value>) -> Self {
        ConfigReport { configs, table }
    }
}

impl Serialize for ConfigReport {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.configs.serialize(serializer)
    }
}

impl Report for ConfigReport {
    fn human(&self, _wide: bool) -> String {
        self.table.render()
    }
}

/// A document printed as JSON in every format but YAML.
#[derive(Debug)]
struct Document(Value);

impl Serialize for Document {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl Report for Document {
    fn human(&self, _wide: bool) -> String {
        serde_json::to_string_pretty(&self.0).unwrap_or_default()
    }
}

/// Every section of `all`, one after the other.
#[derive(Debug)]
struct AllReport {
    dump: Value,
    sections: Vec<(&'static str, ConfigReport)>,
}

impl Serialize for AllReport {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.dump.serialize(serializer)
    }
}

impl Report for AllReport {
    fn human(&self, wide: bool) -> String {
        self.sections
            .iter()
            .map(|(title, report)| format!("{title}:\n{}", report.human(wide)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Where the admin answers come from.
enum Source {
    File(PathBuf),
    Pod(Box<EnvoyAdmin>, String),
}

impl Source {
    async fn of(target: &ProxyTarget, cluster: &ClusterArgs) -> anyhow::Result<Self> {
        if let Some(file) = &target.file {
            return Ok(Source::File(file.clone()));
        }
        let (namespace, pod) = target.pod()?;
        let client = cluster.client().await?;
        Ok(Source::Pod(
            Box::new(EnvoyAdmin::new(client, &namespace, &pod)),
            format!("{pod}.{namespace}"),
        ))
    }

    async fn get(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        match self {
            Source::File(file) => {
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))
            }
            Source::Pod(admin, _) => Ok(admin.get(path).await?.to_vec()),
        }
    }

    async fn config_dump(&self) -> anyhow::Result<ConfigDump> {
        ConfigDump::parse(&self.get("/config_dump").await?)
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The percent-encoded form of a query value (node ids are plain, but nothing relies on it).
fn query_value(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `--diff`: the proxy's config dump against its instance's `/debug/intended`.
async fn diff_with_instance(
    target: &ProxyTarget,
    cluster: &ClusterArgs,
    types: &[DumpedType],
    format: Format,
) -> anyhow::Result<ExitCode> {
    let (namespace, pod) = target.pod()?;
    let client = cluster.client().await?;
    let admin = EnvoyAdmin::new(client.clone(), &namespace, &pod);
    let dump = ConfigDump::parse(&admin.get("/config_dump").await?)?;
    let filter = instances::Filter {
        debug_token: cluster.debug_token.clone(),
        ..instances::Filter::default()
    };
    let (read, tokens) = instances::read_with_tokens(&client, &filter).await?;
    let (instance, proxy) = read
        .iter()
        .flat_map(|i| i.proxies.iter().map(move |p| (i, p)))
        .find(|(_, p)| p.namespace == namespace && p.pod_name.as_deref() == Some(pod.as_str()))
        .with_context(|| {
            format!(
                "no instance has a proxy of pod {namespace}/{pod} connected (meshctl proxy-status lists the connected ones)"
            )
        })?;
    // The token the instance already reviewed for /debug/proxies serves again.
    let token = match cluster
        .debug_token
        .as_ref()
        .or_else(|| tokens.get(&instance.namespace))
    {
        Some(t) => t.clone(),
        None => {
            instances::request_debug_token(&client, &instance.tenant, &instance.namespace).await?
        }
    };
    let path = format!("/debug/intended?proxy={}", query_value(&proxy.id));
    let text = instances::debug_get(&client, &instance.namespace, &instance.pod, &token, &path)
        .await
        .with_context(|| {
            format!(
                "reading what instance {}/{} intends for {}",
                instance.namespace, instance.pod, proxy.id
            )
        })?;
    let intended: Intended = serde_json::from_str(&text)
        .context("the instance's /debug/intended answer is not what this meshctl reads")?;
    if !intended.rendered {
        anyhow::bail!(
            "instance {}/{} has not rendered a configuration for {} yet",
            instance.namespace,
            instance.pod,
            proxy.id
        );
    }
    let (compared, differences) = diff::compare(&dump, &intended, types);
    let report = DiffReport {
        pod: format!("{pod}.{namespace}"),
        instance: format!("{}.{}", instance.pod, instance.namespace),
        proxy: proxy.id.clone(),
        compared,
        differences,
    };
    output::print(&report, format)?;
    Ok(if report.differences.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FINDINGS)
    })
}

/// Runs one `proxy-config` command.
pub async fn run(
    command: &ProxyConfigCommand,
    cluster: &ClusterArgs,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let compared = match command {
        ProxyConfigCommand::Cluster { target, .. } => Some((target, &[DumpedType::Cds][..])),
        ProxyConfigCommand::Listener { target, .. } => Some((target, &[DumpedType::Lds][..])),
        ProxyConfigCommand::Route { target, .. } => Some((target, &[DumpedType::Rds][..])),
        ProxyConfigCommand::All { target } => Some((target, &DumpedType::ALL[..])),
        ProxyConfigCommand::Endpoint { target, .. }
        | ProxyConfigCommand::Secret { target }
        | ProxyConfigCommand::Bootstrap { target }
        | ProxyConfigCommand::Log { target, .. } => {
            if target.diff {
                anyhow::bail!("--diff compares clusters, listeners and routes (cluster, listener, route, all)");
            }
            None
        }
    };
    if let Some((target, types)) = compared.filter(|(t, _)| t.diff) {
        return diff_with_instance(target, cluster, types, format).await;
    }
    show(command, cluster, format).await?;
    Ok(ExitCode::SUCCESS)
}

/// Prints what the proxy holds.
async fn show(
    command: &ProxyConfigCommand,
    cluster: &ClusterArgs,
    format: Format,
) -> anyhow::Result<()> {
    match command {
        ProxyConfigCommand::Cluster {
            target,
            fqdn,
            port,
            subset,
            direction,
        } => {
            let dump = Source::of(target, cluster).await?.config_dump().await?;
            let filter = ClusterFilter {
                fqdn: fqdn.clone(),
                port: *port,
                subset: subset.clone(),
                direction: *direction,
            };
            output::print(&clusters::report(&dump, &filter), format)
        }
        ProxyConfigCommand::Listener {
            target,
            port,
            address,
        } => {
            let dump = Source::of(target, cluster).await?.config_dump().await?;
            let filter = ListenerFilter {
                port: *port,
                address: address.clone(),
            };
            output::print(&listeners::report(&dump, &filter), format)
        }
        ProxyConfigCommand::Route { target, name } => {
            let dump = Source::of(target, cluster).await?.config_dump().await?;
            let filter = RouteFilter { name: name.clone() };
            output::print(&routes::report(&dump, &filter), format)
        }
        ProxyConfigCommand::Endpoint {
            target,
            cluster: cluster_name,
            port,
            status,
        } => {
            let source = Source::of(target, cluster).await?;
            let bytes = source.get("/clusters?format=json").await?;
            let doc: Value = serde_json::from_slice(&bytes)
                .context("the proxy's /clusters answer is not JSON")?;
            let filter = EndpointFilter {
                cluster: cluster_name.clone(),
                port: *port,
                status: status.clone(),
            };
            output::print(&endpoints::report(&doc, &filter), format)
        }
        ProxyConfigCommand::Secret { target } => {
            let dump = Source::of(target, cluster).await?.config_dump().await?;
            output::print(&secrets::report(&dump, unix_now()), format)
        }
        ProxyConfigCommand::Bootstrap { target } => {
            let dump = Source::of(target, cluster).await?.config_dump().await?;
            let bootstrap = dump
                .bootstrap()
                .cloned()
                .context("the config dump has no bootstrap")?;
            output::print(&Document(bootstrap), format)
        }
        ProxyConfigCommand::Log {
            target,
            level,
            reset,
        } => {
            let path = match (level, reset) {
                (Some(level), _) => logging::change_path(level)?,
                (None, true) => logging::change_path(logging::RESET_LEVEL)?,
                (None, false) => "/logging".to_string(),
            };
            let Source::Pod(admin, pod) = Source::of(target, cluster).await? else {
                anyhow::bail!("log levels are read from a running proxy, not a file");
            };
            // Envoy lists the loggers after any change, and on a bare POST.
            let text = admin.post(&path).await?;
            let loggers = logging::Loggers {
                pod,
                loggers: logging::parse(&String::from_utf8_lossy(&text)),
            };
            output::print(&loggers, format)
        }
        ProxyConfigCommand::All { target } => {
            let dump = Source::of(target, cluster).await?.config_dump().await?;
            let sections = vec![
                (
                    "CLUSTERS",
                    clusters::report(&dump, &ClusterFilter::default()),
                ),
                (
                    "LISTENERS",
                    listeners::report(&dump, &ListenerFilter::default()),
                ),
                ("ROUTES", routes::report(&dump, &RouteFilter::default())),
                ("SECRETS", secrets::report(&dump, unix_now())),
            ];
            let report = AllReport {
                dump: dump.document().clone(),
                sections,
            };
            output::print(&report, format)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(pod: &str, namespace: Option<&str>) -> ProxyTarget {
        ProxyTarget {
            pod: Some(pod.to_string()),
            namespace: namespace.map(str::to_string),
            file: None,
            diff: false,
        }
    }

    #[test]
    fn pods_are_named_as_istioctl_names_them() {
        let pod = |p, n| target(p, n).pod().expect("a pod");
        assert_eq!(pod("web-1.shop", None), ("shop".into(), "web-1".into()));
        assert_eq!(pod("shop/web-1", None), ("shop".into(), "web-1".into()));
        assert_eq!(pod("web-1", Some("shop")), ("shop".into(), "web-1".into()));
        assert_eq!(pod("web-1", None), ("default".into(), "web-1".into()));
    }
}
