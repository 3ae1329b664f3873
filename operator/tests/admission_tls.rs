//! The operator's shared admission certificate against the API stand-in: replicas racing on an
//! empty namespace serve one certificate, a Secret near expiry or holding garbage is rotated in
//! place, every caBundle of the webhook configuration follows the Secret, and the serving loop
//! reports ready only once the caBundle trusts what it serves. This was
//! ~200 untested lines of `main.rs`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, PostParams};
use kube::Client;
use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};
use meshplane_operator::admission_tls::{self, SharedTls};
use meshplane_operator::server::Health;
use meshplane_operator::tls::{self, WebhookTls};
use time::OffsetDateTime;
use tokio::sync::watch;

const NS: &str = "meshplane-system";
const SECRET: &str = "meshplane-operator-webhook-tls";
const CONFIG: &str = "meshplane-operator";
const HOST: &str = "meshplane-operator.meshplane-system.svc";

fn shared() -> SharedTls {
    SharedTls {
        namespace: NS.into(),
        secret: SECRET.into(),
        host: HOST.into(),
        config_name: CONFIG.into(),
        validity: time::Duration::days(90),
    }
}

async fn cluster() -> (StandInHandle, Client) {
    let standin = StandIn::start(StandInOptions::default())
        .await
        .expect("stand-in");
    let client = standin.client(&Identity::Admin).await.expect("client");
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    (standin, client)
}

async fn webhook_configuration(client: &Client, hooks: &[&str]) {
    let webhooks: Vec<_> = hooks
        .iter()
        .map(|name| {
            serde_json::json!({
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "clientConfig": {"service": {"name": "meshplane-operator", "namespace": NS, "path": "/validate-meshplane"}},
            })
        })
        .collect();
    let config: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": CONFIG},
        "webhooks": webhooks,
    }))
    .expect("webhook configuration");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .expect("create webhook configuration");
}

async fn stored(client: &Client) -> (WebhookTls, String) {
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get(SECRET)
        .await
        .expect("the Secret");
    let data = serde_json::to_value(&secret.data).expect("data");
    let tls = WebhookTls::from_secret_data(&data).expect("readable material");
    (tls, secret.metadata.resource_version.expect("rv"))
}

