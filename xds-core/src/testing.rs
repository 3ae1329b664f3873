//! Builders the tests of the core and of the xds-server share (not part of product builds):
//! an encoded resource, a sidecar proxy, and an index fed from YAML manifests as the directory
//! source delivers them. Tests change what they care about with struct update syntax
//! (`ProxyNode { kind: ProxyKind::Router, ..mk_proxy("shop", &[]) }`).

use std::sync::Arc;

use bytes::Bytes;
use meshplane_crds::networking::CaptureMode;
use meshplane_crds::MeshConfig;

use crate::generator::Change;
use crate::hash::content_version;
use crate::index::TenantIndex;
use crate::manifest::objects_from_yaml;
use crate::model::{Kind, ProxyNode, Resource, SourceEvent};

/// The tenant, revision and control namespace of [`index_with`].
pub const TENANT: &str = "acme";
pub const REVISION: &str = "blue";
pub const CONTROL_NS: &str = "meshplane-acme";

/// A resource of `type_url` named `name` holding `encoded`, versioned by its content as the
/// index versions resources.
pub fn mk_resource(type_url: &'static str, name: &str, encoded: impl Into<Bytes>) -> Arc<Resource> {
    let encoded = encoded.into();
    Arc::new(Resource {
        name: name.to_string(),
        type_url,
        version: content_version(&encoded),
        packed: Default::default(),
        encoded,
    })
}

/// A sidecar of pod `p` (address 198.18.1.1) in `namespace` with `labels`, capturing traffic,
/// its id in Istio's form.
pub fn mk_proxy(namespace: &str, labels: &[(&str, &str)]) -> ProxyNode {
    ProxyNode {
        id: format!("sidecar~198.18.1.1~p.{namespace}~{namespace}.svc.cluster.local"),
        namespace: namespace.to_string(),
        pod_name: Some("p".into()),
        ip: Some("198.18.1.1".into()),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        capture_mode: CaptureMode::Default,
        ..ProxyNode::default()
    }
}

/// An index of revision [`REVISION`] of tenant [`TENANT`] holding the objects of `yaml`.
pub fn index_with(yaml: &[&str]) -> TenantIndex {
    let mut index = TenantIndex::new(TENANT, REVISION, CONTROL_NS, MeshConfig::default());
    feed(&mut index, yaml);
    index
}

/// Delivers manifests as the directory source does: one full resync.
pub fn feed(index: &mut TenantIndex, yaml: &[&str]) -> Change {
    let mut change = Change::default();
    change.merge(index.apply(SourceEvent::Resync {
        namespace: None,
        kinds: Kind::ALL.to_vec(),
    }));
    for (i, y) in yaml.iter().enumerate() {
        for obj in objects_from_yaml(&format!("doc{i}.yaml"), y) {
            change.merge(index.apply(SourceEvent::Upsert(obj)));
        }
    }
    change.merge(index.apply(SourceEvent::Synced));
    change
}
