//! The shared HTTPS accept loop (`meshplane_webhooks::https`), which serves the instances'
//! webhooks and the operator's admission check: a client that never finishes its handshake is
//! dropped, a request in flight at shutdown is answered before the loop returns, and nothing is
//! accepted after; no connection is served before a certificate is there.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use meshplane_webhooks::https::{self, Limits};
use rcgen::{CertificateParams, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Notify};
use tokio_rustls::TlsConnector;

const HOST: &str = "meshplane-operator.meshplane-system.svc";

fn pki() -> (CertificateDer<'static>, Arc<rustls::ServerConfig>) {
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec![HOST.to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let der = cert.der().clone();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![der.clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .expect("config");
    (der, Arc::new(config))
}

async fn get_over_tls(
    addr: std::net::SocketAddr,
    ca: &CertificateDer<'static>,
    path: &str,
) -> std::io::Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).expect("root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(HOST).expect("name");
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: admission\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    tls.read_to_string(&mut out).await?;
    Ok(out)
}

fn short_limits() -> Limits {
    Limits {
        handshake_timeout: Duration::from_millis(300),
        drain_timeout: Duration::from_secs(5),
        accept_backoff: Duration::from_millis(10),
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_is_dropped() {
    let (ca, config) = pki();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = Router::new().route("/healthz", get(|| async { "ok" }));
    tokio::spawn(https::serve(
        listener,
        https::fixed(config),
        router,
        short_limits(),
        std::future::pending(),
    ));

    // Connect and send nothing: the server closes the socket once the handshake times out.
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
        .await
        .expect("the server closes an idle handshake, it does not hold it open");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed, not answered: {read:?}"
    );

    // Others are still served meanwhile.
    let reply = get_over_tls(addr, &ca, "/healthz").await.expect("request");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[tokio::test]
async fn shutdown_answers_the_request_in_flight_and_accepts_nothing_after() {
    let (ca, config) = pki();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let router = {
        let (entered, release) = (entered.clone(), release.clone());
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route(
                "/slow",
                get(move || {
                    let (entered, release) = (entered.clone(), release.clone());
                    async move {
                        entered.notify_one();
                        release.notified().await;
                        "done"
                    }
                }),
            )
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(https::serve(
        listener,
        https::fixed(config),
        router,
        short_limits(),
        async {
            let _ = stop_rx.await;
        },
    ));

    let in_flight = tokio::spawn({
        let ca = ca.clone();
        async move { get_over_tls(addr, &ca, "/slow").await }
    });
    entered.notified().await;
    stop_tx.send(()).expect("stop");
    // The accept loop has stopped once a new connection is no longer served.
    tokio::time::timeout(Duration::from_secs(5), async {
        while get_over_tls(addr, &ca, "/healthz").await.is_ok() {}
    })
    .await
    .expect("no new connection is served after shutdown");
    assert!(
        !server.is_finished(),
        "still draining the request in flight"
    );

    release.notify_one();
    let reply = in_flight.await.expect("task").expect("answered");
    assert!(
        reply.starts_with("HTTP/1.1 200") && reply.ends_with("done"),
        "{reply}"
    );
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("returns once drained")
        .expect("task");
}

#[tokio::test]
async fn nothing_is_served_before_a_certificate_is_there() {
    let (ca, config) = pki();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (configs_tx, configs) = watch::channel(None);
    let router = Router::new().route("/healthz", get(|| async { "ok" }));
    tokio::spawn(https::serve(
        listener,
        configs,
        router,
        short_limits(),
        std::future::pending(),
    ));
    assert!(
        get_over_tls(addr, &ca, "/healthz").await.is_err(),
        "refused without a certificate"
    );
    configs_tx.send_replace(Some(config));
    let reply = get_over_tls(addr, &ca, "/healthz").await.expect("request");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}
