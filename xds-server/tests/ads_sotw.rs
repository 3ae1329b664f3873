//! State-of-the-world ADS protocol rules, checked with a tonic client.
//!
//! "Nothing was sent" is proven by ordering, not by waiting: after the step under test the
//! client asks for something else, and the next message must be that answer.

mod ads_common;

use ads_common::*;
use meshplane_xds::ads::snapshot::set_version;
use meshplane_xds::model::{type_url, ProxyConfig};

#[tokio::test]
async fn first_response_carries_content_hash_version_and_ack_is_not_answered() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let r = c.recv().await;
    assert_eq!(r.type_url, type_url::CLUSTER);
    assert_eq!(sotw_names(&r), ["c1"]);
    assert_eq!(r.version_info, set_version(&config("a").clusters));
    assert!(!r.nonce.is_empty());
    c.ack(&r).await;
    c.request(type_url::LISTENER, &[], "", "").await;
    let next = c.recv().await;
    assert_eq!(
        next.type_url,
        type_url::LISTENER,
        "an ACK must not be answered with the same clusters"
    );
    assert_ne!(next.nonce, r.nonce);
}

#[tokio::test]
async fn versions_are_stable_across_servers() {
    let a = Harness::start().await;
    let b = Harness::start().await;
    a.set("shop", config("x")).await;
    b.set("shop", config("x")).await;
    let mut ca = SotwClient::open(&a, node("shop", "p"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let mut cb = SotwClient::open(&b, node("shop", "p"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    assert_eq!(ca.recv().await.version_info, cb.recv().await.version_info);
}

#[tokio::test]
async fn nack_is_recorded_and_not_resent_until_config_changes() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let accepted = c.recv().await;
    c.ack(&accepted).await;
    h.set("shop", config("b")).await;
    let r = c.recv().await;
    c.send(
        type_url::CLUSTER,
        &[],
        &accepted.version_info,
        &r.nonce,
        nack("cluster c1: bad"),
    )
    .await;
    // Same content pushed again: still blocked. Endpoints of the cluster the proxy kept still
    // flow (listeners and routes wait for a CDS the proxy accepts).
    h.set("shop", config("b")).await;
    c.request(type_url::ENDPOINT, &["c1"], "", "").await;
    let l = c.recv().await;
    assert_eq!(
        l.type_url,
        type_url::ENDPOINT,
        "NACKed clusters must not be re-sent"
    );
    assert_eq!(sotw_bodies(&l), ["c1:b"]);

    let status = h.hub.proxy_statuses();
    let cds = &status[0].types[0];
    assert_eq!(cds.type_name, "cds");
    let last = cds.last_nack.as_ref().expect("NACK recorded");
    assert_eq!(last.message, "cluster c1: bad");
    assert_eq!(last.version, r.version_info);
    assert_eq!(cds.acked_version, Some(accepted.version_info.clone()));
    let metrics = h.hub.metrics().encode().expect("metrics");
    assert!(
        metrics.contains(r#"meshplane_xds_nacks_total{type="cds"} 1"#),
        "{metrics}"
    );

    c.request(type_url::ENDPOINT, &["c1"], &l.version_info, &l.nonce)
        .await;
    h.set("shop", config("c")).await;
    let again = c.recv().await;
    assert_eq!(
        again.type_url,
        type_url::CLUSTER,
        "changed clusters are sent again"
    );
    assert_eq!(sotw_bodies(&again), ["c1:c"]);
}

#[tokio::test]
async fn one_unacked_response_per_type_and_newer_state_coalesced() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let first = c.recv().await;
    h.set("shop", config("b")).await;
    h.set("shop", config("c")).await;
    c.request(type_url::ENDPOINT, &["c1"], "", "").await;
    let l = c.recv().await;
    assert_eq!(
        l.type_url,
        type_url::ENDPOINT,
        "no second CDS while the first is un-ACKed"
    );
    assert_eq!(sotw_bodies(&l), ["c1:c"]);
    c.ack(&first).await;
    let coalesced = c.recv().await;
    assert_eq!(coalesced.type_url, type_url::CLUSTER);
    assert_eq!(
        sotw_bodies(&coalesced),
        ["c1:c"],
        "intermediate state b is skipped"
    );
}

async fn subscribe_all(c: &mut SotwClient) {
    for (t, names) in [
        (type_url::CLUSTER, vec![]),
        (type_url::ENDPOINT, vec!["c1", "c2"]),
        (type_url::LISTENER, vec![]),
        (type_url::ROUTE, vec!["r1"]),
    ] {
        if t != type_url::CLUSTER {
            c.request(t, &names, "", "").await;
        }
        let r = c.recv().await;
        assert_eq!(r.type_url, t);
        c.request(t, &names, &r.version_info, &r.nonce).await;
    }
}

/// CDS, then EDS at once (Envoy ACKs new clusters only once their endpoints arrived), then
/// listeners after the CDS ACK and routes after the LDS ACK.
#[tokio::test]
async fn listeners_and_routes_wait_for_the_acks_of_what_they_name() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    subscribe_all(&mut c).await;
    h.set("shop", config("b")).await;
    let cds = c.recv().await;
    assert_eq!(cds.type_url, type_url::CLUSTER);
    let eds = c.recv().await;
    assert_eq!(eds.type_url, type_url::ENDPOINT);
    // While CDS b awaits its ACK: endpoints change again and flow, the listener does not.
    h.set("shop", config("c")).await;
    let eds_names = ["c1", "c2"];
    c.request(
        type_url::ENDPOINT,
        &eds_names,
        &eds.version_info,
        &eds.nonce,
    )
    .await;
    let eds = c.recv().await;
    assert_eq!(
        (eds.type_url.as_str(), sotw_bodies(&eds)),
        (type_url::ENDPOINT, vec!["c1:c".to_string()]),
        "no listener before the clusters are ACKed"
    );
    c.request(
        type_url::ENDPOINT,
        &eds_names,
        &eds.version_info,
        &eds.nonce,
    )
    .await;
    c.ack(&cds).await;
    let cds = c.recv().await;
    assert_eq!(sotw_bodies(&cds), ["c1:c"], "CDS c, coalesced");
    // Envoy re-creates a changed cluster, which warms until an EDS response carries its
    // assignment again.
    let eds = c.recv().await;
    assert_eq!(
        (eds.type_url.as_str(), sotw_bodies(&eds)),
        (type_url::ENDPOINT, vec!["c1:c".to_string()])
    );
    c.request(
        type_url::ENDPOINT,
        &eds_names,
        &eds.version_info,
        &eds.nonce,
    )
    .await;
    c.ack(&cds).await;
    let lds = c.recv().await;
    assert_eq!(
        (lds.type_url.as_str(), sotw_bodies(&lds)),
        (type_url::LISTENER, vec!["l1:c".to_string()])
    );
    c.ack(&lds).await;
    let rds = c.recv().await;
    assert_eq!(
        (rds.type_url.as_str(), sotw_bodies(&rds)),
        (type_url::ROUTE, vec!["r1:c".to_string()])
    );
}

#[tokio::test]
async fn removals_go_out_after_additions_are_acked() {
    let h = Harness::start().await;
    let mut two = config("a");
    two.clusters.push(res(type_url::CLUSTER, "c2", "a"));
    h.set("shop", two).await;
    let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    subscribe_all(&mut c).await;
    // c2 removed, listener changed at once.
    let mut next = config("a");
    next.listeners = vec![res(type_url::LISTENER, "l1", "b")];
    h.set("shop", next).await;
    let l = c.recv().await;
    assert_eq!(
        l.type_url,
        type_url::LISTENER,
        "the listener change goes first"
    );
    c.ack(&l).await;
    let cds = c.recv().await;
    assert_eq!(cds.type_url, type_url::CLUSTER);
    assert_eq!(sotw_names(&cds), ["c1"], "c2 is removed last");
}

#[tokio::test]
async fn eds_request_is_answered_while_cds_is_warming() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let cds = c.recv().await;
    assert_eq!(cds.type_url, type_url::CLUSTER);
    // Envoy asks for endpoints before ACKing the clusters that need them.
    c.request(type_url::ENDPOINT, &["c1"], "", "").await;
    let eds = c.recv().await;
    assert_eq!(eds.type_url, type_url::ENDPOINT);
    assert_eq!(sotw_names(&eds), ["c1"]);
}

#[tokio::test]
async fn named_subscriptions_get_only_their_resources() {
    let h = Harness::start().await;
    let mut cfg = config("a");
    cfg.endpoints.push(res(type_url::ENDPOINT, "c2", "a"));
    h.set("shop", cfg).await;
    let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::ENDPOINT, &["c2"])
        .await
        .expect("admitted");
    let r = c.recv().await;
    assert_eq!(sotw_names(&r), ["c2"]);
    c.request(type_url::ENDPOINT, &["c1", "c2"], &r.version_info, &r.nonce)
        .await;
    // Endpoints are not state of the world: the answer carries the newly named one only.
    let added = c.recv().await;
    assert_eq!(sotw_names(&added), ["c1"]);
    // Explicit wildcard.
    let mut w = SotwClient::open(&h, node("shop", "web-2"), type_url::ENDPOINT, &["*"])
        .await
        .expect("admitted");
    assert_eq!(sotw_names(&w.recv().await), ["c1", "c2"]);
}

