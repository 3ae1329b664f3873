//! Admission calls only from the authenticated API server (contract 4's `client-ca.crt`): with
//! the client CA in the webhook TLS directory, `/validate` and `/inject` answer only a caller
//! presenting a certificate of that CA (and, with `client-names`, one of those identities);
//! anyone else learns nothing, not even whether a namespace is a member of the tenant.
//! `/healthz` stays open. Without the CA nothing changes, and the CA is reloaded like the
//! serving certificate.

mod common;
use common::{scratch, webhooks};

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use meshplane_webhooks::serve_on;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

const SERVICE_HOST: &str = "meshplane-blue-v1.meshplane-blue.svc";
/// What the API server's admission client certificate says it is.
const APISERVER: &str = "kube-apiserver-admission";

/// A CA that signs serving or client certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A leaf for `names` (SANs) with subject CN `cn`: (certificate PEM, key PEM).
    fn leaf(&self, cn: &str, names: &[&str], client: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes a file the way the kubelet updates a Secret volume: renamed into place.
fn install(dir: &Path, name: &str, content: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// A forged review asking, in effect, "is `garden` a member of blue?".
fn forged_review() -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "forged-1",
            "kind": {"group": "networking.meshplane.io", "version": "v1alpha1", "kind": "VirtualService"},
            "resource": {"group": "networking.meshplane.io", "version": "v1alpha1", "resource": "virtualservices"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "nobody"},
            "object": {
                "apiVersion": "networking.meshplane.io/v1alpha1", "kind": "VirtualService",
                "metadata": {"name": "probe", "namespace": "shop"},
                "spec": {"hosts": ["web"], "exportTo": ["garden"]}
            },
            "dryRun": false
        }
    })
    .to_string()
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n";

/// One HTTP/1.1 exchange over TLS, trusting `serving_ca`, presenting `client` if given.
async fn exchange(
    addr: SocketAddr,
    serving_ca: &CertificateDer<'static>,
    client: Option<&(String, String)>,
    request: &str,
) -> std::io::Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(serving_ca.clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(SERVICE_HOST).unwrap();
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    tls.write_all(request.as_bytes()).await?;
    let mut out = String::new();
    tls.read_to_string(&mut out).await?;
    Ok(out)
}

struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), meshplane_webhooks::ServeError>>,
}

impl Server {
    async fn start(dir: &Path) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_on(listener, dir.to_owned(), webhooks(), async {
            let _ = stopped.await;
        }));
        Server {
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.unwrap().unwrap();
    }
}

fn serving(dir: &Path, ca: &Ca) {
    let (cert, key) = ca.leaf("webhook", &[SERVICE_HOST], false);
    install(dir, "tls.crt", &cert);
    install(dir, "tls.key", &key);
}

/// The membership answer a forged review would get.
const MEMBERSHIP: &str = "is not a member of tenant";

#[tokio::test]
async fn only_the_api_servers_certificate_reaches_the_admission_paths() {
    let dir = scratch("client-auth-on");
    let serving_ca = Ca::new("webhook-ca");
    serving(&dir, &serving_ca);
    let client_ca = Ca::new("apiserver-client-ca");
    install(&dir, "client-ca.crt", &client_ca.pem());
    let server = Server::start(&dir).await;
    let apiserver = client_ca.leaf(APISERVER, &[], true);
    let rogue = Ca::new("apiserver-client-ca").leaf(APISERVER, &[], true);

    // No certificate: 401 on both admission paths, and not a word about membership.
    for path in ["/validate", "/inject"] {
        let reply = exchange(
            server.addr,
            &serving_ca.der(),
            None,
            &post(path, &forged_review()),
        )
        .await
        .expect("the handshake succeeds without a certificate");
        assert!(reply.starts_with("HTTP/1.1 401"), "{path}: {reply}");
        assert!(reply.contains("no client certificate"), "{reply}");
        assert!(!reply.contains(MEMBERSHIP), "{reply}");
        assert!(!reply.contains("AdmissionReview"), "{reply}");
    }
    // The kubelet's probe needs none.
    let health = exchange(server.addr, &serving_ca.der(), None, HEALTHZ)
        .await
        .expect("healthz without a certificate");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");

    // A certificate of another CA (even one with the same name) fails the handshake.
    let refused = exchange(
        server.addr,
        &serving_ca.der(),
        Some(&rogue),
        &post("/validate", &forged_review()),
    )
    .await;
    match refused {
        Err(_) => {}
        Ok(reply) => {
            assert!(!reply.contains(MEMBERSHIP), "{reply}");
            assert!(!reply.starts_with("HTTP/1.1 200"), "{reply}");
        }
    }

    // The API server's certificate gets the usual answer.
    let answered = exchange(
        server.addr,
        &serving_ca.der(),
        Some(&apiserver),
        &post("/validate", &forged_review()),
    )
    .await
    .expect("the API server is answered");
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(answered.contains(MEMBERSHIP), "{answered}");
    server.stop().await;
}

