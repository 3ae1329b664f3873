//! Per-key registry updates against full builds: random Service, EndpointSlice and Pod events
//! (and now and then a ServiceEntry, which rebuilds), in member and non-member namespaces.
//! After every event the registry equals a full build of the same objects, and the change
//! reported is what comparing the registries before and after says. Pods change labels (what
//! DestinationRule subsets select) and slices name them by `targetRef` or by address.

use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use prost::Message;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::render_cache::EdsIndexMemo;
use super::*;
use crate::model::{type_url, Kind, Object, ObjectKey, Resource};
use crate::translate::cluster_id::HostPort;
use std::cell::Cell;

use crate::test_choices::{for_choices, Choices};
use crate::testing::mk_proxy;

/// `a` and `b` are members, `c` is not.
const NAMESPACES: [&str; 3] = ["a", "b", "c"];

fn typed<T: DeserializeOwned>(v: Value) -> Box<T> {
    Box::new(serde_json::from_value(v).expect("valid object"))
}

fn random_event(rng: &mut Choices) -> SourceEvent {
    let ns = NAMESPACES[rng.below(3) as usize];
    let ip = |rng: &mut Choices| format!("198.18.0.{}", 1 + rng.below(6));
    match rng.below(10) {
        0..=1 => {
            let i = rng.below(4);
            let mut ports = Vec::new();
            if rng.chance(80) {
                ports.push(json!({"name": "http", "port": 80, "targetPort": 8080}));
            }
            if rng.chance(40) {
                ports.push(json!({"name": "tcp-db", "port": 81}));
            }
            SourceEvent::Upsert(Object::Service(typed(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("s{i}"), "namespace": ns},
                "spec": {"clusterIP": format!("198.19.0.{i}"), "selector": {"app": format!("s{}", rng.below(4))}, "ports": ports},
            }))))
        }
        2..=4 => {
            let mut ports = vec![json!({"name": "http", "port": 8080})];
            if rng.chance(40) {
                ports.push(json!({"name": "tcp-db", "port": 7000}));
            }
            let endpoints: Vec<Value> = (0..=rng.below(2))
                .map(|_| {
                    // Endpoint labels come from the pod: by targetRef, else by address.
                    let mut ep =
                        json!({"addresses": [ip(rng)], "conditions": {"ready": rng.chance(80)}});
                    if rng.chance(50) {
                        ep["targetRef"] =
                            json!({"kind": "Pod", "name": format!("p{}", rng.below(4))});
                    }
                    ep
                })
                .collect();
            SourceEvent::Upsert(Object::EndpointSlice(typed(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("e{}", rng.below(6)), "namespace": ns,
                    "labels": {"kubernetes.io/service-name": format!("s{}", rng.below(5))}},
                "addressType": "IPv4", "ports": ports, "endpoints": endpoints,
            }))))
        }
        5..=6 => {
            let ports = if rng.chance(50) {
                json!([{"name": "http", "containerPort": 8080}])
            } else {
                json!([])
            };
            SourceEvent::Upsert(Object::Pod(typed(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p{}", rng.below(4)), "namespace": ns,
                    "labels": {"app": format!("s{}", rng.below(4)), "version": format!("v{}", rng.below(2))}},
                "spec": {"containers": [{"name": "app", "ports": ports}]},
                "status": {"podIP": ip(rng)},
            }))))
        }
        7 => SourceEvent::Upsert(Object::ServiceEntry(typed(json!({
            "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "ServiceEntry",
            "metadata": {"name": format!("x{}", rng.below(2)), "namespace": ns},
            "spec": {"hosts": [format!("ext{}.example.com", rng.below(2)), format!("s{}.{ns}.svc.cluster.local", rng.below(4))],
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "resolution": "STATIC", "workloadSelector": {"labels": {"app": format!("s{}", rng.below(4))}}},
        })))),
        _ => {
            let (kind, prefix, n) = match rng.below(4) {
                0 => (Kind::Service, "s", 4),
                1 => (Kind::EndpointSlice, "e", 6),
                2 => (Kind::Pod, "p", 4),
                _ => (Kind::ServiceEntry, "x", 2),
            };
            SourceEvent::Delete(ObjectKey {
                kind,
                namespace: Some(ns.to_string()),
                name: format!("{prefix}{}", rng.below(n)),
            })
        }
    }
}

fn namespace(name: &str, member: bool) -> SourceEvent {
    let labels = if member {
        json!({"meshplane.io/rev": "blue"})
    } else {
        json!({})
    };
    SourceEvent::Upsert(Object::Namespace(typed(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels},
    }))))
}

