//! External authorization (`action: CUSTOM`) and dry-run policies in translation: which
//! filters the inbound chains get, which requests reach the authorizer (the shadow rules
//! evaluated like Envoy does), what an unusable provider does, and a real Envoy accepting the
//! rendered config.

use envoy_types::pb::envoy::config::cluster::v3::cluster::DiscoveryType;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::rbac::v3::rbac::Action as RbacAction;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ext_authz::Services;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ExtAuthz;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpConfigType;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use meshplane_crds::networking::CaptureMode;
use meshplane_xds::translate::authz;
use meshplane_xds::translate::envoy;
use meshplane_xds::translate::ext_authz;
use meshplane_xds::translate::registry::EndpointModel;
use prost::Message;

mod translate_common;
use translate_common::*;

/// The tenant: a web workload in shop (HTTP 8080, TCP 9000), an authorizer Service in shop,
/// one in pay that a Sidecar of shop does not import, and the tenant's providers.
const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: pay, labels: {meshplane.io/rev: blue}}
---
apiVersion: meshplane.io/v1alpha1
kind: MeshControlPlane
metadata: {name: blue}
spec:
  tenant: acme
  meshConfig:
    extensionProviders:
    - name: authz-http
      envoyExtAuthzHttp:
        service: authz.shop.svc.cluster.local
        port: 8000
        timeout: 2s
        failOpen: false
        statusOnError: "503"
        pathPrefix: /check
        includeRequestHeadersInCheck: [x-ext-authz, "x-user-*"]
        includeAdditionalHeadersInCheck: {x-from: mesh}
        headersToUpstreamOnAllow: [x-authz-user]
        headersToDownstreamOnDeny: [x-authz-reason]
    - name: authz-grpc
      envoyExtAuthzGrpc: {service: pay/authz-grpc, port: 9001, failOpen: true}
    - name: gone
      envoyExtAuthzHttp: {service: nowhere.shop.svc.cluster.local, port: 80}
    - name: prom
      prometheus: {}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 198.19.0.10
  selector: {app: web}
  ports: [{name: http, port: 8080}, {name: tcp-db, port: 9000}]
---
apiVersion: v1
kind: Service
metadata: {name: authz, namespace: shop}
spec:
  clusterIP: 198.19.0.20
  selector: {app: authz}
  ports: [{name: http, port: 8000}]
---
apiVersion: v1
kind: Service
metadata: {name: authz-grpc, namespace: pay}
spec:
  clusterIP: 198.19.0.21
  selector: {app: authz-grpc}
  ports: [{name: grpc, port: 9001}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["./*"]}]
"#;

fn web() -> meshplane_xds::model::ProxyNode {
    let mut node = proxy("shop", &[("app", "web")], CaptureMode::Default);
    node.sds = true;
    node
}

fn policy(name: &str, annotations: &str, spec: &str) -> String {
    format!(
        "apiVersion: security.meshplane.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: shop{annotations}}}\nspec: {spec}\n"
    )
}

/// The HTTP filters of the first HTTP chain of virtualInbound for port 8080 (mutual TLS).
fn http_filters(listeners: &[Listener]) -> Vec<HttpFilter> {
    let inbound = listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .expect("virtualInbound");
    let chain = inbound
        .filter_chains
        .iter()
        .find(|c| c.name.starts_with("inbound|8080") && c.transport_socket.is_some())
        .expect("an mTLS chain of 8080");
    let Some(ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!("typed HCM");
    };
    HttpConnectionManager::decode(any.value.as_slice())
        .expect("HCM")
        .http_filters
}

fn network_rbac(listeners: &[Listener]) -> Vec<NetworkRbac> {
    let inbound = listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .expect("virtualInbound");
    let chain = inbound
        .filter_chains
        .iter()
        .find(|c| c.name.starts_with("inbound|9000") && c.transport_socket.is_some())
        .expect("an mTLS chain of 9000");
    chain
        .filters
        .iter()
        .filter(|f| f.name == authz::NETWORK_RBAC_FILTER)
        .map(|f| match &f.config_type {
            Some(ConfigType::TypedConfig(any)) => {
                NetworkRbac::decode(any.value.as_slice()).expect("network RBAC")
            }
            _ => panic!("typed"),
        })
        .collect()
}

fn rbac_of(f: &HttpFilter) -> HttpRbac {
    match &f.config_type {
        Some(HttpConfigType::TypedConfig(a)) => HttpRbac::decode(a.value.as_slice()).expect("RBAC"),
        _ => panic!("typed"),
    }
}

fn ext_authz_of(f: &HttpFilter) -> ExtAuthz {
    match &f.config_type {
        Some(HttpConfigType::TypedConfig(a)) => {
            ExtAuthz::decode(a.value.as_slice()).expect("ext_authz")
        }
        _ => panic!("typed"),
    }
}

