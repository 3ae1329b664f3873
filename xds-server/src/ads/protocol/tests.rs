//! The protocol layer against its reference model and in scenarios.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::super::map_diff::tests::{diffs_from_changes, walks};
use super::subscription::WILDCARD;
use super::tracker_model;
use super::*;
use crate::ads::snapshot::{Snapshot, TYPE_COUNT, VHDS};
use crate::model::{type_url, Resource};
use meshplane_xds_core::test_choices::{for_choices, Choices};
use meshplane_xds_core::testing::mk_resource;

const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// Resources of each type named from [`NAMES`] (virtual hosts `<name>/x` and `<name>/y`,
/// in the namespaces of route names), with a VHDS form of the routes most of the time.
fn random_config(rng: &mut Choices) -> crate::model::ProxyConfig {
    let mut lists: [Vec<Arc<Resource>>; TYPE_COUNT + 1] = Default::default();
    for (i, list) in lists.iter_mut().enumerate() {
        let names: Vec<String> = if i == VHDS {
            NAMES
                .iter()
                .flat_map(|n| [format!("{n}/x"), format!("{n}/y")])
                .collect()
        } else {
            NAMES.iter().map(|n| n.to_string()).collect()
        };
        for name in names {
            if rng.chance(60) {
                let body = format!("{name}{}", rng.below(3));
                list.push(Arc::new(Resource {
                    type_url: type_url::ORDER[i.min(VHDS)],
                    name,
                    version: super::super::snapshot::content_version(body.as_bytes()),
                    packed: Default::default(),
                    encoded: Bytes::from(body),
                }));
            }
        }
    }
    let [clusters, endpoints, listeners, routes, virtual_hosts, stubs] = lists;
    crate::model::ProxyConfig {
        clusters,
        endpoints,
        listeners,
        routes,
        vhds: rng.chance(80).then_some(crate::model::VhdsRoutes {
            routes: stubs
                .into_iter()
                .map(|r| {
                    Arc::new(Resource {
                        type_url: type_url::ROUTE,
                        ..(*r).clone()
                    })
                })
                .collect(),
            virtual_hosts,
        }),
    }
}

/// `config` with one resource of one type added, changed or removed, the others shared:
/// the kind of change a push usually makes.
fn successor(config: &crate::model::ProxyConfig, rng: &mut Choices) -> crate::model::ProxyConfig {
    let mut next = config.clone();
    let i = rng.below(TYPE_COUNT as u64) as usize;
    let name = NAMES[rng.below(NAMES.len() as u64) as usize];
    let (list, name, url) = match i {
        0 => (&mut next.clusters, name.to_string(), type_url::CLUSTER),
        1 => (&mut next.endpoints, name.to_string(), type_url::ENDPOINT),
        2 => (&mut next.listeners, name.to_string(), type_url::LISTENER),
        3 => (&mut next.routes, name.to_string(), type_url::ROUTE),
        _ => match &mut next.vhds {
            Some(v) => (
                &mut v.virtual_hosts,
                format!("{name}/x"),
                type_url::VIRTUAL_HOST,
            ),
            None => (&mut next.routes, name.to_string(), type_url::ROUTE),
        },
    };
    let at = list.partition_point(|r| r.name < name);
    let present = list.get(at).is_some_and(|r| r.name == name);
    if present && rng.chance(30) {
        list.remove(at);
    } else {
        let body = format!("{name}{}", rng.below(3));
        let r = Arc::new(Resource {
            type_url: url,
            name,
            version: super::super::snapshot::content_version(body.as_bytes()),
            packed: Default::default(),
            encoded: Bytes::from(body),
        });
        if present {
            list[at] = r;
        } else {
            list.insert(at, r);
        }
    }
    next
}

fn random_names(rng: &mut Choices) -> Vec<String> {
    let mut names: Vec<String> = NAMES
        .iter()
        .filter(|_| rng.chance(40))
        .map(|n| n.to_string())
        .collect();
    if rng.chance(15) {
        names.push(WILDCARD.to_string());
    }
    if rng.chance(10) {
        // A full virtual host name: no namespace of VHDS.
        names.push("a/x".to_string());
    }
    names
}

fn view(o: &Outgoing) -> (String, String, String, Vec<(String, String)>, Vec<String>) {
    (
        o.type_url.to_string(),
        o.nonce.clone(),
        o.version.clone(),
        o.resources
            .iter()
            .map(|r| (r.name.clone(), r.version.clone()))
            .collect(),
        o.removed.clone(),
    )
}

