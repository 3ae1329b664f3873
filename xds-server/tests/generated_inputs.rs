//! Generated-input tests of the instance's input surfaces: what a proxy
//! sends on an ADS stream (its node, then requests in any order), and EnvoyFilter patches
//! applied to a proxy's translated resources. 10,000 inputs per property; no input panics the
//! server, every refusal is an error that says what is wrong (within the bounds of
//! `meshplane_xds::bounds`), and a patch that cannot apply changes nothing.

mod translate_common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::OnceLock;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
use meshplane_contracts::node::{meta, NodeId};
use meshplane_crds::networking::EnvoyFilter;
use meshplane_xds::ads::protocol::{Protocol, RequestOutcome, StreamState};
use meshplane_xds::ads::snapshot::Snapshot;
use meshplane_xds::bounds;
use meshplane_xds::envoyfilter;
use meshplane_xds::model::{type_url, ProxyConfig, ProxyKind};
use meshplane_xds::tenancy::parse_node;
use meshplane_xds::translate::{self, Translated};
use proptest::prelude::*;
use serde_json::{json, Value};
use translate_common::{index_with, web_proxy};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 10_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A small mesh: one member namespace with an HTTP and a TCP service, one pod each.
const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 198.19.0.10, selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {clusterIP: 198.19.0.11, selector: {app: db}, ports: [{name: tcp-pg, port: 5432}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop, labels: {app: web}}
spec: {containers: [{name: app, image: web, ports: [{containerPort: 8080}]}]}
status: {podIP: 198.18.1.1, phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, namespace: shop, labels: {app: db}}
spec: {containers: [{name: app, image: db}]}
status: {podIP: 198.18.1.2, phase: Running}
"#;

/// The web proxy's translated resources and its encoded configuration, rendered once.
fn rendered() -> &'static (Translated, ProxyConfig) {
    static RENDERED: OnceLock<(Translated, ProxyConfig)> = OnceLock::new();
    RENDERED.get_or_init(|| {
        let index = index_with(&[MESH]);
        let translated = translate::translate(index.registry(), &web_proxy());
        (translated, index.render_checked(&web_proxy()).0)
    })
}

// ---------- the node a proxy claims ----------

fn string_value(s: &str) -> PbValue {
    PbValue {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// A node id part: a valid one or one of the ways real clients get it wrong.
fn id_part(
    valid: &'static [&'static str],
    broken: &'static [&'static str],
) -> impl Strategy<Value = (String, bool)> {
    prop_oneof![
        3 => prop::sample::select(valid).prop_map(|s| (s.to_string(), true)),
        1 => prop::sample::select(broken).prop_map(|s| (s.to_string(), false)),
    ]
}

#[derive(Clone, Debug)]
struct ClaimedNode {
    node: Node,
    /// Whether the id is well formed, as the generator built it.
    id_valid: bool,
    /// The namespace and pod the id names (when valid).
    namespace: String,
    pod: String,
    /// Whether the metadata contradicts the id or names another tenant.
    contradicts: bool,
}

