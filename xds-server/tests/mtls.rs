//! Automatic mutual TLS to ServiceEntry endpoints that have a sidecar
//! (`security.meshplane.io/tlsMode: istio`), with the entry's `subjectAltNames` as the only
//! identities the client accepts; to Kubernetes Services, with the ServiceAccounts of the meshed
//! pods behind them as the only identities, re-rendered when that set changes and only then.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as SocketConfig;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::MeshConfig;
use meshplane_xds::index::{ChangeKind, TenantIndex};
use meshplane_xds::model::{ProxyNode, SourceEvent};
use meshplane_xds::source_dir::objects_from_yaml;
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
  subjectAltNames: [spiffe://acme.meshplane.local/ns/vms/sa/legacy]
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
    let clusters: Vec<Cluster> = decode_all(&index.render(node).clusters);
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
            "spiffe://acme.meshplane.local/ns/vms/sa/legacy".into()
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
        "  subjectAltNames: [spiffe://acme.meshplane.local/ns/vms/sa/legacy]\n",
        "",
    );
    let index = index_with(&[NAMESPACES, &no_sans]);
    let cluster = vms_cluster(&index, &client(true));
    assert_eq!(
        mesh_tls(&cluster).1,
        [Some(MatchPattern::Prefix(
            "spiffe://acme.meshplane.local/".into()
        ))],
        "without subjectAltNames: any identity of the tenant's trust domain"
    );
}