/// An index of tenant `acme` whose members are `a` and `b` (`c` is not one).
fn tenant_index() -> TenantIndex {
    let mut index = TenantIndex::new("acme", "blue", "meshplane-acme", MeshConfig::default());
    for (ns, member) in [("a", true), ("b", true), ("c", false)] {
        index.apply(namespace(ns, member));
    }
    index
}

#[test]
fn keyed_updates_match_a_full_build() {
    for_choices(300, 1024, |mut rng| {
        let mut index = tenant_index();
        for step in 0..80 {
            let event = random_event(&mut rng);
            let context = format!("step {step}: {event:?}");
            let before = Arc::clone(index.registry());
            let change = index.apply(event);
            let (full, _) = index.state.build_registry();
            let now = index.registry();
            assert_eq!(now.services, full.services, "{context}");
            assert_eq!(now.endpoints, full.endpoints, "{context}");
            assert_eq!(now.pod_ports, full.pod_ports, "{context}");
            // The published pod addresses follow every event that changes them.
            assert_eq!(
                **index.watch().pod_addresses.borrow(),
                index.state.pod_addresses(),
                "{context}"
            );
            let expected = if before.services != full.services || before.pod_ports != full.pod_ports
            {
                ChangeKind::Config
            } else if before.endpoints != full.endpoints {
                ChangeKind::Endpoints
            } else {
                ChangeKind::None
            };
            assert_eq!(change.kind, expected, "{context}");
            if expected == ChangeKind::Endpoints {
                let ports: BTreeSet<&HostPort> = before
                    .endpoints
                    .keys()
                    .chain(full.endpoints.keys())
                    .collect();
                let differ: BTreeSet<HostPort> = ports
                    .into_iter()
                    .filter(|p| before.endpoints.get(*p) != full.endpoints.get(*p))
                    .cloned()
                    .collect();
                assert_eq!(change.clusters, differ, "{context}");
            }
        }
    });
}

fn pod(ns: &str, name: &str, spec: Value, status: Value) -> SourceEvent {
    SourceEvent::Upsert(Object::Pod(typed(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec, "status": status,
    }))))
}

#[test]
fn pod_addresses_are_the_running_pods_of_the_tenant_and_pod_networks_come_from_mesh_config() {
    let mut index = tenant_index();
    let app = json!({"containers": [{"name": "app"}]});
    index.apply(pod(
        "a",
        "web",
        app.clone(),
        json!({"podIP": "198.18.0.1",
        "podIPs": [{"ip": "198.18.0.1"}], "phase": "Running"}),
    ));
    index.apply(pod("b", "db", app.clone(), json!({"podIP": "198.18.0.2"})));
    // Not the tenant's: another namespace, the node's address, a finished pod's.
    index.apply(pod(
        "c",
        "theirs",
        app.clone(),
        json!({"podIP": "198.18.0.3"}),
    ));
    index.apply(pod(
        "a",
        "node-agent",
        json!({"hostNetwork": true, "containers": [{"name": "app"}]}),
        json!({"podIP": "198.19.0.1"}),
    ));
    index.apply(pod(
        "b",
        "job",
        app.clone(),
        json!({"podIP": "198.18.0.4", "phase": "Succeeded"}),
    ));
    let watch = index.watch();
    let held = |w: &IndexWatch| -> Vec<String> {
        w.pod_addresses
            .borrow()
            .iter()
            .map(|a| a.to_string())
            .collect()
    };
    assert_eq!(held(&watch), ["198.18.0.1", "198.18.0.2"]);
    // A deleted pod's address is released; a namespace that leaves takes its pods along.
    index.apply(SourceEvent::Delete(ObjectKey {
        kind: Kind::Pod,
        namespace: Some("a".into()),
        name: "web".into(),
    }));
    assert_eq!(held(&watch), ["198.18.0.2"]);
    index.apply(namespace("b", false));
    assert!(held(&watch).is_empty(), "{:?}", held(&watch));

    assert!(
        watch.pod_networks.borrow().is_empty(),
        "unset: the check is off"
    );
    index.apply(SourceEvent::MeshConfig(Box::new(MeshConfig {
        pod_networks: vec!["198.18.0.0/16".into()],
        ..MeshConfig::default()
    })));
    index.apply(namespace("b", true));
    let nets: Vec<String> = watch
        .pod_networks
        .borrow()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(nets, ["198.18.0.0/16"]);
}

