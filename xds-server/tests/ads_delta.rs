//! Incremental (delta) ADS protocol rules, checked with a tonic client.
//!
//! "Nothing was sent" is proven by ordering, not by waiting: after the step under test the
//! client subscribes to something else, and the next message must be that answer.

mod ads_common;

use ads_common::*;
use envoy_types::pb::envoy::config::core::v3::Node;
use meshplane_xds::model::{type_url, ProxyConfig, VhdsRoutes};

#[tokio::test]
async fn wildcard_first_response_then_ack_is_not_answered() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = DeltaClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let r = c.recv().await;
    assert_eq!(delta_names(&r), ["c1"]);
    assert_eq!(
        r.resources[0].version,
        config("a").clusters[0].version,
        "per-resource content hash"
    );
    assert!(!r.system_version_info.is_empty() && !r.nonce.is_empty());
    c.ack(&r).await;
    c.send(type_url::LISTENER, &[], &[], "", None).await;
    assert_eq!(
        c.recv().await.type_url,
        type_url::LISTENER,
        "an ACK must not be answered"
    );
}

#[tokio::test]
async fn nack_is_recorded_and_not_resent_until_config_changes() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = DeltaClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let accepted = c.recv().await;
    c.ack(&accepted).await;
    h.set("shop", config("b")).await;
    let r = c.recv().await;
    c.send(type_url::CLUSTER, &[], &[], &r.nonce, nack("bad cluster"))
        .await;
    h.set("shop", config("b")).await;
    // Endpoints of the cluster the proxy kept still flow; listeners wait for accepted clusters.
    c.send(type_url::ENDPOINT, &["c1"], &[], "", None).await;
    let l = c.recv().await;
    assert_eq!(
        l.type_url,
        type_url::ENDPOINT,
        "NACKed clusters are not re-sent"
    );
    let status = h.hub.proxy_statuses();
    assert_eq!(status[0].protocol, "delta");
    assert_eq!(
        status[0].types[0]
            .last_nack
            .as_ref()
            .map(|n| n.message.as_str()),
        Some("bad cluster")
    );
    c.ack(&l).await;
    h.set("shop", config("c")).await;
    let again = c.recv().await;
    assert_eq!(again.type_url, type_url::CLUSTER);
    assert_eq!(again.resources[0].version, config("c").clusters[0].version);
}

#[tokio::test]
async fn one_unacked_response_per_type_and_newer_state_coalesced() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = DeltaClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let first = c.recv().await;
    h.set("shop", config("b")).await;
    h.set("shop", config("c")).await;
    c.send(type_url::ENDPOINT, &["c1"], &[], "", None).await;
    assert_eq!(c.recv().await.type_url, type_url::ENDPOINT);
    c.ack(&first).await;
    let next = c.recv().await;
    assert_eq!(next.type_url, type_url::CLUSTER);
    assert_eq!(next.resources[0].version, config("c").clusters[0].version);
}

async fn subscribe_all(c: &mut DeltaClient) {
    for (t, names) in [
        (type_url::CLUSTER, vec![]),
        (type_url::ENDPOINT, vec!["c1", "c2"]),
        (type_url::LISTENER, vec![]),
        (type_url::ROUTE, vec!["r1"]),
    ] {
        if t != type_url::CLUSTER {
            c.send(t, &names, &[], "", None).await;
        }
        let r = c.recv().await;
        assert_eq!(r.type_url, t);
        c.ack(&r).await;
    }
}

#[tokio::test]
async fn pushes_in_order_and_removals_last() {
    let h = Harness::start().await;
    let mut two = config("a");
    two.clusters.push(res(type_url::CLUSTER, "c2", "a"));
    h.set("shop", two).await;
    let mut c = DeltaClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    subscribe_all(&mut c).await;

    let mut next = config("b");
    next.clusters.push(res(type_url::CLUSTER, "c2", "b"));
    h.set("shop", next).await;
    let mut order = Vec::new();
    for _ in 0..4 {
        let r = c.recv().await;
        order.push(r.type_url.clone());
        c.ack(&r).await;
    }
    // Not an Envoy: no virtual hosts of their own.
    assert_eq!(order, type_url::ORDER[..4]);

    let mut removed = config("b");
    removed.listeners = vec![res(type_url::LISTENER, "l1", "c")];
    h.set("shop", removed).await;
    let l = c.recv().await;
    assert_eq!(l.type_url, type_url::LISTENER, "the addition goes first");
    assert!(l.removed_resources.is_empty());
    c.ack(&l).await;
    let cds = c.recv().await;
    assert_eq!(cds.type_url, type_url::CLUSTER);
    assert!(cds.resources.is_empty());
    assert_eq!(cds.removed_resources, ["c2"]);
}

#[tokio::test]
async fn eds_is_answered_while_cds_is_warming() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = DeltaClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    assert_eq!(c.recv().await.type_url, type_url::CLUSTER);
    c.send(type_url::ENDPOINT, &["c1"], &[], "", None).await;
    let eds = c.recv().await;
    assert_eq!(eds.type_url, type_url::ENDPOINT);
    assert_eq!(delta_names(&eds), ["c1"]);
}

