//! How long a pod with a fresh valid token waits for its ADS stream and its certificate while
//! another peer floods the instance with junk tokens (a bench that prints a table, not a test;
//! docs/benchmarks.md records the figures).
//!
//! The real `meshplane-xds` binary runs in Kubernetes mode against the API stand-in (in
//! process), serving ADS and certificates on its TLS port. From 127.0.0.2, 64 requests at a
//! time (ADS streams and certificate requests alternately, on 4 connections) carry tokens shaped
//! as projected tokens of a member namespace for the instance's audience that the API server
//! never issued, for at most [`FLOOD_REQUESTS`] requests or [`FLOOD_TIME`]. Once 300 have been
//! answered, a `shop` pod on 127.0.0.1 presents a token issued just now: an ADS stream, then a
//! certificate request with another fresh token, each retried every 50 ms (as a proxy retries)
//! until served or [`GIVE_UP`]. With `MESHPLANE_XDS_BASELINE_BIN` set to another build of
//! `meshplane-xds`, it runs against that one too (before and after a change, in one run).
//!
//! Run: `cargo test -p meshplane-xds --locked --bench token_flood`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use futures::StreamExt as _;
use meshplane_ca::grpc::{
    connect_instance, connect_instance_from, IstioCertificateRequest, IstioCertificateServiceClient,
};
use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};
use tonic::transport::Channel;

const TENANT: &str = "acme";
const REVISION: &str = "blue";
const CONTROL: &str = "meshplane-acme";
const AUDIENCE: &str = "meshplane-acme";
const TRUST_DOMAIN: &str = "acme.example.org";
const HOST: &str = "meshplane-blue.meshplane-acme.svc";
/// Most junk requests sent, and for how long at most.
const FLOOD_REQUESTS: usize = 20_000;
const FLOOD_TIME: Duration = Duration::from_secs(30);
/// Junk requests in flight at once.
const FLOOD_CONCURRENCY: usize = 64;
/// How long the valid pod keeps retrying.
const GIVE_UP: Duration = Duration::from_secs(15);

/// The instance binary in Kubernetes mode, its output captured in a file.
struct Instance {
    child: Child,
    dir: PathBuf,
    addr: String,
}

