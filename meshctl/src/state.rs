//! What meshctl reasons about: the objects of a cluster, or of a directory of manifests, decoded
//! exactly as the xds-server decodes them (`meshplane_xds_core::manifest::decode_document`), with
//! the raw documents kept for the checks that read them as admission does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use meshplane_crds::membership::{
    self, ControlPlaneFacts, Membership, NamespaceFacts, RevisionMembership, TagFacts,
};
use meshplane_crds::{names, MeshControlPlane, MeshRevisionTag};
use meshplane_xds_core::manifest::{self, decode_document};
use meshplane_xds_core::model::{Object, ObjectKey};
use serde_json::Value;

/// Why a state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read manifest directory {path}: {source}")]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a directory of manifests")]
    NotADirectory(String),
}

/// What became of one document.
#[derive(Clone, Debug)]
pub enum Decoded {
    /// A kind the mesh reads, decoded and valid.
    Object(Object),
    /// A kind the mesh does not read (Deployments, ConfigMaps, ...).
    Ignored,
    /// A kind the mesh reads that does not decode or is not valid: the mesh skips it.
    Invalid(String),
}

/// One document with its origin.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The file it was read from, or `cluster`.
    pub origin: String,
    /// The document as JSON.
    pub raw: Value,
    /// What the mesh makes of it.
    pub decoded: Decoded,
}

impl Entry {
    /// `Kind namespace/name` (or `Kind name` for cluster-scoped objects).
    pub fn describe(&self) -> String {
        describe_value(&self.raw)
    }

