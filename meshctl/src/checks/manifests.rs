//! The objects an install should have created, read as `kubectl apply` reads them: `-f` a
//! manifest file or a directory of them, `-k` a kustomization rendered by `kubectl kustomize`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use meshplane_crds::manifest;
use meshplane_xds_core::manifest::{is_hidden, is_manifest};
use serde_json::Value;

/// One object of a manifest, by kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// The objects of `docs` (the items of a `List` each), skipping documents without a name.
pub fn object_refs(docs: &[Value]) -> Vec<ObjectRef> {
    let mut out = Vec::new();
    for doc in docs {
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        if kind.ends_with("List") {
            if let Some(items) = doc.get("items").and_then(Value::as_array) {
                out.extend(object_refs(items));
            }
            continue;
        }
        let text = |pointer: &str| {
            doc.pointer(pointer)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let (Some(api_version), Some(name)) = (text("/apiVersion"), text("/metadata/name")) else {
            continue;
        };
        out.push(ObjectRef {
            api_version,
            kind: kind.to_string(),
            namespace: text("/metadata/namespace"),
            name,
        });
    }
    out
}

/// Every manifest file at `path`: the file itself, or the `*.yaml`/`*.yml`/`*.json` files of a
/// directory, recursively, in path order.
fn files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            let p = entry.path();
            if is_hidden(&entry.file_name()) {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
            } else if is_manifest(&p) || p.extension().is_some_and(|e| e == "json") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The objects of the manifests at `path` (`-f`).
pub fn from_path(path: &Path) -> anyhow::Result<Vec<ObjectRef>> {
    let mut docs = Vec::new();
    for file in files(path)? {
        // A kustomization is not an object of the cluster.
        if file
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("kustomization."))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        docs.extend(
            manifest::parse_documents(&text)
                .with_context(|| format!("parsing {}", file.display()))?,
        );
    }
    Ok(object_refs(&docs))
}

/// The objects `kubectl kustomize dir` renders (`-k`); kubectl is `$KUBECTL`, else the one on
/// the `PATH`.
pub fn from_kustomization(dir: &Path) -> anyhow::Result<Vec<ObjectRef>> {
    let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| {
            format!(
                "running {} kustomize (set KUBECTL to kubectl's path)",
                kubectl.to_string_lossy()
            )
        })?;
    if !out.status.success() {
        anyhow::bail!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let docs = manifest::parse_documents(&text)
        .with_context(|| format!("parsing what kubectl kustomize {} printed", dir.display()))?;
    Ok(object_refs(&docs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_read_from_files_and_lists_of_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: meshplane-system\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: meshplane-operator\n  namespace: meshplane-system\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("more")).unwrap();
        std::fs::write(
            dir.path().join("more/list.json"),
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc","namespace":"ns"}}, {"kind":"Broken"}]}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("kustomization.yaml"),
            "resources: [a.yaml]\n",
        )
        .unwrap();
        let refs: Vec<String> = from_path(dir.path())
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            refs,
            [
                "Namespace meshplane-system",
                "Deployment meshplane-system/meshplane-operator",
                "Service ns/svc"
            ]
        );
    }
}