#[tokio::test]
async fn subscribe_unsubscribe_and_explicit_wildcard() {
    let h = Harness::start().await;
    let mut cfg = config("a");
    cfg.endpoints.push(res(type_url::ENDPOINT, "c2", "a"));
    h.set("shop", cfg.clone()).await;
    let mut c = DeltaClient::open(&h, node("shop", "web-1"), type_url::ENDPOINT, &["c2"])
        .await
        .expect("admitted");
    let r = c.recv().await;
    assert_eq!(delta_names(&r), ["c2"]);
    c.send(type_url::ENDPOINT, &["c1"], &[], &r.nonce, None)
        .await;
    let r = c.recv().await;
    assert_eq!(
        delta_names(&r),
        ["c1"],
        "only the newly subscribed resource"
    );
    c.send(type_url::ENDPOINT, &[], &["c2"], &r.nonce, None)
        .await;
    // c2 changes after the unsubscribe: not sent; c1 changes: sent.
    cfg.endpoints = vec![
        res(type_url::ENDPOINT, "c1", "b"),
        res(type_url::ENDPOINT, "c2", "b"),
    ];
    h.set("shop", cfg).await;
    let r = c.recv().await;
    assert_eq!(delta_names(&r), ["c1"]);
    assert!(r.removed_resources.is_empty());

    let mut w = DeltaClient::open(&h, node("shop", "web-2"), type_url::ENDPOINT, &["*"])
        .await
        .expect("admitted");
    assert_eq!(delta_names(&w.recv().await), ["c1", "c2"]);
}

#[tokio::test]
async fn reconnect_with_initial_versions_gets_only_changes() {
    let h = Harness::start().await;
    let mut cfg = config("a");
    cfg.clusters.push(res(type_url::CLUSTER, "c2", "a"));
    h.set("shop", cfg.clone()).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let held = cfg.clusters[0].clone();
    tx.send(
        envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
            node: Some(node("shop", "web-1")),
            type_url: type_url::CLUSTER.into(),
            initial_resource_versions: [(held.name.clone(), held.version.clone())].into(),
            ..Default::default()
        },
    )
    .await
    .expect("queue");
    let mut stream = h
        .client()
        .await
        .delta_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("admitted")
        .into_inner();
    let r = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("deadline")
        .expect("ok")
        .expect("open");
    assert_eq!(
        delta_names(&r),
        ["c2"],
        "c1 is already held at this version"
    );
}

#[tokio::test]
async fn proxy_of_a_non_member_namespace_is_refused() {
    let h = Harness::start().await;
    h.set("shop", ProxyConfig::default()).await;
    let err = match DeltaClient::open(&h, node("payments", "p-1"), type_url::CLUSTER, &[]).await {
        Ok(_) => panic!("a non-member must be refused"),
        Err(e) => e,
    };
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(err.message().contains("payments") && err.message().contains("blue"));
}

/// Bodies (`name:tag`) of the resources in a delta response.
fn delta_bodies(
    r: &envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse,
) -> Vec<String> {
    r.resources
        .iter()
        .filter_map(|x| x.resource.as_ref())
        .map(|a| String::from_utf8_lossy(&a.value).to_string())
        .collect()
}

/// A delta Envoy gets the VHDS stubs of route configurations and their virtual hosts by
/// namespace; another delta client gets the routes inline and no virtual hosts.
#[tokio::test]
async fn envoys_get_virtual_hosts_over_vhds_and_other_clients_inline_routes() {
    let h = Harness::start().await;
    let mut cfg = config("a");
    cfg.vhds = Some(VhdsRoutes {
        routes: vec![res(type_url::ROUTE, "r1", "stub")],
        virtual_hosts: vec![
            res(type_url::VIRTUAL_HOST, "r1/v1", "a"),
            res(type_url::VIRTUAL_HOST, "r1/v2", "a"),
        ],
    });
    h.set("shop", cfg.clone()).await;

    let envoy = Node {
        user_agent_name: "envoy".into(),
        ..node("shop", "web-1")
    };
    let mut c = DeltaClient::open(&h, envoy, type_url::ROUTE, &["r1"])
        .await
        .expect("admitted");
    let rds = c.recv().await;
    assert_eq!(delta_bodies(&rds), ["r1:stub"]);
    c.ack(&rds).await;
    c.send(type_url::VIRTUAL_HOST, &["r1"], &[], "", None).await;
    let vhds = c.recv().await;
    assert_eq!(vhds.type_url, type_url::VIRTUAL_HOST);
    assert_eq!(delta_names(&vhds), ["r1/v1", "r1/v2"]);
    c.ack(&vhds).await;
    // One virtual host changes: it alone goes.
    cfg.vhds = Some(VhdsRoutes {
        routes: vec![res(type_url::ROUTE, "r1", "stub")],
        virtual_hosts: vec![
            res(type_url::VIRTUAL_HOST, "r1/v1", "a"),
            res(type_url::VIRTUAL_HOST, "r1/v2", "b"),
        ],
    });
    h.set("shop", cfg).await;
    let update = c.recv().await;
    assert_eq!(update.type_url, type_url::VIRTUAL_HOST);
    assert_eq!(delta_bodies(&update), ["r1/v2:b"]);

    let mut other = DeltaClient::open(&h, node("shop", "web-2"), type_url::ROUTE, &["r1"])
        .await
        .expect("admitted");
    let inline = other.recv().await;
    assert_eq!(delta_bodies(&inline), ["r1:a"]);
    other.ack(&inline).await;
    // Its VHDS subscription is not served: the next answer is that of the clusters.
    other
        .send(type_url::VIRTUAL_HOST, &["r1"], &[], "", None)
        .await;
    other.send(type_url::CLUSTER, &[], &[], "", None).await;
    assert_eq!(other.recv().await.type_url, type_url::CLUSTER);
}
