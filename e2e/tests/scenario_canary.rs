//! Canary and tag move: blue-v2 beside blue-v1, one namespace moved to it, then the tag
//! blue-stable moved to blue-v2 and back (rollback). Green's objects never change.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::ListParams;
use kube::{Api, Resource, ResourceExt};
use meshplane_crds::names;
use meshplane_e2e::harness::{test_pod, wait_for, Cluster};
use serde::de::DeserializeOwned;

const DEADLINE: Duration = Duration::from_secs(120);

/// kind/namespace/name → resourceVersion of every object labelled for tenant green.
async fn green_objects(client: &kube::Client) -> Result<BTreeMap<String, String>, String> {
    async fn collect<K>(
        client: &kube::Client,
        out: &mut BTreeMap<String, String>,
    ) -> Result<(), String>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let api: Api<K> = Api::all(client.clone());
        let selector = format!("{}=green", names::TENANT_LABEL);
        for object in api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| e.to_string())?
        {
            let key = format!(
                "{}/{}/{}",
                K::kind(&()),
                object.namespace().unwrap_or_default(),
                object.name_any()
            );
            out.insert(key, object.resource_version().unwrap_or_default());
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    collect::<ConfigMap>(client, &mut out).await?;
    collect::<Service>(client, &mut out).await?;
    collect::<Deployment>(client, &mut out).await?;
    collect::<Role>(client, &mut out).await?;
    collect::<RoleBinding>(client, &mut out).await?;
    collect::<MutatingWebhookConfiguration>(client, &mut out).await?;
    collect::<ValidatingWebhookConfiguration>(client, &mut out).await?;
    // The instance's own proxy count is live data, not configuration.
    let proxies = format!("{}-proxies", names::instance_name("green"));
    out.retain(|key, _| !key.ends_with(&format!("/{proxies}")));
    Ok(out)
}

/// Creates pod `name` in shop and returns the revision that injected it.
async fn injected_revision(cluster: &Cluster, name: &str) -> Option<String> {
    cluster
        .apply_manifest(&test_pod("shop", name))
        .expect("pod");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "shop");
    let pod = pods.get(name).await.expect("pod");
    pod.annotations()
        .get(names::INJECTED_REVISION_ANNOTATION)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_tag_move_and_rollback_leave_green_untouched() {
    let started = Instant::now();
    let cluster = Cluster::start_two_tenants("canary", DEADLINE)
        .await
        .expect("two tenants Ready");
    let client = cluster.client();
    // Green at rest: two reads in a row agree.
    let previous = std::sync::Mutex::new(BTreeMap::new());
    let green_before = wait_for("green's objects to settle", DEADLINE, || async {
        let now = green_objects(&client).await?;
        let last = std::mem::replace(
            &mut *previous.lock().map_err(|e| e.to_string())?,
            now.clone(),
        );
        (!now.is_empty() && now == last)
            .then_some(now)
            .map(Some)
            .ok_or("still changing".to_string())
    })
    .await
    .expect("green settled");
    assert_eq!(
        injected_revision(&cluster, "before").await.as_deref(),
        Some("blue-v1")
    );

    cluster
        .kubectl(&[
            "apply",
            "--server-side",
            "-f",
            "config/samples/blue-v2.yaml",
        ])
        .expect("blue-v2");
    cluster
        .wait_for_mcp_ready("blue-v2", DEADLINE)
        .await
        .expect("blue-v2 Ready");
    cluster
        .kubectl(&[
            "label",
            "namespace",
            "shop",
            "meshplane.io/rev=blue-v2",
            "--overwrite",
        ])
        .expect("move shop to blue-v2");
    wait_for("new pods in shop injected by blue-v2", DEADLINE, || async {
        let name = format!("canary-{}", rand_suffix());
        let revision = injected_revision(&cluster, &name).await;
        (revision.as_deref() == Some("blue-v2"))
            .then_some(())
            .map(Some)
            .ok_or(format!("{revision:?}"))
    })
    .await
    .expect("canary injection");

    one_status_writer_per_object(&cluster).await;
    one_publisher_of_config_events(&cluster).await;

    // Promote: shop follows the tag again, and the tag points at blue-v2.
    cluster
        .kubectl(&[
            "label",
            "namespace",
            "shop",
            "meshplane.io/rev=blue-stable",
            "--overwrite",
        ])
        .expect("back to the tag");
    cluster
        .kubectl(&[
            "patch",
            "meshrevisiontag",
            "blue-stable",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"revision":"blue-v2"}}"#,
        ])
        .expect("move the tag");
    wait_for(
        "new pods in shop injected by blue-v2 through the tag",
        DEADLINE,
        || async {
            let revision =
                injected_revision(&cluster, &format!("promoted-{}", rand_suffix())).await;
            (revision.as_deref() == Some("blue-v2"))
                .then_some(())
                .map(Some)
                .ok_or(format!("{revision:?}"))
        },
    )
    .await
    .expect("promotion");

    // Roll back by moving the tag back.
    cluster
        .kubectl(&[
            "patch",
            "meshrevisiontag",
            "blue-stable",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"revision":"blue-v1"}}"#,
        ])
        .expect("roll back");
    wait_for(
        "new pods in shop injected by blue-v1 again",
        DEADLINE,
        || async {
            let revision =
                injected_revision(&cluster, &format!("rolledback-{}", rand_suffix())).await;
            (revision.as_deref() == Some("blue-v1"))
                .then_some(())
                .map(Some)
                .ok_or(format!("{revision:?}"))
        },
    )
    .await
    .expect("rollback");

    let green_after = green_objects(&cluster.client())
        .await
        .expect("green objects");
    assert_eq!(
        green_before, green_after,
        "green's objects are unchanged by blue's canary"
    );
    eprintln!("scenario canary took {:?}", started.elapsed());
}