fn sidecar_event(rng: &mut Choices) -> SourceEvent {
    let ns = NAMESPACES[rng.below(2) as usize];
    if rng.chance(25) {
        return SourceEvent::Delete(ObjectKey {
            kind: Kind::Sidecar,
            namespace: Some(ns.to_string()),
            name: "default".to_string(),
        });
    }
    let hosts = match rng.below(4) {
        0 => json!(["./*"]),
        1 => json!(["b/*"]),
        2 => json!(["*/s1.a.svc.cluster.local", "./s2.b.svc.cluster.local"]),
        _ => json!(["a/*", "b/*"]),
    };
    SourceEvent::Upsert(Object::Sidecar(typed(json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {"egress": [{"hosts": hosts}]},
    }))))
}

/// A VirtualService or Gateway upsert or delete: VirtualServices name services of the tenant
/// (by full name, short name or wildcard) or external hosts, as hosts and as destinations, for
/// sidecars, the gateway or both; the Gateway selects the gateway proxy.
fn traffic_event(rng: &mut Choices) -> SourceEvent {
    const HOSTS: [&str; 5] = [
        "s1.a.svc.cluster.local",
        "s2",
        "*.b.svc.cluster.local",
        "ext0.example.com",
        "s3.b.svc.cluster.local",
    ];
    const DESTINATIONS: [&str; 4] = [
        "s0",
        "s1.a.svc.cluster.local",
        "s2.b.svc.cluster.local",
        "ext1.example.com",
    ];
    let ns = NAMESPACES[rng.below(2) as usize];
    if rng.chance(20) {
        if rng.chance(50) {
            return SourceEvent::Delete(ObjectKey {
                kind: Kind::Gateway,
                namespace: Some("b".to_string()),
                name: "gw".to_string(),
            });
        }
        return SourceEvent::Upsert(Object::Gateway(typed(json!({
            "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "b"},
            "spec": {"selector": {"app": "gw"},
                "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*/*"]}]},
        }))));
    }
    let name = format!("v{}", rng.below(2));
    if rng.chance(25) {
        return SourceEvent::Delete(ObjectKey {
            kind: Kind::VirtualService,
            namespace: Some(ns.to_string()),
            name,
        });
    }
    let gateways = match rng.below(3) {
        0 => json!([]),
        1 => json!(["b/gw"]),
        _ => json!(["mesh", "b/gw"]),
    };
    SourceEvent::Upsert(Object::VirtualService(typed(json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hosts": [HOSTS[rng.below(5) as usize]], "gateways": gateways,
            "http": [{"route": [{"destination": {"host": DESTINATIONS[rng.below(4) as usize]}}]}]},
    }))))
}

fn proxy(kind: ProxyKind, namespace: &str, pod: Option<&str>, app: &str) -> ProxyNode {
    ProxyNode {
        id: format!("{kind:?}~{namespace}~{app}"),
        kind,
        pod_name: pod.map(str::to_string),
        ip: None,
        ..mk_proxy(namespace, &[("app", app)])
    }
}

/// The render cache against renders without it: random Service, EndpointSlice, Pod,
/// ServiceEntry, Sidecar, VirtualService and Gateway events, with sidecars of both member
/// namespaces (one known by its Pod), a proxyless gRPC client and a gateway. After every event
/// each proxy's cached configuration (patched per endpoint change, kept or dropped per Service
/// change) equals a fresh render of the same state.
#[test]
fn cached_configurations_equal_fresh_renders_after_every_event() {
    let proxies = [
        proxy(ProxyKind::Sidecar, "a", Some("p0"), "s0"),
        proxy(ProxyKind::Sidecar, "a", None, "s2"),
        proxy(ProxyKind::Sidecar, "b", None, "s1"),
        proxy(ProxyKind::Grpc, "a", None, "s3"),
        proxy(ProxyKind::Router, "b", None, "gw"),
    ];
    // Service changes after which some configuration stayed cached: the per-scope path ran.
    let kept_across_service_changes = Cell::new(0);
    // Of those, the ones made while the tenant had VirtualServices.
    let kept_beside_virtual_services = Cell::new(0);
    // Configurations updated in place by splicing a Service change in.
    let spliced = Cell::new(0);
    for_choices(120, 1024, |mut rng| {
        let mut index = tenant_index();
        for step in 0..60 {
            for p in &proxies {
                index.render(p);
            }
            let event = match rng.below(20) {
                0..=1 => sidecar_event(&mut rng),
                2..=4 => traffic_event(&mut rng),
                _ => random_event(&mut rng),
            };
            let context = format!("step {step}: {event:?}");
            let is_service = matches!(&event, SourceEvent::Upsert(Object::Service(_)))
                || matches!(&event, SourceEvent::Delete(k) if k.kind == Kind::Service);
            let change = index.apply(event);
            if is_service && change.kind == ChangeKind::Config && index.cached_scopes() > 0 {
                kept_across_service_changes.set(kept_across_service_changes.get() + 1);
                if !index.registry().virtual_services.is_empty() {
                    kept_beside_virtual_services.set(kept_beside_virtual_services.get() + 1);
                }
            }
            for p in &proxies {
                let cached = index.render(p);
                let fresh = index.render_checked(p).0;
                assert!(*cached == fresh, "{context}: proxy {}", p.id);
            }
        }
        spliced.set(spliced.get() + index.lock_cache().spliced);
    });
    let (spliced, kept_across_service_changes, kept_beside_virtual_services) = (
        spliced.get(),
        kept_across_service_changes.get(),
        kept_beside_virtual_services.get(),
    );
    assert!(
        spliced > 50,
        "only {spliced} configurations were spliced on a Service change"
    );
    assert!(
        kept_across_service_changes > 50,
        "only {kept_across_service_changes} Service changes kept a cached configuration"
    );
    assert!(
        kept_beside_virtual_services > 20,
        "only {kept_beside_virtual_services} Service changes beside VirtualServices kept a cached configuration"
    );
}

