//! The directory source (`--source dir:PATH`): Kubernetes-style YAML manifests in a directory
//! tree, watched for changes. The standalone mode for local runs, VMs and tests.
//!
//! Every `*.yaml`/`*.yml` file under the directory (multi-document) is read; on any change the
//! whole directory is read again and delivered as one full resync (`Resync` of every kind,
//! the objects, `Synced`), so a deleted file deletes its objects. Objects that do not decode
//! or fail `meshplane_crds::validation` are skipped with a warning naming file and object;
//! the rest still apply. Kinds: `v1` Namespace, Service, Pod; `discovery.k8s.io/v1`
//! EndpointSlice; `networking.meshplane.io/v1alpha1` ServiceEntry, Sidecar, EnvoyFilter;
//! `meshplane.io/v1alpha1` MeshControlPlane, MeshRevisionTag (for membership). Namespaced
//! objects without a namespace land in `default`, as with kubectl.

use std::path::{Path, PathBuf};
use std::time::Duration;

use meshplane_crds::manifest::{decode, parse_documents};
use meshplane_crds::validation;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::model::{Kind, Object, SourceEvent};

/// Quiet time after the last file event before the directory is read again.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// Longest a burst of file events may delay a read of the directory.
pub const DEBOUNCE_MAX: Duration = Duration::from_secs(1);

/// Whether a file event means the manifests may have changed (not a read or an attribute change).
fn changes_content(kind: &notify::EventKind) -> bool {
    use notify::event::ModifyKind;
    !matches!(
        kind,
        notify::EventKind::Access(_) | notify::EventKind::Modify(ModifyKind::Metadata(_))
    )
}

/// Every kind the directory source delivers (the scope of its resyncs).
pub const KINDS: [Kind; 9] = [
    Kind::Namespace,
    Kind::Service,
    Kind::EndpointSlice,
    Kind::Pod,
    Kind::ServiceEntry,
    Kind::Sidecar,
    Kind::EnvoyFilter,
    Kind::MeshControlPlane,
    Kind::MeshRevisionTag,
];

/// Why the directory source stopped.
#[derive(Debug, thiserror::Error)]
pub enum DirSourceError {
    /// The directory cannot be read.
    #[error("cannot read manifest directory {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory cannot be watched.
    #[error("cannot watch manifest directory {path}: {source}")]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// Reads every manifest under `dir`, in path order, skipping (with a warning) what is invalid.
pub fn load_dir(dir: &Path) -> Result<Vec<Object>, DirSourceError> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    files.sort();
    let mut objects = Vec::new();
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => objects.extend(objects_from_yaml(&file.display().to_string(), &text)),
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "manifest file not readable, skipped")
            }
        }
    }
    Ok(objects)
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DirSourceError> {
    let entries = std::fs::read_dir(dir).map_err(|source| DirSourceError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue; // editors' swap files and hidden directories
        }
        if path.is_dir() {
            collect_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

/// The valid objects of one YAML stream; `file` names it in warnings.
pub fn objects_from_yaml(file: &str, text: &str) -> Vec<Object> {
    let docs = match parse_documents(text) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(file, error = %e, "manifest file is not valid YAML, skipped");
            return Vec::new();
        }
    };
    docs.into_iter()
        .filter_map(|doc| match object_from_value(doc) {
            Ok(Some(obj)) => Some(obj),
            Ok(None) => None,
            Err((object, reason)) => {
                tracing::warn!(file, object = %object, reason = %reason, "invalid object skipped");
                None
            }
        })
        .collect()
}

fn describe(doc: &Value) -> String {
    let s = |p: &str| {
        doc.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    format!(
        "{} {}/{}",
        s("/kind"),
        s("/metadata/namespace"),
        s("/metadata/name")
    )
}

fn typed<T: DeserializeOwned>(doc: &Value) -> Result<T, (String, String)> {
    decode(doc).map_err(|e| (describe(doc), e.to_string()))
}

fn checked<T>(
    doc: &Value,
    r: Result<(), validation::ValidationErrors>,
    obj: T,
) -> Result<T, (String, String)> {
    r.map(|_| obj).map_err(|e| (describe(doc), e.to_string()))
}

/// Decodes one document; `Ok(None)` for kinds the xds-server does not read.
fn object_from_value(mut doc: Value) -> Result<Option<Object>, (String, String)> {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err((describe(&doc), "metadata.name is required".to_string()));
    }
    let cluster_scoped = matches!(
        kind.as_str(),
        "Namespace" | "MeshControlPlane" | "MeshRevisionTag"
    );
    if !cluster_scoped && doc.pointer("/metadata/namespace").is_none() {
        if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("namespace".into(), Value::String("default".into()));
        }
    }
    let obj = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => Object::Namespace(Box::new(typed(&doc)?)),
        ("v1", "Service") => Object::Service(Box::new(typed(&doc)?)),
        ("v1", "Pod") => Object::Pod(Box::new(typed(&doc)?)),
        ("discovery.k8s.io/v1", "EndpointSlice") => Object::EndpointSlice(Box::new(typed(&doc)?)),
        ("networking.meshplane.io/v1alpha1", "ServiceEntry") => {
            let se: meshplane_crds::ServiceEntry = typed(&doc)?;
            let r = validation::validate_service_entry(&se.spec);
            Object::ServiceEntry(Box::new(checked(&doc, r, se)?))
        }
        ("networking.meshplane.io/v1alpha1", "Sidecar") => {
            let s: meshplane_crds::Sidecar = typed(&doc)?;
            let r = validation::validate_sidecar(&s.spec);
            Object::Sidecar(Box::new(checked(&doc, r, s)?))
        }
        ("networking.meshplane.io/v1alpha1", "EnvoyFilter") => {
            let f: meshplane_crds::EnvoyFilter = typed(&doc)?;
            let r = validation::validate_envoy_filter(&f.spec);
            Object::EnvoyFilter(Box::new(checked(&doc, r, f)?))
        }
        ("meshplane.io/v1alpha1", "MeshControlPlane") => {
            let m: meshplane_crds::MeshControlPlane = typed(&doc)?;
            let r = validation::validate_mesh_control_plane(&m);
            Object::MeshControlPlane(Box::new(checked(&doc, r, m)?))
        }
        ("meshplane.io/v1alpha1", "MeshRevisionTag") => {
            let t: meshplane_crds::MeshRevisionTag = typed(&doc)?;
            let r = validation::validate_revision_tag(&t);
            Object::MeshRevisionTag(Box::new(checked(&doc, r, t)?))
        }
        _ => {
            tracing::debug!(object = %describe(&doc), api_version, "kind not read by the xds-server, ignored");
            return Ok(None);
        }
    };
    Ok(Some(obj))
}

