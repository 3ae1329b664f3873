//! The certificate service and the TLS port of an instance, against the Kubernetes API
//! stand-in's TokenReview: identity from the token only, tokens of the wrong audience, expired
//! or of a non-member namespace refused, full chains, a plaintext client refused, and a CA
//! change picked up without a restart.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use meshplane_ca::authority::generate_csr;
use meshplane_ca::grpc::{
    connect_instance, IstioCertificateRequest, IstioCertificateServiceClient,
};
use meshplane_ca::pem::{certificates, uri_sans, validity};
use meshplane_ca::root::{generate_root, self_signed_files, CaCert, DEFAULT_ROOT_VALIDITY};
use meshplane_ca::verify::verify_workload_chain;
use meshplane_ca::CaFiles;
use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};
use meshplane_xds::ads::AdsServer;
use meshplane_xds::identity::{secure, CaDirectory, CertificateServer, ServingCert};
use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::{ProxyConfig, ProxyNode, SourceEvent};
use meshplane_xds::outputs::IndexWatch;
use meshplane_xds::push::{run_push_loop, Change, ConfigGenerator, DebounceConfig, Hub, Pusher};
use meshplane_xds::tenancy::TokenReviewer;
use time::OffsetDateTime;
use tokio::sync::watch;

const AUDIENCE: &str = "meshplane-blue";
const HOST: &str = "meshplane-blue-v1.meshplane-blue.svc";
const TRUST_DOMAIN: &str = "blue.example.org";

struct Members(BTreeSet<String>);

impl ConfigGenerator for Members {
    fn apply(&mut self, _event: SourceEvent) -> Change {
        Change::default()
    }
    fn render(&self, _node: &ProxyNode) -> Arc<ProxyConfig> {
        Arc::new(ProxyConfig::default())
    }
    fn watch(&self) -> IndexWatch {
        IndexWatch::with_members(self.0.clone())
    }
}

fn write_ca(dir: &Path, files: &CaFiles) {
    for (name, pem) in files.entries() {
        // Write then rename, as the kubelet swaps a Secret volume atomically.
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, pem).expect("write CA file");
        std::fs::rename(&tmp, dir.join(name)).expect("rename CA file");
    }
}

struct Instance {
    standin: StandInHandle,
    hub: Arc<Hub>,
    addr: std::net::SocketAddr,
    ca_dir: tempfile::TempDir,
    root: CaCert,
    _shutdown: watch::Sender<bool>,
}

async fn kube_object(client: &kube::Client, yaml: serde_json::Value) {
    let (kind, ns) = (
        yaml["kind"].as_str().unwrap_or_default().to_string(),
        yaml["metadata"]["namespace"].as_str().map(str::to_string),
    );
    let resource = match kind.as_str() {
        "Namespace" => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()),
        _ => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&()),
    };
    let api: kube::Api<kube::api::DynamicObject> = match ns {
        Some(ns) => kube::Api::namespaced_with(client.clone(), &ns, &resource),
        None => kube::Api::all_with(client.clone(), &resource),
    };
    let obj: kube::api::DynamicObject = serde_json::from_value(yaml).expect("object");
    api.create(&Default::default(), &obj).await.expect("create");
}

async fn start() -> Instance {
    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let admin = standin
        .client(&Identity::Admin)
        .await
        .expect("admin client");
    for ns in ["shop", "bank"] {
        kube_object(
            &admin,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        kube_object(
            &admin,
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "web", "namespace": ns}}),
        )
        .await;
    }

    let hub = Hub::new(
        "blue",
        "blue-v1",
        "meshplane-blue",
        Arc::new(Metrics::new()),
    );
    let pusher = Pusher::new(
        Arc::clone(&hub),
        Box::new(Members(["shop".to_string()].into())),
    );
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (events, events_rx) = tokio::sync::mpsc::channel(4);
    let debounce = DebounceConfig {
        quiet: Duration::from_millis(1),
        max: Duration::from_millis(5),
        isolated_quiet: Duration::from_millis(1),
    };
    tokio::spawn(run_push_loop(
        pusher,
        events_rx,
        debounce,
        shutdown_rx.clone(),
    ));
    events.send(SourceEvent::Ready).await.expect("push loop");
    tokio::time::timeout(Duration::from_secs(10), hub.wait_ready())
        .await
        .expect("ready");
    let ca_dir = tempfile::tempdir().expect("temp dir");
    let root = generate_root(
        "blue",
        TRUST_DOMAIN,
        OffsetDateTime::now_utc(),
        DEFAULT_ROOT_VALIDITY,
    )
    .expect("root");
    write_ca(ca_dir.path(), &self_signed_files(&root));

    let ca = Arc::new(CaDirectory::new(ca_dir.path()));
    let serving = Arc::new(ServingCert::new(
        Arc::clone(&ca),
        vec![HOST.to_string()],
        None,
        meshplane_ca::verify::provider(),
    ));
    let reviewer = TokenReviewer::new(admin, AUDIENCE);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let ads = AdsServer::new(
        Arc::clone(&hub),
        Some(reviewer.clone()),
        shutdown_rx.clone(),
    );
    let certs = CertificateServer::new(ca, reviewer, Arc::clone(&hub), TRUST_DOMAIN);
    tokio::spawn(secure::serve_secure(
        listener,
        secure::server_config(serving).expect("tls config"),
        ads,
        Some(certs),
        shutdown_rx,
    ));
    Instance {
        standin,
        hub,
        addr,
        ca_dir,
        root,
        _shutdown: shutdown,
    }
}