type TypeView = (
    bool,
    Option<String>,
    Option<String>,
    bool,
    Vec<(String, String)>,
);

fn state_view(s: &StreamState) -> Vec<TypeView> {
    s.types()
        .map(|(_, t)| {
            (
                t.subscribed(),
                t.sent_version().map(str::to_string),
                t.acked_version().map(str::to_string),
                t.awaiting_ack(),
                t.held()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            )
        })
        .collect()
}

fn model_view(s: &tracker_model::StreamState) -> Vec<TypeView> {
    s.types()
        .map(|(_, t)| {
            (
                t.subscribed(),
                t.sent_version().map(str::to_string),
                t.acked_version().map(str::to_string),
                t.awaiting_ack(),
                t.held()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            )
        })
        .collect()
}

/// Random protocol sessions (subscriptions, ACKs, NACKs, stale nonces, reconnects with a
/// version, config changes and repeated wake-ups) give the same responses and state as the
/// tracker that recomputed everything on every wake-up.
fn matches_the_recomputing_model(protocol: Protocol, vhds: bool, mut rng: Choices) {
    let mut state = StreamState::new(protocol);
    let mut model = tracker_model::StreamState::new(protocol);
    if vhds {
        state = state.with_vhds();
        model = model.with_vhds();
    }
    let mut config = random_config(&mut rng);
    let mut snapshot = Snapshot::new(&config, Instant::now());
    let mut last: Vec<Outgoing> = Vec::new();
    for step in 0..60 {
        let type_url = type_url::ORDER[rng.below(TYPE_COUNT as u64) as usize];
        match rng.below(10) {
            0..=2 => {
                // Mostly as the push loop builds them: recording what changed since the
                // last one, which settled streams plan from.
                config = if rng.chance(50) {
                    successor(&config, &mut rng)
                } else {
                    random_config(&mut rng)
                };
                snapshot = if rng.chance(80) {
                    Snapshot::reusing(&config, Instant::now(), Some(&snapshot))
                } else {
                    Snapshot::new(&config, Instant::now())
                };
            }
            3..=6 => {
                // Answer one of the last responses (or something stale), keeping or
                // changing the subscription.
                let (url, nonce, version) = match last.get(rng.below(4) as usize) {
                    Some(o) if !rng.chance(10) => (o.type_url, o.nonce.clone(), o.version.clone()),
                    _ => (type_url, rng.below(50).to_string(), String::new()),
                };
                let error = rng.chance(20).then_some("rejected");
                let names = if rng.chance(70) {
                    Vec::new()
                } else {
                    random_names(&mut rng)
                };
                let (a, b) = match protocol {
                    Protocol::Sotw => (
                        state.on_sotw_request(url, &nonce, &version, &names, error),
                        model.on_sotw_request(url, &nonce, &version, &names, error),
                    ),
                    Protocol::Delta => {
                        let unsubscribe = if rng.chance(20) {
                            random_names(&mut rng)
                        } else {
                            Vec::new()
                        };
                        (
                            state.on_delta_request(
                                url,
                                &nonce,
                                &names,
                                &unsubscribe,
                                &HashMap::new(),
                                error,
                            ),
                            model.on_delta_request(
                                url,
                                &nonce,
                                &names,
                                &unsubscribe,
                                &HashMap::new(),
                                error,
                            ),
                        )
                    }
                };
                let strip = |o: RequestOutcome| match o {
                    RequestOutcome::Nack { type_url, nack } => {
                        (type_url.to_string(), nack.version, nack.message)
                    }
                    other => (format!("{other:?}"), String::new(), String::new()),
                };
                assert_eq!(strip(a), strip(b), "step {step}");
            }
            _ => {
                // A first subscription (possibly resuming a version, or with initial
                // versions) of a type not asked for yet.
                let names = random_names(&mut rng);
                let resume = if rng.chance(50) {
                    snapshot.types[rng.below(TYPE_COUNT as u64) as usize]
                        .version
                        .clone()
                } else {
                    String::new()
                };
                let initial: HashMap<String, String> = snapshot.types[1]
                    .resources
                    .iter()
                    .filter(|_| rng.chance(50))
                    .map(|(n, r)| (n.clone(), r.version.clone()))
                    .collect();
                match protocol {
                    Protocol::Sotw => {
                        state.on_sotw_request(type_url, "", &resume, &names, None);
                        model.on_sotw_request(type_url, "", &resume, &names, None);
                    }
                    Protocol::Delta => {
                        state.on_delta_request(type_url, "", &names, &[], &initial, None);
                        model.on_delta_request(type_url, "", &names, &[], &initial, None);
                    }
                }
            }
        }
        // Wake up once or twice for the same snapshot.
        for _ in 0..=rng.below(2) {
            let ours = state.next_responses(&snapshot);
            let theirs = model.next_responses(&snapshot);
            assert_eq!(
                ours.iter().map(view).collect::<Vec<_>>(),
                theirs.iter().map(view).collect::<Vec<_>>(),
                "step {step}"
            );
            if !ours.is_empty() {
                last = ours;
            }
        }
        assert_eq!(state_view(&state), model_view(&model), "step {step}");
    }
}

