//! Kubernetes Gateway API Gateways compiled into the gateway model VirtualServices already
//! program (docs/architecture.md, "Gateway API gateways"): each programmed listener becomes one
//! internal Istio-form `Gateway` with one server, selecting the Gateway's own proxies by
//! [`GATEWAY_NAME_LABEL`] in the Gateway's namespace only; the routes attached to it become
//! internal VirtualServices bound to that listener, one per served hostname, whose rules are
//! every attached route's matches ordered by the specification's precedence. Translation of
//! gateway proxies ([`super::gateway`]) then serves them like any Gateway and VirtualService.
//!
//! Internal objects are never reported on and never visible to users: they live in their own
//! registry fields (`gateway_api_gateways`, `gateway_api_routes`) and carry names no
//! Kubernetes object can have (`~`).

use std::cmp::Reverse;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use meshplane_crds::networking::gateway::{GatewaySpec, Server, ServerTlsMode, ServerTlsSettings};
use meshplane_crds::networking::virtual_service::{
    HttpMatchRequest, HttpRoute, StringMatch, TcpRoute, TlsRoute, VirtualServiceSpec,
};
use meshplane_crds::networking::Port;
use meshplane_crds::{Gateway, VirtualService};

use super::gateway_listeners::{Attached, ListenerSpec, ListenerVerdict, TlsMode};

pub use meshplane_crds::gateway_tenancy::GATEWAY_NAME_LABEL;