/// `orders` in shop: two meshed pods of ServiceAccount `orders`, a meshed `admin` pod and a
/// `legacy` pod without a sidecar; the slice starts with the first pod only.
const ORDERS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: orders, namespace: shop}
spec:
  clusterIP: 198.19.3.10
  selector: {app: orders}
  ports: [{name: http, port: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: orders-a, namespace: shop, labels: {app: orders}, annotations: {sidecar.meshplane.io/revision: blue}}
spec: {serviceAccountName: orders, containers: [{name: app}]}
status: {podIP: 198.18.3.1}
---
apiVersion: v1
kind: Pod
metadata: {name: orders-b, namespace: shop, labels: {app: orders}, annotations: {sidecar.meshplane.io/revision: blue}}
spec: {serviceAccountName: orders, containers: [{name: app}]}
status: {podIP: 198.18.3.2}
---
apiVersion: v1
kind: Pod
metadata: {name: orders-legacy, namespace: shop, labels: {app: orders}}
spec: {serviceAccountName: legacy, containers: [{name: app}]}
status: {podIP: 198.18.3.3}
---
apiVersion: v1
kind: Pod
metadata: {name: orders-admin, namespace: shop, labels: {app: orders}, annotations: {sidecar.meshplane.io/revision: blue}}
spec: {serviceAccountName: admin, containers: [{name: app}]}
status: {podIP: 198.18.3.4}
"#;

fn orders_slice(addresses: &[&str]) -> String {
    let endpoints: String = addresses
        .iter()
        .map(|a| format!("- {{addresses: [{a}]}}\n"))
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: orders-1, namespace: shop, labels: {{kubernetes.io/service-name: orders}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n{endpoints}"
    )
}

/// One watch event per object, as the Kubernetes source delivers a change (no resync).
fn upsert(index: &mut TenantIndex, yaml: &str) -> ChangeKind {
    let mut change = meshplane_xds::index::Change::default();
    for obj in objects_from_yaml("event.yaml", yaml) {
        change.merge(index.apply(SourceEvent::Upsert(obj)));
    }
    change.kind
}

fn orders_identities(index: &TenantIndex) -> Vec<Option<MatchPattern>> {
    let clusters: Vec<Cluster> = decode_all(&index.render(&client(true)).clusters);
    let cluster = clusters
        .into_iter()
        .find(|c| c.name == "outbound|8080||orders.shop.svc.cluster.local")
        .expect("the Service's cluster");
    mesh_tls(&cluster).1
}

fn exact(ids: &[&str]) -> Vec<Option<MatchPattern>> {
    ids.iter()
        .map(|id| {
            Some(MatchPattern::Exact(format!(
                "spiffe://acme.meshplane.local/ns/shop/sa/{id}"
            )))
        })
        .collect()
}

#[test]
fn a_service_s_servers_must_prove_the_accounts_behind_it_and_the_list_moves_with_the_set() {
    let mut index = index_with(&[NAMESPACES, ORDERS, &orders_slice(&["198.18.3.1"])]);
    assert_eq!(
        orders_identities(&index),
        exact(&["orders"]),
        "only the ServiceAccount of the pod behind the Service, not any identity of the trust domain"
    );

    // Another pod of the same account, and one without a sidecar: endpoints only.
    for addresses in [
        &["198.18.3.1", "198.18.3.2"][..],
        &["198.18.3.1", "198.18.3.2", "198.18.3.3"][..],
    ] {
        assert_eq!(
            upsert(&mut index, &orders_slice(addresses)),
            ChangeKind::Endpoints,
            "{addresses:?}: the set of accounts did not change"
        );
        assert_eq!(orders_identities(&index), exact(&["orders"]));
    }

    // A meshed pod of another account joins: the clusters change, and accept it too.
    assert_eq!(
        upsert(
            &mut index,
            &orders_slice(&["198.18.3.1", "198.18.3.2", "198.18.3.3", "198.18.3.4"])
        ),
        ChangeKind::Config
    );
    assert_eq!(orders_identities(&index), exact(&["admin", "orders"]));

    // It leaves: back to the one account, again as a configuration change.
    assert_eq!(
        upsert(&mut index, &orders_slice(&["198.18.3.1", "198.18.3.2"])),
        ChangeKind::Config
    );
    assert_eq!(orders_identities(&index), exact(&["orders"]));

    // A full rebuild (a relist) arrives at the same list.
    let rebuilt = index_with(&[
        NAMESPACES,
        ORDERS,
        &orders_slice(&["198.18.3.1", "198.18.3.2"]),
    ]);
    assert_eq!(orders_identities(&rebuilt), exact(&["orders"]));
}

#[test]
fn a_pod_that_gains_its_sidecar_adds_its_account() {
    let unmeshed = ORDERS.replace(
        "metadata: {name: orders-admin, namespace: shop, labels: {app: orders}, annotations: {sidecar.meshplane.io/revision: blue}}",
        "metadata: {name: orders-admin, namespace: shop, labels: {app: orders}}",
    );
    let mut index = index_with(&[
        NAMESPACES,
        &unmeshed,
        &orders_slice(&["198.18.3.1", "198.18.3.4"]),
    ]);
    assert_eq!(orders_identities(&index), exact(&["orders"]));
    let admin_meshed = ORDERS
        .split("---")
        .find(|d| d.contains("orders-admin"))
        .expect("the admin pod");
    assert_eq!(upsert(&mut index, admin_meshed), ChangeKind::Config);
    assert_eq!(orders_identities(&index), exact(&["admin", "orders"]));
}

/// web in shop under STRICT mutual TLS.
const STRICT_WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 198.19.0.10
  selector: {app: web}
  ports: [{name: http, port: 8080}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: PeerAuthentication
metadata: {name: default, namespace: shop}
spec: {mtls: {mode: STRICT}}
"#;

/// The client identities web's inbound mutual TLS chains accept.
fn inbound_identities(index: &TenantIndex) -> Vec<Option<MatchPattern>> {
    let mut node = proxy("shop", &[("app", "web")], CaptureMode::Default);
    node.sds = true;
    let listeners: Vec<Listener> = decode_all(&index.render(&node).listeners);
    let contexts: Vec<DownstreamTlsContext> = listeners
        .iter()
        .filter(|l| l.name == "virtualInbound")
        .flat_map(|l| l.filter_chains.iter())
        .filter_map(
            |c| match c.transport_socket.as_ref()?.config_type.as_ref()? {
                SocketConfig::TypedConfig(any) => {
                    DownstreamTlsContext::decode(any.value.as_slice()).ok()
                }
            },
        )
        .collect();
    assert!(!contexts.is_empty(), "STRICT gives web mutual TLS chains");
    let mut sans = Vec::new();
    for ctx in contexts {
        assert_eq!(ctx.require_client_certificate.map(|b| b.value), Some(true));
        let Some(ValidationContextType::CombinedValidationContext(v)) = ctx
            .common_tls_context
            .and_then(|c| c.validation_context_type)
        else {
            panic!("a combined validation context");
        };
        sans.extend(
            v.default_validation_context
                .iter()
                .flat_map(|d| d.match_typed_subject_alt_names.iter())
                .map(|m| m.matcher.as_ref().and_then(|s| s.match_pattern.clone())),
        );
    }
    sans.dedup();
    sans
}

#[test]
fn inbound_mutual_tls_accepts_only_the_tenants_own_trust_domain() {
    // Two tenants that set no trust domain, e.g. with CAs under one organisation root.
    let acme = index_with(&[NAMESPACES, STRICT_WEB]);
    let mut red = TenantIndex::new("red", REVISION, CONTROL_NS, MeshConfig::default());
    feed(&mut red, &[NAMESPACES, STRICT_WEB]);
    assert_eq!(
        inbound_identities(&acme),
        [Some(MatchPattern::Prefix(
            "spiffe://acme.meshplane.local/".into()
        ))]
    );
    assert_eq!(
        inbound_identities(&red),
        [Some(MatchPattern::Prefix(
            "spiffe://red.meshplane.local/".into()
        ))],
        "each tenant accepts its own trust domain only, never the other's"
    );
    // A trust domain the tenant sets is the one bound.
    let mut org = TenantIndex::new(
        TENANT,
        REVISION,
        CONTROL_NS,
        MeshConfig {
            trust_domain: Some("acme.corp.example".into()),
            ..MeshConfig::default()
        },
    );
    feed(&mut org, &[NAMESPACES, STRICT_WEB]);
    assert_eq!(
        inbound_identities(&org),
        [Some(MatchPattern::Prefix(
            "spiffe://acme.corp.example/".into()
        ))]
    );
}

#[test]
fn subject_alt_names_of_another_trust_domain_are_never_accepted() {
    let foreign = VMS.replace(
        "spiffe://acme.meshplane.local/ns/vms/sa/legacy",
        "spiffe://red.meshplane.local/ns/vms/sa/legacy",
    );
    let index = index_with(&[NAMESPACES, &foreign]);
    let (_, sans) = mesh_tls(&vms_cluster(&index, &client(true)));
    assert_eq!(
        sans,
        [Some(MatchPattern::Exact(
            "spiffe://acme.meshplane.local/".into()
        ))],
        "only the trust domain's own ID, which no workload has"
    );
}
