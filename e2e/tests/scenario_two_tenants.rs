//! Two tenants from `config/samples`: each instance becomes Ready; blue's proxies get blue's
//! services and none of green's (and vice versa); in each tenant a client reaches its own
//! tenant's app by Service name, transparently captured by both sidecars. Each tenant has its
//! own CA (contract 11): its root is the trust bundle of its bootstrap ConfigMaps only, and every
//! injected proxy got its workload certificate from its own tenant's instance, and calls between
//! two sidecars of a tenant are mutual TLS carrying the client's SPIFFE ID. Workload
//! certificates of 10 seconds (`sidecar.meshplane.io/certTTL`) rotate under steady load with no
//! failed request. Around the install, `meshctl precheck` passes on the fresh cluster and finds a
//! planted Istio injector that would inject meshplane's namespaces; `meshctl verify-install`
//! passes after the install and fails while the operator is scaled to zero.

use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::PostParams;
use kube::Api;
use meshplane_e2e::harness::{app_and_client, kubectl_path, pod_ip, wait_for, Cluster, WEB_PORT};
use meshplane_pod_runner::{default_bin_dir, locate_binary, workspace_root};

const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_are_ready_isolated_and_route_their_own_traffic() {
    let started = Instant::now();
    let cluster = Cluster::start("two-tenants").await.expect("a cluster");
    precheck_passes_and_finds_a_conflicting_istio_injector(&cluster);
    cluster
        .install_two_tenants(DEADLINE)
        .await
        .expect("two tenants Ready");

    for namespace in ["shop", "garden"] {
        cluster
            .apply_manifest(&app_and_client(namespace))
            .expect("workloads");
    }
    cluster
        .apply_manifest(PLAIN_CALLER)
        .expect("a pod without a sidecar in shop");
    cluster
        .apply_manifest(SHORT_LIVED)
        .expect("two pods with 10-second certificates in shop");
    let mut clients = Vec::new();
    let mut sidecars = Vec::new();
    for namespace in ["shop", "garden"] {
        let web = cluster
            .wait_for_ready_pods(namespace, "app=web", 1, DEADLINE)
            .await
            .expect("web");
        let client = cluster
            .wait_for_ready_pods(namespace, "app=client", 1, DEADLINE)
            .await
            .expect("client");
        let containers: Vec<String> = client[0]
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        assert!(
            containers.len() >= 2,
            "the client in {namespace} is injected: {containers:?}"
        );
        let client_name = client[0].metadata.name.clone().unwrap_or_default();
        let web_name = web[0].metadata.name.clone().unwrap_or_default();
        clients.push((namespace, client_name.clone(), web_name.clone()));
        sidecars.push((namespace, web_name));
        sidecars.push((namespace, client_name));
    }

    // Each tenant's root (Secret meshplane-ca in its control namespace) is the trust bundle of
    // its bootstrap ConfigMap in its member namespace; the two tenants' roots differ.
    let mut roots = Vec::new();
    for (namespace, control, revision) in [
        ("shop", "meshplane-blue", "blue-v1"),
        ("garden", "meshplane-green", "green"),
    ] {
        let secret = Api::<Secret>::namespaced(cluster.client(), control)
            .get("meshplane-ca")
            .await
            .expect("the tenant CA Secret");
        let root = secret
            .data
            .as_ref()
            .and_then(|d| d.get("root-cert.pem"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .expect("root-cert.pem in meshplane-ca");
        assert!(
            root.contains("-----BEGIN CERTIFICATE-----"),
            "{control}'s root is a certificate: {root}"
        );
        let bootstrap = Api::<ConfigMap>::namespaced(cluster.client(), namespace)
            .get(&format!("meshplane-{revision}-bootstrap"))
            .await
            .expect("the bootstrap ConfigMap");
        assert_eq!(
            bootstrap.data.as_ref().and_then(|d| d.get("root-cert.pem")),
            Some(&root),
            "the bootstrap ConfigMap in {namespace} carries {control}'s root"
        );
        roots.push(root);
    }
    assert_ne!(roots[0], roots[1], "every tenant has its own root");

    the_operator_holds_secret_and_deployment_rights_only_in_control_namespaces(&cluster).await;
    a_deleted_webhook_secret_is_recreated(&cluster).await;
    verify_install_passes_and_fails_while_the_operator_is_scaled_to_zero(&cluster).await;

    if cluster.network().is_none() {
        eprintln!(
            "the config and traffic checks reach pods through the local test network; E2E_KUBECONFIG is set"
        );
        return;
    }

    // Each tenant's proxy knows its own services and none of the other tenant's.
    for (namespace, client, _) in &clients {
        let other = if *namespace == "shop" {
            "garden"
        } else {
            "shop"
        };
        let in_client = cluster.in_pod(namespace, client).expect("client pod");
        let what =
            format!("{namespace}'s client Envoy to have web.{namespace} and nothing of {other}");
        let dump = wait_for(&what, DEADLINE, || async {
            let dump = in_client
                .envoy_admin("/config_dump")
                .await
                .map_err(|e| e.to_string())?;
            if dump.contains(&format!("web.{namespace}.svc.cluster.local")) {
                Ok(Some(dump))
            } else {
                Err("web not in config_dump yet".to_string())
            }
        })
        .await
        .expect("config_dump");
        assert!(
            !dump.contains(&format!(".{other}.svc")),
            "{namespace}'s proxy must not see {other}'s services"
        );
    }

    // Traffic in each tenant: the client calls its Service by name; capture takes it through
    // both sidecars to the tenant's own web.
    for (namespace, client, web) in &clients {
        let in_client = cluster.in_pod(namespace, client).expect("client pod");
        let url = format!("http://web.{namespace}.svc.cluster.local:{WEB_PORT}/");
        let reply = wait_for(
            &format!("a reply from web.{namespace} through the sidecars"),
            DEADLINE,
            || async {
                let reply = in_client.http_get(&url).await.map_err(|e| e.to_string())?;
                (reply.status == 200)
                    .then_some(reply.clone())
                    .map(Some)
                    .ok_or(format!("{reply:?}"))
            },
        )
        .await
        .expect("traffic through the sidecars");
        let body: serde_json::Value = serde_json::from_str(&reply.body).expect("echo JSON");
        assert_eq!(body["namespace"], *namespace);
        assert_eq!(body["pod"].as_str(), Some(web.as_str()));
        assert!(
            body["headers"]["x-request-id"].is_string(),
            "the client's sidecar handled the request: {body}"
        );
        // Both pods have a sidecar of the tenant: the call went over mutual TLS (PERMISSIVE by
        // default), and the server's sidecar forwarded the client's SPIFFE ID of its own
        // tenant's trust domain.
        let trust_domain = if *namespace == "shop" {
            "blue.mesh.local"
        } else {
            "green.mesh.local"
        };
        let xfcc = body["headers"]["x-forwarded-client-cert"]
            .as_str()
            .unwrap_or_default();
        assert!(
            xfcc.contains(&format!("URI=spiffe://{trust_domain}/ns/{namespace}/sa/")),
            "web in {namespace} sees the client's identity in x-forwarded-client-cert: {body}"
        );
    }

    // Every sidecar accepted every update it got.
    for (namespace, pod) in sidecars {
        let stats = cluster
            .in_pod(namespace, &pod)
            .expect("pod")
            .envoy_stats()
            .await
            .expect("Envoy stats");
        let rejected: Vec<(&String, &u64)> = stats
            .0
            .iter()
            .filter(|(name, value)| name.contains("update_rejected") && **value != 0)
            .collect();
        assert!(
            !stats.0.is_empty() && rejected.is_empty(),
            "the sidecar of {namespace}/{pod} rejected config: {rejected:?}"
        );
    }
    // Every injected proxy got its certificate from its own tenant's instance: each instance
    // issued one per pod of its tenant (web and client), and its agents reached ADS over TLS
    // verified against their own tenant's root (the traffic above).
    for (control, revision) in [("meshplane-blue", "blue-v1"), ("meshplane-green", "green")] {
        let instance = cluster
            .wait_for_ready_pods(
                control,
                &format!("app.kubernetes.io/name=meshplane-xds,meshplane.io/revision={revision}"),
                1,
                DEADLINE,
            )
            .await
            .expect("instance pod");
        let name = instance[0].metadata.name.clone().unwrap_or_default();
        let in_instance = cluster.in_pod(control, &name).expect("instance pod");
        let metrics = in_instance
            .http_get("http://127.0.0.1:15014/metrics")
            .await
            .expect("instance metrics");
        let issued = format!(
            r#"meshplane_xds_certificate_requests_total{{tenant="{}",revision="{revision}",result="issued"}}"#,
            control.trim_start_matches("meshplane-")
        );
        let count: u64 = metrics
            .body
            .lines()
            .find_map(|l| l.strip_prefix(&issued))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_default();
        assert!(
            count >= 2,
            "{revision} issued a certificate to each of its 2 pods: {count}"
        );
    }
    let identity_started = Instant::now();
    strict_mutual_tls_refuses_plaintext_and_other_tenants(&cluster, &clients).await;
    ads_port_refuses_plaintext_and_other_roots(&cluster, &roots).await;
    let identity_took = identity_started.elapsed();
    let rotation_started = Instant::now();
    certificates_rotate_under_load_without_failed_requests(&cluster).await;
    eprintln!(
        "scenario two-tenants took {:?} (STRICT and cross-tenant checks {identity_took:?}, rotation under load {:?})",
        started.elapsed(),
        rotation_started.elapsed()
    );
}

/// Whether the operator's ServiceAccount may `verb` `resource` (in `namespace`, else
/// cluster-wide), as the stand-in's RBAC decides (SubjectAccessReview).
async fn operator_may(
    cluster: &Cluster,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
) -> bool {
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "system:serviceaccount:meshplane-system:meshplane-operator",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:meshplane-system",
                       "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                   "namespace": namespace.unwrap_or_default()},
        },
    }))
    .expect("a SubjectAccessReview");
    Api::<SubjectAccessReview>::all(cluster.client())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview answered")
        .status
        .is_some_and(|s| s.allowed)
}