fn claimed_node() -> impl Strategy<Value = ClaimedNode> {
    let structured = (
        id_part(
            &["sidecar", "router"],
            &["", "Sidecar", "gateway", "sidecar "],
        ),
        id_part(
            &["198.18.1.1", "198.19.0.2", "::1", "2001:db8::5"],
            &["", "198.18.1", "198.18.1.300", "localhost", "$(POD_IP)"],
        ),
        id_part(
            &["web-1", "db-0", "a.b-c"],
            &["", "-web", "Web", "web_1", "$(POD_NAME)"],
        ),
        id_part(&["shop", "pay", "garden"], &["", "Shop", "shop.x", "-shop"]),
        id_part(
            &["cluster.local", "corp.example"],
            &["", "Cluster.Local", "a..b"],
        ),
        any::<bool>(),
    )
        .prop_map(
            |((kind, k), (ip, i), (pod, p), (ns, n), (domain, d), same_ns)| {
                // The third part must repeat the namespace of the fourth; a mismatch is invalid.
                let pod_ns = if same_ns {
                    ns.clone()
                } else {
                    format!("{ns}x")
                };
                let id = format!("{kind}~{ip}~{pod}.{pod_ns}~{ns}.svc.{domain}");
                (id, k && i && p && n && d && same_ns, ns, pod)
            },
        );
    let free = "\\PC{0,80}".prop_map(|id| (id, false, String::new(), String::new()));
    let oversized = (1usize..4).prop_map(|k| {
        (
            "~".repeat(bounds::MAX_NODE_ID * k + 1),
            false,
            String::new(),
            String::new(),
        )
    });
    let metadata = prop::collection::vec(
        (
            prop::sample::select(vec![
                meta::NAMESPACE,
                meta::POD_NAME,
                meta::TENANT,
                meta::CAPTURE_MODE,
                meta::LOOPBACK_ADDR,
                "GENERATOR",
                "OTHER",
            ]),
            prop_oneof![
                Just(None),
                prop::sample::select(vec![
                    "shop", "pay", "web-1", "blue", "green", "grpc", "NONE", "IPTABLES", "", "x"
                ])
                .prop_map(Some)
            ],
        ),
        0..4,
    );
    (
        prop_oneof![6 => structured, 2 => free, 1 => oversized],
        metadata,
        "\\PC{0,20}",
    )
        .prop_map(|((id, id_valid, namespace, pod), metadata, cluster)| {
            let mut fields = BTreeMap::new();
            let mut contradicts = false;
            let mut seen = HashMap::new();
            for (key, value) in metadata {
                match value {
                    Some(v) => {
                        seen.insert(key, v);
                    }
                    None => {
                        seen.remove(key);
                    }
                }
            }
            for (key, v) in &seen {
                fields.insert(key.to_string(), string_value(v));
                // An empty metadata value counts as absent.
                if v.is_empty() {
                    continue;
                }
                contradicts |= match *key {
                    k if k == meta::NAMESPACE => *v != namespace,
                    k if k == meta::POD_NAME => *v != pod,
                    k if k == meta::TENANT => *v != "blue",
                    _ => false,
                };
            }
            ClaimedNode {
                node: Node {
                    id,
                    cluster,
                    metadata: Some(Struct {
                        fields: fields.into_iter().collect(),
                    }),
                    ..Node::default()
                },
                id_valid,
                namespace,
                pod,
                contradicts,
            }
        })
}

// ---------- requests on a stream ----------

#[derive(Clone, Debug)]
enum Step {
    /// A request for one type; `nonce`/`version` pick an earlier response's (by index) or are
    /// made up.
    Request {
        type_url: usize,
        nonce: Option<usize>,
        made_up: String,
        names: Vec<String>,
        error: Option<String>,
    },
    /// The server writes what is due.
    Respond,
}

const TYPES: [&str; 6] = [
    type_url::CLUSTER,
    type_url::ENDPOINT,
    type_url::LISTENER,
    type_url::ROUTE,
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
    "",
];

