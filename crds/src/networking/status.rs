//! Status of networking config: whether the tenant's instance could apply it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition type saying whether the config applies (`True`) or why not (`False`).
pub const ACCEPTED: &str = "Accepted";

/// Observed state of a VirtualService, DestinationRule or Gateway, written by the tenant's
/// instance.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    /// Generation of the spec the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`: `True`, or `False` with a reason such as `HostConflict`, `UnknownSubset`,
    /// `NamespaceNotAllowed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