impl Instance {
    fn token(&self, namespace: &str, audiences: &[&str], lifetime: Duration) -> String {
        self.standin
            .issue_service_account_token(namespace, "web", audiences, lifetime)
    }

    async fn client(
        &self,
        bundle: &str,
    ) -> IstioCertificateServiceClient<tonic::transport::Channel> {
        let channel = connect_instance(&self.addr.to_string(), HOST, bundle)
            .await
            .expect("TLS channel to the instance");
        IstioCertificateServiceClient::new(channel)
    }

    async fn request(
        &self,
        token: Option<&str>,
        csr: &str,
        validity_seconds: i64,
    ) -> Result<Vec<String>, tonic::Status> {
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr: csr.to_string(),
            validity_duration: validity_seconds,
            metadata: None,
        });
        if let Some(t) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {t}").parse().expect("ascii"),
            );
        }
        let mut client = self.client(&self.root.cert_pem).await;
        tokio::time::timeout(Duration::from_secs(30), client.create_certificate(request))
            .await
            .expect("deadline")
            .map(|r| r.into_inner().cert_chain)
    }
}

fn leaf_uri(chain: &[String]) -> Vec<String> {
    let leaf = &certificates(&chain[0]).expect("pem")[0];
    uri_sans(&leaf.parse().expect("x509"))
}