/// xDS keeps state of the world for listeners and clusters only: an endpoint change sends the
/// changed assignment; a cluster change sends every cluster, then the changed cluster's
/// assignment again (Envoy re-creates the cluster, and the new one warms on it).
#[tokio::test]
async fn sotw_endpoints_carry_what_changed_and_a_changed_cluster_its_assignment_again() {
    let h = Harness::start().await;
    let two = |cluster_c2: &str, endpoints_c1: &str| {
        let mut cfg = config("a");
        cfg.clusters.push(res(type_url::CLUSTER, "c2", cluster_c2));
        cfg.endpoints = vec![
            res(type_url::ENDPOINT, "c1", endpoints_c1),
            res(type_url::ENDPOINT, "c2", "a"),
        ];
        cfg
    };
    h.set("shop", two("a", "a")).await;
    let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let cds = c.recv().await;
    assert_eq!(sotw_names(&cds), ["c1", "c2"]);
    let names = ["c1", "c2"];
    c.request(type_url::ENDPOINT, &names, "", "").await;
    let eds = c.recv().await;
    assert_eq!(sotw_names(&eds), names, "the first answer has everything");
    c.ack(&cds).await;
    c.request(type_url::ENDPOINT, &names, &eds.version_info, &eds.nonce)
        .await;

    h.set("shop", two("a", "moved")).await;
    let eds = c.recv().await;
    assert_eq!(eds.type_url, type_url::ENDPOINT);
    assert_eq!(
        sotw_bodies(&eds),
        ["c1:moved"],
        "the changed assignment only"
    );
    assert_ne!(
        eds.version_info, "",
        "versioned as the whole subscribed set"
    );
    c.request(type_url::ENDPOINT, &names, &eds.version_info, &eds.nonce)
        .await;

    h.set("shop", two("b", "moved")).await;
    let cds = c.recv().await;
    assert_eq!(cds.type_url, type_url::CLUSTER);
    assert_eq!(
        sotw_bodies(&cds),
        ["c1:a", "c2:b"],
        "clusters: the whole set"
    );
    let eds = c.recv().await;
    assert_eq!(eds.type_url, type_url::ENDPOINT);
    assert_eq!(
        sotw_bodies(&eds),
        ["c2:a"],
        "the changed cluster's assignment again"
    );
}

