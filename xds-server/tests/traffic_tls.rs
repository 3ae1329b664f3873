//! DestinationRule `tls` against the tenant's automatic mutual TLS (contract 11): `DISABLE`
//! means never TLS (automatic mutual TLS leaves such clusters alone, as in Istio), and
//! `ISTIO_MUTUAL` is the tenant's mutual TLS with the node agent's SDS secrets, on proxies that
//! hold a workload certificate.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
use envoy_types::pb::envoy::config::core::v3::TransportSocket;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use meshplane_crds::networking::CaptureMode;
use meshplane_xds::index::TenantIndex;
use meshplane_xds::model::ProxyNode;
use prost::Message;

mod translate_common;
use translate_common::*;

/// Service web in shop with two pods, both with a sidecar (the injector's annotation).
/// Addresses in 198.18.0.0/15.
const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: meshplane-acme}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 198.19.0.20
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-v1, namespace: shop, labels: {app: web, version: v1}, annotations: {sidecar.meshplane.io/revision: blue}}
spec: {containers: [{name: app}]}
status: {podIP: 198.18.1.1}
---
apiVersion: v1
kind: Pod
metadata: {name: web-v2, namespace: shop, labels: {app: web, version: v2}, annotations: {sidecar.meshplane.io/revision: blue}}
spec: {containers: [{name: app}]}
status: {podIP: 198.18.1.2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [198.18.1.1]
  conditions: {ready: true}
  targetRef: {kind: Pod, name: web-v1, namespace: shop}
- addresses: [198.18.1.2]
  conditions: {ready: true}
  targetRef: {kind: Pod, name: web-v2, namespace: shop}
"#;

/// The whole host plaintext, except subset v2 (the tenant's mutual TLS with a given server
/// identity) and subset v3 (automatic again: no `tls` of its own, but the rule's DISABLE
/// applies to it too).
const RULE: &str = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: web, namespace: shop}
spec:
  host: web
  trafficPolicy:
    tls: {mode: DISABLE}
  subsets:
  - {name: v1, labels: {version: v1}}
  - name: v2
    labels: {version: v2}
    trafficPolicy:
      tls: {mode: ISTIO_MUTUAL, subjectAltNames: ["spiffe://acme.meshplane.local/ns/shop/sa/web"]}
"#;

const WEB: &str = "outbound|80||web.shop.svc.cluster.local";
const WEB_V1: &str = "outbound|80|v1|web.shop.svc.cluster.local";
const WEB_V2: &str = "outbound|80|v2|web.shop.svc.cluster.local";

fn client(sds: bool) -> ProxyNode {
    let mut node = proxy("shop", &[("app", "client")], CaptureMode::Default);
    node.sds = sds;
    node
}

fn clusters(index: &TenantIndex, node: &ProxyNode) -> Vec<Cluster> {
    decode_all(&index.render(node).clusters)
}

fn cluster<'a>(clusters: &'a [Cluster], name: &str) -> &'a Cluster {
    clusters
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no cluster {name}"))
}

fn socket_name(socket: &Option<TransportSocket>) -> Option<&str> {
    socket.as_ref().map(|s| s.name.as_str())
}

fn upstream_tls(socket: &TransportSocket) -> UpstreamTlsContext {
    match &socket.config_type {
        Some(ConfigType::TypedConfig(any)) => {
            UpstreamTlsContext::decode(any.value.as_slice()).expect("an UpstreamTlsContext")
        }
        other => panic!("no typed config: {other:?}"),
    }
}

#[test]
fn without_a_rule_sidecars_originate_mutual_tls_to_meshed_endpoints() {
    let index = index_with(&[MESH]);
    let got = clusters(&index, &client(true));
    let web = cluster(&got, WEB);
    assert_eq!(socket_name(&web.transport_socket), None);
    assert_eq!(web.transport_socket_matches.len(), 1, "{web:?}");
}

#[test]
fn disable_is_never_tls_even_to_meshed_endpoints() {
    let index = index_with(&[MESH, RULE]);
    let got = clusters(&index, &client(true));
    for name in [WEB, WEB_V1] {
        let c = cluster(&got, name);
        assert_eq!(
            socket_name(&c.transport_socket),
            Some("envoy.transport_sockets.raw_buffer"),
            "{name} is explicitly plaintext"
        );
        assert!(
            c.transport_socket_matches.is_empty(),
            "automatic mutual TLS leaves {name} alone: {:?}",
            c.transport_socket_matches
        );
    }
}

