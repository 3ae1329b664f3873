//! Pod volumes materialised as directories under the pod's own directory.
//!
//! ConfigMap, Secret, downward API and projected volumes are written as files and kept up to
//! date as their sources change (writes go through a temporary file and a rename, so readers
//! never see half a file); emptyDir is an empty directory. ServiceAccount tokens of projected
//! volumes are requested once, when the pod starts, and passed in by the caller.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIVolumeFile, KeyToPath, Pod, SecretProjection, Volume,
};

use super::downward::field_value;
use super::error::PodRunnerError;

/// The files of one volume: path relative to the volume directory → content.
pub type VolumeFiles = BTreeMap<String, Vec<u8>>;

/// Data of ConfigMaps and Secrets, by namespace and name.
pub trait ObjectData: Send + Sync {
    fn config_map(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>>;
    fn secret(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>>;
}

/// A ServiceAccount token a projected volume asks for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TokenProjection {
    pub volume: String,
    pub path: String,
    pub audience: Option<String>,
    pub expiration_seconds: Option<i64>,
}

/// Every `serviceAccountToken` source of the pod's projected volumes.
pub fn token_projections(pod: &Pod) -> Vec<TokenProjection> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let mut projections = Vec::new();
    for volume in volumes.into_iter().flatten() {
        let sources = volume.projected.as_ref().and_then(|p| p.sources.as_ref());
        for source in sources.into_iter().flatten() {
            if let Some(token) = &source.service_account_token {
                projections.push(TokenProjection {
                    volume: volume.name.clone(),
                    path: token.path.clone(),
                    audience: token.audience.clone().filter(|a| !a.is_empty()),
                    expiration_seconds: token.expiration_seconds,
                });
            }
        }
    }
    projections
}

/// What a volume needs to be written.
pub struct VolumeInputs<'a> {
    pub pod: &'a Pod,
    pub pod_ip: Ipv4Addr,
    pub objects: &'a dyn ObjectData,
    /// Issued tokens by (volume, path).
    pub tokens: &'a BTreeMap<(String, String), String>,
}

/// The files `volume` should hold, `Ok(None)` for a plain directory (emptyDir and any kind the
/// runner does not materialise), or `Err` naming what is missing.
pub fn volume_files(
    volume: &Volume,
    inputs: &VolumeInputs<'_>,
) -> Result<Option<VolumeFiles>, String> {
    let namespace = inputs
        .pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    if let Some(source) = &volume.config_map {
        let data = inputs.objects.config_map(namespace, &source.name);
        return keyed_files(
            "ConfigMap",
            &source.name,
            data,
            source.items.as_deref(),
            source.optional,
        )
        .map(Some);
    }
    if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        let data = inputs.objects.secret(namespace, &name);
        return keyed_files(
            "Secret",
            &name,
            data,
            source.items.as_deref(),
            source.optional,
        )
        .map(Some);
    }
    if let Some(source) = &volume.downward_api {
        return Ok(Some(downward_files(source.items.as_deref(), inputs)));
    }
    if let Some(projected) = &volume.projected {
        let mut files = VolumeFiles::new();
        for source in projected.sources.iter().flatten() {
            if let Some(ConfigMapProjection {
                name,
                items,
                optional,
            }) = &source.config_map
            {
                let data = inputs.objects.config_map(namespace, name);
                files.extend(keyed_files(
                    "ConfigMap",
                    name,
                    data,
                    items.as_deref(),
                    *optional,
                )?);
            }
            if let Some(SecretProjection {
                name,
                items,
                optional,
            }) = &source.secret
            {
                let data = inputs.objects.secret(namespace, name);
                files.extend(keyed_files(
                    "Secret",
                    name,
                    data,
                    items.as_deref(),
                    *optional,
                )?);
            }
            if let Some(downward) = &source.downward_api {
                files.extend(downward_files(downward.items.as_deref(), inputs));
            }
            if let Some(token) = &source.service_account_token {
                let key = (volume.name.clone(), token.path.clone());
                let value = inputs
                    .tokens
                    .get(&key)
                    .ok_or_else(|| format!("token for volume {} is not issued yet", volume.name))?;
                files.insert(token.path.clone(), value.clone().into_bytes());
            }
        }
        return Ok(Some(files));
    }
    Ok(None)
}

fn keyed_files(
    kind: &str,
    name: &str,
    data: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
) -> Result<VolumeFiles, String> {
    let Some(data) = data else {
        return if optional == Some(true) {
            Ok(VolumeFiles::new())
        } else {
            Err(format!("{kind} {name} not found"))
        };
    };
    match items {
        Some(items) if !items.is_empty() => {
            let mut files = VolumeFiles::new();
            for item in items {
                match data.get(&item.key) {
                    Some(value) => {
                        files.insert(item.path.clone(), value.clone());
                    }
                    None if optional == Some(true) => {}
                    None => return Err(format!("{kind} {name} has no key {}", item.key)),
                }
            }
            Ok(files)
        }
        _ => Ok(data),
    }
}