fn step() -> impl Strategy<Value = Step> {
    let names = prop::collection::vec(
        prop::sample::select(vec![
            "*",
            "outbound|80||web.shop.svc.cluster.local",
            "80",
            "virtualInbound",
            "nope",
            "",
        ])
        .prop_map(String::from),
        0..3,
    );
    prop_oneof![
        3 => (0..TYPES.len(), prop::option::of(0usize..8), "\\PC{0,8}", names, prop::option::of("\\PC{0,30}"))
            .prop_map(|(type_url, nonce, made_up, names, error)| Step::Request { type_url, nonce, made_up, names, error }),
        2 => Just(Step::Respond),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// The node check: a node is admitted exactly when its id is well formed and its metadata
    /// agrees with the id and the tenant; a refusal is the gRPC status a client can read,
    /// bounded in size whatever the node held.
    #[test]
    fn claimed_nodes_are_admitted_only_when_consistent(claim in claimed_node()) {
        match parse_node(Some(&claim.node), "blue") {
            Ok(proxy) => {
                prop_assert!(claim.id_valid && !claim.contradicts, "admitted {:?}", claim);
                prop_assert_eq!(&proxy.namespace, &claim.namespace);
                prop_assert_eq!(proxy.pod_name.as_deref(), Some(claim.pod.as_str()));
                prop_assert!(proxy.labels.is_empty(), "labels come from the Pod, never the node");
                let id = NodeId::parse(&proxy.id);
                prop_assert!(id.is_ok(), "{:?}", id);
            }
            Err(e) => {
                prop_assert!(!claim.id_valid || claim.contradicts, "refused {:?}: {}", claim, e);
                let status = e.to_status();
                prop_assert!(matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::PermissionDenied), "{:?}", status);
                prop_assert!(!status.message().is_empty());
                prop_assert!(status.message().len() <= bounds::STATUS_MESSAGE + 4, "{} bytes", status.message().len());
            }
        }
    }

    /// Any sequence of requests, state of the world or delta, with made-up or replayed nonces,
    /// unknown types and NACKs: no panic; unknown types are named as such; responses go only to
    /// types the proxy asked for, each with a fresh nonce.
    #[test]
    fn request_sequences_never_confuse_a_stream(delta in any::<bool>(), steps in prop::collection::vec(step(), 1..24)) {
        let (_, config) = rendered();
        let snapshot = Snapshot::new(config, Instant::now());
        let mut state = StreamState::new(if delta { Protocol::Delta } else { Protocol::Sotw });
        let mut sent: Vec<(String, String)> = Vec::new();
        let mut nonces = HashSet::new();
        let mut requested = HashSet::new();
        for step in steps {
            match step {
                Step::Request { type_url, nonce, made_up, names, error } => {
                    let url = TYPES[type_url];
                    let (nonce, version) = match nonce.and_then(|i| sent.get(i)) {
                        Some((n, v)) => (n.clone(), v.clone()),
                        None => (made_up.clone(), made_up),
                    };
                    let outcome = if delta {
                        let initial: HashMap<String, String> = names.iter().map(|n| (n.clone(), version.clone())).collect();
                        state.on_delta_request(url, &nonce, &names, &[], &initial, error.as_deref())
                    } else {
                        state.on_sotw_request(url, &nonce, &version, &names, error.as_deref())
                    };
                    if type_url >= 4 {
                        prop_assert!(matches!(outcome, RequestOutcome::UnknownType(ref u) if u == url), "{:?}", outcome);
                    } else {
                        requested.insert(url);
                    }
                }
                Step::Respond => {
                    for out in state.next_responses(&snapshot) {
                        prop_assert!(requested.contains(out.type_url), "{} was never requested", out.type_url);
                        prop_assert!(nonces.insert(out.nonce.clone()), "nonce {} reused", out.nonce);
                        prop_assert!(out.resources.iter().all(|r| r.type_url == out.type_url));
                        sent.push((out.nonce, out.version));
                    }
                }
            }
        }
    }
}

// ---------- EnvoyFilter patches ----------

/// Patch values: fragments of real Envoy messages, and random JSON with their field names.
fn patch_value() -> impl Strategy<Value = Value> {
    let fragments = prop::sample::select(vec![
        json!({"name": "extra", "type": "STATIC", "connectTimeout": "1s"}),
        json!({"connectTimeout": "2s"}),
        json!({"type": "STRICT_DNS"}),
        json!({"name": "extra", "address": {"socketAddress": {"address": "127.0.0.1", "portValue": 9999}}}),
        json!({"name": "envoy.filters.http.fault", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault", "abort": {"httpStatus": 503, "percentage": {"numerator": 1}}}}),
        json!({"name": "envoy.filters.http.buffer", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "maxRequestBytes": 1024}}),
        json!({"name": "x", "typedConfig": {"@type": "type.googleapis.com/does.not.Exist"}}),
        json!({"name": "x", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "maxRequestBytes": "lots"}}),
        json!({"filterChainMatch": {"destinationPort": 80}, "filters": []}),
        json!({"name": "vh", "domains": ["*"], "routes": []}),
        json!({"virtualHosts": [{"name": "vh", "domains": ["a"]}]}),
        json!({"typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager", "statPrefix": "x"}}),
        json!("not an object"),
        json!(42),
        json!(null),
        json!({"@type": 7}),
    ]);
    let leaf = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "\\PC{0,10}".prop_map(Value::String),
    ];
    let random = leaf.prop_recursive(3, 16, 4, |inner| {
        prop::collection::btree_map(
            prop::sample::select(vec![
                "name",
                "type",
                "connectTimeout",
                "typedConfig",
                "@type",
                "address",
                "filters",
                "domains",
                "routes",
                "lbPolicy",
                "x",
            ])
            .prop_map(String::from),
            inner,
            0..4,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect()))
    });
    prop_oneof![3 => fragments, 1 => random]
}

