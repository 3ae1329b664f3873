//! Pure construction of the final Envoy bootstrap from the bootstrap ConfigMap's `envoy.yaml`
//! (contract 6) and the proxy's identity (contract 7).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::{json, Map, Value};

/// Name of the static cluster that carries ADS to the instance (contract 6).
pub const ADS_CLUSTER: &str = meshplane_contracts::bootstrap::ADS_CLUSTER;

/// Node metadata key telling the control plane which loopback address the pod owns, so that
/// it binds the proxy's dynamic listeners there too.
pub const LOOPBACK_ADDR_META: &str = meshplane_contracts::node::meta::LOOPBACK_ADDR;

/// Addresses rewritten to the pod's own loopback address when one is given.
const SHARED_BIND_ADDRESSES: &[&str] = &["127.0.0.1", "0.0.0.0"];

/// What the launcher adds to the bootstrap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootstrapOptions {
    /// `node.id`, e.g. `sidecar~198.18.0.7~web-1.shop~shop.svc.cluster.local`.
    pub node_id: String,
    /// `node.cluster`: the workload's service cluster name.
    pub cluster: String,
    /// Entries merged into `node.metadata` (string values), overriding the bootstrap's.
    pub metadata: BTreeMap<String, String>,
    /// Projected ServiceAccount token sent as `authorization: Bearer <token>` on the ADS stream.
    pub token: Option<String>,
    /// Set only by the local test pod runner, where every pod shares the host's network
    /// namespace: the loopback address (e.g. `127.0.0.12`) that stands for this pod's own.
    pub loopback_addr: Option<IpAddr>,
}

/// Why the bootstrap could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The input is not YAML (or JSON).
    #[error("bootstrap is not valid YAML: {0}")]
    Parse(String),
    /// The input parsed but is not a mapping at the top or where a mapping is needed.
    #[error("bootstrap field {field} must be a mapping")]
    NotAMapping { field: &'static str },
    /// A token was given but no ADS `grpc_service` targets the `xds-grpc` cluster.
    #[error("bootstrap has no dynamic_resources grpc_service with envoy_grpc.cluster_name {ADS_CLUSTER:?} to carry the proxy token")]
    NoAdsGrpcService,
    /// The token is empty: the instance would refuse the proxy anyway.
    #[error("the proxy token is empty")]
    EmptyToken,
    /// The node agent needs the `xds-grpc` cluster to know where the instance is.
    #[error("bootstrap has no static cluster {ADS_CLUSTER:?} with a socket address endpoint")]
    NoAdsCluster,
    /// A required identity value is empty.
    #[error("{0} must not be empty")]
    EmptyIdentity(&'static str),
    /// The node id breaks contract 7 (e.g. a `$(POD_IP)` the kubelet did not expand): the
    /// instance would refuse the proxy.
    #[error("{0}")]
    NodeId(#[from] meshplane_contracts::ContractError),
}

/// Builds the final bootstrap: parses `input` (the ConfigMap's `envoy.yaml`), sets `node.id`,
/// `node.cluster` and `node.metadata`, adds the token to the ADS `grpc_service`s and, in the
/// local test runner only, moves the admin and static listener binds on `127.0.0.1` or
/// `0.0.0.0`, and static upstreams on `127.0.0.1`, to the pod's loopback address.
pub fn build_bootstrap(input: &str, opts: &BootstrapOptions) -> Result<Value, BootstrapError> {
    if opts.node_id.is_empty() {
        return Err(BootstrapError::EmptyIdentity("node id"));
    }
    meshplane_contracts::node::NodeId::parse(&opts.node_id)?;
    if opts.cluster.is_empty() {
        return Err(BootstrapError::EmptyIdentity("node cluster"));
    }
    let mut bootstrap: Value =
        serde_saphyr::from_str(input).map_err(|e| BootstrapError::Parse(e.to_string()))?;
    let root = bootstrap
        .as_object_mut()
        .ok_or(BootstrapError::NotAMapping {
            field: "(top level)",
        })?;

    let mut metadata = opts.metadata.clone();
    if let Some(addr) = opts.loopback_addr {
        metadata.insert(LOOPBACK_ADDR_META.to_owned(), addr.to_string());
    }
    set_node(root, opts, &metadata)?;

    if let Some(token) = &opts.token {
        let token = token.trim();
        if token.is_empty() {
            return Err(BootstrapError::EmptyToken);
        }
        let header = format!("Bearer {token}");
        let changed = root
            .get_mut("dynamic_resources")
            .map_or(0, |dynamic| add_authorization(dynamic, &header));
        if changed == 0 {
            return Err(BootstrapError::NoAdsGrpcService);
        }
    }

    if let Some(addr) = opts.loopback_addr {
        let addr = addr.to_string();
        if let Some(admin) = root.get_mut("admin") {
            rebind_socket_address(admin.get_mut("address"), &addr);
        }
        let listeners = root
            .get_mut("static_resources")
            .and_then(|s| s.get_mut("listeners"))
            .and_then(Value::as_array_mut);
        for listener in listeners.into_iter().flatten() {
            rebind_socket_address(listener.get_mut("address"), &addr);
        }
        // Inside a pod 127.0.0.1 is the pod itself (e.g. the `envoy-admin` cluster behind the
        // readiness route to the admin port), so static upstreams on loopback move to the
        // pod's address as well. The ADS cluster is the instance Service, never the pod.
        let clusters = root
            .get_mut("static_resources")
            .and_then(|s| s.get_mut("clusters"))
            .and_then(Value::as_array_mut);
        for cluster in clusters.into_iter().flatten() {
            if cluster.get("name").and_then(Value::as_str) == Some(ADS_CLUSTER) {
                continue;
            }
            if let Some(assignment) = cluster.get_mut("load_assignment") {
                redirect_loopback_upstreams(assignment, &addr);
            }
        }
    }
    Ok(bootstrap)
}

/// Name of the static cluster through which Envoy asks the node agent for its secrets.
pub const SDS_CLUSTER: &str = meshplane_ca::sds::SDS_CLUSTER;

/// Where the node agent listens for Envoy, relative to Envoy's working directory (the pod's
/// runtime `emptyDir`): relative paths stay short whatever the directory, and Unix socket paths
/// are limited to 107 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSockets {
    /// ADS, proxied to the instance over TLS.
    pub xds: String,
    /// SDS: the workload certificate (`default`) and the trust bundle (`ROOTCA`).
    pub sds: String,
}

impl Default for AgentSockets {
    fn default() -> Self {
        Self {
            xds: "./xds.sock".into(),
            sds: "./sds.sock".into(),
        }
    }
}

/// Where the node agent carries ADS: the instance address of the bootstrap's `xds-grpc`
/// cluster and the name its certificate must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `host:port` to connect to (a ClusterIP or the Service's DNS name).
    pub target: String,
    /// The TLS server name: the `sni` of the cluster's transport socket, else the host.
    pub server_name: String,
}

