//! Admission answers only the authenticated API server: the platform admin gives the operator
//! the CA of the API server's admission client certificate (`--apiserver-client-ca`, from a
//! Secret, as docs/webhooks.md says), and the API server (the stand-in, with the client
//! certificates of a `WebhookAdmissionConfiguration` kubeconfig) presents it. Admission keeps
//! working through the API server: a VirtualService naming a namespace outside the tenant is
//! refused with the usual message, pods are injected, the operator's own check answers. A
//! forged AdmissionReview sent straight to an instance's 15017 (or to the operator's 9443)
//! from the pod network, where the API server's calls come from too, learns nothing about
//! membership: 401 without a certificate, a failed handshake with one of another CA.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, PostParams};
use kube::Api;
use meshplane_crds::names;
use meshplane_e2e::harness::{container_names, pod_is_ready, test_pod, wait_for, Cluster};
use meshplane_e2e::reach::OnNode;
use meshplane_kube_standin::WebhookClientCredentials;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(180);
const OPERATOR_NS: &str = "meshplane-system";
/// The identity on the API server's admission client certificate.
const APISERVER: &str = "kube-apiserver-admission";
/// The Secret the platform admin keeps the client CA in.
const CLIENT_CA_SECRET: &str = "meshplane-apiserver-client-ca";
const CLIENT_CA_DIR: &str = "/etc/meshplane/apiserver-client-ca";
/// What a membership answer says.
const MEMBERSHIP: &str = "is not a member of tenant";

/// A CA: its PEM and its issuer.
fn ca() -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "apiserver admission client CA");
    let cert = params.self_signed(&key).expect("CA");
    (cert.pem(), Issuer::new(params, key))
}

/// A client certificate for `cn`: (certificate PEM, key PEM).
fn client_cert(issuer: &Issuer<'static, KeyPair>, cn: &str) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).expect("client certificate");
    (cert.pem(), key.serialize_pem())
}

/// The `ca.crt` of TLS Secret `namespace/name`.
async fn serving_ca(cluster: &Cluster, namespace: &str, name: &str) -> String {
    let secret = Api::<Secret>::namespaced(cluster.client(), namespace)
        .get(name)
        .await
        .expect("webhook TLS Secret");
    let data = secret.data.unwrap_or_default();
    String::from_utf8(data["ca.crt"].0.clone()).expect("PEM")
}

/// One POST over TLS from the node to `address`, verifying the server as `host` by
/// `serving_ca`, presenting `client` if given: the raw HTTP/1.1 response, or why none came.
async fn post_from_node(
    node: &OnNode,
    address: SocketAddr,
    host: &str,
    serving_ca: &str,
    client: Option<&(String, String)>,
    request: &str,
) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(serving_ca.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?,
                PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string())?,
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let exchange = async {
        let tcp = node.connect(address).await.map_err(|e| e.to_string())?;
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        tls.write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        if let Err(e) = tls.read_to_end(&mut raw).await {
            if raw.is_empty() {
                return Err(format!("reading the answer: {e}"));
            }
        }
        Ok(String::from_utf8_lossy(&raw).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .map_err(|_| "timed out".to_string())?
}

fn post(host: &str, path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A forged review asking, in effect, "is `garden` a member of blue?".
fn forged_review() -> String {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged-1", "operation": "CREATE", "name": "probe", "namespace": "shop",
            "kind": {"group": "networking.meshplane.io", "version": "v1alpha1", "kind": "VirtualService"},
            "resource": {"group": "networking.meshplane.io", "version": "v1alpha1", "resource": "virtualservices"},
            "userInfo": {"username": "nobody"},
            "object": {"apiVersion": "networking.meshplane.io/v1alpha1", "kind": "VirtualService",
                "metadata": {"name": "probe", "namespace": "shop"},
                "spec": {"hosts": ["web"], "exportTo": ["garden"]}},
            "dryRun": false
        }
    })
    .to_string()
}

/// The address of the one ready pod matching `selector` in `namespace`.
async fn pod_address(cluster: &Cluster, namespace: &str, selector: &str) -> IpAddr {
    let pods = cluster
        .wait_for_ready_pods(namespace, selector, 1, DEADLINE)
        .await
        .expect("the pod is ready");
    meshplane_e2e::harness::pod_ip(&pods[0])
        .expect("a pod IP")
        .into()
}

