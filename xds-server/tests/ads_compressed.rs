//! Large responses to a client that accepts zstd (as the node agent does), read by tonic's
//! client as the agent reads them: the same resources as an uncompressed client gets.

mod ads_common;

use ads_common::*;
use meshplane_xds::model::{type_url, ProxyConfig};
use tonic::codec::CompressionEncoding;

/// A body of about `len` bytes: configuration-like text with names that differ.
fn body(len: usize, seed: usize) -> String {
    let mut out = String::with_capacity(len + 64);
    let mut i = 0;
    while out.len() < len {
        out.push_str(&format!(
            "vh-{seed}-{i}.shop.svc.cluster.local retry_on=connect-failure,refused-stream;"
        ));
        i += 1;
    }
    out
}

/// 300 clusters (a whole set of about 300 KiB) and a route configuration of 400 KiB: both
/// above the size from which responses go compressed.
fn large_config() -> ProxyConfig {
    ProxyConfig {
        clusters: (0..300)
            .map(|i| res(type_url::CLUSTER, &format!("c{i:03}"), &body(1_000, i)))
            .collect(),
        endpoints: vec![],
        listeners: vec![],
        routes: vec![res(type_url::ROUTE, "80", &body(400_000, 0))],
        vhds: None,
    }
}

async fn zstd_client(
    h: &Harness,
) -> envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient<tonic::transport::Channel>{
    h.client()
        .await
        .accept_compressed(CompressionEncoding::Zstd)
        .max_decoding_message_size(64 << 20)
}

#[tokio::test]
async fn a_client_accepting_zstd_reads_the_same_sotw_resources() {
    let h = Harness::start().await;
    h.set("shop", large_config()).await;
    let mut plain = SotwClient::open(&h, node("shop", "a"), type_url::CLUSTER, &[])
        .await
        .expect("admitted");
    let mut zstd = SotwClient::open_on(
        zstd_client(&h).await,
        node("shop", "b"),
        type_url::CLUSTER,
        &[],
    )
    .await
    .expect("admitted");
    assert_eq!(zstd.encoding.as_deref(), Some("zstd"));
    assert_eq!(plain.encoding, None);
    let (p, z) = (plain.recv().await, zstd.recv().await);
    assert_eq!(sotw_names(&z).len(), 300);
    assert_eq!(sotw_bodies(&z), sotw_bodies(&p));
    assert_eq!(z.version_info, p.version_info);
    zstd.ack(&z).await;
    zstd.request(type_url::ROUTE, &["80"], "", "").await;
    let route = zstd.recv().await;
    assert_eq!(route.type_url, type_url::ROUTE);
    assert_eq!(sotw_bodies(&route), [format!("80:{}", body(400_000, 0))]);
}

#[tokio::test]
async fn a_client_accepting_zstd_reads_the_same_delta_resources() {
    let h = Harness::start().await;
    h.set("shop", large_config()).await;
    let mut plain = DeltaClient::open(&h, node("shop", "a"), type_url::CLUSTER, &["*"])
        .await
        .expect("admitted");
    let mut zstd = DeltaClient::open_on(
        zstd_client(&h).await,
        node("shop", "b"),
        type_url::CLUSTER,
        &["*"],
    )
    .await
    .expect("admitted");
    assert_eq!(zstd.encoding.as_deref(), Some("zstd"));
    assert_eq!(plain.encoding, None);
    let (p, z) = (plain.recv().await, zstd.recv().await);
    assert_eq!(delta_names(&z).len(), 300);
    assert_eq!(delta_names(&z), delta_names(&p));
    assert_eq!(z.resources, p.resources);
    zstd.ack(&z).await;
    zstd.send(type_url::ROUTE, &["80"], &[], "", None).await;
    let route = zstd.recv().await;
    assert_eq!(delta_names(&route), ["80"]);
    let any = route.resources[0].resource.as_ref().expect("a resource");
    assert_eq!(any.value, format!("80:{}", body(400_000, 0)).into_bytes());
}