fn sorted_names(rbac: &envoy_types::pb::envoy::config::rbac::v3::Rbac) -> Vec<String> {
    let mut names: Vec<String> = rbac.policies.keys().cloned().collect();
    names.sort();
    names
}

#[test]
fn a_custom_policy_puts_its_authorizer_before_deny_and_allow_for_matching_requests_only() {
    let custom = policy(
        "ext",
        "",
        "{selector: {matchLabels: {app: web}}, action: CUSTOM, provider: {name: authz-http}, rules: [{to: [{operation: {paths: ['/private*']}}]}]}",
    );
    let deny = policy(
        "deny",
        "",
        "{action: DENY, rules: [{to: [{operation: {paths: ['/admin']}}]}]}",
    );
    let index = index_with(&[MESH, &custom, &deny]);
    let config = index.render(&web());
    let listeners = decode_all::<Listener>(&config.listeners);
    let filters = http_filters(&listeners);
    let names: Vec<&str> = filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            authz::HTTP_RBAC_FILTER,
            ext_authz::HTTP_EXT_AUTHZ_FILTER,
            authz::HTTP_RBAC_FILTER,
            "envoy.filters.http.router"
        ]
    );
    // The shadow filter enforces nothing; its rules name the CUSTOM policy's rules.
    let shadow = rbac_of(&filters[0]);
    assert!(shadow.rules.is_none(), "the selector enforces nothing");
    assert_eq!(shadow.shadow_rules_stat_prefix, "istio_ext_authz_");
    let rules = shadow.shadow_rules.expect("shadow rules");
    assert_eq!(rules.action, RbacAction::Allow as i32);
    assert_eq!(
        sorted_names(&rules),
        ["istio-ext-authz-ns[shop]-policy[ext]-rule[0]"]
    );
    // The authorizer is asked only when that shadow rule matched.
    let ext = ext_authz_of(&filters[1]);
    let enabled = ext.filter_enabled_metadata.expect("enabled by metadata");
    assert_eq!(enabled.filter, "envoy.filters.http.rbac");
    assert!(format!("{:?}", enabled.path).contains("istio_ext_authz_shadow_effective_policy_id"));
    assert!(format!("{:?}", enabled.value).contains("istio-ext-authz-"));
    assert!(!ext.failure_mode_allow);
    assert_eq!(ext.status_on_error.map(|s| s.code), Some(503));
    let Some(Services::HttpService(http)) = ext.services else {
        panic!("an HTTP service");
    };
    let uri = http.server_uri.expect("server uri");
    assert_eq!(uri.uri, "http://authz.shop.svc.cluster.local:8000");
    assert_eq!(uri.timeout.map(|t| t.seconds), Some(2));
    assert!(format!("{:?}", uri.http_upstream_type)
        .contains("outbound|8000||authz.shop.svc.cluster.local"));
    assert_eq!(http.path_prefix, "/check");
    let allowed = format!("{:?}", ext.allowed_headers);
    assert!(
        allowed.contains("x-ext-authz") && allowed.contains("Prefix(\"x-user-\")"),
        "{allowed}"
    );
    let response = format!("{:?}", http.authorization_response);
    assert!(
        response.contains("x-authz-user") && response.contains("x-authz-reason"),
        "{response}"
    );
    assert!(format!("{:?}", http.authorization_request).contains("x-from"));
    // DENY follows, enforced.
    let deny = rbac_of(&filters[2]);
    assert_eq!(
        sorted_names(&deny.rules.expect("deny rules")),
        ["ns[shop]-policy[deny]-rule[0]"]
    );
    // On the TCP port an HTTP authorizer cannot be asked: the CUSTOM rules deny there (a path
    // rule cannot be known on TCP, so it matches every connection).
    let tcp = network_rbac(&listeners);
    let names: Vec<Vec<String>> = tcp
        .iter()
        .map(|r| sorted_names(r.rules.as_ref().expect("rules")))
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.contains(&"ns[shop]-policy[ext]-rule[0]".to_string())),
        "{names:?}"
    );
}

