//! Identity, RBAC, tokens, CRD schema and admission of the API stand-in, through a real kube
//! client over HTTP, as the operator and xds-server will see them.

use std::convert::Infallible;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use meshplane_kube_standin::{Identity, StandIn, StandInHandle, StandInOptions};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

async fn standin() -> StandInHandle {
    StandIn::start(StandInOptions::default()).await.unwrap()
}

/// Creates (as admin) every object in `objects`, by their apiVersion and kind.
async fn apply_all(handle: &StandInHandle, objects: Vec<Value>) {
    let client = handle.client(&Identity::Admin).await.unwrap();
    for object in objects {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        let types = object.types.clone().unwrap();
        let gvk = GroupVersionKind::try_from(&types).unwrap();
        let plural = format!("{}s", gvk.kind.to_lowercase());
        let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
        let api: Api<DynamicObject> = match &object.metadata.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        api.create(&PostParams::default(), &object).await.unwrap();
    }
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn tenant_namespaces() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "meshplane-blue"}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "blue", "labels": {"meshplane.io/rev": "blue"}}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "green", "labels": {"meshplane.io/rev": "green"}}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "xds", "namespace": "meshplane-blue"}}),
    ]
}

#[tokio::test]
async fn strict_isolation_is_enforced_as_403_for_the_instance_identity() {
    let handle = standin().await;
    let mut objects = tenant_namespaces();
    objects.extend([
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "xds-read", "namespace": "blue"},
            "rules": [{"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "xds-read", "namespace": "blue"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "xds-read"},
            "subjects": [{"kind": "ServiceAccount", "name": "xds", "namespace": "meshplane-blue"}]}),
    ]);
    apply_all(&handle, objects).await;

    let instance = Identity::ServiceAccount {
        namespace: "meshplane-blue".into(),
        name: "xds".into(),
    };
    let client = handle.client(&instance).await.unwrap();
    let blue_pods: Api<Pod> = Api::namespaced(client.clone(), "blue");
    assert!(blue_pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());

    let green_pods: Api<Pod> = Api::namespaced(client.clone(), "green");
    let (code, message) = api_error(green_pods.list(&ListParams::default()).await);
    assert_eq!(code, 403);
    assert!(
        message.contains(r#"User "system:serviceaccount:meshplane-blue:xds" cannot list resource "pods" in API group "" in the namespace "green""#),
        "{message}"
    );
    let (code, _) = api_error(
        Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403);
    // Read-only: no writes even in its own namespace.
    let blue_config: Api<ConfigMap> = Api::namespaced(client, "blue");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    assert_eq!(
        api_error(blue_config.create(&PostParams::default(), &cm).await).0,
        403
    );
}

#[tokio::test]
async fn unknown_tokens_get_401() {
    let handle = standin().await;
    let response = status_of_get(&handle, "/api/v1/namespaces", Some("Bearer not-a-token")).await;
    assert_eq!(response, 401);
    assert_eq!(
        status_of_get(&handle, "/api/v1/namespaces", None).await,
        401
    );
    let admin = format!("Bearer {}", handle.token(&Identity::Admin));
    assert_eq!(
        status_of_get(&handle, "/api/v1/namespaces", Some(&admin)).await,
        200
    );
}

/// Status code of a plain HTTP GET against the stand-in.
async fn status_of_get(handle: &StandInHandle, path: &str, authorization: Option<&str>) -> u16 {
    let stream = tokio::net::TcpStream::connect(handle.addr()).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request =
        http::Request::get(path).header(http::header::HOST, handle.addr().to_string());
    if let Some(value) = authorization {
        request = request.header(http::header::AUTHORIZATION, value);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    response.status().as_u16()
}

#[tokio::test]
async fn token_request_and_review_check_audiences() {
    let handle = standin().await;
    apply_all(&handle, tenant_namespaces()).await;
    let admin = handle.client(&Identity::Admin).await.unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "meshplane-blue");
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": ["meshplane-blue"], "expirationSeconds": 600}}))
    .unwrap();
    let issued = accounts
        .create_token_request("xds", &PostParams::default(), &request)
        .await
        .unwrap();
    let token = issued.status.unwrap().token;

    let reviews: Api<TokenReview> = Api::all(admin);
    let review = |audience: &str| -> TokenReview {
        serde_json::from_value(json!({"spec": {"token": token, "audiences": [audience]}})).unwrap()
    };
    let accepted = reviews
        .create(&PostParams::default(), &review("meshplane-blue"))
        .await
        .unwrap();
    let status = accepted.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(
        status.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:meshplane-blue:xds")
    );

    let refused = reviews
        .create(&PostParams::default(), &review("meshplane-green"))
        .await
        .unwrap();
    let status = refused.status.unwrap();
    assert_eq!(status.authenticated, Some(false));
    assert!(status
        .error
        .unwrap()
        .contains("invalid for the target audiences"));

    // The instance itself may not review tokens without system:auth-delegator.
    let instance = Identity::ServiceAccount {
        namespace: "meshplane-blue".into(),
        name: "xds".into(),
    };
    let as_instance: Api<TokenReview> = Api::all(handle.client(&instance).await.unwrap());
    assert_eq!(
        api_error(
            as_instance
                .create(&PostParams::default(), &review("meshplane-blue"))
                .await
        )
        .0,
        403
    );
}

