//! `GatewayClass` (`gateway.networking.k8s.io/v1`, cluster-scoped): a kind of Gateway and the
//! controller that implements it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::*;

/// A class of Gateways, implemented by the controller it names.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "GatewayClass",
    plural = "gatewayclasses",
    doc = "A class of Gateways and the controller implementing it (Kubernetes Gateway API).",
    shortname = "gc",
    status = "GatewayClassStatus",
    category = "gateway-api",
    printcolumn = r#"{"name":"Controller","type":"string","jsonPath":".spec.controllerName"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Description","type":"string","jsonPath":".spec.description","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    /// The controller implementing the class (`meshplane.io/gateway-controller`). Immutable.
    #[schemars(length(min = 1, max = 253), regex(pattern = CONTROLLER_NAME_PATTERN))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "Value is immutable"}]))]
    pub controller_name: String,
    /// Parameters of the class, an object the controller understands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_ref: Option<ParametersReference>,
    /// A short description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub description: Option<String>,
}

/// A reference to the parameters of a class (a namespaced object names its namespace).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParametersReference {
    /// API group of the object.
    #[schemars(length(max = 253), regex(pattern = GROUP_PATTERN))]
    pub group: String,
    /// Kind of the object.
    #[schemars(length(min = 1, max = 63), regex(pattern = KIND_PATTERN))]
    pub kind: String,
    /// Name of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of a namespaced object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = NAMESPACE_PATTERN))]
    pub namespace: Option<String>,
}

/// Observed state of a class, written by its controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassStatus {
    /// `Accepted` (the controller takes the class).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Features of the specification the controller supports for this class (experimental
    /// channel).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub supported_features: Vec<SupportedFeature>,
}

/// One supported feature, by its name in the specification's conformance suite.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct SupportedFeature {
    /// Feature name (`HTTPRoute`, `MeshHTTPRoute`, ...).
    pub name: String,
}
