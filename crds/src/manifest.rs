//! Multi-document Kubernetes YAML into typed objects: samples, the xds-server's directory
//! source, and tests.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::controlplane::{MeshControlPlane, MeshRevisionTag};
use crate::networking::{
    DestinationRule, EnvoyFilter, Gateway, ServiceEntry, Sidecar, VirtualService,
};

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The text is not YAML.
    #[error("invalid YAML: {0}")]
    Yaml(String),
    /// A document is not an object with `apiVersion` and `kind`.
    #[error("document {index}: not a Kubernetes object (needs apiVersion and kind)")]
    NotAnObject { index: usize },
    /// A document does not match the schema of its kind.
    #[error("{kind} {name:?}: {source}")]
    Decode {
        kind: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A meshplane object, or any other Kubernetes object kept as JSON.
#[derive(Debug, Clone)]
pub enum Object {
    /// `meshplane.io/v1alpha1` MeshControlPlane.
    MeshControlPlane(Box<MeshControlPlane>),
    /// `meshplane.io/v1alpha1` MeshRevisionTag.
    MeshRevisionTag(Box<MeshRevisionTag>),
    /// `networking.meshplane.io/v1alpha1` ServiceEntry.
    ServiceEntry(Box<ServiceEntry>),
    /// `networking.meshplane.io/v1alpha1` EnvoyFilter.
    EnvoyFilter(Box<EnvoyFilter>),
    /// `networking.meshplane.io/v1alpha1` Sidecar.
    Sidecar(Box<Sidecar>),
    /// `networking.meshplane.io/v1alpha1` VirtualService.
    VirtualService(Box<VirtualService>),
    /// `networking.meshplane.io/v1alpha1` DestinationRule.
    DestinationRule(Box<DestinationRule>),
    /// `networking.meshplane.io/v1alpha1` Gateway.
    Gateway(Box<Gateway>),
    /// Anything else (Namespace, Service, EndpointSlice, Pod, ...).
    Other(Value),
}

/// Parses every non-empty document of a YAML stream into JSON values.
pub fn parse_documents(yaml: &str) -> Result<Vec<Value>, ManifestError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| ManifestError::Yaml(e.to_string()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// Decodes a JSON object into a typed Kubernetes object, naming it in the error.
pub fn decode<T: DeserializeOwned>(doc: &Value) -> Result<T, ManifestError> {
    serde_json::from_value(doc.clone()).map_err(|source| ManifestError::Decode {
        kind: doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string(),
        name: doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string(),
        source,
    })
}

/// Parses a YAML stream into typed objects; meshplane kinds are decoded strictly by their
/// `apiVersion` and `kind`, other kinds are kept as JSON.
pub fn parse_objects(yaml: &str) -> Result<Vec<Object>, ManifestError> {
    parse_documents(yaml)?
        .iter()
        .enumerate()
        .map(|(index, doc)| {
            let api_version = doc.get("apiVersion").and_then(Value::as_str);
            let kind = doc.get("kind").and_then(Value::as_str);
            let (Some(api_version), Some(kind)) = (api_version, kind) else {
                return Err(ManifestError::NotAnObject { index });
            };
            Ok(match (api_version, kind) {
                ("meshplane.io/v1alpha1", "MeshControlPlane") => {
                    Object::MeshControlPlane(Box::new(decode(doc)?))
                }
                ("meshplane.io/v1alpha1", "MeshRevisionTag") => {
                    Object::MeshRevisionTag(Box::new(decode(doc)?))
                }
                ("networking.meshplane.io/v1alpha1", "ServiceEntry") => {
                    Object::ServiceEntry(Box::new(decode(doc)?))
                }
                ("networking.meshplane.io/v1alpha1", "EnvoyFilter") => {
                    Object::EnvoyFilter(Box::new(decode(doc)?))
                }
                ("networking.meshplane.io/v1alpha1", "Sidecar") => {
                    Object::Sidecar(Box::new(decode(doc)?))
                }
                ("networking.meshplane.io/v1alpha1", "VirtualService") => {
                    Object::VirtualService(Box::new(decode(doc)?))
                }
                ("networking.meshplane.io/v1alpha1", "DestinationRule") => {
                    Object::DestinationRule(Box::new(decode(doc)?))
                }
                ("networking.meshplane.io/v1alpha1", "Gateway") => {
                    Object::Gateway(Box::new(decode(doc)?))
                }
                _ => Object::Other(doc.clone()),
            })
        })
        .collect()
}