async fn bundles(client: &Client) -> Vec<String> {
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(CONFIG)
        .await
        .expect("webhook configuration")
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|h| {
            h.client_config
                .ca_bundle
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
                .unwrap_or_default()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_racing_on_an_empty_namespace_serve_one_certificate() {
    let (_standin, client) = cluster().await;
    let api = Api::<Secret>::namespaced(client.clone(), NS);
    let now = OffsetDateTime::now_utc();
    let shared = shared();
    let replicas: Vec<_> = (0..4)
        .map(|_| {
            let (api, shared) = (api.clone(), shared.clone());
            tokio::spawn(async move { admission_tls::sync_secret(&api, &shared, now).await })
        })
        .collect();
    let mut served = Vec::new();
    for replica in replicas {
        served.push(replica.await.expect("task").expect("sync"));
    }
    let (stored, _) = stored(&client).await;
    for tls in &served {
        assert_eq!(tls, &stored, "every replica serves the stored certificate");
    }
    let facts = stored.serving_cert_facts().expect("parses");
    assert_eq!(facts.dns_names, vec![HOST.to_string()]);

    // A later sync keeps it: no write.
    let (_, rv) = self::stored(&client).await;
    let again = admission_tls::sync_secret(&api, &shared, now)
        .await
        .expect("sync");
    assert_eq!(again, stored);
    assert_eq!(self::stored(&client).await.1, rv, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_near_expiry_or_holding_garbage_is_rotated_in_place() {
    let (_standin, client) = cluster().await;
    let api = Api::<Secret>::namespaced(client.clone(), NS);
    let shared = shared();

    // Garbage under the Secret's name (e.g. a hand edit): replaced, not created.
    let garbage: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": SECRET, "namespace": NS},
        "stringData": {"tls.crt": "not a certificate"},
    }))
    .expect("secret");
    api.create(&PostParams::default(), &garbage)
        .await
        .expect("create garbage");
    let now = OffsetDateTime::now_utc();
    let first = admission_tls::sync_secret(&api, &shared, now)
        .await
        .expect("sync");
    assert!(first.serving_cert_facts().is_some(), "garbage was replaced");
    assert_eq!(stored(&client).await.0, first);

    // 70 of 90 days later, less than a third remains: a new certificate whose bundle still
    // carries the old CA, so the API server trusts both during the switch.
    let later = now + time::Duration::days(70);
    let rotated = admission_tls::sync_secret(&api, &shared, later)
        .await
        .expect("sync");
    assert_ne!(rotated.cert_pem, first.cert_pem, "rotated");
    assert!(
        tls::ca_bundle_trusts(&rotated.ca_bundle_pem, &first),
        "the new bundle still trusts the old certificate's CA"
    );
    assert_eq!(stored(&client).await.0, rotated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ca_bundle_follows_the_secret_and_is_written_once() {
    let (_standin, client) = cluster().await;
    webhook_configuration(
        &client,
        &[
            "meshcontrolplanes.meshplane.io",
            "meshrevisiontags.meshplane.io",
        ],
    )
    .await;
    let api = Api::<Secret>::namespaced(client.clone(), NS);
    let tls = admission_tls::sync_secret(&api, &shared(), OffsetDateTime::now_utc())
        .await
        .expect("sync");

    assert!(admission_tls::publish_ca_bundle(&client, CONFIG, &tls)
        .await
        .expect("publish"));
    for bundle in bundles(&client).await {
        assert_eq!(
            bundle, tls.ca_bundle_pem,
            "every webhook trusts the Secret's CA"
        );
    }
    let configs = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let rv = configs
        .get(CONFIG)
        .await
        .expect("get")
        .metadata
        .resource_version;
    assert!(admission_tls::publish_ca_bundle(&client, CONFIG, &tls)
        .await
        .expect("publish"));
    assert_eq!(
        configs
            .get(CONFIG)
            .await
            .expect("get")
            .metadata
            .resource_version,
        rv,
        "a caBundle already equal to ca.crt is not written again"
    );

    // A configuration that does not exist is an error the loop retries, never "trusted".
    assert!(admission_tls::publish_ca_bundle(&client, "missing", &tls)
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_loop_is_ready_only_once_the_ca_bundle_trusts_its_certificate() {
    let (_standin, client) = cluster().await;
    let (configs_tx, mut configs) = watch::channel(None);
    let (stop_tx, stop_rx) = watch::channel(false);
    let health = Health::default();
    let task = tokio::spawn(admission_tls::run(
        client.clone(),
        shared(),
        None,
        Arc::new(OffsetDateTime::now_utc),
        configs_tx,
        health.clone(),
        stop_rx,
    ));

    // No webhook configuration yet: the certificate is served (nothing else would be), but the
    // replica is not ready, because the API server could not verify it.
    tokio::time::timeout(Duration::from_secs(20), configs.wait_for(|c| c.is_some()))
        .await
        .expect("a certificate within 20 s")
        .expect("sender alive");
    assert!(!health.is_ready(), "not ready while no caBundle trusts it");

    // Once the configuration exists, the next retry publishes the CA and turns ready.
    webhook_configuration(&client, &["meshcontrolplanes.meshplane.io"]).await;
    tokio::time::timeout(Duration::from_secs(20), health.ready())
        .await
        .expect("ready within 20 s of the configuration");
    let (stored, _) = stored(&client).await;
    assert_eq!(bundles(&client).await, vec![stored.ca_bundle_pem.clone()]);

    stop_tx.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops when asked")
        .expect("task");
}

/// One POST of `body` to `path` over TLS trusting `ca_pem`, presenting `client` if given: the
/// raw HTTP/1.1 response, or the handshake's error.
async fn post_over_tls(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    client: Option<&(String, String)>,
    path: &str,
    body: &str,
) -> std::io::Result<String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("chain"),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key"),
            )
            .expect("client config"),
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(HOST).expect("name"), tcp)
        .await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes()).await?;
    let mut out = String::new();
    tls.read_to_string(&mut out).await?;
    Ok(out)
}

/// A client CA: its PEM and the issuer that signs client certificates.
fn client_ca() -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    (ca.pem(), Issuer::new(ca_params, ca_key))
}

fn client_ca_issuer_elsewhere() -> rcgen::Issuer<'static, rcgen::KeyPair> {
    client_ca().1
}

/// A client certificate for subject CN `cn`: (certificate PEM, key PEM).
fn client_cert(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, cn: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let cert = params.signed_by(&key, issuer).expect("client certificate");
    (cert.pem(), key.serialize_pem())
}