#[test]
fn sotw_matches_the_recomputing_model() {
    let before = diffs_from_changes();
    for_choices(400, 4096, |rng| {
        matches_the_recomputing_model(Protocol::Sotw, false, rng)
    });
    // The sequences reach the plans taken from a snapshot's recorded changes.
    assert!(diffs_from_changes() - before > 100);
}

#[test]
fn delta_matches_the_recomputing_model() {
    let before = diffs_from_changes();
    for_choices(400, 4096, |rng| {
        matches_the_recomputing_model(Protocol::Delta, false, rng)
    });
    // The sequences reach the plans taken from a snapshot's recorded changes.
    assert!(diffs_from_changes() - before > 100);
}

/// Delta Envoys with VHDS: route stubs, and virtual hosts subscribed by namespace.
#[test]
fn vhds_matches_the_recomputing_model() {
    let before = diffs_from_changes();
    for_choices(400, 4096, |rng| {
        matches_the_recomputing_model(Protocol::Delta, true, rng)
    });
    // The sequences reach the plans taken from a snapshot's recorded changes.
    assert!(diffs_from_changes() - before > 100);
}

fn resource(url: &'static str, name: &str, body: &str) -> Arc<Resource> {
    mk_resource(url, name, body.to_string())
}

/// SotW streams that send a snapshot's whole set share one framing of it: the first
/// clusters, the first assignments (all of them) and the clusters after a change; a
/// stream that subscribed to some names only gets those, listed.
#[test]
fn sotw_streams_share_the_framing_of_a_whole_snapshot() {
    let config = |n: usize| crate::model::ProxyConfig {
        clusters: (0..n)
            .map(|i| resource(type_url::CLUSTER, &format!("c{i}"), "c"))
            .collect(),
        endpoints: (0..n)
            .map(|i| resource(type_url::ENDPOINT, &format!("c{i}"), "e"))
            .collect(),
        ..Default::default()
    };
    let framing = |o: &Outgoing| match &o.resources {
        Resources::Whole(_, fields) => Some(Arc::clone(fields)),
        Resources::Listed(_) => None,
    };
    let ack = |s: &mut StreamState, o: &Outgoing, names: &[String]| {
        s.on_sotw_request(o.type_url, &o.nonce, &o.version, names, None);
    };
    let wildcard = vec![WILDCARD.to_string()];
    let mut snapshot = Snapshot::new(&config(3), Instant::now());
    let mut streams: Vec<StreamState> = (0..2)
        .map(|_| {
            let mut s = StreamState::new(Protocol::Sotw);
            s.on_sotw_request(type_url::CLUSTER, "", "", &[], None);
            s.on_sotw_request(type_url::ENDPOINT, "", "", &wildcard, None);
            s
        })
        .collect();
    for round in 0..2 {
        let mut framings = Vec::new();
        for s in &mut streams {
            let out = s.next_responses(&snapshot);
            let cds = out.iter().find(|o| o.type_url == type_url::CLUSTER);
            let cds = cds.expect("clusters");
            assert_eq!(cds.resources.len(), 3 + round);
            framings.push(framing(cds).expect("the whole set"));
            if round == 0 {
                let eds = out.iter().find(|o| o.type_url == type_url::ENDPOINT);
                let eds = eds.expect("every assignment");
                assert!(framing(eds).is_some());
                ack(s, eds, &wildcard);
            }
            ack(s, cds, &[]);
            let rest = s.next_responses(&snapshot);
            for o in &rest {
                // After the change, the new assignment alone.
                assert_eq!(o.type_url, type_url::ENDPOINT);
                assert!(framing(o).is_none());
                assert_eq!(o.resources.len(), 1);
                ack(s, o, &wildcard);
            }
        }
        assert!(Arc::ptr_eq(&framings[0], &framings[1]), "framed once");
        snapshot = Snapshot::reusing(&config(4), Instant::now(), Some(&snapshot));
    }
    let mut named = StreamState::new(Protocol::Sotw);
    named.on_sotw_request(type_url::CLUSTER, "", "", &[], None);
    named.on_sotw_request(type_url::ENDPOINT, "", "", &["c1".to_string()], None);
    let out = named.next_responses(&snapshot);
    let eds = out.iter().find(|o| o.type_url == type_url::ENDPOINT);
    let eds = eds.expect("the named assignment");
    assert!(framing(eds).is_none());
    assert_eq!(
        eds.resources.iter().map(|r| &r.name).collect::<Vec<_>>(),
        ["c1"]
    );
}