/// blue-v2 declares an external authorizer that blue-v1 does not: blue-v2 accepts a CUSTOM
/// policy in shop (attached to blue-v2), blue-v1 would refuse it. The policy's condition is
/// blue-v2's verdict and only blue-v2 writes it, through several verdict rounds of both
/// instances; config in the control namespace has its status written by blue-v1 (the tenant's
/// status writer) alone.
async fn one_status_writer_per_object(cluster: &Cluster) {
    cluster
        .kubectl(&[
            "patch",
            "meshcontrolplane",
            "blue-v2",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"meshConfig":{"extensionProviders":[{"name":"authz","envoyExtAuthzHttp":{"service":"authz.shop.svc.cluster.local","port":8000}}]}}}"#,
        ])
        .expect("a provider on blue-v2 only");
    let get = |kind: &str, ns: &str, name: &str, path: &str| {
        cluster
            .kubectl(&[
                "get",
                kind,
                name,
                "-n",
                ns,
                "-o",
                &format!("jsonpath={path}"),
            ])
            .map(|s| s.trim().to_string())
            .map_err(|e| e.to_string())
    };
    const ACCEPTED: &str = "{.status.conditions[?(@.type==\"Accepted\")].status}";
    for round in 0..3 {
        cluster
            .apply_manifest(&format!(
                r#"apiVersion: v1
kind: Service
metadata: {{name: authz, namespace: shop}}
spec:
  selector: {{app: authz}}
  ports: [{{name: http, port: 8000, targetPort: 8000}}]
---
apiVersion: security.meshplane.io/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: canary-ext, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  action: CUSTOM
  provider: {{name: authz}}
  rules:
    - to: [{{operation: {{paths: [/round-{round}*]}}}}]
---
apiVersion: networking.meshplane.io/v1alpha1
kind: VirtualService
metadata: {{name: round-{round}, namespace: meshplane-blue}}
spec:
  hosts: [round-{round}.example.com]
  http:
    - route: [{{destination: {{host: round-{round}.example.com}}}}]
"#
            ))
            .expect("policy and tenant-wide config");
        let generation = get(
            "authorizationpolicy",
            "shop",
            "canary-ext",
            "{.metadata.generation}",
        )
        .expect("policy");
        // blue-v2's verdict for this generation.
        let version = wait_for(
            &format!("round {round}: the policy judged by blue-v2"),
            DEADLINE,
            || async {
                let status = get("authorizationpolicy", "shop", "canary-ext", ACCEPTED)?;
                let observed = get(
                    "authorizationpolicy",
                    "shop",
                    "canary-ext",
                    "{.status.observedGeneration}",
                )?;
                (status == "True" && observed == generation)
                    .then(|| {
                        get(
                            "authorizationpolicy",
                            "shop",
                            "canary-ext",
                            "{.metadata.resourceVersion}",
                        )
                    })
                    .transpose()
                    .map_err(|e| e.to_string())?
                    .map(Some)
                    .ok_or(format!("Accepted={status} at generation {observed}"))
            },
        )
        .await
        .expect("blue-v2's verdict");
        // blue-v1 went through a verdict round since: it wrote the tenant-wide object.
        wait_for(
            &format!("round {round}: tenant-wide config judged by blue-v1"),
            DEADLINE,
            || async {
                let status = get(
                    "virtualservice",
                    "meshplane-blue",
                    &format!("round-{round}"),
                    ACCEPTED,
                )?;
                (!status.is_empty())
                    .then_some(Some(()))
                    .ok_or("no condition yet".to_string())
            },
        )
        .await
        .expect("blue-v1's verdict");
        let managers = get(
            "virtualservice",
            "meshplane-blue",
            &format!("round-{round}"),
            "{.metadata.managedFields[*].manager}",
        )
        .expect("managers");
        assert!(
            managers.contains("meshplane-xds/blue-v1")
                && !managers.contains("meshplane-xds/blue-v2"),
            "tenant-wide config has one status writer: {managers}"
        );
        assert_eq!(
            get("authorizationpolicy", "shop", "canary-ext", ACCEPTED).as_deref(),
            Ok("True"),
            "blue-v1 never overwrote blue-v2's verdict"
        );
        assert_eq!(
            get(
                "authorizationpolicy",
                "shop",
                "canary-ext",
                "{.metadata.resourceVersion}"
            ),
            Ok(version),
            "nothing wrote the policy's status since"
        );
        let managers = get(
            "authorizationpolicy",
            "shop",
            "canary-ext",
            "{.metadata.managedFields[*].manager}",
        )
        .expect("managers");
        assert!(
            !managers.contains("meshplane-xds/blue-v1"),
            "only the attached revision writes the policy's status: {managers}"
        );
    }
    // The canary's objects leave with it: the tag move below sends shop back to blue-v1.
    cluster
        .kubectl(&["delete", "authorizationpolicy", "canary-ext", "-n", "shop"])
        .expect("policy deleted");
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