#[tokio::test]
async fn crd_schema_and_cel_rules_apply_on_the_api() {
    let handle = standin().await;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../config/crd/meshplane.io_meshcontrolplanes.yaml"
    );
    let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    apply_all(&handle, vec![crd]).await;

    let client = handle.client(&Identity::Admin).await.unwrap();
    let gvk = GroupVersionKind::gvk("meshplane.io", "v1alpha1", "MeshControlPlane");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "meshcontrolplanes");
    let planes: Api<DynamicObject> = Api::all_with(client, &resource);
    let params = PatchParams::apply("standin-auth-test");
    let plane = |name: &str, tenant: &str| {
        json!({"apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": name}, "spec": {"tenant": tenant}})
    };
    let created = planes
        .patch("blue-v1", &params, &Patch::Apply(plane("blue-v1", "blue")))
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["isolation"], "Strict");

    let (code, message) = api_error(
        planes
            .patch("blue-v1", &params, &Patch::Apply(plane("blue-v1", "green")))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains(r#"spec.tenant: Invalid value: "string": spec.tenant is immutable"#),
        "{message}"
    );

    let long = "a".repeat(33);
    let (code, message) = api_error(
        planes
            .patch(&long, &params, &Patch::Apply(plane(&long, "blue")))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("metadata.name must be a DNS-1035 label of at most 32 characters"),
        "{message}"
    );
}

/// A local HTTPS webhook with a certificate for `server_name`: `/validate` denies everything,
/// `/mutate` adds the label `injected=true`.
async fn webhook_server(server_name: &str) -> (u16, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![server_name.to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let chain = CertificateDer::pem_slice_iter(cert.pem().as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(
                    |request: http::Request<hyper::body::Incoming>| async move {
                        let path = request.uri().path().to_string();
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap();
                        let uid = review["request"]["uid"].clone();
                        let response = if path == "/mutate" {
                            let patch = json!([{"op": "add", "path": "/metadata/labels", "value": {"injected": "true"}}]);
                            let patch =
                                base64::engine::general_purpose::STANDARD.encode(patch.to_string());
                            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch})
                        } else {
                            json!({"uid": uid, "allowed": false,
                            "status": {"code": 403, "message": "green is not a member of tenant blue"}})
                        };
                        let answer = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(
                            answer.to_string(),
                        ))))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, ca.pem())
}

#[tokio::test]
async fn validating_webhook_denies_only_in_selected_namespaces() {
    let handle = standin().await;
    apply_all(&handle, tenant_namespaces()).await;
    let (port, ca_pem) = webhook_server("127.0.0.1").await;
    apply_all(&handle, vec![json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "deny-green"},
        "webhooks": [{
            "name": "deny.meshplane.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem)},
            "namespaceSelector": {"matchLabels": {"meshplane.io/rev": "green"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
        }],
    })])
    .await;

    let admin = handle.client(&Identity::Admin).await.unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "boot"}})).unwrap();
    let blue: Api<ConfigMap> = Api::namespaced(admin.clone(), "blue");
    blue.create(&PostParams::default(), &cm).await.unwrap();
    let green: Api<ConfigMap> = Api::namespaced(admin, "green");
    let (code, message) = api_error(green.create(&PostParams::default(), &cm).await);
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"admission webhook "deny.meshplane.io" denied the request: green is not a member of tenant blue"#
    );
}

#[tokio::test]
async fn mutating_webhook_is_reached_through_its_service_endpoints() {
    let handle = standin().await;
    let (port, ca_pem) = webhook_server("injector.meshplane-blue.svc").await;
    let mut objects = tenant_namespaces();
    objects.extend([
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "injector", "namespace": "meshplane-blue"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": "https"}]}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "injector-x1", "namespace": "meshplane-blue",
                "labels": {"kubernetes.io/service-name": "injector"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "inject-blue"},
            "webhooks": [{
                "name": "blue.inject.meshplane.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 5,
                "clientConfig": {"service": {"name": "injector", "namespace": "meshplane-blue", "path": "/mutate", "port": 443},
                    "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca_pem)},
                "namespaceSelector": {"matchExpressions": [{"key": "meshplane.io/rev", "operator": "In", "values": ["blue"]}]},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "scope": "Namespaced"}],
            }]}),
    ]);
    apply_all(&handle, objects).await;

    let admin = handle.client(&Identity::Admin).await.unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "app"}})).unwrap();
    let blue: Api<ConfigMap> = Api::namespaced(admin.clone(), "blue");
    let created = blue.create(&PostParams::default(), &cm).await.unwrap();
    assert_eq!(
        created
            .metadata
            .labels
            .unwrap()
            .get("injected")
            .map(String::as_str),
        Some("true")
    );
    // Stored as patched, not just returned so.
    assert!(blue.get("app").await.unwrap().metadata.labels.is_some());
    // Outside the selector the webhook is not called.
    let green: Api<ConfigMap> = Api::namespaced(admin, "green");
    assert!(green
        .create(&PostParams::default(), &cm)
        .await
        .unwrap()
        .metadata
        .labels
        .is_none());
}
