//! The 1,000-service directory-style tenant the translation and hot-spot benches share
//! (20 namespaces × 50 Services, 3 endpoints each).

use meshplane_crds::networking::CaptureMode;
use meshplane_crds::MeshConfig;
use meshplane_xds_core::index::TenantIndex;
use meshplane_xds_core::manifest::objects_from_yaml;
use meshplane_xds_core::model::Kind;
use meshplane_xds_core::model::{ProxyNode, SourceEvent};

pub const NAMESPACES: usize = 20;
pub const SERVICES_PER_NAMESPACE: usize = 50;

/// One manifest file per namespace, as a directory source would read them.
pub fn manifests(scoped: bool) -> Vec<String> {
    let mut files = Vec::new();
    for n in 0..NAMESPACES {
        let mut y = String::new();
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: ns{n}, labels: {{meshplane.io/rev: blue}}}}\n"
        ));
        if scoped {
            y.push_str(&format!(
                "---\napiVersion: networking.meshplane.io/v1alpha1\nkind: Sidecar\nmetadata: {{name: default, namespace: ns{n}}}\nspec: {{egress: [{{hosts: [\"./*\"]}}]}}\n"
            ));
        }
        for s in 0..SERVICES_PER_NAMESPACE {
            let ip = format!("198.19.{n}.{s}");
            y.push_str(&format!(
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc{s}, namespace: ns{n}}}\nspec: {{clusterIP: {ip}, selector: {{app: svc{s}}}, ports: [{{name: http, port: 80, targetPort: 8080}}, {{name: tcp-db, port: {}}}]}}\n",
                7000 + s
            ));
            y.push_str(&format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc{s}-1, namespace: ns{n}, labels: {{kubernetes.io/service-name: svc{s}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}, {{name: tcp-db, port: {}}}]\nendpoints: [{{addresses: [198.18.{n}.{}], zone: a}}, {{addresses: [198.18.{n}.{}], zone: b}}, {{addresses: [198.18.{n}.{}], zone: c}}]\n",
                7000 + s,
                3 * s + 1,
                3 * s + 2,
                3 * s + 3
            ));
        }
        files.push(y);
    }
    files
}

pub fn tenant(scoped: bool) -> TenantIndex {
    let mut index = TenantIndex::new("acme", "blue", "meshplane-acme", MeshConfig::default());
    index.apply(SourceEvent::Resync {
        namespace: None,
        kinds: Kind::ALL.to_vec(),
    });
    for (i, file) in manifests(scoped).iter().enumerate() {
        for obj in objects_from_yaml(&format!("ns{i}.yaml"), file) {
            index.apply(SourceEvent::Upsert(obj));
        }
    }
    index.apply(SourceEvent::Synced);
    index
}

pub fn node() -> ProxyNode {
    ProxyNode {
        id: "sidecar~198.18.250.1~svc0-x.ns0~ns0.svc.cluster.local".into(),
        kind: Default::default(),
        namespace: "ns0".into(),
        pod_name: Some("svc0-x".into()),
        ip: Some("198.18.250.1".into()),
        labels: [("app".to_string(), "svc0".to_string())].into(),
        capture_mode: CaptureMode::Default,
        loopback: None,
        sds: false,
        service_account: None,
        readable_credentials: None,
    }
}