#[tokio::test]
async fn reconnect_with_current_version_is_not_answered() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    let version = {
        let mut c = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
            .await
            .expect("admitted");
        c.recv().await.version_info
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(
        envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
            node: Some(node("shop", "web-1")),
            type_url: type_url::CLUSTER.into(),
            version_info: version,
            ..Default::default()
        },
    )
    .await
    .expect("queue");
    let mut stream = h
        .client()
        .await
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("admitted")
        .into_inner();
    tx.send(
        envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
            type_url: type_url::LISTENER.into(),
            ..Default::default()
        },
    )
    .await
    .expect("queue");
    let next = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("deadline")
        .expect("ok")
        .expect("open");
    assert_eq!(
        next.type_url,
        type_url::LISTENER,
        "clusters the proxy holds are not re-sent"
    );
}

#[tokio::test]
async fn endpoint_only_change_reaches_only_affected_proxies_as_eds() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    h.set("bank", config("a")).await;
    let mut shop = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let mut bank = SotwClient::open(&h, node("bank", "api-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    for c in [&mut shop, &mut bank] {
        let r = c.recv().await;
        c.ack(&r).await;
        c.request(type_url::ENDPOINT, &["c1"], "", "").await;
        let r = c.recv().await;
        c.request(type_url::ENDPOINT, &["c1"], &r.version_info, &r.nonce)
            .await;
    }
    let mut changed = config("a");
    changed.endpoints = vec![res(type_url::ENDPOINT, "c1", "moved")];
    h.set("shop", changed).await;
    let eds = shop.recv().await;
    assert_eq!(eds.type_url, type_url::ENDPOINT);
    assert_eq!(sotw_bodies(&eds), ["c1:moved"]);
    shop.request(type_url::ENDPOINT, &["c1"], &eds.version_info, &eds.nonce)
        .await;
    for c in [&mut shop, &mut bank] {
        c.request(type_url::LISTENER, &[], "", "").await;
        assert_eq!(
            c.recv().await.type_url,
            type_url::LISTENER,
            "no CDS after an endpoint change; nothing for bank"
        );
    }
}