fn service(namespace: &str, name: &str, ip: &str, port: u16) -> SourceEvent {
    SourceEvent::Upsert(Object::Service(typed(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": ip, "selector": {"app": name},
            "ports": [{"name": "http", "port": port, "targetPort": 8080}]},
    }))))
}

/// A VirtualService routing an imported host to a host the scope does not import: the route's
/// cluster takes the destination's only port, so a port change of the destination Service
/// changes the configuration of a scope that does not see the destination itself.
#[test]
fn a_service_change_reaches_scopes_routing_to_it_through_a_virtual_service() {
    let mut index = tenant_index();
    index.apply(SourceEvent::Upsert(Object::Sidecar(typed(json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": "b"},
        "spec": {"egress": [{"hosts": ["./*"]}]},
    })))));
    index.apply(service("b", "front", "198.19.0.1", 80));
    index.apply(service("a", "back", "198.19.0.2", 80));
    index.apply(SourceEvent::Upsert(Object::VirtualService(typed(json!({
        "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "VirtualService",
        "metadata": {"name": "front", "namespace": "b"},
        "spec": {"hosts": ["front"],
            "http": [{"route": [{"destination": {"host": "back.a.svc.cluster.local"}}]}]},
    })))));
    let client = proxy(ProxyKind::Sidecar, "b", None, "client");
    let before = index.render(&client);

    index.apply(service("a", "back", "198.19.0.2", 9090));
    let cached = index.render(&client);
    let fresh = index.render_checked(&client).0;
    assert!(
        *before != fresh,
        "the port change changes the route's cluster"
    );
    assert!(
        *cached == fresh,
        "the cached configuration was dropped and rendered anew"
    );

    // A Service no VirtualService names keeps the scope cached.
    index.apply(service("a", "other", "198.19.0.3", 80));
    assert_eq!(index.cached_scopes(), 1, "the client's scope stays cached");
    assert!(*index.render(&client) == index.render_checked(&client).0);
}

fn service_with_ports(namespace: &str, name: &str, ip: &str, ports: Value) -> SourceEvent {
    SourceEvent::Upsert(Object::Service(typed(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": ip, "selector": {"app": name}, "ports": ports},
    }))))
}