/// Sends the directory's full state as one resync; false when the receiver is gone.
async fn send_snapshot(dir: &Path, tx: &mpsc::Sender<SourceEvent>) -> Result<bool, DirSourceError> {
    let objects = load_dir(dir)?;
    tracing::info!(dir = %dir.display(), objects = objects.len(), "manifest directory read");
    let events = std::iter::once(SourceEvent::Resync {
        namespace: None,
        kinds: KINDS.to_vec(),
    })
    .chain(objects.into_iter().map(SourceEvent::Upsert))
    .chain(std::iter::once(SourceEvent::Synced));
    for ev in events {
        if tx.send(ev).await.is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Runs the directory source until the receiver is dropped: the initial state, then a full
/// resync after every (debounced) change under `path`.
pub async fn run_dir_source(
    path: impl AsRef<Path>,
    tx: mpsc::Sender<SourceEvent>,
) -> Result<(), DirSourceError> {
    use notify::Watcher as _;
    let dir = path.as_ref().to_path_buf();
    let (fs_tx, mut fs_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher =
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            // Reading the manifests changes their access time (a metadata event); only content,
            // name, creation and removal events mean the directory changed.
            Ok(ev) if changes_content(&ev.kind) => {
                // The receiver only goes away when the source stops.
                let _ = fs_tx.send(());
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "manifest directory watch error"),
        })
        .map_err(|source| DirSourceError::Watch {
            path: dir.clone(),
            source,
        })?;
    watcher
        .watch(&dir, notify::RecursiveMode::Recursive)
        .map_err(|source| DirSourceError::Watch {
            path: dir.clone(),
            source,
        })?;

    if !send_snapshot(&dir, &tx).await? {
        return Ok(());
    }
    loop {
        tokio::select! {
            ev = fs_rx.recv() => if ev.is_none() { return Ok(()) },
            _ = tx.closed() => return Ok(()),
        }
        // Debounce: wait for a quiet period so an editor's burst of writes is read once, but
        // never longer than DEBOUNCE_MAX, so a steady stream of changes cannot starve readers.
        let deadline = tokio::time::Instant::now() + DEBOUNCE_MAX;
        loop {
            let quiet = (tokio::time::Instant::now() + DEBOUNCE).min(deadline);
            match tokio::time::timeout_at(quiet, fs_rx.recv()).await {
                Ok(Some(())) if tokio::time::Instant::now() < deadline => {}
                Ok(None) => return Ok(()),
                _ => break,
            }
        }
        match send_snapshot(&dir, &tx).await {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "manifest directory not readable; keeping the last state")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_attribute_changes_do_not_trigger_a_reload() {
        use notify::event::{
            AccessKind, CreateKind, DataChange, MetadataKind, ModifyKind, RemoveKind, RenameMode,
        };
        use notify::EventKind;
        assert!(!changes_content(&EventKind::Access(AccessKind::Any)));
        assert!(!changes_content(&EventKind::Modify(ModifyKind::Metadata(
            MetadataKind::AccessTime
        ))));
        assert!(changes_content(&EventKind::Modify(ModifyKind::Data(
            DataChange::Content
        ))));
        assert!(changes_content(&EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        ))));
        assert!(changes_content(&EventKind::Create(CreateKind::File)));
        assert!(changes_content(&EventKind::Remove(RemoveKind::File)));
    }

    #[test]
    fn invalid_objects_are_skipped_and_the_rest_kept() {
        let yaml = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {meshplane.io/rev: blue}}
---
apiVersion: networking.meshplane.io/v1alpha1
kind: ServiceEntry
metadata: {name: bad, namespace: shop}
spec: {hosts: ["*"]}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ignored}
"#;
        let objs = objects_from_yaml("t.yaml", yaml);
        let keys: Vec<String> = objs
            .iter()
            .map(|o| {
                let k = o.key();
                format!("{:?} {:?} {}", k.kind, k.namespace, k.name)
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                "Namespace None shop".to_string(),
                "Service Some(\"default\") web".to_string()
            ]
        );
    }

    #[test]
    fn broken_yaml_yields_nothing_instead_of_failing() {
        assert!(objects_from_yaml("t.yaml", "a: [unclosed").is_empty());
    }
}
