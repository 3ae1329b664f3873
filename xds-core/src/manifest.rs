//! Manifest decoding: Kubernetes-style YAML documents into the [`Object`]s the instance
//! reads, exactly as the directory source reads them (the xds-server's `source_dir`, which
//! watches the files) and as meshctl reads the same manifests. A namespaced object without a
//! namespace lands in `default`, as with kubectl; every object passes
//! `meshplane_crds::validation` (through [`Object::validate`]) or is reported, never used.

use std::ffi::OsStr;
use std::path::Path;

use meshplane_crds::manifest::{decode, parse_documents};
use serde_json::Value;

use crate::kinds::{KindVisitor, WatchedObject};
use crate::model::{Kind, Object};

/// Whether `path` names a manifest file (`*.yaml`/`*.yml`).
pub fn is_manifest(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

/// Whether a directory entry named `name` is left out of the manifests (hidden: editors' swap
/// files, `.git`).
pub fn is_hidden(name: &OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

/// An object the directory source skips: it does not decode into its kind, or fails
/// `meshplane_crds::validation`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedObject {
    /// `Kind namespace/name` of the document.
    pub object: String,
    /// Why it is skipped.
    pub reason: String,
}

/// Decodes one manifest document exactly as the directory source does (a namespaced object
/// without a namespace lands in `default`): `Ok(None)` for kinds the xds-server does not read.
pub fn decode_document(doc: Value) -> Result<Option<Object>, SkippedObject> {
    object_from_value(doc).map_err(|(object, reason)| SkippedObject { object, reason })
}

/// What one YAML stream holds: the objects that decode and validate, and a problem for each
/// document that does not (or for the stream, when it is not YAML).
#[derive(Debug, Default)]
pub struct Manifest {
    /// Objects of the kinds the xds-server reads, in document order.
    pub objects: Vec<Object>,
    /// `Kind namespace/name: reason` per document left out, or why the stream is not YAML.
    pub problems: Vec<String>,
}

/// Reads one YAML stream (multi-document) as the directory source does.
pub fn read_manifest(text: &str) -> Manifest {
    let docs = match parse_documents(text) {
        Ok(d) => d,
        Err(e) => {
            return Manifest {
                objects: Vec::new(),
                problems: vec![format!("not valid YAML: {e}")],
            }
        }
    };
    let mut manifest = Manifest::default();
    for doc in docs {
        match object_from_value(doc) {
            Ok(Some(obj)) => manifest.objects.push(obj),
            Ok(None) => {}
            Err((object, reason)) => manifest.problems.push(format!("{object}: {reason}")),
        }
    }
    manifest
}

/// The valid objects of one YAML stream, the invalid ones left out with a warning naming
/// `file`: for tests and tools that build state from text. The directory source itself uses a
/// file whole or not at all.
pub fn objects_from_yaml(file: &str, text: &str) -> Vec<Object> {
    let Manifest { objects, problems } = read_manifest(text);
    for problem in problems {
        tracing::warn!(file, problem = %problem, "manifest document skipped");
    }
    objects
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

/// Decodes a document into its kind's Rust type.
struct Decode<'a>(&'a Value);

impl KindVisitor for Decode<'_> {
    type Output = Result<Object, (String, String)>;
    fn visit<T: WatchedObject>(self) -> Self::Output {
        decode::<T>(self.0)
            .map(T::into_object)
            .map_err(|e| (describe(self.0), e.to_string()))
    }
}

/// Decodes one document; `Ok(None)` for kinds the xds-server does not read.
fn object_from_value(mut doc: Value) -> Result<Option<Object>, (String, String)> {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind_name = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    if doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err((describe(&doc), "metadata.name is required".to_string()));
    }
    let Some(kind) = Kind::from_api(api_version, kind_name) else {
        tracing::debug!(object = %describe(&doc), api_version, "kind not read by the xds-server, ignored");
        return Ok(None);
    };
    if kind.namespaced() && doc.pointer("/metadata/namespace").is_none() {
        if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("namespace".into(), Value::String("default".into()));
        }
    }
    let obj = kind.visit(Decode(&doc))?;
    // The rules the validating webhook and the index apply (`Object::validate`); an invalid
    // AuthorizationPolicy is not dropped: it denies what it selects (fails closed,
    // translate::authz::unenforceable) and its status says why.
    obj.validate()
        .map_err(|e| (describe(&doc), e.to_string()))?;
    Ok(Some(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

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