/// The operator (which ran everything above as its ServiceAccount, with
/// `config/rbac` applied and the stand-in enforcing RBAC) holds no cluster-wide right on
/// Secrets, Deployments, ServiceAccounts, PDBs or NetworkPolicies; it holds them in each control
/// namespace, through the RoleBinding it gave itself there.
async fn the_operator_holds_secret_and_deployment_rights_only_in_control_namespaces(
    cluster: &Cluster,
) {
    let operator_pods = cluster
        .wait_for_ready_pods(
            "meshplane-system",
            "app.kubernetes.io/name=meshplane-operator",
            2,
            DEADLINE,
        )
        .await
        .expect("the operator's pod");
    for pod in &operator_pods {
        assert_eq!(
            pod.spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref()),
            Some("meshplane-operator"),
            "the operator runs as its ServiceAccount"
        );
    }
    for (verb, group, resource) in [
        ("get", "", "secrets"),
        ("list", "", "secrets"),
        ("watch", "", "secrets"),
        ("list", "apps", "deployments"),
        ("patch", "apps", "deployments"),
        ("create", "apps", "deployments"),
        ("delete", "apps", "deployments"),
        ("create", "", "serviceaccounts"),
        ("delete", "policy", "poddisruptionbudgets"),
        ("patch", "networking.k8s.io", "networkpolicies"),
        ("patch", "", "services"),
    ] {
        for namespace in [None, Some("kube-system"), Some("garden")] {
            // In a member namespace the operator may read and restart (patch) Deployments:
            // meshplane-workload-restarter, bound there as the namespace joined (migrations).
            let restarts = namespace == Some("garden")
                && resource == "deployments"
                && ["list", "patch"].contains(&verb);
            assert_eq!(
                operator_may(cluster, verb, group, resource, namespace).await,
                restarts,
                "the operator's right to {verb} {resource} in {namespace:?}"
            );
        }
    }
    for control in ["meshplane-blue", "meshplane-green"] {
        for (verb, group, resource) in [
            ("get", "", "secrets"),
            ("watch", "", "secrets"),
            ("patch", "apps", "deployments"),
            ("delete", "networking.k8s.io", "networkpolicies"),
        ] {
            assert!(
                operator_may(cluster, verb, group, resource, Some(control)).await,
                "the operator may {verb} {resource} in {control}"
            );
        }
    }
}