#[test]
fn istio_mutual_uses_the_workload_certificate_and_checks_the_named_server() {
    let index = index_with(&[MESH, RULE]);
    let got = clusters(&index, &client(true));
    let v2 = cluster(&got, WEB_V2);
    assert!(v2.transport_socket_matches.is_empty(), "{v2:?}");
    let socket = v2.transport_socket.as_ref().expect("a TLS transport");
    assert_eq!(socket.name, "envoy.transport_sockets.tls");
    let tls = upstream_tls(socket);
    assert_eq!(tls.sni, "outbound_.80_.v2_.web.shop.svc.cluster.local");
    let common = tls.common_tls_context.expect("common context");
    let certs: Vec<&str> = common
        .tls_certificate_sds_secret_configs
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(certs, ["default"], "the node agent's workload certificate");
    let Some(ValidationContextType::CombinedValidationContext(combined)) =
        &common.validation_context_type
    else {
        panic!("validation against the tenant's bundle: {common:?}");
    };
    assert_eq!(
        combined
            .validation_context_sds_secret_config
            .as_ref()
            .map(|s| s.name.as_str()),
        Some("ROOTCA")
    );
    let sans = format!("{:?}", combined.default_validation_context);
    assert!(
        sans.contains("spiffe://acme.meshplane.local/ns/shop/sa/web"),
        "the rule's subjectAltNames are the identities accepted: {sans}"
    );
    assert!(
        common.alpn_protocols.iter().any(|p| p == "istio"),
        "the mesh ALPN, which PERMISSIVE servers route to their mutual TLS chain: {:?}",
        common.alpn_protocols
    );
}

#[test]
fn a_proxy_without_a_workload_certificate_gets_no_mesh_tls_context() {
    // Without the node agent's secrets (a proxyless gRPC client, or any proxy that does not
    // announce SDS) a TLS context would never warm; the cluster stays plaintext (a STRICT
    // server refuses it, which docs/traffic.md says).
    let index = index_with(&[MESH, RULE]);
    let got = clusters(&index, &client(false));
    let v2 = cluster(&got, WEB_V2);
    assert_eq!(socket_name(&v2.transport_socket), None, "{v2:?}");
    assert!(v2.transport_socket_matches.is_empty());
}

#[test]
fn the_verdict_accepts_istio_mutual() {
    let index = index_with(&[MESH, RULE]);
    let verdicts = index.diagnostics();
    let (_, findings) = verdicts
        .objects
        .get(&meshplane_xds::translate::diagnostics::ConfigRef {
            kind: meshplane_xds::translate::diagnostics::ConfigKind::DestinationRule,
            namespace: "shop".into(),
            name: "web".into(),
        })
        .expect("a verdict on the rule");
    assert!(findings.is_empty(), "{findings:?}");
}

#[test]
fn subset_clusters_get_automatic_mutual_tls_too() {
    let subsets = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: web, namespace: shop}
spec:
  host: web
  subsets:
  - {name: v1, labels: {version: v1}}
"#;
    let index = index_with(&[MESH, subsets]);
    let config = index.render(&client(true));
    let got: Vec<Cluster> = decode_all(&config.clusters);
    let v1 = cluster(&got, WEB_V1);
    assert_eq!(v1.transport_socket_matches.len(), 1, "{v1:?}");
    let endpoints: Vec<envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment> =
        decode_all(&config.endpoints);
    let cla = endpoints
        .iter()
        .find(|c| c.cluster_name == WEB_V1)
        .expect("v1 endpoints");
    let marked: Vec<bool> = cla
        .endpoints
        .iter()
        .flat_map(|g| g.lb_endpoints.iter())
        .map(|lb| lb.metadata.is_some())
        .collect();
    assert_eq!(marked, [true], "the meshed v1 pod is marked");
}

#[test]
fn subset_endpoints_arriving_later_are_marked_as_in_a_full_render() {
    // The config is rendered (and cached) before web's pods and slice exist; they arrive as
    // endpoint-only changes, which patch the cached subset assignment.
    let (before, after) = MESH
        .split_once("---\napiVersion: v1\nkind: Pod")
        .expect("the pods follow the Service");
    let after = format!("apiVersion: v1\nkind: Pod{after}");
    let subsets = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: web, namespace: shop}
spec:
  host: web
  subsets:
  - {name: v1, labels: {version: v1}}
"#;
    let mut index = index_with(&[before, subsets]);
    let node = client(true);
    let _ = index.render(&node);
    for obj in meshplane_xds::source_dir::objects_from_yaml("later.yaml", &after) {
        index.apply(meshplane_xds::model::SourceEvent::Upsert(obj));
    }
    let patched = index.render(&node);
    let full = index_with(&[MESH, subsets]).render(&node);
    let v1 = |config: &meshplane_xds::model::ProxyConfig| {
        let endpoints: Vec<envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment> =
            decode_all(&config.endpoints);
        endpoints
            .into_iter()
            .find(|c| c.cluster_name == WEB_V1)
            .expect("v1 endpoints")
    };
    assert_eq!(v1(&patched), v1(&full));
    assert!(
        v1(&patched)
            .endpoints
            .iter()
            .flat_map(|g| g.lb_endpoints.iter())
            .all(|lb| lb.metadata.is_some()),
        "{:?}",
        v1(&patched)
    );
}