/// Rewires a bootstrap for the node agent: the `xds-grpc` cluster now reaches the agent's ADS
/// socket in plaintext (the agent carries the stream to the instance over TLS, with the
/// token), and a `sds-grpc` cluster reaches its SDS socket. Returns where ADS really goes.
pub fn route_through_agent(
    bootstrap: &mut Value,
    sockets: &AgentSockets,
) -> Result<Upstream, BootstrapError> {
    let clusters = bootstrap
        .get_mut("static_resources")
        .and_then(|s| s.get_mut("clusters"))
        .and_then(Value::as_array_mut)
        .ok_or(BootstrapError::NoAdsCluster)?;
    let ads = clusters
        .iter_mut()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(ADS_CLUSTER))
        .ok_or(BootstrapError::NoAdsCluster)?;
    let socket = ads
        .pointer("/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address")
        .ok_or(BootstrapError::NoAdsCluster)?;
    let host = socket
        .get("address")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
        .ok_or(BootstrapError::NoAdsCluster)?
        .to_owned();
    let port = socket
        .get("port_value")
        .and_then(Value::as_u64)
        .ok_or(BootstrapError::NoAdsCluster)?;
    let sni = ads
        .pointer("/transport_socket/typed_config/sni")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let upstream = Upstream {
        target,
        server_name: sni.unwrap_or(host),
    };
    let obj = ads
        .as_object_mut()
        .ok_or(BootstrapError::NotAMapping { field: "xds-grpc" })?;
    obj.remove("transport_socket");
    obj.insert("type".into(), json!("STATIC"));
    obj.insert(
        "load_assignment".into(),
        pipe_assignment(ADS_CLUSTER, &sockets.xds),
    );

    clusters.retain(|c| c.get("name").and_then(Value::as_str) != Some(SDS_CLUSTER));
    clusters.push(json!({
        "name": SDS_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": pipe_assignment(SDS_CLUSTER, &sockets.sds),
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }));
    Ok(upstream)
}

