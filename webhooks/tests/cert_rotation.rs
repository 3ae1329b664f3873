//! The webhook server picks up a rotated certificate without a restart (contract 4), and
//! serves the admission endpoints over HTTPS.

mod common;
use common::{scratch, webhooks};

use std::path::Path;
use std::sync::Arc;

use meshplane_webhooks::serve_on;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

/// The serving name the operator issues for a revision's instance.
const SERVICE_HOST: &str = "meshplane-blue-v1.meshplane-blue.svc";

/// A CA and a serving certificate issued by it.
struct Pki {
    ca: CertificateDer<'static>,
    cert_pem: String,
    key_pem: String,
}

fn issue(ca_name: &str) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![SERVICE_HOST.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    Pki {
        ca: ca.der().clone(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
    }
}

/// Writes the pair the way the kubelet updates a Secret volume: new files renamed into place.
fn install(dir: &Path, pki: &Pki) {
    for (name, content) in [("tls.crt", &pki.cert_pem), ("tls.key", &pki.key_pem)] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
}

/// Sends one HTTP/1.1 request over TLS trusting only `ca`; returns the raw response.
async fn request(
    addr: std::net::SocketAddr,
    ca: &CertificateDer<'static>,
    req: &str,
) -> Result<String, std::io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(SERVICE_HOST).unwrap();
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    tls.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    tls.read_to_string(&mut out).await?;
    Ok(out)
}

const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn a_rotated_certificate_is_served_without_restart() {
    let dir = scratch("rotation");
    let (a, b) = (issue("ca-a"), issue("ca-b"));
    install(&dir, &a);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(listener, dir.clone(), webhooks(), async {
        let _ = stopped.await;
    }));

    let ok = request(addr, &a.ca, HEALTHZ)
        .await
        .expect("client trusting A connects to A");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.ends_with("ok"), "{ok}");
    assert!(
        request(addr, &b.ca, HEALTHZ).await.is_err(),
        "B's CA must not trust A's certificate"
    );

    install(&dir, &b);
    // The next handshake after the files changed serves B: no restart, nothing to wait for.
    let ok = request(addr, &b.ca, HEALTHZ)
        .await
        .expect("client trusting only B connects after the rotation");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        request(addr, &a.ca, HEALTHZ).await.is_err(),
        "A's certificate must no longer be served"
    );

    // A broken update (key not matching) keeps the last good certificate serving.
    let c = issue("ca-c");
    let broken = Pki {
        ca: c.ca.clone(),
        cert_pem: c.cert_pem.clone(),
        key_pem: b.key_pem.clone(),
    };
    install(&dir, &broken);
    let ok = request(addr, &b.ca, HEALTHZ)
        .await
        .expect("B keeps serving after a broken update");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn admission_endpoints_answer_over_https() {
    let dir = scratch("https");
    let pki = issue("ca");
    install(&dir, &pki);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(listener, dir.clone(), webhooks(), async {
        let _ = stopped.await;
    }));

    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-https",
            "kind": {"group": "networking.meshplane.io", "version": "v1alpha1", "kind": "ServiceEntry"},
            "resource": {"group": "networking.meshplane.io", "version": "v1alpha1", "resource": "serviceentries"},
            "namespace": "shop", "operation": "CREATE", "userInfo": {},
            "object": {"metadata": {"name": "x"}, "spec": {"hosts": ["api.example.com"], "exportTo": ["green"]}}
        }
    })
    .to_string();
    let req = format!(
        "POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{review}",
        review.len()
    );
    let out = request(addr, &pki.ca, &req).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let body: serde_json::Value =
        serde_json::from_str(out.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["response"]["uid"], "u-https");
    assert_eq!(body["response"]["allowed"], false);

    let garbage = "POST /inject HTTP/1.1\r\nHost: webhook\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{{{";
    let out = request(addr, &pki.ca, garbage).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("malformed AdmissionReview"), "{out}");

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn serving_fails_clearly_without_a_certificate() {
    let dir = scratch("nocert");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve_on(listener, dir.clone(), webhooks(), std::future::pending())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tls.crt"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