/// Which Service changes are spliced into a cached configuration, which drop it, and that a
/// spliced configuration is the one a full render gives.
#[test]
fn a_service_change_is_spliced_only_where_it_touches_the_hosts_own_resources() {
    let mut index = tenant_index();
    index.apply(service("a", "front", "198.19.0.1", 80));
    let client = proxy(ProxyKind::Sidecar, "b", None, "client");
    let mut spliced = 0;
    // `expect_splice`: the change keeps the client's scope cached, updated in place.
    let mut check = |index: &mut TenantIndex, event: SourceEvent, expect_splice: bool| {
        let before = index.render(&client);
        let context = format!("{event:?}");
        assert_eq!(index.apply(event).kind, ChangeKind::Config, "{context}");
        let now = index.lock_cache().spliced;
        assert_eq!(now > spliced, expect_splice, "{context}");
        assert_eq!(index.cached_scopes() == 1, expect_splice, "{context}");
        spliced = now;
        let cached = index.render(&client);
        assert!(*cached != *before, "{context}: the configuration changed");
        assert!(*cached == index.render_checked(&client).0, "{context}");
    };
    let http = |port: u16| json!([{"name": "http", "port": port, "targetPort": 8080}]);
    // Another host on port 80: its cluster, assignment and virtual host join.
    check(&mut index, service("a", "back", "198.19.0.2", 80), true);
    // Its address changes: its virtual host's domains change.
    check(&mut index, service("a", "back", "198.19.0.3", 80), true);
    // A host sorting before the others joins at the front of the route configuration.
    check(&mut index, service("a", "aaa", "198.19.0.4", 80), true);
    // A TCP port owns filter chains of the listener: rendered anew.
    let tcp = json!([{"name": "tcp-db", "port": 5432}]);
    check(
        &mut index,
        service_with_ports("a", "db", "198.19.0.5", tcp),
        false,
    );
    // A port without a route configuration yet gets its own listener: rendered anew.
    check(
        &mut index,
        service("a", "metrics", "198.19.0.6", 9090),
        false,
    );
    // The only host of a port leaving takes the listener's routes with it: rendered anew.
    let delete = |name: &str| {
        SourceEvent::Delete(ObjectKey {
            kind: Kind::Service,
            namespace: Some("a".to_string()),
            name: name.to_string(),
        })
    };
    check(&mut index, delete("metrics"), false);
    // A host leaving a port others stay on: spliced out.
    check(&mut index, delete("aaa"), true);
    // A host claiming another's address: the first host keeps the domain, rendered anew.
    check(&mut index, service("a", "copy", "198.19.0.1", 80), false);
    // A Service in the client's own namespace that does not select it: spliced, with the bare
    // short name among its domains there.
    check(
        &mut index,
        service_with_ports("b", "local", "198.19.0.7", http(80)),
        true,
    );
    let routes = index.render(&client).routes.clone();
    let domains: Vec<String> = routes
        .iter()
        .filter(|r| r.name == "80")
        .filter_map(|r| RouteConfiguration::decode(r.encoded.clone()).ok())
        .flat_map(|rc| rc.virtual_hosts)
        .filter(|v| v.name == "local.b.svc.cluster.local:80")
        .flat_map(|v| v.domains)
        .collect();
    assert!(domains.iter().any(|d| d == "local"), "{domains:?}");
    // One selecting the client adds its inbound ports: the client moves to a scope of its own,
    // rendered anew, and the one it left is spliced.
    let before = index.render(&client);
    assert_eq!(
        index
            .apply(service_with_ports("b", "client", "198.19.0.8", http(80)))
            .kind,
        ChangeKind::Config
    );
    let after = index.render(&client);
    assert!(*after != *before);
    assert!(*after == index.render_checked(&client).0);
    assert_eq!(index.cached_scopes(), 2);
}

/// Configurations holding the same assignments (the same interned `Arc`s) share one index of
/// them; other assignments get their own. Subset assignments are indexed under the cluster
/// whose endpoints they are built from.
#[test]
fn configurations_with_the_same_assignments_share_their_index() {
    let assignment = |name: &str| {
        Arc::new(Resource {
            name: name.to_string(),
            type_url: type_url::ENDPOINT,
            encoded: bytes::Bytes::from(name.to_string()),
            version: name.to_string(),
            packed: Default::default(),
        })
    };
    let web = assignment("outbound|80||web.a.svc.cluster.local");
    let web_v1 = assignment("outbound|80|v1|web.a.svc.cluster.local");
    let api = assignment("outbound|80||api.b.svc.cluster.local");
    let config = |endpoints: Vec<Arc<Resource>>| {
        Arc::new(ProxyConfig {
            endpoints,
            ..ProxyConfig::default()
        })
    };
    let mut memo = EdsIndexMemo::default();
    let one = memo.index(&config(vec![
        Arc::clone(&api),
        Arc::clone(&web),
        Arc::clone(&web_v1),
    ]));
    let two = memo.index(&config(vec![
        Arc::clone(&api),
        Arc::clone(&web),
        Arc::clone(&web_v1),
    ]));
    assert!(Arc::ptr_eq(&one, &two));
    let port = |host: &str| HostPort::new(host, 80);
    assert_eq!(
        one.get(&port("web.a.svc.cluster.local")),
        Some(&vec![(1, String::new()), (2, "v1".to_string())])
    );
    assert_eq!(
        one.get(&port("api.b.svc.cluster.local")),
        Some(&vec![(0, String::new())])
    );
    // Same length and ends, another assignment between them: its own index.
    let other = assignment("outbound|80||web.a.svc.cluster.local");
    let three = memo.index(&config(vec![Arc::clone(&api), other, Arc::clone(&web_v1)]));
    assert!(!Arc::ptr_eq(&one, &three));
    assert_eq!(*three, *one);
}