#[test]
fn the_authorizers_cluster_is_there_even_when_the_sidecar_does_not_import_it() {
    let custom = policy(
        "ext",
        "",
        "{action: CUSTOM, provider: {name: authz-grpc}, rules: [{from: [{source: {namespaces: [pay]}}]}]}",
    );
    let index = index_with(&[MESH, &custom]);
    let config = index.render(&web());
    let clusters = decode_all::<Cluster>(&config.clusters);
    assert!(
        clusters
            .iter()
            .any(|c| c.name == "outbound|9001||authz-grpc.pay.svc.cluster.local"),
        "{:?}",
        clusters.iter().map(|c| &c.name).collect::<Vec<_>>()
    );
    let filters = http_filters(&decode_all::<Listener>(&config.listeners));
    let ext = ext_authz_of(&filters[1]);
    assert!(ext.failure_mode_allow, "failOpen");
    let Some(Services::GrpcService(grpc)) = ext.services else {
        panic!("a gRPC service");
    };
    let target = format!("{:?}", grpc.target_specifier);
    assert!(
        target.contains("outbound|9001||authz-grpc.pay.svc.cluster.local"),
        "{target}"
    );
    assert_eq!(
        grpc.timeout.map(|t| t.seconds),
        Some(ext_authz::DEFAULT_TIMEOUT_SECONDS)
    );
}

#[test]
fn a_custom_policy_whose_provider_cannot_be_used_denies_every_request() {
    for (provider, why) in [
        ("missing", "no extension provider \"missing\" is declared"),
        (
            "gone",
            "which is no Service or ServiceEntry host of the tenant",
        ),
        ("prom", "is of kind prometheus, not an external authorizer"),
    ] {
        let custom = policy(
            "ext",
            "",
            &format!("{{action: CUSTOM, provider: {{name: {provider}}}, rules: [{{to: [{{operation: {{paths: ['/x']}}}}]}}]}}"),
        );
        let index = index_with(&[MESH, &custom]);
        let filters = http_filters(&decode_all::<Listener>(&index.render(&web()).listeners));
        let names: Vec<&str> = filters.iter().map(|f| f.name.as_str()).collect();
        assert!(
            !names.contains(&ext_authz::HTTP_EXT_AUTHZ_FILTER),
            "{provider}: {names:?}"
        );
        let deny = rbac_of(&filters[0]).rules.expect("deny rules");
        assert_eq!(deny.action, RbacAction::Deny as i32);
        assert_eq!(
            sorted_names(&deny),
            ["ns[shop]-policy[ext]-custom-provider-unavailable"],
            "{provider}"
        );
        // The policy's status says why.
        let d = index.diagnostics();
        let findings: Vec<String> = d
            .objects
            .values()
            .flat_map(|(_, f)| f.iter().map(|f| format!("{}: {}", f.reason, f.message)))
            .collect();
        assert!(
            findings
                .iter()
                .any(|f| f.starts_with("ProviderUnavailable") && f.contains(why)),
            "{provider}: {findings:?}"
        );
    }
}

#[test]
fn dry_run_policies_are_shadow_rules_and_deny_nothing() {
    let dry_deny = policy(
        "dry-deny",
        ", annotations: {istio.io/dry-run: 'true'}",
        "{action: DENY, rules: [{to: [{operation: {paths: ['/admin*']}}]}]}",
    );
    let dry_allow = policy(
        "dry-allow",
        ", annotations: {istio.io/dry-run: 'true'}",
        "{rules: [{from: [{source: {namespaces: [pay]}}]}]}",
    );
    let index = index_with(&[MESH, &dry_deny, &dry_allow]);
    let config = index.render(&web());
    let listeners = decode_all::<Listener>(&config.listeners);
    let filters = http_filters(&listeners);
    assert_eq!(
        filters.len(),
        3,
        "a DENY and an ALLOW filter, then the router"
    );
    let deny = rbac_of(&filters[0]);
    assert!(deny.rules.is_none(), "a dry-run DENY enforces nothing");
    assert_eq!(deny.shadow_rules_stat_prefix, "istio_dry_run_deny_");
    let shadow = deny.shadow_rules.expect("shadow");
    assert_eq!(shadow.action, RbacAction::Deny as i32);
    assert_eq!(sorted_names(&shadow), ["ns[shop]-policy[dry-deny]-rule[0]"]);
    let allow = rbac_of(&filters[1]);
    assert!(
        allow.rules.is_none(),
        "a dry-run ALLOW denies nothing either"
    );
    assert_eq!(allow.shadow_rules_stat_prefix, "istio_dry_run_allow_");
    assert_eq!(
        allow.shadow_rules.expect("shadow").action,
        RbacAction::Allow as i32
    );
    // TCP chains shadow them too.
    let tcp = network_rbac(&listeners);
    assert!(
        tcp.iter()
            .all(|r| r.rules.is_none() && r.shadow_rules.is_some()),
        "{tcp:?}"
    );
    // Without the annotation the same DENY is enforced.
    let enforced = dry_deny.replace(", annotations: {istio.io/dry-run: 'true'}", "");
    let index = index_with(&[MESH, &enforced]);
    let filters = http_filters(&decode_all::<Listener>(&index.render(&web()).listeners));
    assert!(rbac_of(&filters[0]).rules.is_some());
    assert!(rbac_of(&filters[0]).shadow_rules.is_none());
}