#[tokio::test]
async fn the_identity_comes_from_the_token_and_the_chain_is_complete() {
    let inst = start().await;
    let token = inst.token("shop", &[AUDIENCE], Duration::from_secs(3600));
    // The CSR asks for a bank identity; the token is shop/web's.
    let (_key, csr) =
        generate_csr(Some("spiffe://blue.example.org/ns/bank/sa/admin")).expect("csr");
    let chain = inst.request(Some(&token), &csr, 0).await.expect("issued");
    assert_eq!(
        leaf_uri(&chain),
        vec!["spiffe://blue.example.org/ns/shop/sa/web".to_string()]
    );
    assert_eq!(chain.len(), 2, "leaf then root");
    assert_eq!(chain[1], inst.root.cert_pem);
    let presented: String = chain[..1].concat();
    let id = verify_workload_chain(&presented, &inst.root.cert_pem, OffsetDateTime::now_utc())
        .expect("chain verifies under the tenant root");
    assert_eq!(id.namespace(), "shop");
    // 24 hours by default, the requested lifetime otherwise.
    let leaf = &certificates(&chain[0]).expect("pem")[0];
    let (from, to) = validity(&leaf.parse().expect("x509")).expect("validity");
    assert!(
        (to - OffsetDateTime::now_utc() - time::Duration::hours(24)).abs()
            < time::Duration::minutes(2)
    );
    assert!(from <= OffsetDateTime::now_utc());
    let short = inst.request(Some(&token), &csr, 120).await.expect("issued");
    let leaf = &certificates(&short[0]).expect("pem")[0];
    let (_, to) = validity(&leaf.parse().expect("x509")).expect("validity");
    assert!(
        (to - OffsetDateTime::now_utc() - time::Duration::minutes(2)).abs()
            < time::Duration::minutes(1)
    );

    let metrics = inst.hub.metrics().encode().expect("metrics");
    assert!(
        metrics.contains(r#"meshplane_xds_certificate_requests_total{result="issued"} 2"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn wrong_audience_expired_missing_and_foreign_tokens_are_refused() {
    let inst = start().await;
    let (_key, csr) = generate_csr(None).expect("csr");

    // A token for the API server (or another tenant) is not for this instance.
    let api_token = inst.token("shop", &[], Duration::from_secs(3600));
    let err = inst
        .request(Some(&api_token), &csr, 0)
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    let green_token = inst.token("shop", &["meshplane-green"], Duration::from_secs(3600));
    let err = inst
        .request(Some(&green_token), &csr, 0)
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    let expired = inst.token("shop", &[AUDIENCE], Duration::ZERO);
    let err = inst
        .request(Some(&expired), &csr, 0)
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("expired"), "{}", err.message());

    let err = inst.request(None, &csr, 0).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    let err = inst
        .request(Some("forged"), &csr, 0)
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    // A valid token of a namespace that is not a member of the tenant.
    let bank = inst.token("bank", &[AUDIENCE], Duration::from_secs(3600));
    let err = inst
        .request(Some(&bank), &csr, 0)
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("bank"), "{}", err.message());

    // A request that is no CSR.
    let shop = inst.token("shop", &[AUDIENCE], Duration::from_secs(3600));
    let err = inst
        .request(
            Some(&shop),
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            0,
        )
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    let metrics = inst.hub.metrics().encode().expect("metrics");
    assert!(
        metrics.contains(r#"meshplane_xds_certificate_requests_total{result="unauthenticated"} 5"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"meshplane_xds_certificate_requests_total{result="issued"} 0"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_tls_port_refuses_plaintext_and_untrusting_clients() {
    let inst = start().await;
    // A plaintext gRPC client (what an Envoy with the old bootstrap would be) gets nothing.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", inst.addr))
        .expect("uri")
        .connect()
        .await;
    let refused = match plain {
        Err(_) => true,
        Ok(channel) => {
            let mut client = IstioCertificateServiceClient::new(channel);
            client
                .create_certificate(IstioCertificateRequest::default())
                .await
                .is_err()
        }
    };
    assert!(refused, "a plaintext client must not be served");

    // A client trusting another root refuses the instance's certificate.
    let other = generate_root(
        "green",
        "green.example.org",
        OffsetDateTime::now_utc(),
        DEFAULT_ROOT_VALIDITY,
    )
    .expect("root");
    let err = connect_instance(&inst.addr.to_string(), HOST, &other.cert_pem)
        .await
        .expect_err("untrusted instance");
    assert!(err.to_string().contains(&inst.addr.to_string()), "{err}");
    // And one expecting another name.
    assert!(connect_instance(
        &inst.addr.to_string(),
        "meshplane-green-v1.meshplane-green.svc",
        &inst.root.cert_pem
    )
    .await
    .is_err());
}

#[tokio::test]
async fn a_new_ca_in_the_mounted_directory_signs_without_a_restart() {
    let inst = start().await;
    let token = inst.token("shop", &[AUDIENCE], Duration::from_secs(3600));
    let (_key, csr) = generate_csr(None).expect("csr");
    let before = inst.request(Some(&token), &csr, 0).await.expect("issued");
    assert_eq!(before[1], inst.root.cert_pem);

    // The Secret now holds a new root (e.g. a plug-in replaced the self-signed CA).
    let next = generate_root(
        "blue",
        TRUST_DOMAIN,
        OffsetDateTime::now_utc(),
        DEFAULT_ROOT_VALIDITY,
    )
    .expect("root");
    write_ca(inst.ca_dir.path(), &self_signed_files(&next));
    // The serving certificate follows: a client trusting only the new root connects...
    let channel = connect_instance(&inst.addr.to_string(), HOST, &next.cert_pem)
        .await
        .expect("instance serves a certificate of the new CA");
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr: csr.clone(),
        validity_duration: 0,
        metadata: None,
    });
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    let after = IstioCertificateServiceClient::new(channel)
        .create_certificate(request)
        .await
        .expect("issued")
        .into_inner()
        .cert_chain;
    // ...and workload certificates chain to it.
    assert_eq!(after[1], next.cert_pem);
    assert_eq!(leaf_uri(&after), leaf_uri(&before));
}

/// A token shaped as a projected token of `shop/web` for the instance's audience, valid for an
/// hour by its claims, that the API server never issued (its last segment is `n`).
fn junk_token(n: usize) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let exp = OffsetDateTime::now_utc().unix_timestamp() + 3600;
    let claims = serde_json::json!({
        "aud": [AUDIENCE], "exp": exp, "sub": "system:serviceaccount:shop:web",
    });
    format!(
        "{}.{}.{}",
        b64(r#"{"alg":"RS256"}"#),
        b64(&claims.to_string()),
        b64(&format!("junk-{n}"))
    )
}

fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    request
}