/// The operator watches its Secrets only in control namespaces, and still re-creates a deleted
/// one at once (not at the next 5-minute resync).
async fn a_deleted_webhook_secret_is_recreated(cluster: &Cluster) {
    let secrets = Api::<Secret>::namespaced(cluster.client(), "meshplane-blue");
    let name = "meshplane-blue-v1-webhook-tls";
    let before = secrets
        .get(name)
        .await
        .expect("blue-v1's webhook TLS Secret")
        .metadata
        .uid;
    secrets
        .delete(name, &Default::default())
        .await
        .expect("deleted");
    wait_for(
        "the webhook TLS Secret re-created",
        Duration::from_secs(30),
        || async {
            match secrets.get_opt(name).await {
                Ok(Some(s)) if s.metadata.uid != before => Ok(Some(())),
                Ok(_) => Err("not yet".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .expect("the Secret came back");
}

/// What a `meshctl` run printed, and its exit code.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The JSON it printed (`-o json`).
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}{}", self.stdout, self.stderr))
    }
}

/// `meshctl <args>` as a user runs it: the binary, the admin kubeconfig, kubectl for `-k`.
fn meshctl(cluster: &Cluster, args: &[&str]) -> Run {
    let binary = locate_binary(&default_bin_dir(), "meshctl").expect("meshctl is built");
    let out = std::process::Command::new(binary)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(args)
        .env("KUBECTL", kubectl_path().expect("kubectl"))
        .env("RUST_LOG", "error")
        .current_dir(workspace_root())
        .output()
        .expect("meshctl runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The codes of a precheck report.
fn precheck_codes(report: &serde_json::Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["code"].as_str().map(str::to_string))
        .collect()
}

/// An Istio injector that injects every namespace not opted out (`enableNamespacesByDefault`),
/// hence every namespace that joins meshplane. It calls no one (failurePolicy Ignore).
const ISTIO_INJECTOR_EVERYWHERE: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: istio-sidecar-injector
webhooks:
  - name: sidecar-injector.istio.io
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: Ignore
    clientConfig:
      service: {name: istiod, namespace: istio-system, path: /inject, port: 443}
    namespaceSelector:
      matchExpressions:
        - {key: istio-injection, operator: NotIn, values: [disabled]}
    rules:
      - operations: [CREATE]
        apiGroups: [""]
        apiVersions: [v1]
        resources: [pods]
"#;

/// Before the install: `meshctl precheck` passes on the fresh cluster (supported version, no
/// meshplane CRDs, no other mesh, every permission the install needs), fails with MP0821 on an
/// Istio injector that would inject meshplane's namespaces, and passes again once it is gone.
fn precheck_passes_and_finds_a_conflicting_istio_injector(cluster: &Cluster) {
    let fresh = meshctl(cluster, &["precheck", "-o", "json"]);
    assert_eq!(fresh.code, Some(0), "{}{}", fresh.stdout, fresh.stderr);
    let report = fresh.json();
    assert!(precheck_codes(&report).is_empty(), "{report}");
    let checked = report["checked"].to_string();
    assert!(
        checked.contains("none installed (a fresh install)")
            && checked.contains("you may create every kind of object the install creates"),
        "{checked}"
    );

    cluster
        .apply_manifest(ISTIO_INJECTOR_EVERYWHERE)
        .expect("Istio's injector");
    let conflict = meshctl(cluster, &["precheck"]);
    assert_eq!(
        conflict.code,
        Some(3),
        "{}{}",
        conflict.stdout,
        conflict.stderr
    );
    assert!(
        conflict.stdout.contains("MP0821")
            && conflict
                .stdout
                .contains("MutatingWebhookConfiguration istio-sidecar-injector")
            && conflict
                .stdout
                .contains("1 error(s): fix them before installing meshplane"),
        "{}",
        conflict.stdout
    );
    cluster
        .kubectl(&[
            "delete",
            "mutatingwebhookconfiguration",
            "istio-sidecar-injector",
        ])
        .expect("Istio's injector removed");
    let clean = meshctl(cluster, &["precheck"]);
    assert_eq!(clean.code, Some(0), "{}{}", clean.stdout, clean.stderr);
}

/// The failed checks of a verify-install report, as `check: reason`.
fn failed_checks(report: &serde_json::Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["status"] == "Failed")
        .map(|c| format!("{}: {}", c["check"], c["reason"]))
        .collect()
}

/// After the install: `meshctl verify-install -k config/default` passes every check (CRDs, the
/// operator and its webhook answering a dry run, both control planes with their instances and
/// webhooks, every object of config/default); with the operator's Deployment scaled to 0 it
/// fails on it and exits 3; scaled back, it passes again. A canary precheck (`--revision`)
/// passes for a new name and refuses a taken one.
async fn verify_install_passes_and_fails_while_the_operator_is_scaled_to_zero(cluster: &Cluster) {
    let healthy = meshctl(
        cluster,
        &["verify-install", "-k", "config/default", "-o", "json"],
    );
    let report = healthy.json();
    assert_eq!(healthy.code, Some(0), "{report}");
    assert!(failed_checks(&report).is_empty(), "{report}");
    let checks = report["checks"].to_string();
    for expected in [
        "MeshControlPlane blue-v1",
        "Deployment meshplane-green/meshplane-green",
        "MutatingWebhookConfiguration meshplane-blue-v1-injector",
        "revision green's validating webhook answers the API server",
        "the operator's admission webhook answers the API server",
        "ValidatingAdmissionPolicy meshplane-operator-guardrails",
    ] {
        assert!(checks.contains(expected), "{expected} in {checks}");
    }

    let upgrade = meshctl(
        cluster,
        &["precheck", "--revision", "blue-v2", "-o", "json"],
    );
    assert_eq!(
        upgrade.code,
        Some(0),
        "{}{}",
        upgrade.stdout,
        upgrade.stderr
    );
    assert!(
        upgrade.json()["checked"]
            .to_string()
            .contains("at versions this release serves"),
        "{}",
        upgrade.stdout
    );
    let taken = meshctl(
        cluster,
        &["precheck", "--revision", "blue-v1", "-o", "json"],
    );
    assert_eq!(taken.code, Some(3), "{}{}", taken.stdout, taken.stderr);
    assert_eq!(precheck_codes(&taken.json()), ["MP0832"]);

    let scale = |replicas: u32| {
        cluster
            .kubectl(&[
                "patch",
                "deployment",
                "meshplane-operator",
                "-n",
                "meshplane-system",
                "--type=merge",
                "-p",
                &format!(r#"{{"spec":{{"replicas":{replicas}}}}}"#),
            ])
            .expect("the operator scaled")
    };
    scale(0);
    let broken = meshctl(cluster, &["verify-install", "-o", "json"]);
    assert_eq!(broken.code, Some(3), "{}{}", broken.stdout, broken.stderr);
    let failed = failed_checks(&broken.json());
    assert!(
        failed.iter().any(|f| f.starts_with(
            "\"Deployment meshplane-system/meshplane-operator\": \"scaled to 0 replicas"
        )),
        "{failed:?}"
    );
    let table = meshctl(cluster, &["verify-install"]);
    assert!(
        table.stdout.contains("FAILED") && table.stdout.contains("meshplane is not healthy"),
        "{}",
        table.stdout
    );

    scale(2);
    cluster
        .wait_for_deployment_available("meshplane-system", "meshplane-operator", DEADLINE)
        .await
        .expect("the operator back");
    cluster
        .wait_for_operator_admission(DEADLINE)
        .await
        .expect("its webhook back");
    let healthy_again = meshctl(cluster, &["verify-install", "-o", "json"]);
    assert_eq!(
        healthy_again.code,
        Some(0),
        "{:?}",
        failed_checks(&healthy_again.json())
    );
}

/// A caller without a sidecar in shop: its plaintext reaches web's sidecar directly.
const PLAIN_CALLER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: plain
  namespace: shop
  labels: {app: plain, sidecar.meshplane.io/inject: "false"}
spec:
  containers:
    - name: app
      image: example.com/echo:1
      ports: [{name: http, containerPort: 9080}]
"#;

/// A server (`ledger`, behind a Service) and a client in shop whose node agents ask for
/// 10-second certificates, so that they rotate every ~5 seconds. The client's sidecar opens a
/// new connection, and so a new mutual TLS handshake, for every request
/// (`maxRequestsPerConnection: 1`): a pooled connection would hide a certificate that expired.
const SHORT_LIVED: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: ledger, namespace: shop}
spec:
  selector: {app: ledger}
  ports: [{name: http, port: 8080, targetPort: http}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ledger, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: ledger}}
  template:
    metadata:
      labels: {app: ledger}
      annotations: {sidecar.meshplane.io/certTTL: 10s}
    spec:
      containers:
        - name: ledger
          image: example.com/echo:1
          ports: [{name: http, containerPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata:
  name: ledger-client
  namespace: shop
  labels: {app: ledger-client}
  annotations: {sidecar.meshplane.io/certTTL: 10s}
spec:
  containers:
    - name: app
      image: example.com/echo:1
      ports: [{name: http, containerPort: 9080}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: DestinationRule
metadata: {name: ledger, namespace: shop}
spec:
  host: ledger
  trafficPolicy:
    connectionPool:
      http: {maxRequestsPerConnection: 1}
"#;

/// Requests of the load loop under rotation, and the pause between two of them: ~25 s of
/// steady load, four to six rotations of a 10-second certificate.
const ROTATION_REQUESTS: u32 = 200;
const ROTATION_PACE: Duration = Duration::from_millis(125);
/// The loop stops here even if requests are slow (a loaded machine).
const ROTATION_LIMIT: Duration = Duration::from_secs(60);
/// Envoy's count of accepted pushes of the workload certificate (SDS secret `default`).
const CERT_UPDATES: &str = "sds.default.update_success";
/// Mutual TLS handshakes completed on a sidecar's inbound listener.
const INBOUND_HANDSHAKES: &str = "listener.0.0.0.0_15006.ssl.handshake";
/// Of those, the handshakes that negotiated TLS 1.3 and TLS 1.2.
const INBOUND_TLS13: &str = "listener.0.0.0.0_15006.ssl.versions.TLSv1.3";
const INBOUND_TLS12: &str = "listener.0.0.0.0_15006.ssl.versions.TLSv1.2";

/// Serial numbers of the certificates a sidecar presents (`/certs`, its `cert_chain`s).
async fn presented_serials(pod: &meshplane_e2e::reach::InPod) -> Result<Vec<String>, String> {
    let certs = pod.envoy_admin("/certs").await.map_err(|e| e.to_string())?;
    let certs: serde_json::Value = serde_json::from_str(&certs).map_err(|e| e.to_string())?;
    let mut serials: Vec<String> = certs["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["cert_chain"].as_array().into_iter().flatten())
        .filter_map(|c| c["serial_number"].as_str().map(str::to_owned))
        .collect();
    serials.sort();
    serials.dedup();
    Ok(serials)
}

/// Certificate rotation under steady load, on the real pod network and real Envoys, under the
/// STRICT policy the previous check left in shop (so every request is mutual TLS):
/// `ROTATION_REQUESTS` requests from `ledger-client` to the `ledger` Service, each on its own
/// handshake, while both agents renew their 10-second certificates. Asserts no failed request,
/// at least two new certificates accepted by each Envoy during the loop, a presented serial
/// that changed, and the client's identity seen by the server throughout.
async fn certificates_rotate_under_load_without_failed_requests(cluster: &Cluster) {
    let server = cluster
        .wait_for_ready_pods("shop", "app=ledger", 1, DEADLINE)
        .await
        .expect("ledger");
    let server_name = server[0].metadata.name.clone().unwrap_or_default();
    cluster
        .wait_for_ready_pods("shop", "app=ledger-client", 1, DEADLINE)
        .await
        .expect("ledger-client");
    let server = cluster.in_pod("shop", &server_name).expect("ledger pod");
    let client = cluster.in_pod("shop", "ledger-client").expect("client pod");
    let url = "http://ledger.shop.svc.cluster.local:8080/";
    wait_for("a first reply from ledger", DEADLINE, || async {
        let reply = client.http_get(url).await.map_err(|e| e.to_string())?;
        (reply.status == 200)
            .then_some(Some(()))
            .ok_or(format!("{reply:?}"))
    })
    .await
    .expect("ledger answers through both sidecars");

    // The client accepts only the ServiceAccount behind ledger, not any identity of the tenant.
    let dump: serde_json::Value = serde_json::from_str(
        &client
            .envoy_admin("/config_dump?resource=dynamic_active_clusters")
            .await
            .expect("client's clusters"),
    )
    .expect("config_dump JSON");
    let accepted: Vec<String> = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["cluster"]["name"] == "outbound|8080||ledger.shop.svc.cluster.local")
        .flat_map(|c| {
            c["cluster"]["transport_socket_matches"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .flat_map(|m| {
            m["transport_socket"]["typed_config"]["common_tls_context"]
                ["combined_validation_context"]["default_validation_context"]
                ["match_typed_subject_alt_names"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .map(|m| m["matcher"].to_string())
        .collect();
    assert_eq!(
        accepted,
        [r#"{"exact":"spiffe://blue.mesh.local/ns/shop/sa/default"}"#],
        "ledger's client verifies the ServiceAccount of the pod behind the Service"
    );

    let (client_before, server_before) = (
        client.envoy_stats().await.expect("client stats"),
        server.envoy_stats().await.expect("server stats"),
    );
    let serials_before = presented_serials(&client).await.expect("client's /certs");
    let started = Instant::now();
    let mut pace = tokio::time::interval(ROTATION_PACE);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut sent, mut failed) = (0u32, Vec::new());
    while sent < ROTATION_REQUESTS && started.elapsed() < ROTATION_LIMIT {
        pace.tick().await;
        sent += 1;
        match client.http_get(url).await {
            Ok(reply)
                if reply.status == 200
                    && reply
                        .body
                        .contains("URI=spiffe://blue.mesh.local/ns/shop/sa/") => {}
            Ok(reply) => failed.push(format!("#{sent}: {} {}", reply.status, reply.body)),
            Err(e) => failed.push(format!("#{sent}: {e}")),
        }
    }
    let took = started.elapsed();
    let (client_after, server_after) = (
        client.envoy_stats().await.expect("client stats"),
        server.envoy_stats().await.expect("server stats"),
    );
    let serials_after = presented_serials(&client).await.expect("client's /certs");
    let rotations = |before: &meshplane_e2e::reach::EnvoyStats,
                     after: &meshplane_e2e::reach::EnvoyStats| {
        after
            .get(CERT_UPDATES)
            .saturating_sub(before.get(CERT_UPDATES))
    };
    let (client_rotations, server_rotations) = (
        rotations(&client_before, &client_after),
        rotations(&server_before, &server_after),
    );
    let handshakes = server_after
        .get(INBOUND_HANDSHAKES)
        .saturating_sub(server_before.get(INBOUND_HANDSHAKES));
    eprintln!(
        "rotation under load: {sent} requests in {took:?}, {} failed; certificates accepted during the loop: client {client_rotations}, server {server_rotations}; server handshakes {handshakes}",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "no request fails while certificates rotate: {} of {sent} failed, first {:?}",
        failed.len(),
        failed.iter().take(3).collect::<Vec<_>>()
    );
    assert!(
        sent >= ROTATION_REQUESTS / 2,
        "the loop ran long enough to count: {sent} requests in {took:?}"
    );
    assert!(
        client_rotations >= 2 && server_rotations >= 2,
        "both Envoys accepted at least two new certificates during {took:?} ({CERT_UPDATES}): client {client_rotations}, server {server_rotations}"
    );
    assert!(
        handshakes >= u64::from(sent),
        "every request was a new mutual TLS handshake, so the rotated certificates were used: {handshakes} handshakes for {sent} requests"
    );
    let (tls13, tls12) = (
        server_after
            .get(INBOUND_TLS13)
            .saturating_sub(server_before.get(INBOUND_TLS13)),
        server_after
            .get(INBOUND_TLS12)
            .saturating_sub(server_before.get(INBOUND_TLS12)),
    );
    assert!(
        tls13 >= u64::from(sent) && tls12 == 0,
        "sidecars negotiate TLS 1.3 with each other: {tls13} TLS 1.3 and {tls12} TLS 1.2 handshakes for {sent} requests"
    );
    assert!(
        !serials_before.is_empty() && serials_before != serials_after,
        "the client presents a new certificate: {serials_before:?} then {serials_after:?}"
    );
}

/// TLS handshakes that failed on a sidecar's inbound listener.
const INBOUND_TLS_ERRORS: &str = "listener.0.0.0.0_15006.ssl.connection_error";
/// Requests a sidecar handed to the app on web's port.
const INBOUND_REQUESTS: &str = "listener.0.0.0.0_15006.http.inbound|8080||.downstream_rq_completed";

/// The host under which green's ServiceEntry points at blue's web pod.
const STOLEN_HOST: &str = "blue-web.example.com";

/// `PeerAuthentication` STRICT in shop, on the real pod network:
/// - under the default PERMISSIVE, the pod without a sidecar reaches web in plaintext;
/// - under STRICT it is refused (web's sidecar has no chain for plaintext:
///   `no_filter_chain_match`), while shop's meshed client still reaches web over mutual TLS;
/// - green's client, pointed at blue's web pod by a ServiceEntry that claims it has a sidecar,
///   originates mutual TLS with green's certificate and fails the handshake: blue's server
///   certificate does not chain to green's root (`ssl.fail_verify_error`, and Envoy's 503 names
///   `CERTIFICATE_VERIFY_FAILED`), and blue's sidecar never hands it to the app. The entry is
///   admitted because green's MeshControlPlane does not name the cluster's pod networks yet: it
///   stands for what admission cannot see (an entry written before the setting, an address
///   that became another tenant's pod after admission), which mutual TLS still stops;
/// - once green's `meshConfig.podNetworks` is set, green's webhook refuses such an entry.
///   (scenario_bad_input covers the check itself.)
async fn strict_mutual_tls_refuses_plaintext_and_other_tenants(
    cluster: &Cluster,
    clients: &[(&str, String, String)],
) {
    let url = format!("http://web.shop.svc.cluster.local:{WEB_PORT}/");
    cluster
        .wait_for_ready_pods("shop", "app=plain", 1, DEADLINE)
        .await
        .expect("the plain pod");
    let plain = cluster.in_pod("shop", "plain").expect("plain pod");
    let reply = wait_for("plaintext to web under PERMISSIVE", DEADLINE, || async {
        let reply = plain.http_get(&url).await.map_err(|e| e.to_string())?;
        (reply.status == 200)
            .then_some(reply.clone())
            .map(Some)
            .ok_or(format!("{reply:?}"))
    })
    .await
    .expect("PERMISSIVE accepts plaintext");
    let body: serde_json::Value = serde_json::from_str(&reply.body).expect("echo JSON");
    assert!(
        body["headers"]["x-forwarded-client-cert"].is_null(),
        "a plaintext caller has no identity to forward: {body}"
    );

    let (_, blue_client, blue_web) = clients
        .iter()
        .find(|(ns, _, _)| *ns == "shop")
        .expect("shop's pods");
    let (_, green_client, _) = clients
        .iter()
        .find(|(ns, _, _)| *ns == "garden")
        .expect("garden's pods");
    let web = cluster.in_pod("shop", blue_web).expect("web pod");
    let web_ip = web.ip();
    cluster
        .apply_manifest(&format!(
            r#"
apiVersion: security.meshplane.io/v1alpha1
kind: PeerAuthentication
metadata: {{name: default, namespace: shop}}
spec:
  mtls: {{mode: STRICT}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: ServiceEntry
metadata: {{name: blue-web, namespace: garden}}
spec:
  hosts: [{STOLEN_HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {WEB_PORT}, name: http, protocol: HTTP}}]
  endpoints:
    - address: {web_ip}
      labels: {{security.meshplane.io/tlsMode: istio}}
"#
        ))
        .expect("STRICT in shop, and green's entry for blue's web");

    // STRICT: the plaintext caller is refused by web's sidecar, which has no chain for it.
    let refused = wait_for(
        "plaintext to web refused under STRICT",
        DEADLINE,
        || async {
            match plain.http_get(&url).await {
                Ok(reply) if reply.status == 200 => Err(format!("still served: {}", reply.status)),
                Ok(reply) => Ok(Some(format!("answered {}", reply.status))),
                Err(e) => Ok(Some(e.to_string())),
            }
        },
    )
    .await
    .expect("STRICT refuses plaintext");
    let web_stats = web.envoy_stats().await.expect("web's stats");
    let unmatched: u64 = web_stats
        .0
        .iter()
        .filter(|(name, _)| {
            name.starts_with("listener.") && name.ends_with(".no_filter_chain_match")
        })
        .map(|(_, v)| *v)
        .sum();
    assert!(
        unmatched >= 1,
        "web's sidecar refused the plaintext connection for want of a mutual TLS chain ({refused}): {:?}",
        web_stats.0.iter().filter(|(n, _)| n.contains("filter_chain")).collect::<Vec<_>>()
    );
    // The meshed client still gets through, with its identity.
    let in_client = cluster.in_pod("shop", blue_client).expect("client pod");
    let reply = in_client
        .http_get(&url)
        .await
        .expect("meshed call under STRICT");
    assert_eq!(
        reply.status, 200,
        "a meshed client passes STRICT: {reply:?}"
    );
    assert!(
        reply
            .body
            .contains("URI=spiffe://blue.mesh.local/ns/shop/sa/"),
        "web sees the meshed client's identity under STRICT: {}",
        reply.body
    );

    // Green's sidecar, told that blue's web is a meshed endpoint, cannot complete a handshake.
    let blue_before = web.envoy_stats().await.expect("web's stats");
    let green = cluster
        .in_pod("garden", green_client)
        .expect("green client");
    let cluster_stat = format!("cluster.outbound|{WEB_PORT}||{STOLEN_HOST}.ssl.fail_verify_error");
    let target = std::net::SocketAddr::from((web_ip, WEB_PORT));
    let reply = wait_for(
        "green's handshake with blue's STRICT web to fail verification",
        DEADLINE,
        || async {
            let reply = green
                .http_get_at(target, STOLEN_HOST, "/")
                .await
                .map_err(|e| e.to_string())?;
            let failed = green
                .envoy_stats()
                .await
                .map_err(|e| e.to_string())?
                .get(&cluster_stat);
            if failed >= 1 {
                Ok(Some(reply))
            } else {
                Err(format!("{cluster_stat} = 0 after {reply:?}"))
            }
        },
    )
    .await
    .expect("the cross-tenant handshake fails");
    assert_eq!(
        reply.status, 503,
        "green gets no answer from blue: {reply:?}"
    );
    assert!(
        reply.body.contains("upstream connect error"),
        "green's sidecar could not connect to blue: {}",
        reply.body
    );
    let green_stats = green.envoy_stats().await.expect("green's stats");
    let stat = |name: &str| {
        green_stats.get(&format!(
            "cluster.outbound|{WEB_PORT}||{STOLEN_HOST}.{name}"
        ))
    };
    assert!(
        stat("tlsMode-istio.total_match_count") >= 1
            && stat("upstream_cx_connect_fail") >= 1
            && stat("ssl.handshake") == 0,
        "green's sidecar originated mutual TLS and never completed a handshake: {:?}",
        green_stats
            .0
            .iter()
            .filter(|(n, v)| n.contains(STOLEN_HOST) && **v > 0)
            .collect::<Vec<_>>()
    );
    let blue_after = web.envoy_stats().await.expect("web's stats");
    assert!(
        blue_after.get(INBOUND_TLS_ERRORS) > blue_before.get(INBOUND_TLS_ERRORS),
        "blue's sidecar saw the failed handshakes ({INBOUND_TLS_ERRORS})"
    );
    assert_eq!(
        blue_after.get(INBOUND_REQUESTS),
        blue_before.get(INBOUND_REQUESTS),
        "no request of green's reached blue's app"
    );
    assert!(
        !reply.body.contains("\"pod\""),
        "blue's app never answered green: {}",
        reply.body
    );

    // With the cluster's pod networks named, green's webhook refuses the entry outright.
    let networks = cluster.pod_networks();
    if networks.is_empty() {
        eprintln!("the pod networks of this cluster are unknown: set E2E_POD_NETWORKS");
        return;
    }
    let patch = serde_json::json!({"spec": {"meshConfig": {"podNetworks": networks}}}).to_string();
    cluster
        .kubectl(&[
            "patch",
            "meshcontrolplane",
            "green",
            "--type",
            "merge",
            "-p",
            &patch,
        ])
        .expect("green's pod networks");
    let again = format!(
        "apiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata: {{name: blue-web-again, namespace: garden}}\nspec:\n  hosts: [again.{STOLEN_HOST}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: {WEB_PORT}, name: http, protocol: HTTP}}]\n  endpoints: [{{address: \"{web_ip}\"}}]\n"
    );
    let refused = wait_for(
        "green's webhook refusing blue's pod address",
        DEADLINE,
        || async {
            match cluster.apply_manifest_dry_run(&again) {
                Ok(out) => Err(format!("admitted: {out}")),
                Err(e) if e.to_string().contains("is in the cluster's pod network") => {
                    Ok(Some(e.to_string()))
                }
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .expect("the entry is refused at admission");
    assert!(
        refused.contains(&format!("{web_ip} is in the cluster's pod network")),
        "{refused}"
    );
}

/// The instances' ADS port 15012 speaks TLS only, under a certificate of the tenant's own root:
/// a client trusting green's root cannot verify blue's instance (and the reverse), a client
/// with the instance's own root can, and plaintext HTTP/2 gets no HTTP/2 answer.
async fn ads_port_refuses_plaintext_and_other_roots(cluster: &Cluster, roots: &[String]) {
    let dir = std::env::temp_dir().join(format!("meshplane-two-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the roots");
    let node = cluster.on_node().expect("the node");
    for (i, (control, revision, namespace)) in [
        ("meshplane-blue", "blue-v1", "shop"),
        ("meshplane-green", "green", "garden"),
    ]
    .into_iter()
    .enumerate()
    {
        let own = dir.join(format!("{revision}-own.pem"));
        let other = dir.join(format!("{revision}-other.pem"));
        std::fs::write(&own, &roots[i]).expect("own root");
        std::fs::write(&other, &roots[1 - i]).expect("other root");
        let bootstrap = Api::<ConfigMap>::namespaced(cluster.client(), namespace)
            .get(&format!("meshplane-{revision}-bootstrap"))
            .await
            .expect("the bootstrap ConfigMap");
        let envoy = bootstrap
            .data
            .as_ref()
            .and_then(|d| d.get("envoy.yaml"))
            .cloned()
            .unwrap_or_default();
        let server_name = server_name_of(&envoy).expect("the bootstrap names the instance (sni)");
        let instance = cluster
            .wait_for_ready_pods(
                control,
                &format!("app.kubernetes.io/name=meshplane-xds,meshplane.io/revision={revision}"),
                1,
                DEADLINE,
            )
            .await
            .expect("instance pod");
        let ip = pod_ip(&instance[0]).expect("the instance's address");
        let output = node
            .command("python3")
            .expect("python3 on the node")
            .args(["-c", ADS_PROBE, &ip.to_string(), "15012", &server_name])
            .arg(&own)
            .arg(&other)
            .output()
            .await
            .expect("the ADS probe runs");
        let report = String::from_utf8_lossy(&output.stdout).into_owned();
        eprintln!("ADS probe of {revision}'s instance:\n{report}");
        assert!(
            output.status.success(),
            "the ADS probe of {revision}: {report}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            report.contains("own-root: ok h2"),
            "{revision}'s instance serves TLS (h2) under its own root: {report}"
        );
        assert!(
            report.contains("other-root: verify-failed"),
            "a client trusting the other tenant's root cannot verify {revision}'s instance: {report}"
        );
        assert!(
            report.contains("plaintext: refused"),
            "{revision}'s instance gives plaintext ADS no HTTP/2 answer: {report}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `sni` of the bootstrap's ADS cluster: the instance Service's host.
fn server_name_of(envoy_yaml: &str) -> Option<String> {
    envoy_yaml.lines().find_map(|line| {
        let rest = line.trim().trim_start_matches('"').strip_prefix("sni")?;
        let value = rest
            .trim_start_matches('"')
            .trim_start()
            .strip_prefix(':')?;
        let value = value
            .trim()
            .trim_end_matches(',')
            .trim_matches('"')
            .trim_matches('\'');
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// Probes a TLS port: `own-root: ok <alpn>` or `verify-failed`, the same with the other root,
/// and whether plaintext HTTP/2 (preface and SETTINGS) gets an HTTP/2 frame back. Every socket
/// has a 5 s timeout.
const ADS_PROBE: &str = r#"
import socket, ssl, sys
ip, port, name, own, other = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def tls(cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((ip, port), timeout=5) as s:
        try:
            with ctx.wrap_socket(s, server_hostname=name) as t:
                return "ok " + (t.selected_alpn_protocol() or "none")
        except ssl.SSLCertVerificationError as e:
            return "verify-failed (" + str(e.verify_message) + ")"
def plaintext():
    with socket.create_connection((ip, port), timeout=5) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        data = b""
        try:
            while len(data) < 64:
                chunk = s.recv(64)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    if len(data) >= 9 and data[3] == 4:
        return "answered with HTTP/2 " + data[:16].hex()
    return "refused (" + (data[:8].hex() or "closed") + ")"
print("own-root:", tls(own))
print("other-root:", tls(other))
print("plaintext:", plaintext())
"#;