fn config_patch() -> impl Strategy<Value = Value> {
    let apply_to = prop::sample::select(vec![
        "CLUSTER",
        "LISTENER",
        "ROUTE_CONFIGURATION",
        "FILTER_CHAIN",
        "VIRTUAL_HOST",
        "NETWORK_FILTER",
        "HTTP_FILTER",
        "HTTP_ROUTE",
        "EXTENSION_CONFIG",
        "BOGUS",
    ]);
    let operation = prop::sample::select(vec![
        "ADD",
        "MERGE",
        "REMOVE",
        "REPLACE",
        "INSERT_BEFORE",
        "INSERT_AFTER",
        "INSERT_FIRST",
        "INVALID",
        "",
    ]);
    let context = prop::option::of(prop::sample::select(vec![
        "ANY",
        "SIDECAR_INBOUND",
        "SIDECAR_OUTBOUND",
        "GATEWAY",
    ]));
    let port = prop::option::of(prop::sample::select(vec![
        80u32, 5432, 8080, 15006, 0, 70_000,
    ]));
    let name = prop::option::of(prop::sample::select(vec![
        "virtualInbound",
        "virtualOutbound",
        "0.0.0.0_80",
        "outbound|80||web.shop.svc.cluster.local",
        "80",
        "envoy.filters.network.http_connection_manager",
        "envoy.filters.http.router",
        "envoy.filters.network.tcp_proxy",
        "nope",
    ]));
    (apply_to, operation, context, port, name.clone(), name, patch_value()).prop_map(
        |(apply_to, operation, context, port, name, sub, value)| {
            let mut m = serde_json::Map::new();
            if let Some(c) = context {
                m.insert("context".into(), json!(c));
            }
            let target = match apply_to {
                "CLUSTER" => json!({"cluster": {"portNumber": port, "name": name}}),
                "ROUTE_CONFIGURATION" | "VIRTUAL_HOST" | "HTTP_ROUTE" => {
                    json!({"routeConfiguration": {"portNumber": port, "name": name, "vhost": {"name": sub}}})
                }
                _ => json!({"listener": {"portNumber": port, "name": name, "filterChain": {"filter": {"name": name, "subFilter": {"name": sub}}}}}),
            };
            if let Value::Object(t) = target {
                for (k, v) in t {
                    m.insert(k, strip_nulls(v));
                }
            }
            json!({"applyTo": apply_to, "match": m, "patch": {"operation": operation, "value": value}})
        },
    )
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

proptest! {
    #![proptest_config(config())]

    /// Random EnvoyFilters on a real translation: never a panic; each failed patch is reported
    /// with its index and a reason; when every patch fails, the resources are exactly as
    /// translated (a patch that cannot apply is skipped whole, never half applied).
    #[test]
    fn envoy_filter_patches_apply_whole_or_not_at_all(patches in prop::collection::vec(config_patch(), 1..4)) {
        let filter = json!({
            "apiVersion": "networking.meshplane.io/v1alpha1",
            "kind": "EnvoyFilter",
            "metadata": {"name": "generated", "namespace": "shop"},
            "spec": {"configPatches": patches},
        });
        let filter: EnvoyFilter = match serde_json::from_value(filter) {
            Ok(f) => f,
            Err(e) => {
                // Refused when read (the schema and the directory source say the same).
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        let (base, _) = rendered();
        let mut out = base.clone();
        let errors = envoyfilter::apply(&[&filter], ProxyKind::Sidecar, &mut out);
        for e in &errors {
            prop_assert!(e.index < patches.len(), "{:?}", e);
            prop_assert!(!e.reason.trim().is_empty(), "{:?}", e);
        }
        let failed: HashSet<usize> = errors.iter().map(|e| e.index).collect();
        if failed.len() == patches.len() {
            prop_assert!(out == *base, "every patch failed ({:?}) yet the resources changed", errors);
        }
    }
}

/// Subscribed and unsubscribed names, initial versions, nonce and version of a request.
type RequestFields = (
    Vec<String>,
    Vec<String>,
    Vec<(String, String)>,
    String,
    String,
);

/// A SotW or delta request with generated names, locators, versions and nonce.
fn request_fields() -> impl Strategy<Value = RequestFields> {
    let name = "[a-z0-9./_-]{0,40}";
    (
        prop::collection::vec(name, 0..40),
        prop::collection::vec(name, 0..40),
        prop::collection::vec((name, "[0-9a-f]{0,16}"), 0..40),
        "[ -~]{0,64}",
        "[ -~]{0,64}",
    )
}

proptest! {
    #![proptest_config(config())]

    /// The budget counts a request from its encoding, before it is decoded: whatever the bytes,
    /// the scan never panics, and wherever the decoder also reads them, both count the same
    /// names, versions and nonce (so nothing a decoded request would hold escapes the budget).
    #[test]
    fn the_request_scan_agrees_with_the_decoder(
        (subscribe, unsubscribe, versions, nonce, version) in request_fields(),
        noise in prop::collection::vec(any::<u8>(), 0..64),
        cut in any::<prop::sample::Index>(),
    ) {
        use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
        use meshplane_xds::ads::budget::scan;
        use prost::Message;
        let sotw = DiscoveryRequest {
            resource_names: subscribe.clone(),
            response_nonce: nonce.clone(),
            version_info: version.clone(),
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        };
        let delta = DeltaDiscoveryRequest {
            resource_names_subscribe: subscribe.clone(),
            resource_names_unsubscribe: unsubscribe.clone(),
            initial_resource_versions: versions.iter().cloned().collect::<HashMap<_, _>>(),
            response_nonce: nonce.clone(),
            type_url: type_url::CLUSTER.into(),
            ..Default::default()
        };
        let encoded_sotw = sotw.encode_to_vec();
        let s = scan(Protocol::Sotw, &encoded_sotw).expect("a request scans");
        prop_assert_eq!(s.subscribe, subscribe.len());
        prop_assert_eq!(s.nonce, nonce.len());
        prop_assert_eq!(s.version_info, version.len());
        let encoded_delta = delta.encode_to_vec();
        let d = scan(Protocol::Delta, &encoded_delta).expect("a request scans");
        prop_assert_eq!(d.subscribe, subscribe.len());
        prop_assert_eq!(d.unsubscribe, unsubscribe.len());
        prop_assert_eq!(d.initial_versions, delta.initial_resource_versions.len());
        // Cut and noised encodings: never a panic; where both read them, both agree.
        for (protocol, encoded) in [(Protocol::Sotw, encoded_sotw), (Protocol::Delta, encoded_delta)] {
            let mut bytes = encoded[..cut.index(encoded.len() + 1)].to_vec();
            bytes.extend_from_slice(&noise);
            let scanned = scan(protocol, &bytes);
            match protocol {
                Protocol::Sotw => {
                    if let (Some(s), Ok(r)) = (scanned, DiscoveryRequest::decode(bytes.as_slice())) {
                        prop_assert_eq!(s.subscribe, r.resource_names.len() + r.resource_locators.len());
                        prop_assert_eq!(s.nonce, r.response_nonce.len());
                    }
                }
                Protocol::Delta => {
                    if let (Some(s), Ok(r)) = (scanned, DeltaDiscoveryRequest::decode(bytes.as_slice())) {
                        prop_assert_eq!(
                            s.subscribe,
                            r.resource_names_subscribe.len() + r.resource_locators_subscribe.len()
                        );
                        prop_assert!(s.initial_versions >= r.initial_resource_versions.len());
                    }
                }
            }
        }
    }

    /// Directory mode reads manifests someone may still be writing: any text (a manifest cut
    /// at any byte, with garbage after it, or garbage alone) decodes without a panic, every
    /// problem is said in bounded words, and what a cut manifest yields is the file's own
    /// objects: each one read before the cut exactly as in the whole file, the last one at
    /// least under its own name (never an object the file does not hold).
    #[test]
    fn a_cut_or_garbled_manifest_never_invents_objects(
        cut in any::<prop::sample::Index>(),
        garbage in "[ -~\n\t]{0,80}",
    ) {
        use meshplane_xds::source_dir::read_manifest;
        let whole = read_manifest(MESH);
        prop_assert!(whole.problems.is_empty(), "{:?}", whole.problems);
        let at = cut.index(MESH.len() + 1);
        let read = read_manifest(&MESH[..at]);
        prop_assert!(read.objects.len() <= whole.objects.len());
        for (i, object) in read.objects.iter().enumerate() {
            prop_assert_eq!(object.key(), whole.objects[i].key());
            if i + 1 < read.objects.len() {
                prop_assert_eq!(format!("{object:?}"), format!("{:?}", whole.objects[i]));
            }
        }
        for text in [format!("{}{garbage}", &MESH[..at]), garbage.clone()] {
            for p in read_manifest(&text).problems {
                prop_assert!(!p.is_empty());
                prop_assert!(p.len() <= 4 * bounds::ECHO + 256, "{}", p);
            }
        }
    }
}