/// A VHDS stream gets the route stubs, then the virtual hosts of the namespaces it
/// subscribed and only those; a new virtual host goes alone, a removed one by name; a
/// stream without VHDS gets the inline routes and does not serve the type.
#[test]
fn vhds_streams_get_stubs_and_the_virtual_hosts_of_their_namespaces() {
    let vh = |name: &str, body: &str| resource(type_url::VIRTUAL_HOST, name, body);
    let config = |hosts: Vec<Arc<Resource>>| crate::model::ProxyConfig {
        clusters: vec![resource(type_url::CLUSTER, "c", "c")],
        routes: vec![
            resource(type_url::ROUTE, "80", "inline 80"),
            resource(type_url::ROUTE, "8080", "inline 8080"),
        ],
        vhds: Some(crate::model::VhdsRoutes {
            routes: vec![
                resource(type_url::ROUTE, "80", "stub 80"),
                resource(type_url::ROUTE, "8080", "stub 8080"),
            ],
            virtual_hosts: hosts,
        }),
        ..Default::default()
    };
    let hosts = vec![vh("80/a", "a"), vh("80/b", "b"), vh("8080/a", "a2")];
    let snapshot = Snapshot::new(&config(hosts.clone()), Instant::now());
    let names =
        |o: &Outgoing| -> Vec<String> { o.resources.iter().map(|r| r.name.clone()).collect() };
    let bodies =
        |o: &Outgoing| -> Vec<Bytes> { o.resources.iter().map(|r| r.encoded.clone()).collect() };
    let ack = |s: &mut StreamState, o: &Outgoing| {
        s.on_delta_request(o.type_url, &o.nonce, &[], &[], &HashMap::new(), None)
    };

    let mut s = StreamState::new(Protocol::Delta).with_vhds();
    s.on_delta_request(type_url::CLUSTER, "", &[], &[], &HashMap::new(), None);
    let cds = s.next_responses(&snapshot);
    ack(&mut s, &cds[0]);
    let rds_names = vec!["80".to_string(), "8080".to_string()];
    s.on_delta_request(type_url::ROUTE, "", &rds_names, &[], &HashMap::new(), None);
    let rds = s.next_responses(&snapshot);
    assert_eq!(bodies(&rds[0]), ["stub 80", "stub 8080"]);
    ack(&mut s, &rds[0]);
    // Envoy subscribes one route configuration's virtual hosts.
    s.on_delta_request(
        type_url::VIRTUAL_HOST,
        "",
        &["80".into()],
        &[],
        &HashMap::new(),
        None,
    );
    let first = s.next_responses(&snapshot);
    assert_eq!(first.len(), 1);
    assert_eq!(names(&first[0]), ["80/a", "80/b"]);
    ack(&mut s, &first[0]);
    // A new virtual host goes alone; one of an unsubscribed namespace does not go.
    let grown = Snapshot::new(
        &config([hosts.clone(), vec![vh("80/c", "c"), vh("8080/b", "b2")]].concat()),
        Instant::now(),
    );
    let next = s.next_responses(&grown);
    assert_eq!(next.len(), 1);
    assert_eq!(names(&next[0]), ["80/c"]);
    assert!(next[0].removed.is_empty());
    ack(&mut s, &next[0]);
    // A removed one goes by name.
    let shrunk = Snapshot::new(
        &config(vec![vh("80/a", "a"), vh("80/c", "c")]),
        Instant::now(),
    );
    let removal = s.next_responses(&shrunk);
    assert_eq!(removal.len(), 1);
    assert!(removal[0].resources.is_empty());
    assert_eq!(removal[0].removed, ["80/b"]);
    ack(&mut s, &removal[0]);
    // Unsubscribing the namespace forgets its virtual hosts without a removal.
    s.on_delta_request(
        type_url::VIRTUAL_HOST,
        "",
        &[],
        &["80".into()],
        &HashMap::new(),
        None,
    );
    let (_, vhds) = s.types().nth(VHDS).expect("vhds tracker");
    assert_eq!(vhds.held().count(), 0);

    let mut plain = StreamState::new(Protocol::Delta);
    assert!(matches!(
        plain.on_delta_request(
            type_url::VIRTUAL_HOST,
            "",
            &["80".into()],
            &[],
            &HashMap::new(),
            None
        ),
        RequestOutcome::UnknownType(_)
    ));
    plain.on_delta_request(type_url::ROUTE, "", &rds_names, &[], &HashMap::new(), None);
    let inline = plain.next_responses(&snapshot);
    assert_eq!(bodies(&inline[0]), ["inline 80", "inline 8080"]);
    // VHDS is delta only.
    assert!(!StreamState::new(Protocol::Sotw).with_vhds().vhds());

    // Envoy 1.40 subscribes without names: only the virtual hosts of the route
    // configurations it holds go, those of one it gets later after that one's ACK.
    let mut envoy = StreamState::new(Protocol::Delta).with_vhds();
    envoy.on_delta_request(
        type_url::ROUTE,
        "",
        &["80".into()],
        &[],
        &HashMap::new(),
        None,
    );
    let rds = envoy.next_responses(&snapshot);
    assert_eq!(names(&rds[0]), ["80"]);
    envoy.on_delta_request(type_url::VIRTUAL_HOST, "", &[], &[], &HashMap::new(), None);
    assert!(
        envoy.next_responses(&snapshot).is_empty(),
        "routes not ACKed yet"
    );
    ack(&mut envoy, &rds[0]);
    let first = envoy.next_responses(&snapshot);
    assert_eq!(names(&first[0]), ["80/a", "80/b"]);
    ack(&mut envoy, &first[0]);
    envoy.on_delta_request(
        type_url::ROUTE,
        "",
        &["8080".into()],
        &[],
        &HashMap::new(),
        None,
    );
    let more = envoy.next_responses(&snapshot);
    assert_eq!(
        more.len(),
        1,
        "{:?}",
        more.iter().map(names).collect::<Vec<_>>()
    );
    assert_eq!(names(&more[0]), ["8080"]);
    ack(&mut envoy, &more[0]);
    let later = envoy.next_responses(&snapshot);
    assert_eq!(names(&later[0]), ["8080/a"]);
}