fn downward_files(
    items: Option<&[DownwardAPIVolumeFile]>,
    inputs: &VolumeInputs<'_>,
) -> VolumeFiles {
    items
        .into_iter()
        .flatten()
        .filter_map(|item| {
            let field = item.field_ref.as_ref()?;
            let value = field_value(inputs.pod, &field.field_path, inputs.pod_ip)?;
            Some((item.path.clone(), value.into_bytes()))
        })
        .collect()
}

/// Makes `dir` hold exactly `files`: writes what changed, removes what is no longer there.
/// Returns whether anything changed.
pub fn sync_dir(dir: &Path, files: &VolumeFiles) -> Result<bool, PodRunnerError> {
    std::fs::create_dir_all(dir).map_err(|e| PodRunnerError::io("cannot create", dir, e))?;
    let mut changed = false;
    for (relative, content) in files {
        let path = dir.join(relative);
        if std::fs::read(&path).ok().as_deref() == Some(content.as_slice()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| PodRunnerError::io("cannot create", parent, e))?;
        }
        let temporary = temporary_path(&path);
        std::fs::write(&temporary, content)
            .map_err(|e| PodRunnerError::io("cannot write", &temporary, e))?;
        std::fs::rename(&temporary, &path)
            .map_err(|e| PodRunnerError::io("cannot rename into", &path, e))?;
        changed = true;
    }
    for existing in files_under(dir) {
        let relative = existing
            .strip_prefix(dir)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !files.contains_key(&relative) {
            std::fs::remove_file(&existing)
                .map_err(|e| PodRunnerError::io("cannot remove", &existing, e))?;
            changed = true;
        }
    }
    Ok(changed)
}

fn temporary_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("..{name}.tmp"))
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(path),
                Ok(_) => found.push(path),
                Err(_) => {}
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(BTreeMap<String, Vec<u8>>);

    impl ObjectData for Fixed {
        fn config_map(&self, _: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
            (name == "boot").then(|| self.0.clone())
        }
        fn secret(&self, _: &str, _: &str) -> Option<BTreeMap<String, Vec<u8>>> {
            None
        }
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop"},
            "spec": {"containers": [], "volumes": [
                {"name": "boot", "configMap": {"name": "boot"}},
                {"name": "tls", "secret": {"secretName": "tls"}},
                {"name": "token", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "audience": "meshplane-blue"}},
                    {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}
                ]}},
                {"name": "scratch", "emptyDir": {}}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn volumes_resolve_from_their_sources() {
        let pod = pod();
        let data = Fixed([("envoy.yaml".to_string(), b"admin: {}".to_vec())].into());
        let tokens = [(
            ("token".to_string(), "token".to_string()),
            "tok".to_string(),
        )]
        .into();
        let inputs = VolumeInputs {
            pod: &pod,
            pod_ip: Ipv4Addr::LOCALHOST,
            objects: &data,
            tokens: &tokens,
        };
        let volumes = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap();
        let boot = volume_files(&volumes[0], &inputs).unwrap().unwrap();
        assert_eq!(boot["envoy.yaml"], b"admin: {}");
        assert_eq!(
            volume_files(&volumes[1], &inputs).unwrap_err(),
            "Secret tls not found"
        );
        let projected = volume_files(&volumes[2], &inputs).unwrap().unwrap();
        assert_eq!(projected["token"], b"tok");
        assert_eq!(projected["name"], b"web-1");
        assert!(volume_files(&volumes[3], &inputs).unwrap().is_none());
        assert_eq!(
            token_projections(&pod),
            vec![TokenProjection {
                volume: "token".into(),
                path: "token".into(),
                audience: Some("meshplane-blue".into()),
                expiration_seconds: None
            }]
        );
    }

    #[test]
    fn sync_dir_writes_changes_and_removes_stale_files() {
        let dir = std::env::temp_dir().join(format!("podrunner-sync-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first: VolumeFiles = [
            ("a".to_string(), b"1".to_vec()),
            ("b".to_string(), b"2".to_vec()),
        ]
        .into();
        assert!(sync_dir(&dir, &first).unwrap());
        assert!(
            !sync_dir(&dir, &first).unwrap(),
            "unchanged content must not be rewritten"
        );
        let second: VolumeFiles = [("a".to_string(), b"3".to_vec())].into();
        assert!(sync_dir(&dir, &second).unwrap());
        assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"3");
        assert!(!dir.join("b").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