/// A config finding in a namespace attached to blue-v2 is published as a Warning Event by
/// blue-v2 alone, though blue-v1 indexes the same object: of a canary's revisions only the
/// status writer of the object's namespace publishes Events about it. The ServiceEntry is
/// written before its namespace joins (so no webhook refuses it) and joins attached to blue-v2.
async fn one_publisher_of_config_events(cluster: &Cluster) {
    cluster
        .apply_manifest(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: late}\n---\napiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata: {name: bypassed, namespace: late}\nspec:\n  hosts: [\"*.bypassed.example.com\"]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: DNS\n",
        )
        .expect("an invalid ServiceEntry outside the tenant");
    cluster
        .kubectl(&["label", "namespace", "late", "meshplane.io/rev=blue-v2"])
        .expect("late joins blue, attached to blue-v2");
    // The set of reporting controllers (each replica of a revision publishes its own Event).
    let reporters = || -> Result<std::collections::BTreeSet<String>, String> {
        let out = cluster
            .kubectl(&["get", "events.events.k8s.io", "-n", "late", "-o", "json"])
            .map_err(|e| e.to_string())?;
        let list: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["regarding"]["name"] == "bypassed" && e["reason"] == "InvalidConfig")
            .map(|e| {
                e["reportingController"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect())
    };
    let first = wait_for(
        "an InvalidConfig Event on late/bypassed",
        DEADLINE,
        || async {
            let found = reporters()?;
            Ok((!found.is_empty()).then_some(found))
        },
    )
    .await
    .expect("Event");
    assert_eq!(
        first,
        ["meshplane-xds/blue-v2".to_string()].into(),
        "published by blue-v2"
    );
    // Sync point for blue-v1: a second ServiceEntry written after the first (one watch, in
    // order) reaches the proxy blue-v1 still serves in shop, so blue-v1 has indexed the invalid
    // one by then.
    if cluster.network().is_none() {
        eprintln!("the blue-v1 sync point needs the local test network; E2E_KUBECONFIG is set");
        return;
    }
    cluster
        .apply_manifest("apiVersion: networking.meshplane.io/v1alpha1\nkind: ServiceEntry\nmetadata: {name: marker, namespace: late}\nspec:\n  hosts: [marker.example.com]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: DNS\n")
        .expect("a valid ServiceEntry after the invalid one");
    cluster
        .wait_for_ready_pods("shop", "app=before", 1, DEADLINE)
        .await
        .expect("blue-v1's pod in shop ready");
    let before = cluster.in_pod("shop", "before").expect("blue-v1's pod");
    wait_for(
        "blue-v1's proxy to have marker.example.com",
        DEADLINE,
        || async {
            let dump = before
                .envoy_admin("/config_dump")
                .await
                .map_err(|e| e.to_string())?;
            Ok(dump.contains("marker.example.com").then_some(()))
        },
    )
    .await
    .expect("blue-v1 indexed late");
    assert_eq!(
        reporters().expect("events"),
        ["meshplane-xds/blue-v2".to_string()].into(),
        "blue-v1 publishes nothing about an object whose status blue-v2 writes"
    );
}