/// `--apiserver-client-ca`: the operator's /validate-meshplane answers only the API server's
/// client certificate (of the CA, with an accepted name); a forged review from anyone else
/// gets 401 or 403 and no verdict (which could tell which trust domains other tenants hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_check_answers_only_the_api_servers_client_certificate() {
    use meshplane_operator::server;
    use meshplane_webhooks::client_auth::ClientAuth;
    let (_standin, client) = cluster().await;
    let (serving, _) = tls::ensure(
        None,
        HOST,
        OffsetDateTime::now_utc(),
        time::Duration::days(1),
    )
    .expect("serving certificate");
    let (client_ca, issuer) = client_ca();
    let apiserver = client_cert(&issuer, "kube-apiserver-admission");
    // Another client the same CA signed, and a certificate of another CA with the right name.
    let other_name = client_cert(&issuer, "system:node:worker-1");
    let rogue = client_cert(&client_ca_issuer_elsewhere(), "kube-apiserver-admission");
    let dir = std::env::temp_dir().join(format!("operator-client-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, &client_ca).expect("CA file");
    let auth = Arc::new(
        ClientAuth::from_file(
            ca_file.clone(),
            vec!["kube-apiserver-admission".into()],
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .expect("client CA"),
    );
    assert!(
        ClientAuth::from_file(
            dir.join("absent.crt"),
            vec![],
            Arc::new(rustls::crypto::ring::default_provider())
        )
        .is_err(),
        "a flag naming a missing file is an error at start"
    );
    let config = server::rustls_config(&serving.cert_pem, &serving.key_pem, Some(auth.clone()))
        .expect("config");
    let (_configs_tx, configs) = watch::channel(Some(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let metrics = Arc::new(meshplane_operator::metrics::Metrics::default());
    let task = tokio::spawn(server::serve_https_reloading(
        listener,
        configs,
        server::admission_router(client.clone(), Some(auth.clone()), metrics.clone()),
        async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        },
    ));
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged", "operation": "CREATE", "name": "probe",
            "kind": {"group": "meshplane.io", "version": "v1alpha1", "kind": "MeshControlPlane"},
            "resource": {"group": "meshplane.io", "version": "v1alpha1", "resource": "meshcontrolplanes"},
            "userInfo": {"username": "nobody"},
            "object": {"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
                "metadata": {"name": "probe"},
                "spec": {"tenant": "probe", "meshConfig": {"trustDomain": "green.meshplane.local"}}}
        }
    })
    .to_string();
    let path = meshplane_contracts::operator_tls::ADMISSION_PATH;

    let anonymous = post_over_tls(addr, &serving.ca_bundle_pem, None, path, &review)
        .await
        .expect("the handshake succeeds without a certificate");
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    assert!(!anonymous.contains("AdmissionReview"), "{anonymous}");
    let wrong_name = post_over_tls(
        addr,
        &serving.ca_bundle_pem,
        Some(&other_name),
        path,
        &review,
    )
    .await
    .expect("the CA signed it: the handshake succeeds");
    assert!(wrong_name.starts_with("HTTP/1.1 403"), "{wrong_name}");
    assert!(wrong_name.contains("system:node:worker-1"), "{wrong_name}");
    assert!(!wrong_name.contains("AdmissionReview"), "{wrong_name}");
    // Signed by another CA: refused in the handshake (or with 403), never answered.
    let forged = post_over_tls(addr, &serving.ca_bundle_pem, Some(&rogue), path, &review).await;
    assert!(
        forged
            .as_ref()
            .map_or(true, |r| !r.contains("AdmissionReview")),
        "{forged:?}"
    );
    let answered = post_over_tls(
        addr,
        &serving.ca_bundle_pem,
        Some(&apiserver),
        path,
        &review,
    )
    .await
    .expect("the API server is answered");
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(answered.contains("AdmissionReview"), "{answered}");
    assert!(
        auth.refusals() >= 3,
        "refusals counted: {}",
        auth.refusals()
    );
    // Only the answered call is a request of the check: counted by its outcome, and timed.
    let text = metrics.encode().expect("metrics");
    let requests: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with(
                r#"meshplane_operator_webhook_requests_total{webhook="validate-meshplane","#,
            )
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(requests, 1.0, "{text}");
    assert!(
        text.lines().any(|l| l
            == r#"meshplane_operator_webhook_duration_seconds_count{webhook="validate-meshplane"} 1"#),
        "{text}"
    );

    stop_tx.send_replace(true);
    task.await.expect("server stops");
    let _ = std::fs::remove_dir_all(&dir);
}