/// A Gateway's listeners as [`super::gateway_listeners`] judges them.
pub fn listener_specs(gateway: &meshplane_crds::gateway_api::Gateway) -> Vec<ListenerSpec> {
    use super::gateway_listeners::{CertificateRef, RouteKind, RouteNamespaces};
    use meshplane_crds::gateway_api::gateway::{FromNamespaces, TlsModeType};
    gateway
        .spec
        .listeners
        .iter()
        .map(|l| {
            let allowed = l.allowed_routes.clone().unwrap_or_default();
            let namespaces = allowed.namespaces.unwrap_or_default();
            ListenerSpec {
                name: l.name.clone(),
                hostname: l.hostname.clone().filter(|h| !h.is_empty()),
                port: l.port,
                protocol: l.protocol.clone(),
                tls_mode: l.tls.as_ref().map(|t| match t.mode {
                    TlsModeType::Terminate => TlsMode::Terminate,
                    TlsModeType::Passthrough => TlsMode::Passthrough,
                }),
                certificate_refs: l
                    .tls
                    .iter()
                    .flat_map(|t| t.certificate_refs.iter())
                    .map(|r| CertificateRef {
                        group: r.group.clone(),
                        kind: r.kind.clone(),
                        namespace: r.namespace.clone(),
                        name: r.name.clone(),
                    })
                    .collect(),
                allowed_namespaces: match namespaces.from {
                    FromNamespaces::Same => RouteNamespaces::Same,
                    FromNamespaces::All => RouteNamespaces::All,
                    // A Selector without a selector selects nothing.
                    FromNamespaces::Selector => RouteNamespaces::Selector(
                        namespaces.selector.unwrap_or_else(|| {
                            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                                match_expressions: Some(vec![
                                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                                        key: "kubernetes.io/metadata.name".into(),
                                        operator: "In".into(),
                                        values: Some(Vec::new()),
                                    },
                                ]),
                                ..Default::default()
                            }
                        }),
                    ),
                },
                allowed_kinds: allowed
                    .kinds
                    .iter()
                    .map(|k| RouteKind {
                        group: k.group.clone(),
                        kind: k.kind.clone(),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Name of the internal Gateway of one listener.
pub fn listener_gateway_name(gateway: &str, listener: &str) -> String {
    format!("gateway-api~{gateway}~{listener}")
}

/// Whether an internal Gateway is a compiled Gateway API listener.
pub fn is_compiled(gateway: &Gateway) -> bool {
    gateway
        .metadata
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with("gateway-api~"))
}

/// A Gateway API Gateway as compiling it needs: where it is, when it was made, its listeners
/// and their verdicts.
pub struct GatewayApiGateway<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub created: Option<&'a Time>,
    pub listeners: &'a [ListenerSpec],
    pub verdicts: &'a [ListenerVerdict],
}

/// The internal Gateways of a Gateway's programmed listeners.
pub fn compile_listeners(gw: &GatewayApiGateway<'_>) -> Vec<Gateway> {
    gw.listeners
        .iter()
        .zip(gw.verdicts)
        .filter(|(_, v)| v.programmed())
        .map(|(l, v)| {
            let (protocol, tls) = match (l.protocol.as_str(), l.tls_mode) {
                ("HTTPS", _) | ("TLS", Some(TlsMode::Terminate)) => (
                    if l.protocol == "HTTPS" {
                        "HTTPS"
                    } else {
                        "TLS"
                    },
                    Some(ServerTlsSettings {
                        mode: Some(ServerTlsMode::Simple),
                        // Served from the Gateway's namespace (the proxy's), as the
                        // credential checks ask.
                        credential_name: v
                            .certificates
                            .iter()
                            .find(|(ns, _)| ns == gw.namespace)
                            .map(|(_, name)| name.clone())
                            .unwrap_or_default(),
                        ..Default::default()
                    }),
                ),
                ("TLS", _) => (
                    "TLS",
                    Some(ServerTlsSettings {
                        mode: Some(ServerTlsMode::Passthrough),
                        ..Default::default()
                    }),
                ),
                ("TCP", _) => ("TCP", None),
                _ => ("HTTP", None),
            };
            Gateway {
                metadata: ObjectMeta {
                    name: Some(listener_gateway_name(gw.name, &l.name)),
                    namespace: Some(gw.namespace.to_string()),
                    creation_timestamp: gw.created.cloned(),
                    ..Default::default()
                },
                spec: GatewaySpec {
                    servers: vec![Server {
                        port: Port {
                            number: u32::try_from(l.port).unwrap_or_default(),
                            name: l.name.clone(),
                            protocol: protocol.to_string(),
                            ..Default::default()
                        },
                        hosts: vec![l.hostname.clone().unwrap_or_else(|| "*".to_string())],
                        tls,
                        name: l.name.clone(),
                        ..Default::default()
                    }],
                    selector: BTreeMap::from([(
                        GATEWAY_NAME_LABEL.to_string(),
                        gw.name.to_string(),
                    )]),
                },
                status: None,
            }
        })
        .collect()
}

/// What one attached route brings to a Gateway: its HTTP rules (already in the route model,
/// destinations fully qualified) or its TLS and TCP rules, and where it attached.
pub struct AttachedRoute<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub created: Option<&'a Time>,
    pub http: &'a [HttpRoute],
    pub tls: &'a [TlsRoute],
    pub tcp: &'a [TcpRoute],
    pub attached: &'a Attached,
}

/// The sort key of a match: path kind and length, method, header and query parameter counts.
type Precedence = (u8, Reverse<usize>, bool, Reverse<usize>, Reverse<usize>);
/// The order of a rule's match on a hostname: precedence, then the route's age, namespace and
/// name, then the rule's position.
type RuleOrder = (Precedence, Option<Time>, String, String, usize);

/// How specific a match is, most specific first, as the specification orders them: an exact
/// path, then the longest prefix, then a regular expression; then a method; then more header
/// matches; then more query parameter matches. A regular expression (whose place the
/// specification leaves to implementations) comes after exact paths and before prefixes, so a
/// prefix `/` never hides it.
fn precedence(m: Option<&HttpMatchRequest>) -> Precedence {
    let Some(m) = m else {
        return (2, Reverse(1), true, Reverse(0), Reverse(0));
    };
    let (kind, len) = match &m.uri {
        Some(StringMatch { exact: Some(p), .. }) => (0, p.len()),
        Some(StringMatch { regex: Some(p), .. }) => (1, p.len()),
        Some(StringMatch {
            prefix: Some(p), ..
        }) => (2, p.len()),
        _ => (2, 1),
    };
    (
        kind,
        Reverse(len),
        m.method.is_none(),
        Reverse(m.headers.len()),
        Reverse(m.query_params.len()),
    )
}

/// The internal VirtualServices of the routes attached to one Gateway: per listener and served
/// hostname, the rules of every route attached there, one rule per match, ordered by
/// [`precedence`], then the oldest route, then by namespace and name, then rule order.
pub fn compile_routes(
    gw: &GatewayApiGateway<'_>,
    routes: &[AttachedRoute<'_>],
) -> Vec<VirtualService> {
    // (listener index, hostname) -> ordered HTTP rules; TLS and TCP rules in route order.
    let mut http: BTreeMap<(usize, String), Vec<(RuleOrder, HttpRoute)>> = BTreeMap::new();
    let mut l4: BTreeMap<(usize, String), (Vec<TlsRoute>, Vec<TcpRoute>)> = BTreeMap::new();
    let mut ordered: Vec<&AttachedRoute<'_>> = routes.iter().collect();
    ordered.sort_by(|a, b| (a.created, a.namespace, a.name).cmp(&(b.created, b.namespace, b.name)));
    for r in ordered {
        for (listener, hostnames) in &r.attached.listeners {
            for host in hostnames {
                for (i, rule) in r.http.iter().enumerate() {
                    let matches: Vec<Option<&HttpMatchRequest>> = if rule.match_.is_empty() {
                        vec![None]
                    } else {
                        rule.match_.iter().map(Some).collect()
                    };
                    for m in matches {
                        let mut one = rule.clone();
                        one.match_ = m.cloned().into_iter().collect();
                        http.entry((*listener, host.clone())).or_default().push((
                            (
                                precedence(m),
                                r.created.cloned(),
                                r.namespace.to_string(),
                                r.name.to_string(),
                                i,
                            ),
                            one,
                        ));
                    }
                }
                if !r.tls.is_empty() || !r.tcp.is_empty() {
                    let entry = l4.entry((*listener, host.clone())).or_default();
                    entry.0.extend(r.tls.iter().cloned());
                    entry.1.extend(r.tcp.iter().cloned());
                }
            }
        }
    }
    let mut keys: Vec<(usize, String)> = http.keys().cloned().collect();
    keys.extend(l4.keys().cloned());
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|(listener, host)| {
            let l = gw.listeners.get(listener)?;
            let mut rules = http.remove(&(listener, host.clone())).unwrap_or_default();
            rules.sort_by(|a, b| a.0.cmp(&b.0));
            let (tls, tcp) = l4.remove(&(listener, host.clone())).unwrap_or_default();
            Some(VirtualService {
                metadata: ObjectMeta {
                    name: Some(format!("gateway-api~{}~{}~{host}", gw.name, l.name)),
                    namespace: Some(gw.namespace.to_string()),
                    creation_timestamp: gw.created.cloned(),
                    ..Default::default()
                },
                spec: VirtualServiceSpec {
                    hosts: vec![host],
                    gateways: vec![format!(
                        "{}/{}",
                        gw.namespace,
                        listener_gateway_name(gw.name, &l.name)
                    )],
                    http: rules.into_iter().map(|(_, r)| r).collect(),
                    tls,
                    tcp,
                    ..Default::default()
                },
                status: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::gateway_listeners::{
        judge_listeners, CertificateRef, ListenerFacts, RouteNamespaces, SecretState,
    };

    struct NoFacts;
    impl ListenerFacts for NoFacts {
        fn secret(&self, namespace: &str, name: &str) -> SecretState {
            if namespace == "edge" && name == "cert" {
                SecretState::Usable
            } else {
                SecretState::Missing
            }
        }
        fn secret_granted(&self, _: &str, _: &str, _: &str) -> bool {
            false
        }
        fn namespace_labels(&self, _: &str) -> Option<&BTreeMap<String, String>> {
            None
        }
    }

    fn listener(name: &str, port: i32, protocol: &str, hostname: Option<&str>) -> ListenerSpec {
        ListenerSpec {
            name: name.into(),
            hostname: hostname.map(str::to_string),
            port,
            protocol: protocol.into(),
            tls_mode: (protocol == "HTTPS").then_some(TlsMode::Terminate),
            certificate_refs: if protocol == "HTTPS" {
                vec![CertificateRef {
                    group: String::new(),
                    kind: "Secret".into(),
                    namespace: None,
                    name: "cert".into(),
                }]
            } else {
                Vec::new()
            },
            allowed_namespaces: RouteNamespaces::Same,
            allowed_kinds: Vec::new(),
        }
    }

    fn path(kind: &str, p: &str) -> HttpMatchRequest {
        let uri = match kind {
            "exact" => StringMatch {
                exact: Some(p.into()),
                ..Default::default()
            },
            "prefix" => StringMatch {
                prefix: Some(p.into()),
                ..Default::default()
            },
            _ => StringMatch {
                regex: Some(p.into()),
                ..Default::default()
            },
        };
        HttpMatchRequest {
            uri: Some(uri),
            ..Default::default()
        }
    }

    fn rule(name: &str, matches: Vec<HttpMatchRequest>) -> HttpRoute {
        HttpRoute {
            name: name.into(),
            match_: matches,
            ..Default::default()
        }
    }

    #[test]
    fn listeners_are_read_from_the_gateway_api_gateway_with_the_specifications_defaults() {
        let gw: meshplane_crds::gateway_api::Gateway = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "web", "namespace": "edge"},
            "spec": {
                "gatewayClassName": "meshplane-blue",
                "listeners": [
                    {"name": "http", "port": 80, "protocol": "HTTP"},
                    {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
                     "tls": {"certificateRefs": [{"name": "cert"}, {"name": "other", "namespace": "certs"}]},
                     "allowedRoutes": {"namespaces": {"from": "Selector",
                        "selector": {"matchLabels": {"team": "shop"}}},
                        "kinds": [{"kind": "HTTPRoute"}]}},
                    {"name": "db", "port": 5432, "protocol": "TLS", "tls": {"mode": "Passthrough"},
                     "allowedRoutes": {"namespaces": {"from": "All"}}},
                ],
            },
        }))
        .expect("a Gateway");
        let specs = listener_specs(&gw);
        assert_eq!(specs[0].allowed_namespaces, RouteNamespaces::Same);
        assert_eq!(specs[0].tls_mode, None);
        assert_eq!(specs[1].tls_mode, Some(TlsMode::Terminate));
        assert_eq!(specs[1].hostname.as_deref(), Some("*.example.com"));
        assert_eq!(
            specs[1].certificate_refs[0],
            CertificateRef {
                group: String::new(),
                kind: "Secret".into(),
                namespace: None,
                name: "cert".into()
            }
        );
        assert_eq!(
            specs[1].certificate_refs[1].namespace.as_deref(),
            Some("certs")
        );
        assert!(matches!(
            specs[1].allowed_namespaces,
            RouteNamespaces::Selector(_)
        ));
        assert_eq!(
            specs[1].allowed_kinds,
            vec![crate::translate::gateway_listeners::RouteKind::gateway_api(
                "HTTPRoute"
            )]
        );
        assert_eq!(specs[2].tls_mode, Some(TlsMode::Passthrough));
        assert_eq!(specs[2].allowed_namespaces, RouteNamespaces::All);
    }

    #[test]
    fn programmed_listeners_become_one_server_gateways_selecting_the_gateways_own_pods() {
        let listeners = vec![
            listener("http", 80, "HTTP", Some("*.example.com")),
            listener("https", 443, "HTTPS", None),
            listener("clash", 80, "TCP", None),
        ];
        let verdicts = judge_listeners(&listeners, "edge", &NoFacts);
        let gw = GatewayApiGateway {
            namespace: "edge",
            name: "web",
            created: None,
            listeners: &listeners,
            verdicts: &verdicts,
        };
        let compiled = compile_listeners(&gw);
        // The TCP listener conflicts with the HTTP one on port 80: neither is programmed.
        let names: Vec<&str> = compiled
            .iter()
            .filter_map(|g| g.metadata.name.as_deref())
            .collect();
        assert_eq!(names, vec!["gateway-api~web~https"]);
        let server = &compiled[0].spec.servers[0];
        assert_eq!(
            (server.port.number, server.port.protocol.as_str()),
            (443, "HTTPS")
        );
        assert_eq!(server.hosts, vec!["*"]);
        let tls = server.tls.as_ref().expect("tls");
        assert_eq!(
            (tls.mode, tls.credential_name.as_str()),
            (Some(ServerTlsMode::Simple), "cert")
        );
        assert_eq!(compiled[0].spec.selector[GATEWAY_NAME_LABEL], "web");
        assert!(is_compiled(&compiled[0]));
        let listeners = vec![listener("http", 80, "HTTP", Some("*.example.com"))];
        let verdicts = judge_listeners(&listeners, "edge", &NoFacts);
        let compiled = compile_listeners(&GatewayApiGateway {
            listeners: &listeners,
            verdicts: &verdicts,
            ..gw
        });
        assert_eq!(compiled[0].spec.servers[0].hosts, vec!["*.example.com"]);
        assert_eq!(compiled[0].spec.servers[0].port.protocol, "HTTP");
    }

    #[test]
    fn attached_routes_merge_per_hostname_in_the_specifications_precedence() {
        let listeners = vec![listener("http", 80, "HTTP", None)];
        let verdicts = judge_listeners(&listeners, "edge", &NoFacts);
        let gw = GatewayApiGateway {
            namespace: "edge",
            name: "web",
            created: None,
            listeners: &listeners,
            verdicts: &verdicts,
        };
        let older = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("t"));
        let newer = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_100).expect("t"));
        let shop = Attached {
            listeners: vec![(0, vec!["shop.example.com".into()])],
        };
        let both = Attached {
            listeners: vec![(0, vec!["shop.example.com".into(), "api.example.com".into()])],
        };
        let a_rules = vec![
            rule("catch-all", vec![]),
            rule("two", vec![path("prefix", "/a"), path("exact", "/a/x")]),
        ];
        let b_rules = vec![
            rule("regex", vec![path("regex", "/r.*")]),
            rule("long-prefix", vec![path("prefix", "/a/long")]),
            rule(
                "same-prefix-method",
                vec![HttpMatchRequest {
                    method: Some(StringMatch {
                        exact: Some("GET".into()),
                        ..Default::default()
                    }),
                    ..path("prefix", "/a")
                }],
            ),
        ];
        let routes = vec![
            AttachedRoute {
                namespace: "edge",
                name: "b",
                created: Some(&newer),
                http: &b_rules,
                tls: &[],
                tcp: &[],
                attached: &both,
            },
            AttachedRoute {
                namespace: "edge",
                name: "a",
                created: Some(&older),
                http: &a_rules,
                tls: &[],
                tcp: &[],
                attached: &shop,
            },
        ];
        let vss = compile_routes(&gw, &routes);
        let hosts: Vec<&str> = vss.iter().map(|v| v.spec.hosts[0].as_str()).collect();
        assert_eq!(hosts, vec!["api.example.com", "shop.example.com"]);
        let order: Vec<String> = vss[1]
            .spec
            .http
            .iter()
            .map(|r| {
                let m = r.match_.first();
                format!(
                    "{}:{}",
                    r.name,
                    m.and_then(|m| m.uri.as_ref())
                        .and_then(|u| u.exact.clone().or(u.prefix.clone()).or(u.regex.clone()))
                        .unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(
            order,
            vec![
                "two:/a/x",
                "regex:/r.*",
                "long-prefix:/a/long",
                "same-prefix-method:/a",
                "two:/a",
                "catch-all:",
            ]
        );
        assert_eq!(vss[1].spec.gateways, vec!["edge/gateway-api~web~http"]);
        assert_eq!(vss[0].spec.http.len(), 3, "only b serves api.example.com");
    }

    fn router(namespace: &str, gateway: &str) -> crate::model::ProxyNode {
        crate::model::ProxyNode {
            id: format!("router~198.18.9.9~gw-1.{namespace}~{namespace}.svc.cluster.local"),
            kind: crate::model::ProxyKind::Router,
            namespace: namespace.into(),
            pod_name: Some("gw-1".into()),
            ip: Some("198.18.9.9".into()),
            labels: [(GATEWAY_NAME_LABEL.to_string(), gateway.to_string())].into(),
            ..Default::default()
        }
    }

    /// The compiled Gateway serves its attached route's host on its proxies, and on no other
    /// gateway proxy: not another Gateway's of its namespace, not one of the same name in
    /// another namespace.
    #[test]
    fn a_gateway_proxy_serves_its_own_gateways_compiled_listeners_only() {
        let listeners = vec![listener("http", 80, "HTTP", None)];
        let verdicts = judge_listeners(&listeners, "edge", &NoFacts);
        let gw = GatewayApiGateway {
            namespace: "edge",
            name: "web",
            created: None,
            listeners: &listeners,
            verdicts: &verdicts,
        };
        let attached = Attached {
            listeners: vec![(0, vec!["shop.example.com".into()])],
        };
        let rules = vec![HttpRoute {
            direct_response: Some(
                meshplane_crds::networking::virtual_service::HttpDirectResponse {
                    status: 204,
                    ..Default::default()
                },
            ),
            ..rule("ok", vec![path("prefix", "/")])
        }];
        let registry = super::super::Registry {
            control_namespace: "meshplane-acme".into(),
            gateway_api_gateways: compile_listeners(&gw),
            gateway_api_routes: compile_routes(
                &gw,
                &[AttachedRoute {
                    namespace: "edge",
                    name: "shop",
                    created: None,
                    http: &rules,
                    tls: &[],
                    tcp: &[],
                    attached: &attached,
                }],
            ),
            ..Default::default()
        };
        let own = super::super::translate(&registry, &router("edge", "web"));
        assert_eq!(own.listeners.len(), 1, "{:?}", own.listeners);
        let domains: Vec<&str> = own
            .routes
            .iter()
            .flat_map(|r| r.virtual_hosts.iter())
            .flat_map(|v| v.domains.iter().map(String::as_str))
            .collect();
        assert_eq!(domains, vec!["shop.example.com"]);
        for other in [router("edge", "api"), router("shop", "web")] {
            let t = super::super::translate(&registry, &other);
            assert!(
                t.listeners.is_empty(),
                "{}: {:?}",
                other.namespace,
                t.listeners
            );
        }
    }
}