impl Instance {
    fn start(bin: &str, name: &str, kubeconfig: &Path, root: &meshplane_ca::root::CaCert) -> Self {
        let dir =
            std::env::temp_dir().join(format!("meshplane-flood-{}-{name}", std::process::id()));
        let ca_dir = dir.join("ca");
        std::fs::create_dir_all(&ca_dir).expect("temp dir");
        for (file, pem) in meshplane_ca::root::self_signed_files(root).entries() {
            std::fs::write(ca_dir.join(file), pem).expect("CA file");
        }
        let log = dir.join("instance.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin)
            .args(["--tenant", TENANT, "--revision", REVISION])
            .args(["--control-namespace", CONTROL, "--source", "kube"])
            .args([
                "--xds-tls-addr",
                "127.0.0.1:0",
                "--trust-domain",
                TRUST_DOMAIN,
            ])
            .arg("--ca-dir")
            .arg(&ca_dir)
            .args(["--serving-dns-name", HOST])
            .args(["--webhook-addr", "127.0.0.1:0"])
            .args(["--monitoring-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn,meshplane_xds=info")
            .env("NO_COLOR", "1")
            .env_remove("MESHPLANE_PROXY_IMAGE")
            .stdout(Stdio::from(out.try_clone().expect("log file")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("start meshplane-xds");
        let mut instance = Instance {
            child,
            dir,
            addr: String::new(),
        };
        let end = Instant::now() + Duration::from_secs(60);
        instance.addr = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addr) = text.split("xds_tls=Some(").nth(1).map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect::<String>()
            }) {
                break addr;
            }
            assert!(Instant::now() < end, "instance did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        };
        instance
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    request
}

async fn ads(channel: Channel, token: &str) -> Result<(), tonic::Status> {
    let first = DiscoveryRequest {
        node: Some(Node {
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

async fn certificate(channel: Channel, token: &str, csr: &str) -> Result<(), tonic::Status> {
    let request = IstioCertificateRequest {
        csr: csr.to_string(),
        validity_duration: 0,
        metadata: None,
    };
    IstioCertificateServiceClient::new(channel)
        .create_certificate(bearer(request, token))
        .await
        .map(drop)
}

/// A well-formed token of `shop/web` for the instance's audience that nobody issued.
fn junk_token(n: usize) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
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

/// Retries `call` every 50 ms until it succeeds: the time taken and the attempts, or `None`
/// after [`GIVE_UP`] (with the last error).
async fn served<F, Fut>(mut call: F) -> (Option<Duration>, usize, String)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let start = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match tokio::time::timeout(GIVE_UP, call()).await {
            Ok(Ok(())) => return (Some(start.elapsed()), attempts, String::new()),
            Ok(Err(status)) if start.elapsed() >= GIVE_UP => {
                return (None, attempts, format!("{:?}", status.code()))
            }
            Err(_) => return (None, attempts, "timeout".into()),
            Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

struct Row {
    name: &'static str,
    ads: (Option<Duration>, usize, String),
    certificate: (Option<Duration>, usize, String),
    junk: usize,
    junk_reviewed: usize,
    flood_time: Duration,
}

async fn run(standin: &StandInHandle, kubeconfig: &Path, bin: &str, name: &'static str) -> Row {
    let root = meshplane_ca::root::generate_root(
        TENANT,
        TRUST_DOMAIN,
        time::OffsetDateTime::now_utc(),
        meshplane_ca::root::DEFAULT_ROOT_VALIDITY,
    )
    .expect("root");
    let instance = Instance::start(bin, name, kubeconfig, &root);
    let (_key, csr) = meshplane_ca::authority::generate_csr(None).expect("csr");
    let channel = connect_instance(&instance.addr, HOST, &root.cert_pem)
        .await
        .expect("channel");
    // Synced and serving before the flood.
    let warm =
        standin.issue_service_account_token("shop", "web", &[AUDIENCE], Duration::from_secs(3600));
    let (ok, _, why) = served(|| certificate(channel.clone(), &warm, &csr)).await;
    assert!(
        ok.is_some(),
        "{name}: instance never served: {why}\n{}",
        std::fs::read_to_string(instance.dir.join("instance.log")).unwrap_or_default()
    );

    let flooder: IpAddr = "127.0.0.2".parse().expect("address");
    let mut channels = Vec::new();
    for _ in 0..4 {
        channels.push(
            connect_instance_from(&instance.addr, HOST, &root.cert_pem, flooder)
                .await
                .expect("flooder's channel"),
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let reviewed = Arc::new(AtomicUsize::new(0));
    // Signalled once the flood has had 300 answers, or has ended.
    let warmed = Arc::new(tokio::sync::Notify::new());
    let flood = {
        let (stop, answered, reviewed, csr, warmed) = (
            Arc::clone(&stop),
            Arc::clone(&answered),
            Arc::clone(&reviewed),
            csr.clone(),
            Arc::clone(&warmed),
        );
        tokio::spawn(async move {
            let started = Instant::now();
            let ended = Arc::clone(&warmed);
            let requests = (0..FLOOD_REQUESTS)
                .take_while(move |_| {
                    !stop.load(Ordering::Relaxed) && started.elapsed() < FLOOD_TIME
                })
                .map(move |n| {
                    let channel = channels[n % channels.len()].clone();
                    let (answered, reviewed, csr, warmed) = (
                        Arc::clone(&answered),
                        Arc::clone(&reviewed),
                        csr.clone(),
                        Arc::clone(&warmed),
                    );
                    async move {
                        let token = junk_token(n);
                        let result = if n % 2 == 0 {
                            ads(channel, &token).await
                        } else {
                            certificate(channel, &token, &csr).await
                        };
                        if matches!(&result, Err(s) if s.code() == tonic::Code::Unauthenticated) {
                            reviewed.fetch_add(1, Ordering::Relaxed);
                        }
                        if answered.fetch_add(1, Ordering::Relaxed) + 1 == 300 {
                            warmed.notify_one();
                        }
                    }
                });
            futures::stream::iter(requests)
                .buffer_unordered(FLOOD_CONCURRENCY)
                .collect::<Vec<()>>()
                .await;
            ended.notify_one();
            started.elapsed()
        })
    };
    warmed.notified().await;
    let token =
        standin.issue_service_account_token("shop", "web", &[AUDIENCE], Duration::from_secs(3600));
    let ads_result = served(|| ads(channel.clone(), &token)).await;
    let other =
        standin.issue_service_account_token("shop", "web", &[AUDIENCE], Duration::from_secs(3600));
    let certificate_result = served(|| certificate(channel.clone(), &other, &csr)).await;
    stop.store(true, Ordering::Relaxed);
    let flood_time = flood.await.expect("flood");
    Row {
        name,
        ads: ads_result,
        certificate: certificate_result,
        junk: answered.load(Ordering::Relaxed),
        junk_reviewed: reviewed.load(Ordering::Relaxed),
        flood_time,
    }
}

async fn object(client: &kube::Client, value: serde_json::Value) {
    let kind = value["kind"].as_str().unwrap_or_default().to_string();
    let namespace = value["metadata"]["namespace"].as_str().map(str::to_string);
    let resource = match kind.as_str() {
        "Namespace" => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()),
        "ConfigMap" => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        _ => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&()),
    };
    let api: kube::Api<kube::api::DynamicObject> = match namespace {
        Some(ns) => kube::Api::namespaced_with(client.clone(), &ns, &resource),
        None => kube::Api::all_with(client.clone(), &resource),
    };
    let object: kube::api::DynamicObject = serde_json::from_value(value).expect("object");
    api.create(&Default::default(), &object)
        .await
        .expect("create");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let standin = StandIn::start(StandInOptions::default())
            .await
            .expect("stand-in");
        let admin = standin.client(&Identity::Admin).await.expect("admin");
        let crds: kube::Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = kube::Api::all(admin.clone());
        for crd in meshplane_crds::crdgen::all() {
            crds.create(&Default::default(), &crd).await.expect("create CRD");
        }
        for ns in [CONTROL, "shop"] {
            object(&admin, serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"meshplane.io/rev": REVISION}}})).await;
        }
        object(&admin, serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "web", "namespace": "shop"}})).await;
        let members = meshplane_contracts::members::MembersData {
            members: ["shop".to_string()].into(),
            ..Default::default()
        };
        object(&admin, serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": meshplane_contracts::members::configmap_name(REVISION), "namespace": CONTROL},
            "data": members.to_data(),
        }))
        .await;
        let kubeconfig = standin.kubeconfig(&Identity::Admin).expect("kubeconfig");
        let mut rows = Vec::new();
        if let Ok(baseline) = std::env::var("MESHPLANE_XDS_BASELINE_BIN") {
            rows.push(run(&standin, &kubeconfig, &baseline, "baseline").await);
        }
        rows.push(run(&standin, &kubeconfig, env!("CARGO_BIN_EXE_meshplane-xds"), "this build").await);
        let time = |(t, attempts, why): &(Option<Duration>, usize, String)| match t {
            Some(t) => format!("{:.0} ms ({attempts} attempts)", t.as_secs_f64() * 1000.0),
            None => format!("not served in {} s ({attempts} attempts, last {why})", GIVE_UP.as_secs()),
        };
        println!("| binary | fresh valid token: ADS stream admitted after | certificate issued after | junk requests answered | junk tokens reviewed (UNAUTHENTICATED) | flood duration |");
        println!("|---|---|---|---|---|---|");
        for row in rows {
            println!(
                "| {} | {} | {} | {} | {} | {:.1} s |",
                row.name,
                time(&row.ads),
                time(&row.certificate),
                row.junk,
                row.junk_reviewed,
                row.flood_time.as_secs_f64()
            );
        }
    });
}