#[tokio::test]
async fn accepted_names_narrow_the_certificates_of_the_ca() {
    let dir = scratch("client-auth-names");
    let serving_ca = Ca::new("webhook-ca");
    serving(&dir, &serving_ca);
    let client_ca = Ca::new("apiserver-client-ca");
    install(&dir, "client-ca.crt", &client_ca.pem());
    install(&dir, "client-names", &format!("{APISERVER}\n"));
    let server = Server::start(&dir).await;

    // Another client of the same CA (the CA signs more than the API server's certificate).
    let other = client_ca.leaf("system:node:worker-1", &[], true);
    let reply = exchange(
        server.addr,
        &serving_ca.der(),
        Some(&other),
        &post("/validate", &forged_review()),
    )
    .await
    .expect("the handshake succeeds: the CA signed it");
    assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
    assert!(reply.contains("system:node:worker-1"), "{reply}");
    assert!(!reply.contains(MEMBERSHIP), "{reply}");

    // The name may be the subject CN or a SAN.
    for apiserver in [
        client_ca.leaf(APISERVER, &[], true),
        client_ca.leaf("apiserver", &[APISERVER], true),
    ] {
        let reply = exchange(
            server.addr,
            &serving_ca.der(),
            Some(&apiserver),
            &post("/validate", &forged_review()),
        )
        .await
        .expect("answered");
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.contains(MEMBERSHIP), "{reply}");
    }
    server.stop().await;
}

#[tokio::test]
async fn without_the_ca_nothing_changes_and_the_ca_is_reloaded() {
    let dir = scratch("client-auth-reload");
    let serving_ca = Ca::new("webhook-ca");
    serving(&dir, &serving_ca);
    let server = Server::start(&dir).await;
    let forged = post("/validate", &forged_review());

    // Off: anyone is answered (the behaviour without the option).
    let reply = exchange(server.addr, &serving_ca.der(), None, &forged)
        .await
        .expect("answered");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains(MEMBERSHIP), "{reply}");

    // The Secret gains client-ca.crt: the next connection must authenticate.
    let client_ca = Ca::new("apiserver-client-ca");
    install(&dir, "client-ca.crt", &client_ca.pem());
    let reply = exchange(server.addr, &serving_ca.der(), None, &forged)
        .await
        .expect("connects");
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    let apiserver = client_ca.leaf(APISERVER, &[], true);
    let reply = exchange(server.addr, &serving_ca.der(), Some(&apiserver), &forged)
        .await
        .expect("answered");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    // A CA rotated to a new one: the old CA's certificates no longer get in.
    let next_ca = Ca::new("apiserver-client-ca-2");
    install(&dir, "client-ca.crt", &next_ca.pem());
    let old = exchange(server.addr, &serving_ca.der(), Some(&apiserver), &forged).await;
    assert!(
        old.as_ref().map_or(true, |r| !r.contains(MEMBERSHIP)),
        "{old:?}"
    );
    let renewed = next_ca.leaf(APISERVER, &[], true);
    let reply = exchange(server.addr, &serving_ca.der(), Some(&renewed), &forged)
        .await
        .expect("answered");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    // An unusable update keeps the CA in force.
    install(&dir, "client-ca.crt", "not a certificate");
    let reply = exchange(server.addr, &serving_ca.der(), None, &forged)
        .await
        .expect("connects");
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");

    // Removed: open again.
    std::fs::remove_file(dir.join("client-ca.crt")).unwrap();
    let reply = exchange(server.addr, &serving_ca.der(), None, &forged)
        .await
        .expect("answered");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    server.stop().await;
}

#[tokio::test]
async fn an_unusable_client_ca_at_start_is_an_error() {
    let dir = scratch("client-auth-broken");
    serving(&dir, &Ca::new("webhook-ca"));
    install(
        &dir,
        "client-ca.crt",
        "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let served = serve_on(listener, dir, webhooks(), async {}).await;
    assert!(
        matches!(served, Err(meshplane_webhooks::ServeError::ClientAuth(_))),
        "{served:?}"
    );
}