/// Turns the option on as a platform admin does: the CA into a Secret of the operator's
/// namespace, mounted into the operator, whose flags name it and the accepted identity.
async fn give_the_operator_the_client_ca(cluster: &Cluster, ca_pem: &str) {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": CLIENT_CA_SECRET, "namespace": OPERATOR_NS},
        "stringData": {"ca.crt": ca_pem},
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(cluster.client(), OPERATOR_NS)
        .create(&PostParams::default(), &secret)
        .await
        .expect("client CA Secret created");
    let patch = serde_json::json!([
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
         "value": format!("--apiserver-client-ca={CLIENT_CA_DIR}/ca.crt")},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
         "value": format!("--apiserver-client-name={APISERVER}")},
        {"op": "add", "path": "/spec/template/spec/volumes",
         "value": [{"name": "apiserver-client-ca", "secret": {"secretName": CLIENT_CA_SECRET}}]},
        {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts",
         "value": [{"name": "apiserver-client-ca", "mountPath": CLIENT_CA_DIR, "readOnly": true}]},
    ])
    .to_string();
    cluster
        .kubectl(&[
            "-n",
            OPERATOR_NS,
            "patch",
            "deployment",
            "meshplane-operator",
            "--type=json",
            "-p",
            &patch,
        ])
        .expect("operator patched");
    // Every replica runs with the flag, and admission answers through the API server.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), OPERATOR_NS);
    wait_for(
        "every operator replica to run with --apiserver-client-ca",
        DEADLINE,
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(
                        &ListParams::default().labels("app.kubernetes.io/name=meshplane-operator"),
                    )
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                let with_flag = |p: &Pod| {
                    p.spec.as_ref().is_some_and(|s| {
                        s.containers[0]
                            .args
                            .iter()
                            .flatten()
                            .any(|a| a.starts_with("--apiserver-client-ca="))
                    })
                };
                let done = list.len() == 2 && list.iter().all(|p| with_flag(p) && pod_is_ready(p));
                if done {
                    Ok(Some(()))
                } else {
                    Err(format!(
                        "{} pods, {} with the flag and ready",
                        list.len(),
                        list.iter()
                            .filter(|p| with_flag(p) && pod_is_ready(p))
                            .count()
                    ))
                }
            }
        },
    )
    .await
    .expect("operator rolled out");
    cluster
        .wait_for_operator_admission(DEADLINE)
        .await
        .expect("admission through the API server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_answers_only_the_api_servers_client_certificate() {
    let started = Instant::now();
    let (ca_pem, issuer) = ca();
    let apiserver = client_cert(&issuer, APISERVER);
    // The admission kubeconfig of the API server: every instance's webhook (port 15017 of any
    // Service), and the operator's Service (port 443, so the name may leave the port out).
    let credentials = WebhookClientCredentials::default()
        .with("*.svc:15017", &apiserver.0, &apiserver.1)
        .with(
            "meshplane-operator.meshplane-system.svc",
            &apiserver.0,
            &apiserver.1,
        );
    let cluster = Cluster::start_with_webhook_credentials("apiserver-auth", credentials)
        .await
        .expect("cluster");
    if cluster.standin().is_none() {
        eprintln!("the API server's client certificate is made here and given to the stand-in; a real cluster's API server takes it from its own --admission-control-config-file, so with E2E_KUBECONFIG this scenario does not apply");
        return;
    }
    cluster
        .install_operator()
        .await
        .expect("operator installed");
    give_the_operator_the_client_ca(&cluster, &ca_pem).await;

    for sample in ["config/samples/blue.yaml", "config/samples/green.yaml"] {
        cluster
            .kubectl(&["apply", "--server-side", "-f", sample])
            .expect("sample");
    }
    cluster
        .kubectl(&["create", "namespace", "shop"])
        .expect("shop");
    cluster
        .kubectl(&["label", "namespace", "shop", "meshplane.io/rev=blue-stable"])
        .expect("shop joins blue");
    // Ready includes WebhooksReady: the operator's dry-run probe through the API server
    // reached blue's /validate, which asks for the client certificate.
    cluster
        .wait_for_mcp_ready("blue-v1", DEADLINE)
        .await
        .expect("blue-v1 Ready");

    // Contract 4: the instance got the CA and the accepted name.
    let control = names::control_namespace("blue");
    let tls_secret = Api::<Secret>::namespaced(cluster.client(), &control)
        .get("meshplane-blue-v1-webhook-tls")
        .await
        .expect("webhook TLS Secret");
    let data = tls_secret.data.unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&data["client-ca.crt"].0),
        ca_pem,
        "the instance's Secret carries the client CA"
    );
    assert_eq!(
        String::from_utf8_lossy(&data["client-names"].0).trim(),
        APISERVER
    );

    // (a) Through the API server, admission is as before: the usual refusal...
    let refused = cluster
        .apply_manifest(
            "apiVersion: networking.meshplane.io/v1alpha1\nkind: VirtualService\nmetadata:\n  name: leaky\n  namespace: shop\nspec:\n  hosts: [web]\n  exportTo: [garden]\n  http:\n    - route:\n        - destination: {host: web}\n",
        )
        .expect_err("a VirtualService exported outside the tenant is refused");
    let refused = refused.to_string();
    assert!(
        refused.contains("namespace \"garden\" is not a member of tenant \"blue\""),
        "{refused}"
    );
    // ...and injection.
    cluster
        .apply_manifest(&test_pod("shop", "probe"))
        .expect("pod created");
    let pod = Api::<Pod>::namespaced(cluster.client(), "shop")
        .get("probe")
        .await
        .expect("pod");
    assert!(
        container_names(&pod).contains(&"meshplane-proxy".to_string()),
        "injected: {:?}",
        container_names(&pod)
    );

    // (b) Straight to the instance, from the pod network: no certificate, no answer.
    let node = cluster.on_node().expect("the test network");
    let instance_ip = pod_address(
        &cluster,
        &control,
        "app.kubernetes.io/name=meshplane-xds,meshplane.io/revision=blue-v1",
    )
    .await;
    let instance = SocketAddr::new(instance_ip, names::ports::HTTPS_WEBHOOK);
    let instance_host = format!("meshplane-blue-v1.{control}.svc");
    let instance_ca = serving_ca(&cluster, &control, "meshplane-blue-v1-webhook-tls").await;
    let forged = post(&instance_host, "/validate", &forged_review());
    let anonymous = post_from_node(&node, instance, &instance_host, &instance_ca, None, &forged)
        .await
        .expect("the handshake succeeds without a certificate");
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    assert!(!anonymous.contains(MEMBERSHIP), "{anonymous}");
    assert!(!anonymous.contains("AdmissionReview"), "{anonymous}");
    let inject = post(&instance_host, "/inject", &forged_review());
    let anonymous = post_from_node(&node, instance, &instance_host, &instance_ca, None, &inject)
        .await
        .expect("the handshake succeeds without a certificate");
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    // A certificate with the right name from another CA.
    let (_, elsewhere) = ca();
    let rogue = client_cert(&elsewhere, APISERVER);
    let forged_with_rogue = post_from_node(
        &node,
        instance,
        &instance_host,
        &instance_ca,
        Some(&rogue),
        &forged,
    )
    .await;
    assert!(
        forged_with_rogue
            .as_ref()
            .map_or(true, |r| !r.contains(MEMBERSHIP)
                && !r.contains("AdmissionReview")),
        "{forged_with_rogue:?}"
    );
    // The kubelet's probe needs no certificate.
    let healthz =
        format!("GET /healthz HTTP/1.1\r\nHost: {instance_host}\r\nConnection: close\r\n\r\n");
    let health = post_from_node(
        &node,
        instance,
        &instance_host,
        &instance_ca,
        None,
        &healthz,
    )
    .await
    .expect("healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    // Each refusal is counted.
    let metrics = node
        .http_get(
            SocketAddr::new(instance_ip, names::ports::HTTP_MONITORING),
            &instance_host,
            "/metrics",
        )
        .await
        .expect("instance metrics");
    let refused_without_certificate = metrics
        .body
        .lines()
        .find(|l| {
            l.starts_with("meshplane_xds_webhook_refusals_total{")
                && l.contains("reason=\"no_certificate\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        refused_without_certificate.is_some_and(|n| n >= 2.0),
        "{refused_without_certificate:?}"
    );
    // The API server's certificate is what makes the difference.
    let answered = post_from_node(
        &node,
        instance,
        &instance_host,
        &instance_ca,
        Some(&apiserver),
        &forged,
    )
    .await
    .expect("answered");
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(answered.contains(MEMBERSHIP), "{answered}");

    // The operator's own check: the same.
    let operator_ip = pod_address_any(
        &cluster,
        OPERATOR_NS,
        "app.kubernetes.io/name=meshplane-operator",
    )
    .await;
    let operator = SocketAddr::new(operator_ip, 9443);
    let operator_host = format!("meshplane-operator.{OPERATOR_NS}.svc");
    let operator_ca = serving_ca(&cluster, OPERATOR_NS, "meshplane-operator-webhook-tls").await;
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged-2", "operation": "CREATE", "name": "probe",
            "kind": {"group": "meshplane.io", "version": "v1alpha1", "kind": "MeshControlPlane"},
            "resource": {"group": "meshplane.io", "version": "v1alpha1", "resource": "meshcontrolplanes"},
            "userInfo": {"username": "nobody"},
            "object": {"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
                "metadata": {"name": "probe"},
                "spec": {"tenant": "probe", "meshConfig": {"trustDomain": "green.meshplane.local"}}}
        }
    })
    .to_string();
    let forged = post(&operator_host, "/validate-meshplane", &review);
    let anonymous = post_from_node(&node, operator, &operator_host, &operator_ca, None, &forged)
        .await
        .expect("the handshake succeeds without a certificate");
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    assert!(!anonymous.contains("AdmissionReview"), "{anonymous}");
    let answered = post_from_node(
        &node,
        operator,
        &operator_host,
        &operator_ca,
        Some(&apiserver),
        &forged,
    )
    .await
    .expect("answered");
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(answered.contains("AdmissionReview"), "{answered}");

    eprintln!("scenario took {:?}", started.elapsed());
}

/// The address of a ready pod matching `selector` in `namespace` (there may be several).
async fn pod_address_any(cluster: &Cluster, namespace: &str, selector: &str) -> IpAddr {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .expect("pods")
        .items;
    let ready = list.iter().find(|p| pod_is_ready(p)).expect("a ready pod");
    meshplane_e2e::harness::pod_ip(ready)
        .expect("a pod IP")
        .into()
}