    /// The document's kind.
    pub fn kind(&self) -> &str {
        self.raw
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// The document's namespace.
    pub fn namespace(&self) -> Option<&str> {
        self.raw
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
    }

    /// The document's name.
    pub fn name(&self) -> &str {
        self.raw
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// Whether the document is in the `networking.meshplane.io`, `security.meshplane.io`,
    /// `telemetry.meshplane.io` or `gateway.networking.k8s.io` groups: the config a tenant's
    /// teams write.
    pub fn is_mesh_config(&self) -> bool {
        self.raw
            .get("apiVersion")
            .and_then(Value::as_str)
            .and_then(|v| v.split_once('/'))
            .is_some_and(|(group, _)| {
                group == "networking.meshplane.io"
                    || group == "security.meshplane.io"
                    || group == "telemetry.meshplane.io"
                    || group == "gateway.networking.k8s.io"
            })
    }
}

/// `Kind namespace/name` of a document.
pub fn describe_value(doc: &Value) -> String {
    let s = |p: &str| doc.pointer(p).and_then(Value::as_str);
    let kind = s("/kind").unwrap_or("?");
    let name = s("/metadata/name").unwrap_or("?");
    match s("/metadata/namespace") {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Every manifest file under `dir`, in path order: the files the directory source reads
/// (`*.yaml`/`*.yml`, recursively, hidden entries skipped).
fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, StateError> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), StateError> {
        let entries = std::fs::read_dir(dir).map_err(|source| StateError::Directory {
            path: dir.to_path_buf(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if manifest::is_hidden(&entry.file_name()) {
                continue;
            }
            if path.is_dir() {
                walk(&path, out)?;
            } else if manifest::is_manifest(&path) {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut paths = Vec::new();
    walk(dir, &mut paths)?;
    paths.sort();
    Ok(paths)
}

/// Every object of a cluster or a directory.
#[derive(Clone, Debug, Default)]
pub struct MeshState {
    /// Every document, in reading order.
    pub entries: Vec<Entry>,
    /// Files that could not be read or parsed, with the reason.
    pub unreadable: Vec<(String, String)>,
}

impl MeshState {
    /// Reads every manifest under `dir` as the directory source does (`*.yaml`/`*.yml`,
    /// recursively, hidden entries skipped, in path order).
    pub fn from_dir(dir: &Path) -> Result<Self, StateError> {
        if !dir.is_dir() {
            return Err(StateError::NotADirectory(dir.display().to_string()));
        }
        let mut state = MeshState::default();
        for file in manifest_files(dir)? {
            let origin = file
                .strip_prefix(dir)
                .unwrap_or(&file)
                .display()
                .to_string();
            let text = match std::fs::read_to_string(&file) {
                Ok(text) => text,
                Err(e) => {
                    state.unreadable.push((origin, e.to_string()));
                    continue;
                }
            };
            match meshplane_crds::manifest::parse_documents(&text) {
                Ok(docs) => state.add_documents(&origin, docs),
                Err(e) => state.unreadable.push((origin, e.to_string())),
            }
        }
        Ok(state)
    }

    /// Adds documents read from `origin`.
    pub fn add_documents(&mut self, origin: &str, docs: impl IntoIterator<Item = Value>) {
        for raw in docs {
            let decoded = match decode_document(raw.clone()) {
                Ok(Some(object)) => Decoded::Object(object),
                Ok(None) => Decoded::Ignored,
                Err(skipped) => Decoded::Invalid(skipped.reason),
            };
            self.entries.push(Entry {
                origin: origin.to_string(),
                raw,
                decoded,
            });
        }
    }

    /// Every decoded object; of several with one key, the last read (as the directory source
    /// keeps it).
    pub fn objects(&self) -> Vec<&Object> {
        let mut last: BTreeMap<ObjectKey, usize> = BTreeMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            if let Decoded::Object(o) = &e.decoded {
                last.insert(o.key(), i);
            }
        }
        let keep: BTreeSet<usize> = last.into_values().collect();
        self.entries
            .iter()
            .enumerate()
            .filter(|(i, _)| keep.contains(i))
            .filter_map(|(_, e)| match &e.decoded {
                Decoded::Object(o) => Some(o),
                _ => None,
            })
            .collect()
    }

    /// The Namespaces.
    pub fn namespaces(&self) -> Vec<&Namespace> {
        self.objects()
            .into_iter()
            .filter_map(|o| match o {
                Object::Namespace(n) => Some(n.as_ref()),
                _ => None,
            })
            .collect()
    }

    /// The MeshControlPlanes.
    pub fn control_planes(&self) -> Vec<&MeshControlPlane> {
        self.objects()
            .into_iter()
            .filter_map(|o| match o {
                Object::MeshControlPlane(m) => Some(m.as_ref()),
                _ => None,
            })
            .collect()
    }

    /// The MeshRevisionTags.
    pub fn tags(&self) -> Vec<&MeshRevisionTag> {
        self.objects()
            .into_iter()
            .filter_map(|o| match o {
                Object::MeshRevisionTag(t) => Some(t.as_ref()),
                _ => None,
            })
            .collect()
    }

    /// The Pods.
    pub fn pods(&self) -> Vec<&Pod> {
        self.objects()
            .into_iter()
            .filter_map(|o| match o {
                Object::Pod(p) => Some(p.as_ref()),
                _ => None,
            })
            .collect()
    }

    /// The Pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods().into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
    }

    /// Labels of namespace `name`, if it exists.
    pub fn namespace_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .map(|n| n.metadata.labels.clone().unwrap_or_default())
    }

    /// Membership as the operator computes it (`meshplane_crds::membership::compute_guarded`).
    pub fn membership(&self) -> Membership {
        let namespaces: Vec<NamespaceFacts> = self
            .namespaces()
            .into_iter()
            .map(|n| NamespaceFacts::of(&n.metadata))
            .collect();
        let control_planes: Vec<ControlPlaneFacts> = self
            .control_planes()
            .into_iter()
            .map(ControlPlaneFacts::from)
            .collect();
        let tags: Vec<TagFacts> = self.tags().into_iter().map(TagFacts::from).collect();
        membership::compute_guarded(&namespaces, &control_planes, &tags, |name| {
            namespaces.iter().find(|n| n.name == name).cloned()
        })
    }
}

/// Where a namespace belongs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The tenant.
    pub tenant: String,
    /// The revision new pods of the namespace get.
    pub revision: String,
    /// The tenant's control namespace.
    pub control_namespace: String,
    /// The tag the namespace is labelled with, when it joins through one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// The revision and tenant namespace `namespace` is attached to. A tenant's control namespace
/// belongs to the tenant (its first revision by name, when nothing else says).
pub fn placement(
    membership: &Membership,
    labels: &BTreeMap<String, String>,
    namespace: &str,
) -> Option<Placement> {
    let label = labels.get(names::REV_LABEL);
    membership
        .revisions
        .iter()
        .find(|(_, r)| r.attached.contains(namespace))
        .map(|(revision, r)| Placement {
            tenant: r.tenant.clone(),
            revision: revision.clone(),
            control_namespace: r.control_namespace.clone(),
            tag: label.filter(|l| *l != revision).cloned(),
        })
        .or_else(|| {
            let (tenant, t) = membership
                .tenants
                .iter()
                .find(|(_, t)| t.control_namespace == namespace)?;
            Some(Placement {
                tenant: tenant.clone(),
                revision: t.revisions.iter().next()?.clone(),
                control_namespace: namespace.to_string(),
                tag: None,
            })
        })
}

/// The active revision `revision`, with its name.
pub fn revision<'a>(
    membership: &'a Membership,
    revision: &str,
) -> Option<(&'a String, &'a RevisionMembership)> {
    membership.revisions.get_key_value(revision)
}
