//! Two tenants from `config/samples`: each instance becomes Ready; blue's proxies get blue's
//! services and none of green's (and vice versa); in each tenant a client reaches its own
//! tenant's app by Service name, transparently captured by both sidecars. Each tenant has its
//! own CA (contract 11): its root is the trust bundle of its bootstrap ConfigMaps only, and every
//! injected proxy got its workload certificate from its own tenant's instance, and calls between
//! two sidecars of a tenant are mutual TLS carrying the client's SPIFFE ID.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use meshplane_e2e::harness::{app_and_client, wait_for, Cluster, WEB_PORT};

const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_are_ready_isolated_and_route_their_own_traffic() {
    let started = Instant::now();
    let cluster = Cluster::start_two_tenants("two-tenants", DEADLINE)
        .await
        .expect("two tenants Ready");

    for namespace in ["shop", "garden"] {
        cluster
            .apply_manifest(&app_and_client(namespace))
            .expect("workloads");
    }
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
    eprintln!("scenario two-tenants took {:?}", started.elapsed());
}