/// An ADS stream of a `shop` proxy with `token`: whether admission let it open.
async fn ads_stream(channel: tonic::transport::Channel, token: &str) -> Result<(), tonic::Status> {
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    let first = DiscoveryRequest {
        node: Some(envoy_types::pb::envoy::config::core::v3::Node {
            id: "sidecar~198.18.0.1~web-1.shop~shop.svc.cluster.local".into(),
            cluster: "web.shop".into(),
            ..Default::default()
        }),
        type_url: meshplane_xds::model::type_url::CLUSTER.into(),
        ..Default::default()
    };
    let requests =
        tokio_stream::StreamExt::chain(tokio_stream::iter([first]), tokio_stream::pending());
    AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(bearer(requests, token))
        .await
        .map(drop)
}

/// Junk tokens starve nobody: one peer floods ADS and the certificate service with 600 tokens
/// that pass every check a token can be put to by itself (a JWT for this audience, not
/// expired, claiming `shop/web`) but that the API server never issued. While it does, a pod of
/// `shop` with a fresh valid token, from another address, gets its ADS stream and its
/// certificate. Before per-source budgets the flood spent the one TokenReview budget both
/// services shared, and the valid token got UNAVAILABLE.
#[tokio::test]
async fn a_junk_token_flood_from_one_peer_starves_neither_ads_nor_certificates() {
    use futures::StreamExt as _;
    const FLOOD: usize = 600;
    let inst = start().await;
    let flooder: std::net::IpAddr = "127.0.0.2".parse().expect("address");
    let mut channels = Vec::new();
    for _ in 0..4 {
        let channel = meshplane_ca::grpc::connect_instance_from(
            &inst.addr.to_string(),
            HOST,
            &inst.root.cert_pem,
            flooder,
        )
        .await
        .expect("flooder's channel");
        channels.push(channel);
    }
    let (_key, csr) = generate_csr(None).expect("csr");
    let (sent_tx, mut sent) = watch::channel(0usize);
    let flood = {
        let csr = csr.clone();
        tokio::spawn(async move {
            let requests = (0..FLOOD).map(|n| {
                let (channel, csr) = (channels[n % channels.len()].clone(), csr.clone());
                let sent_tx = sent_tx.clone();
                async move {
                    let token = junk_token(n);
                    let result = if n % 2 == 0 {
                        ads_stream(channel, &token).await
                    } else {
                        let request = IstioCertificateRequest {
                            csr,
                            validity_duration: 0,
                            metadata: None,
                        };
                        IstioCertificateServiceClient::new(channel)
                            .create_certificate(bearer(request, &token))
                            .await
                            .map(drop)
                    };
                    sent_tx.send_modify(|s| *s += 1);
                    result.expect_err("a junk token is refused").code()
                }
            });
            futures::stream::iter(requests)
                .buffer_unordered(64)
                .collect::<Vec<_>>()
                .await
        })
    };
    // Most of the flood has been answered, and the rest is still coming.
    tokio::time::timeout(Duration::from_secs(60), sent.wait_for(|s| *s >= FLOOD / 2))
        .await
        .expect("flood answered in time")
        .expect("flood running");

    let token = inst.token("shop", &[AUDIENCE], Duration::from_secs(3600));
    let channel = connect_instance(&inst.addr.to_string(), HOST, &inst.root.cert_pem)
        .await
        .expect("channel");
    let ads = tokio::time::timeout(Duration::from_secs(30), ads_stream(channel, &token))
        .await
        .expect("ADS answered in time");
    let certificate = inst.request(Some(&token), &csr, 0).await;
    let codes = tokio::time::timeout(Duration::from_secs(60), flood)
        .await
        .expect("flood over in time")
        .expect("flood task");
    ads.expect("the valid token's ADS stream is admitted during the flood");
    let chain = certificate.expect("the valid token gets its certificate during the flood");
    assert_eq!(
        leaf_uri(&chain),
        vec!["spiffe://blue.example.org/ns/shop/sa/web".to_string()]
    );

    // The flood was refused: UNAUTHENTICATED while its peer had reviews left, then UNAVAILABLE
    // (retry later) without asking the API server, counted by service and reason.
    assert!(codes
        .iter()
        .all(|c| matches!(c, tonic::Code::Unauthenticated | tonic::Code::Unavailable)));
    let metrics = inst.hub.metrics().encode().expect("metrics");
    for service in ["ads", "certificates"] {
        let throttled = format!(
            r#"meshplane_xds_token_refusals_total{{service="{service}",reason="peer_budget"}}"#
        );
        let count: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&throttled))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{throttled} missing: {metrics}"));
        assert!(count > 0, "{service}: the flooder spent its own budget");
    }
    // At most a peer's burst and rate of them cost a TokenReview.
    let reviewed = codes
        .iter()
        .filter(|c| **c == tonic::Code::Unauthenticated)
        .count();
    assert!(reviewed < FLOOD / 4, "{reviewed} junk tokens reviewed");
}