fn pipe_assignment(cluster: &str, path: &str) -> Value {
    json!({
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": path}}}}]}],
    })
}

fn set_node(
    root: &mut Map<String, Value>,
    opts: &BootstrapOptions,
    metadata: &BTreeMap<String, String>,
) -> Result<(), BootstrapError> {
    let node = root.entry("node").or_insert_with(|| json!({}));
    let node = node
        .as_object_mut()
        .ok_or(BootstrapError::NotAMapping { field: "node" })?;
    node.insert("id".into(), Value::String(opts.node_id.clone()));
    node.insert("cluster".into(), Value::String(opts.cluster.clone()));
    let meta = node.entry("metadata").or_insert_with(|| json!({}));
    let meta = meta.as_object_mut().ok_or(BootstrapError::NotAMapping {
        field: "node.metadata",
    })?;
    for (k, v) in metadata {
        meta.insert(k.clone(), Value::String(v.clone()));
    }
    Ok(())
}

/// Sets `authorization` in the `initial_metadata` of every `grpc_service` under `value` whose
/// `envoy_grpc.cluster_name` is the ADS cluster; returns how many it changed.
fn add_authorization(value: &mut Value, header: &str) -> usize {
    match value {
        Value::Object(map) => {
            let targets_ads = map
                .get("envoy_grpc")
                .and_then(|g| g.get("cluster_name"))
                .and_then(Value::as_str)
                == Some(ADS_CLUSTER);
            if targets_ads {
                let entries = map.entry("initial_metadata").or_insert_with(|| json!([]));
                if !entries.is_array() {
                    *entries = json!([]);
                }
                if let Some(entries) = entries.as_array_mut() {
                    // Replace, never duplicate: Envoy would send both values.
                    entries.retain(|e| {
                        e.get("key")
                            .and_then(Value::as_str)
                            .is_none_or(|k| !k.eq_ignore_ascii_case("authorization"))
                    });
                    entries.push(json!({ "key": "authorization", "value": header }));
                }
                return 1;
            }
            map.values_mut().map(|v| add_authorization(v, header)).sum()
        }
        Value::Array(items) => items.iter_mut().map(|v| add_authorization(v, header)).sum(),
        _ => 0,
    }
}

fn redirect_loopback_upstreams(value: &mut Value, loopback: &str) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(socket)) = map.get_mut("socket_address") {
                if socket.get("address").and_then(Value::as_str) == Some("127.0.0.1") {
                    socket.insert("address".into(), Value::String(loopback.to_owned()));
                }
            }
            map.values_mut()
                .for_each(|v| redirect_loopback_upstreams(v, loopback));
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| redirect_loopback_upstreams(v, loopback)),
        _ => {}
    }
}