/// When members shrink, the streams of proxies whose namespace left the
/// tenant end with a clear PERMISSION_DENIED; the streams of members stay and keep receiving.
#[tokio::test]
async fn streams_of_a_namespace_that_left_the_tenant_are_closed_and_members_stay() {
    let h = Harness::start().await;
    h.set("shop", config("a")).await;
    h.set("bank", config("a")).await;
    let mut shop = SotwClient::open(&h, node("shop", "web-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let mut bank = SotwClient::open(&h, node("bank", "api-1"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    for c in [&mut shop, &mut bank] {
        let r = c.recv().await;
        c.ack(&r).await;
    }
    h.set_members(&["shop"]).await;
    let status = tokio::time::timeout(DEADLINE, bank.rx.message())
        .await
        .expect("bank's stream answered before the deadline")
        .expect_err("bank's stream ends with a status");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status
            .message()
            .contains("\"bank\" is no longer a member of tenant \"blue\""),
        "{}",
        status.message()
    );
    // shop is still served: its next config arrives on the same stream.
    h.set("shop", config("b")).await;
    let r = shop.recv().await;
    assert_eq!(r.type_url, type_url::CLUSTER);
    assert_eq!(sotw_bodies(&r), ["c1:b"]);
}

#[tokio::test]
async fn proxy_of_a_non_member_namespace_is_refused() {
    let h = Harness::start().await;
    h.set("shop", ProxyConfig::default()).await;
    let err = match SotwClient::open(&h, node("payments", "p-1"), type_url::CLUSTER, &[]).await {
        Ok(_) => panic!("a non-member must be refused"),
        Err(e) => e,
    };
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message().contains("\"payments\"") && err.message().contains("\"blue\""),
        "{}",
        err.message()
    );
    let metrics = h.hub.metrics().encode().expect("metrics");
    assert!(
        metrics.contains(r#"meshplane_xds_rejected_connections_total{reason="not_member"} 1"#),
        "{metrics}"
    );
}
