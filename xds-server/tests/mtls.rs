//! Automatic mutual TLS to ServiceEntry endpoints that have a sidecar
//! (`security.meshplane.io/tlsMode: istio`), with the entry's `subjectAltNames` as the only
//! identities the client accepts.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as SocketConfig;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use meshplane_crds::networking::CaptureMode;
use meshplane_xds::model::ProxyNode;
use prost::Message;

mod translate_common;
use translate_common::*;

const NAMESPACES: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: meshplane-acme}
"#;

/// A VM with a sidecar (198.18.7.1) and one without (198.18.7.2) behind one host.
const VMS: &str = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: ServiceEntry
metadata: {name: vms, namespace: shop}
spec:
  hosts: [vms.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9000, name: http, protocol: HTTP}]
  subjectAltNames: [spiffe://cluster.local/ns/vms/sa/legacy]
  endpoints:
    - {address: 198.18.7.1, labels: {security.meshplane.io/tlsMode: istio}}
    - {address: 198.18.7.2}
"#;

fn client(sds: bool) -> ProxyNode {
    let mut node = proxy("shop", &[("app", "client")], CaptureMode::Default);
    node.sds = sds;
    node
}

fn vms_cluster(index: &meshplane_xds::index::TenantIndex, node: &ProxyNode) -> Cluster {
    let clusters: Vec<Cluster> = decode_all(&index.render_proxy(node).clusters);
    clusters
        .into_iter()
        .find(|c| c.name == "outbound|9000||vms.example.com")
        .expect("the entry's cluster")
}

/// Addresses of the cluster's inline endpoints, and whether each is marked meshed.
fn marked(cluster: &Cluster) -> Vec<(String, bool)> {
    cluster
        .load_assignment
        .iter()
        .flat_map(|cla| cla.endpoints.iter())
        .flat_map(|g| g.lb_endpoints.iter())
        .map(|lb| {
            let address = match &lb.host_identifier {
                Some(HostIdentifier::Endpoint(ep)) => addr(&ep.address),
                _ => String::new(),
            };
            (address, lb.metadata.is_some())
        })
        .collect()
}

/// The SNI and the accepted server identities of the cluster's mutual TLS match.
fn mesh_tls(cluster: &Cluster) -> (String, Vec<Option<MatchPattern>>) {
    let socket = cluster
        .transport_socket_matches
        .first()
        .and_then(|m| m.transport_socket.as_ref())
        .and_then(|s| match &s.config_type {
            Some(SocketConfig::TypedConfig(any)) => {
                UpstreamTlsContext::decode(any.value.as_slice()).ok()
            }
            _ => None,
        })
        .expect("an upstream TLS context");
    let Some(ValidationContextType::CombinedValidationContext(validation)) = socket
        .common_tls_context
        .as_ref()
        .and_then(|c| c.validation_context_type.clone())
    else {
        panic!("a combined validation context: {socket:?}");
    };
    let sans = validation
        .default_validation_context
        .iter()
        .flat_map(|v| v.match_typed_subject_alt_names.iter())
        .map(|m| m.matcher.as_ref().and_then(|s| s.match_pattern.clone()))
        .collect();
    (socket.sni, sans)
}

#[test]
fn service_entry_endpoints_with_a_sidecar_get_mutual_tls_checked_against_subject_alt_names() {
    let index = index_with(&[NAMESPACES, VMS]);
    let cluster = vms_cluster(&index, &client(true));
    assert_eq!(
        marked(&cluster),
        [
            ("198.18.7.1:9000".to_string(), true),
            ("198.18.7.2:9000".to_string(), false)
        ]
    );
    assert!(
        cluster.transport_socket.is_none(),
        "plaintext to the VM without a sidecar"
    );
    assert_eq!(cluster.transport_socket_matches.len(), 1, "{cluster:?}");
    let (sni, sans) = mesh_tls(&cluster);
    assert_eq!(sni, "outbound_.9000_._.vms.example.com");
    assert_eq!(
        sans,
        [Some(MatchPattern::Exact(
            "spiffe://cluster.local/ns/vms/sa/legacy".into()
        ))],
        "only the entry's subjectAltNames are accepted, not any identity of the trust domain"
    );

    // A proxy without the agent's secrets keeps plaintext (the marks alone change nothing).
    let plain = vms_cluster(&index, &client(false));
    assert!(plain.transport_socket_matches.is_empty() && plain.transport_socket.is_none());
}

#[test]
fn an_entry_without_meshed_endpoints_stays_plaintext_and_without_san_any_tenant_identity() {
    let unlabelled = VMS.replace(
        "labels: {security.meshplane.io/tlsMode: istio}",
        "labels: {app: vm}",
    );
    let index = index_with(&[NAMESPACES, &unlabelled]);
    let cluster = vms_cluster(&index, &client(true));
    assert!(marked(&cluster).iter().all(|(_, m)| !m), "{cluster:?}");
    assert!(cluster.transport_socket_matches.is_empty());

    let no_sans = VMS.replace(
        "  subjectAltNames: [spiffe://cluster.local/ns/vms/sa/legacy]\n",
        "",
    );
    let index = index_with(&[NAMESPACES, &no_sans]);
    let cluster = vms_cluster(&index, &client(true));
    assert_eq!(
        mesh_tls(&cluster).1,
        [Some(MatchPattern::Prefix("spiffe://cluster.local/".into()))],
        "without subjectAltNames: any identity of the tenant's trust domain"
    );
}