#[test]
fn an_unchanged_wildcard_type_shares_the_snapshot_map() {
    let res = |name: &str| {
        Arc::new(Resource {
            name: name.into(),
            type_url: type_url::CLUSTER,
            encoded: Bytes::from(name.to_string()),
            version: name.into(),
            packed: Default::default(),
        })
    };
    let config = crate::model::ProxyConfig {
        clusters: vec![res("a"), res("b")],
        ..Default::default()
    };
    let snapshot = Snapshot::new(&config, Instant::now());
    let mut state = StreamState::new(Protocol::Sotw);
    state.on_sotw_request(type_url::CLUSTER, "", "", &[], None);
    let out = state.next_responses(&snapshot);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].version, snapshot.types[0].version);
    state.on_sotw_request(type_url::CLUSTER, &out[0].nonce, &out[0].version, &[], None);
    assert!(state.next_responses(&snapshot).is_empty());
    let (_, cds) = state.types().next().expect("cds tracker");
    assert!(Arc::ptr_eq(cds.held_map(), &snapshot.types[0].resources));
}

/// A stream that holds its whole configuration and gets a successor with one cluster, its
/// assignment and its virtual host added plans it without a look at the other resources
/// (the snapshot recorded what changed), and gets just those (all of CDS over SotW).
#[test]
fn a_settled_stream_plans_a_small_change_without_walking_its_resources() {
    let res = |url: &'static str, name: &str| resource(url, name, name);
    let config = |services: std::ops::Range<usize>| {
        let n = services.len();
        let names: Vec<String> = services.map(|i| format!("svc{i:03}")).collect();
        let of = |url| names.iter().map(|c| res(url, c)).collect::<Vec<_>>();
        crate::model::ProxyConfig {
            clusters: of(type_url::CLUSTER),
            endpoints: of(type_url::ENDPOINT),
            listeners: vec![res(type_url::LISTENER, "out")],
            routes: vec![resource(type_url::ROUTE, "80", &format!("{n} hosts"))],
            vhds: Some(crate::model::VhdsRoutes {
                routes: vec![resource(type_url::ROUTE, "80", "stub")],
                virtual_hosts: names
                    .iter()
                    .map(|c| res(type_url::VIRTUAL_HOST, &format!("80/{c}")))
                    .collect(),
            }),
        }
    };
    for (protocol, vhds) in [
        (Protocol::Delta, true),
        (Protocol::Delta, false),
        (Protocol::Sotw, false),
    ] {
        let mut s = StreamState::new(protocol);
        if vhds {
            s = s.with_vhds();
        }
        // SotW: the assignments by wildcard, as the bench's clients. (Envoy names them,
        // and a new cluster makes that a new subscription whose request lists every name:
        // the stream then looks at each, in the size of the request.)
        let sotw_names = |url: &str| match url {
            type_url::ENDPOINT => vec![WILDCARD.to_string()],
            type_url::ROUTE => vec!["80".to_string()],
            _ => Vec::new(),
        };
        // Answers every response with an ACK until nothing is due.
        let settle = |s: &mut StreamState, snapshot: &Snapshot| {
            let mut sent = Vec::new();
            loop {
                let out = s.next_responses(snapshot);
                if out.is_empty() {
                    return sent;
                }
                for o in out {
                    match protocol {
                        Protocol::Sotw => s.on_sotw_request(
                            o.type_url,
                            &o.nonce,
                            &o.version,
                            &sotw_names(o.type_url),
                            None,
                        ),
                        Protocol::Delta => s.on_delta_request(
                            o.type_url,
                            &o.nonce,
                            &[],
                            &[],
                            &HashMap::new(),
                            None,
                        ),
                    };
                    sent.push(o);
                }
            }
        };
        let before = Snapshot::new(&config(0..50), Instant::now());
        let star = vec![WILDCARD.to_string()];
        match protocol {
            Protocol::Sotw => {
                for url in &type_url::ORDER[..VHDS] {
                    s.on_sotw_request(url, "", "", &sotw_names(url), None);
                }
            }
            Protocol::Delta => {
                for url in &type_url::ORDER[..VHDS] {
                    s.on_delta_request(url, "", &star, &[], &HashMap::new(), None);
                }
                if vhds {
                    let ns = vec!["80".to_string()];
                    s.on_delta_request(type_url::VIRTUAL_HOST, "", &ns, &[], &HashMap::new(), None);
                }
            }
        }
        settle(&mut s, &before);
        // Built as the push loop does, once for every stream (that walks, per type).
        let grown = Snapshot::reusing(&config(0..51), Instant::now(), Some(&before));
        let shrunk = Snapshot::reusing(&config(1..51), Instant::now(), Some(&grown));
        let walked = walks();
        let sent = settle(&mut s, &grown);
        let got: Vec<(&str, usize)> = sent
            .iter()
            .map(|o| (o.type_url, o.resources.len()))
            .collect();
        let mut want = vec![(type_url::CLUSTER, 1), (type_url::ENDPOINT, 1)];
        if protocol == Protocol::Sotw {
            want[0].1 = 51;
        }
        // The inline route configuration changed too; VHDS clients get the new host.
        want.push(match vhds {
            true => (type_url::VIRTUAL_HOST, 1),
            false => (type_url::ROUTE, 1),
        });
        assert_eq!(got, want, "{protocol:?} vhds {vhds}");
        // A service removed: what names it goes first, the cluster last.
        let sent = settle(&mut s, &shrunk);
        let got: Vec<(&str, usize, Vec<String>)> = sent
            .iter()
            .map(|o| (o.type_url, o.resources.len(), o.removed.clone()))
            .collect();
        let gone = || vec!["svc000".to_string()];
        let want = match (protocol, vhds) {
            (Protocol::Sotw, _) => vec![
                (type_url::ROUTE, 1, vec![]),
                (type_url::CLUSTER, 50, vec![]),
            ],
            (Protocol::Delta, true) => vec![
                (type_url::VIRTUAL_HOST, 0, vec!["80/svc000".to_string()]),
                (type_url::ENDPOINT, 0, gone()),
                (type_url::CLUSTER, 0, gone()),
            ],
            (Protocol::Delta, false) => vec![
                (type_url::ROUTE, 1, vec![]),
                (type_url::ENDPOINT, 0, gone()),
                (type_url::CLUSTER, 0, gone()),
            ],
        };
        assert_eq!(got, want, "{protocol:?} vhds {vhds}");
        assert_eq!(walks(), walked, "{protocol:?} vhds {vhds}: walked");
    }
}