#[test]
fn a_grpc_custom_policy_asks_its_authorizer_about_tcp_connections() {
    use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
    let grpc = policy(
        "ext-tcp",
        "",
        "{selector: {matchLabels: {app: web}}, action: CUSTOM, provider: {name: authz-grpc}, rules: [{to: [{operation: {ports: ['9000']}}]}]}",
    );
    let index = index_with(&[MESH, &grpc]);
    let config = index.render(&web());
    let listeners = decode_all::<Listener>(&config.listeners);
    let inbound = listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .expect("virtualInbound");
    let chain = inbound
        .filter_chains
        .iter()
        .find(|c| c.name.starts_with("inbound|9000") && c.transport_socket.is_some())
        .expect("an mTLS chain of 9000");
    let names: Vec<&str> = chain.filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            authz::NETWORK_RBAC_FILTER,
            ext_authz::NETWORK_EXT_AUTHZ_FILTER,
            "envoy.filters.network.tcp_proxy"
        ]
    );
    // The shadow rules select the connections; nothing is enforced by RBAC.
    let shadow = network_rbac(&listeners).remove(0);
    assert!(shadow.rules.is_none(), "the selector enforces nothing");
    assert_eq!(shadow.shadow_rules_stat_prefix, "istio_ext_authz_");
    assert_eq!(
        sorted_names(&shadow.shadow_rules.expect("shadow rules")),
        ["istio-ext-authz-ns[shop]-policy[ext-tcp]-rule[0]"]
    );
    let Some(ConfigType::TypedConfig(any)) = &chain.filters[1].config_type else {
        panic!("typed ext_authz");
    };
    let ext = NetworkExtAuthz::decode(any.value.as_slice()).expect("network ext_authz");
    let enabled = ext.filter_enabled_metadata.expect("enabled by metadata");
    assert_eq!(enabled.filter, "envoy.filters.network.rbac");
    assert!(format!("{:?}", enabled.path).contains("istio_ext_authz_shadow_effective_policy_id"));
    assert!(ext.failure_mode_allow, "the provider's failOpen");
    assert!(ext.include_peer_certificate, "the check names the peer");
    let service = format!("{:?}", ext.grpc_service);
    assert!(
        service.contains("outbound|9001||authz-grpc.pay.svc.cluster.local"),
        "{service}"
    );
    // The HTTP port is outside the rules: no authorizer there, and the authorizer's cluster is
    // still added although shop's Sidecar does not import pay.
    let filters = http_filters(&listeners);
    assert!(
        filters
            .iter()
            .all(|f| f.name != ext_authz::HTTP_EXT_AUTHZ_FILTER),
        "{:?}",
        filters.iter().map(|f| &f.name).collect::<Vec<_>>()
    );
    assert!(names_of_clusters(&config)
        .contains(&"outbound|9001||authz-grpc.pay.svc.cluster.local".to_string()));
}

/// The clusters' names.
fn names_of_clusters(config: &meshplane_xds::model::ProxyConfig) -> Vec<String> {
    names(&config.clusters)
}

#[test]
fn envoy_accepts_the_custom_and_dry_run_filters() {
    let Some(bin) = envoy_bin() else {
        panic!("ENVOY_BIN or the venv's Envoy is needed for this test");
    };
    let custom = policy(
        "ext",
        "",
        "{action: CUSTOM, provider: {name: authz-http}, rules: [{to: [{operation: {paths: ['/private*']}}]}]}",
    );
    let grpc = policy(
        "ext-grpc",
        "",
        "{action: CUSTOM, provider: {name: authz-grpc}, rules: [{to: [{operation: {methods: [POST]}}]}]}",
    );
    let dry = policy(
        "dry",
        ", annotations: {istio.io/dry-run: 'true'}",
        "{action: DENY, rules: [{to: [{operation: {paths: ['/admin*']}}]}]}",
    );
    let index = index_with(&[MESH, &custom, &grpc, &dry]);
    let config = index.render(&web());
    let mut bootstrap = static_bootstrap(&config);
    let mut sds = envoy::with_http2(envoy::cluster(
        meshplane_contracts::tenant_ca::SDS_CLUSTER,
        DiscoveryType::Static,
    ));
    sds.load_assignment = Some(envoy::load_assignment(
        meshplane_contracts::tenant_ca::SDS_CLUSTER,
        &[EndpointModel {
            address: "127.0.0.1".into(),
            port: 1,
            ..EndpointModel::default()
        }],
    ));
    if let Some(r) = bootstrap.static_resources.as_mut() {
        r.clusters.push(sds);
    }
    let (ok, log) = envoy_validates(&bin, &bootstrap, "ext-authz");
    assert!(ok, "Envoy rejected the rendered config:\n{log}");
}
