//! Strict isolation as denials: blue's instance ServiceAccount may read its member namespace
//! and gets 403 on green's.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::Api;
use meshplane_crds::names;
use meshplane_e2e::harness::{wait_for, Cluster};

const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_instance_token_is_denied_in_green_namespaces() {
    let started = Instant::now();
    let cluster = Cluster::start_two_tenants("strict-isolation", DEADLINE)
        .await
        .expect("two tenants Ready");

    // The instance's own identity, as its pods get it: a token of its ServiceAccount.
    let control = names::control_namespace("blue");
    let account = names::instance_name("blue-v1");
    let token = cluster
        .kubectl(&["-n", &control, "create", "token", &account])
        .expect("token for blue's instance")
        .trim()
        .to_string();
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(cluster.kubeconfig()).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let blue = kube::Client::try_from(config).expect("client as blue's instance");

    let shop: Api<Pod> = Api::namespaced(blue.clone(), "shop");
    wait_for(
        "blue's instance to read its member namespace",
        DEADLINE,
        || async {
            shop.list(&ListParams::default())
                .await
                .map(|_| Some(()))
                .map_err(|e| e.to_string())
        },
    )
    .await
    .expect("member read allowed");

    let garden: Api<Pod> = Api::namespaced(blue, "garden");
    match garden.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "expected Forbidden, got {status:?}")
        }
        other => panic!("blue's instance must be denied pods in garden, got {other:?}"),
    }
    eprintln!("scenario strict-isolation took {:?}", started.elapsed());
}