fn rebind_socket_address(address: Option<&mut Value>, loopback: &str) {
    let Some(socket) = address.and_then(|a| a.get_mut("socket_address")) else {
        return;
    };
    let Some(bound) = socket.get_mut("address") else {
        return;
    };
    if bound
        .as_str()
        .is_some_and(|a| SHARED_BIND_ADDRESSES.contains(&a))
    {
        *bound = Value::String(loopback.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like contract 6: admin on loopback, readiness listener, ADS over `xds-grpc`.
    const INPUT: &str = r#"
node:
  metadata:
    FROM_CONFIGMAP: "kept"
admin:
  address:
    socket_address: { address: 127.0.0.1, port_value: 15000 }
dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services:
      - envoy_grpc: { cluster_name: xds-grpc }
  cds_config: { ads: {}, resource_api_version: V3 }
  lds_config: { ads: {}, resource_api_version: V3 }
static_resources:
  listeners:
    - name: readiness
      address:
        socket_address: { address: 0.0.0.0, port_value: 15021 }
  clusters:
    - name: admin
      type: STATIC
      load_assignment:
        cluster_name: admin
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: { address: 127.0.0.1, port_value: 15000 }
    - name: xds-grpc
      type: STRICT_DNS
      load_assignment:
        cluster_name: xds-grpc
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: { address: meshplane-blue-v1.meshplane-blue.svc, port_value: 15010 }
"#;

    fn opts() -> BootstrapOptions {
        BootstrapOptions {
            node_id: "sidecar~198.18.0.7~web-1.shop~shop.svc.cluster.local".into(),
            cluster: "web".into(),
            metadata: BTreeMap::from([
                ("NAMESPACE".into(), "shop".into()),
                ("TENANT".into(), "blue".into()),
            ]),
            token: None,
            loopback_addr: None,
        }
    }

    #[test]
    fn sets_node_identity_and_merges_metadata() {
        let out = build_bootstrap(INPUT, &opts()).unwrap();
        assert_eq!(
            out["node"]["id"],
            "sidecar~198.18.0.7~web-1.shop~shop.svc.cluster.local"
        );
        assert_eq!(out["node"]["cluster"], "web");
        assert_eq!(
            out["node"]["metadata"],
            json!({ "FROM_CONFIGMAP": "kept", "NAMESPACE": "shop", "TENANT": "blue" })
        );
    }

    /// Contract 7 from the launcher's side: what the injector renders, once expanded, is
    /// accepted; an id the kubelet could not expand is refused here, with the reason, rather
    /// than by the instance.
    #[test]
    fn the_node_id_must_satisfy_contract_7() {
        let template = meshplane_contracts::node::NodeId::injector_template();
        let mut o = opts();
        o.node_id = template
            .replace("$(POD_IP)", "198.18.0.7")
            .replace("$(POD_NAME)", "web-1")
            .replace("$(POD_NAMESPACE)", "shop");
        assert!(build_bootstrap(INPUT, &o).is_ok());
        o.node_id = template
            .replace("$(POD_NAME)", "web-1")
            .replace("$(POD_NAMESPACE)", "shop");
        let err = build_bootstrap(INPUT, &o).expect_err("unexpanded POD_IP");
        assert!(err.to_string().contains("not an IP address"), "{err}");
    }

    #[test]
    fn adds_bearer_token_to_the_ads_grpc_service_only() {
        let mut o = opts();
        o.token = Some("tok-123\n".into());
        let out = build_bootstrap(INPUT, &o).unwrap();
        assert_eq!(
            out["dynamic_resources"]["ads_config"]["grpc_services"][0]["initial_metadata"],
            json!([{ "key": "authorization", "value": "Bearer tok-123" }])
        );
        // The static cluster is not a grpc_service and stays untouched.
        assert!(out["static_resources"]["clusters"][1]
            .get("initial_metadata")
            .is_none());
    }

    #[test]
    fn replaces_an_existing_authorization_header() {
        let input = r#"
dynamic_resources:
  ads_config:
    grpc_services:
      - envoy_grpc: { cluster_name: xds-grpc }
        initial_metadata:
          - { key: Authorization, value: "Bearer stale" }
          - { key: x-other, value: "1" }
"#;
        let mut o = opts();
        o.token = Some("fresh".into());
        let out = build_bootstrap(input, &o).unwrap();
        assert_eq!(
            out["dynamic_resources"]["ads_config"]["grpc_services"][0]["initial_metadata"],
            json!([
                { "key": "x-other", "value": "1" },
                { "key": "authorization", "value": "Bearer fresh" }
            ])
        );
    }

    #[test]
    fn a_token_without_an_ads_grpc_service_is_an_error() {
        let input = "dynamic_resources:\n  ads_config:\n    grpc_services:\n      - envoy_grpc: { cluster_name: other }\n";
        let mut o = opts();
        o.token = Some("tok".into());
        let err = build_bootstrap(input, &o).unwrap_err();
        assert!(matches!(err, BootstrapError::NoAdsGrpcService), "{err}");
    }

    #[test]
    fn an_empty_token_is_an_error() {
        let mut o = opts();
        o.token = Some(" \n".into());
        assert!(matches!(
            build_bootstrap(INPUT, &o),
            Err(BootstrapError::EmptyToken)
        ));
    }

    #[test]
    fn without_token_no_authorization_is_added() {
        let out = build_bootstrap(INPUT, &opts()).unwrap();
        assert!(out["dynamic_resources"]["ads_config"]["grpc_services"][0]
            .get("initial_metadata")
            .is_none());
    }

    #[test]
    fn loopback_addr_rebinds_admin_and_static_listeners_and_is_announced() {
        let mut o = opts();
        o.loopback_addr = Some("127.0.0.12".parse().unwrap());
        let out = build_bootstrap(INPUT, &o).unwrap();
        assert_eq!(
            out["admin"]["address"]["socket_address"]["address"],
            "127.0.0.12"
        );
        assert_eq!(
            out["admin"]["address"]["socket_address"]["port_value"],
            15000
        );
        assert_eq!(
            out["static_resources"]["listeners"][0]["address"]["socket_address"]["address"],
            "127.0.0.12"
        );
        assert_eq!(out["node"]["metadata"][LOOPBACK_ADDR_META], "127.0.0.12");
        assert_eq!(
            out["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]
                ["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"],
            "127.0.0.12",
            "a loopback upstream is the pod itself"
        );
        // Other upstreams are not the pod and must not move.
        assert_eq!(
            out["static_resources"]["clusters"][1]["load_assignment"]["endpoints"][0]
                ["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"],
            "meshplane-blue-v1.meshplane-blue.svc"
        );
    }

    /// The bootstrap exactly as the operator renders it (golden `render-blue-v1.yaml`), with the
    /// ADS cluster on loopback as in the local pod runner, where the instance Service is too.
    const RENDERED: &str = r#"
admin:
  address:
    socket_address:
      address: "127.0.0.1"
      port_value: 15000
dynamic_resources:
  ads_config:
    api_type: DELTA_GRPC
    grpc_services:
    - envoy_grpc:
        cluster_name: xds-grpc
    set_node_on_first_message_only: true
    transport_api_version: V3
  cds_config:
    ads: {}
    resource_api_version: V3
  lds_config:
    ads: {}
    resource_api_version: V3
static_resources:
  clusters:
  - connect_timeout: 1s
    load_assignment:
      cluster_name: xds-grpc
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address:
                address: "127.0.0.1"
                port_value: 15010
    name: xds-grpc
    type: STATIC
  - connect_timeout: 1s
    load_assignment:
      cluster_name: envoy-admin
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address:
                address: "127.0.0.1"
                port_value: 15000
    name: envoy-admin
    type: STATIC
  listeners:
  - address:
      socket_address:
        address: "0.0.0.0"
        port_value: 15021
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          route_config:
            virtual_hosts:
            - domains: ["*"]
              name: readiness
              routes:
              - match: { path: /healthz/ready }
                route: { cluster: envoy-admin, prefix_rewrite: /ready }
          stat_prefix: readiness
    name: readiness
"#;

    fn endpoint_address<'a>(out: &'a Value, cluster: &str) -> &'a Value {
        let clusters = out["static_resources"]["clusters"].as_array().unwrap();
        let c = clusters.iter().find(|c| c["name"] == cluster).unwrap();
        &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"]
    }

    #[test]
    fn loopback_addr_moves_the_rendered_envoy_admin_cluster_but_not_ads() {
        let mut o = opts();
        o.loopback_addr = Some("127.0.0.12".parse().unwrap());
        let out = build_bootstrap(RENDERED, &o).unwrap();
        // The readiness route's upstream follows the admin listener to the pod's address.
        assert_eq!(
            out["admin"]["address"]["socket_address"]["address"],
            "127.0.0.12"
        );
        let admin = endpoint_address(&out, "envoy-admin");
        assert_eq!(admin["address"], "127.0.0.12");
        assert_eq!(admin["port_value"], 15000);
        // The ADS cluster is the instance Service, not this pod, even when it is on loopback.
        let ads = endpoint_address(&out, ADS_CLUSTER);
        assert_eq!(ads["address"], "127.0.0.1");
        assert_eq!(ads["port_value"], 15010);

        let unchanged = build_bootstrap(RENDERED, &opts()).unwrap();
        assert_eq!(
            endpoint_address(&unchanged, "envoy-admin")["address"],
            "127.0.0.1"
        );
    }

    #[test]
    fn without_loopback_addr_binds_are_unchanged() {
        let out = build_bootstrap(INPUT, &opts()).unwrap();
        assert_eq!(
            out["admin"]["address"]["socket_address"]["address"],
            "127.0.0.1"
        );
        assert!(out["node"]["metadata"].get(LOOPBACK_ADDR_META).is_none());
    }

    #[test]
    fn a_non_mapping_bootstrap_is_an_error_not_a_panic() {
        assert!(matches!(
            build_bootstrap("- just\n- a list\n", &opts()),
            Err(BootstrapError::NotAMapping { .. })
        ));
        assert!(matches!(
            build_bootstrap("node: [1]\n", &opts()),
            Err(BootstrapError::NotAMapping { field: "node" })
        ));
        assert!(matches!(
            build_bootstrap("a: [unclosed\n", &opts()),
            Err(BootstrapError::Parse(_))
        ));
    }

    #[test]
    fn empty_identity_is_an_error() {
        let mut o = opts();
        o.cluster.clear();
        assert!(matches!(
            build_bootstrap(INPUT, &o),
            Err(BootstrapError::EmptyIdentity(_))
        ));
    }
}
