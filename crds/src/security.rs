//! `security.meshplane.io/v1alpha1`: the workload-identity policies, field-compatible with
//! Istio's `security.istio.io`, so a manifest ports by changing `apiVersion`.
//!
//! | kind | fields |
//! |---|---|
//! | `PeerAuthentication` | `selector.matchLabels`, `mtls.mode`, `portLevelMtls.<port>.mode` (`UNSET`, `DISABLE`, `PERMISSIVE`, `STRICT`) |
//! | `RequestAuthentication` ([`request_authentication`]) | `selector.matchLabels`, `jwtRules[]` (issuer, audiences, `jwksUri`/`jwks`, `fromHeaders`/`fromParams`/`fromCookies`, `outputPayloadToHeader`, `forwardOriginalToken`, `outputClaimToHeaders`, `timeout`) |
//! | `AuthorizationPolicy` ([`authorization`]) | `selector.matchLabels`, `action` (`ALLOW`, `DENY`, `AUDIT`, `CUSTOM` with `provider.name`), the `istio.io/dry-run` annotation, `rules[].from[].source`, `rules[].to[].operation`, `rules[].when[]` |
//!
//! Which PeerAuthentication applies to a workload, and how `UNSET` inherits, is decided in one
//! place: [`effective_mtls`]; which AuthorizationPolicies apply, in
//! [`authorization::applicable_policies`].

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::networking::status::ConfigStatus;

pub mod authorization;
pub mod request_authentication;

pub use authorization::{AuthorizationAction, AuthorizationPolicy, AuthorizationPolicySpec};
pub use request_authentication::{
    JwtRule, RequestAuthentication, RequestAuthenticationSpec, RequestAuthenticationStatus,
};

/// How a workload's proxy accepts inbound connections.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    /// Inherit from the enclosing policy (namespace, then tenant; PERMISSIVE at the top).
    #[default]
    Unset,
    /// Plaintext only: no mutual TLS is terminated.
    Disable,
    /// Mutual TLS and plaintext are both accepted.
    Permissive,
    /// Mutual TLS only: plaintext connections are refused.
    Strict,
}

impl MtlsMode {
    /// The mode's spelling in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            MtlsMode::Unset => "UNSET",
            MtlsMode::Disable => "DISABLE",
            MtlsMode::Permissive => "PERMISSIVE",
            MtlsMode::Strict => "STRICT",
        }
    }
}

/// Mutual TLS settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MutualTls {
    /// The mode; `UNSET` inherits.
    #[serde(default)]
    pub mode: MtlsMode,
}

/// Selects workloads (pods) by labels in the policy's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelsSelector {
    /// Pod labels that must all match.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

impl LabelsSelector {
    /// Whether an optional selector takes a workload with `labels`: no selector takes every
    /// workload of the object's scope.
    pub fn admits(sel: &Option<LabelsSelector>, labels: &BTreeMap<String, String>) -> bool {
        match sel {
            None => true,
            Some(s) => s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)),
        }
    }
}

/// The objects that reach a workload with `labels` in `namespace`, in a stable order
/// (namespace, then name): those of its own namespace and of the control namespace
/// (tenant-wide) whose selector, if any, takes the workload.
pub fn in_workload_scope<'a, K: kube::Resource>(
    objects: impl IntoIterator<Item = &'a K>,
    selector: impl Fn(&K) -> &Option<LabelsSelector>,
    control_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a K> {
    let mut out: Vec<&K> = objects
        .into_iter()
        .filter(|o| {
            let ns = o.meta().namespace.as_deref();
            (ns == Some(namespace) || ns == Some(control_namespace))
                && LabelsSelector::admits(selector(o), labels)
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.meta().namespace, &a.meta().name).cmp(&(&b.meta().namespace, &b.meta().name))
    });
    out
}

/// How the selected workloads (or the whole namespace, or the whole tenant from the control
/// namespace) accept connections from their peers.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "security.meshplane.io",
    version = "v1alpha1",
    kind = "PeerAuthentication",
    doc = "How workloads accept connections from their peers: mutual TLS STRICT, PERMISSIVE or DISABLE (Istio-compatible).",
    namespaced,
    status = "ConfigStatus",
    shortname = "pa",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mtls.mode"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    /// Workloads of the namespace this policy applies to; absent: the whole namespace (or the
    /// whole tenant in the control namespace, where a selector is ignored as in Istio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelsSelector>,
    /// The mode for every port of the selected workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls: Option<MutualTls>,
    /// Modes of single workload ports (the container port the application listens on), by
    /// port number. Honoured only with a `selector`, as in Istio.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(k, k.matches('^[0-9]+$') && int(k) >= 1 && int(k) <= 65535)",
        "message": "portLevelMtls keys must be port numbers (1-65535)"
    }]))]
    pub port_level_mtls: BTreeMap<String, MutualTls>,
}

impl PeerAuthenticationSpec {
    fn mode(&self) -> MtlsMode {
        self.mtls.as_ref().map(|m| m.mode).unwrap_or_default()
    }
}

/// The mutual TLS modes in force on one workload: the workload-wide mode and the overrides of
/// single ports, both resolved (never `UNSET`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadMtls {
    /// The mode of every port without an override.
    pub mode: MtlsMode,
    /// Overrides by workload (target) port.
    pub ports: BTreeMap<u32, MtlsMode>,
}

impl Default for WorkloadMtls {
    fn default() -> Self {
        Self {
            mode: MtlsMode::Permissive,
            ports: BTreeMap::new(),
        }
    }
}

impl WorkloadMtls {
    /// The mode on workload port `port`.
    pub fn port_mode(&self, port: u32) -> MtlsMode {
        self.ports.get(&port).copied().unwrap_or(self.mode)
    }
}

/// The oldest of several policies (creation time, then name), as Istio breaks ties.
fn oldest<'a>(
    policies: impl Iterator<Item = &'a PeerAuthentication>,
) -> Option<&'a PeerAuthentication> {
    policies.min_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    })
}

fn selects(pa: &PeerAuthentication, labels: &BTreeMap<String, String>) -> bool {
    pa.spec.selector.as_ref().is_some_and(|s| {
        !s.match_labels.is_empty() && s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    })
}

fn namespace_wide(pa: &PeerAuthentication) -> bool {
    pa.spec
        .selector
        .as_ref()
        .is_none_or(|s| s.match_labels.is_empty())
}

/// The mutual TLS modes of a workload with `labels` in `namespace`, from the tenant's
/// policies (`policies` may hold any namespace's; only the workload's and the control
/// namespace's count).
///
/// Istio's rules: the tenant-wide policy (control namespace, no selector), overridden by the
/// namespace-wide one (no selector), overridden by a workload policy (selector matching the
/// labels); at one level the oldest policy wins; `UNSET` inherits from the level above;
/// PERMISSIVE when nothing says otherwise. Port-level modes come from the workload policy
/// only, and an `UNSET` port inherits the workload's mode.
pub fn effective_mtls<'a>(
    policies: impl IntoIterator<Item = &'a PeerAuthentication>,
    control_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> WorkloadMtls {
    let policies: Vec<&PeerAuthentication> = policies.into_iter().collect();
    let in_ns = |ns: &str| -> Vec<&'a PeerAuthentication> {
        policies
            .iter()
            .copied()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .collect()
    };
    let tenant = oldest(
        in_ns(control_namespace)
            .into_iter()
            .filter(|p| namespace_wide(p)),
    );
    let ns_wide = oldest(in_ns(namespace).into_iter().filter(|p| namespace_wide(p)));
    // Istio ignores selectors in the root namespace.
    let workload = (namespace != control_namespace)
        .then(|| oldest(in_ns(namespace).into_iter().filter(|p| selects(p, labels))))
        .flatten();

    let mut mode = MtlsMode::Permissive;
    for level in [tenant, ns_wide, workload].into_iter().flatten() {
        if level.spec.mode() != MtlsMode::Unset {
            mode = level.spec.mode();
        }
    }
    let ports = workload
        .map(|w| {
            w.spec
                .port_level_mtls
                .iter()
                .filter_map(|(port, m)| {
                    let port = port
                        .parse::<u32>()
                        .ok()
                        .filter(|p| (1..=65535).contains(p))?;
                    let m = if m.mode == MtlsMode::Unset {
                        mode
                    } else {
                        m.mode
                    };
                    Some((port, m))
                })
                .collect()
        })
        .unwrap_or_default();
    WorkloadMtls { mode, ports }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn mk_pa(
        ns: &str,
        name: &str,
        age: i64,
        selector: &[(&str, &str)],
        mode: MtlsMode,
    ) -> PeerAuthentication {
        let mut pa = PeerAuthentication::new(
            name,
            PeerAuthenticationSpec {
                selector: (!selector.is_empty()).then(|| LabelsSelector {
                    match_labels: selector
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                }),
                mtls: Some(MutualTls { mode }),
                port_level_mtls: BTreeMap::new(),
            },
        );
        pa.metadata.namespace = Some(ns.into());
        pa.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 - age).expect("time"),
        ));
        pa
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const ROOT: &str = "meshplane-blue";

    #[test]
    fn permissive_when_no_policy_says_otherwise() {
        let none: Vec<PeerAuthentication> = vec![];
        assert_eq!(
            effective_mtls(&none, ROOT, "shop", &labels(&[])),
            WorkloadMtls::default()
        );
        let unset = [mk_pa("shop", "default", 0, &[], MtlsMode::Unset)];
        assert_eq!(
            effective_mtls(&unset, ROOT, "shop", &labels(&[])).mode,
            MtlsMode::Permissive
        );
    }

    #[test]
    fn workload_overrides_namespace_overrides_tenant() {
        let policies = [
            mk_pa(ROOT, "mesh", 0, &[], MtlsMode::Strict),
            mk_pa("shop", "default", 0, &[], MtlsMode::Permissive),
            mk_pa("shop", "db", 0, &[("app", "db")], MtlsMode::Disable),
        ];
        assert_eq!(
            effective_mtls(&policies, ROOT, "bank", &labels(&[])).mode,
            MtlsMode::Strict,
            "tenant-wide"
        );
        assert_eq!(
            effective_mtls(&policies, ROOT, "shop", &labels(&[("app", "web")])).mode,
            MtlsMode::Permissive
        );
        assert_eq!(
            effective_mtls(&policies, ROOT, "shop", &labels(&[("app", "db")])).mode,
            MtlsMode::Disable
        );
    }

    #[test]
    fn unset_inherits_and_the_oldest_policy_of_a_level_wins() {
        let policies = [
            mk_pa(ROOT, "mesh", 0, &[], MtlsMode::Strict),
            mk_pa("shop", "new", 10, &[], MtlsMode::Disable),
            mk_pa("shop", "old", 20, &[], MtlsMode::Unset),
        ];
        // `old` wins the namespace level and inherits STRICT from the tenant.
        assert_eq!(
            effective_mtls(&policies, ROOT, "shop", &labels(&[])).mode,
            MtlsMode::Strict
        );
    }

    #[test]
    fn selectors_in_the_control_namespace_and_other_namespaces_do_not_apply() {
        let policies = [
            mk_pa(ROOT, "mesh-web", 0, &[("app", "web")], MtlsMode::Strict),
            mk_pa("bank", "default", 0, &[], MtlsMode::Strict),
            mk_pa("bank", "web", 0, &[("app", "web")], MtlsMode::Strict),
        ];
        assert_eq!(
            effective_mtls(&policies, ROOT, "shop", &labels(&[("app", "web")])).mode,
            MtlsMode::Permissive
        );
    }

    #[test]
    fn port_level_modes_come_from_the_workload_policy_and_unset_ports_inherit() {
        let mut pa = mk_pa("shop", "web", 0, &[("app", "web")], MtlsMode::Strict);
        pa.spec.port_level_mtls = BTreeMap::from([
            (
                "8080".to_string(),
                MutualTls {
                    mode: MtlsMode::Disable,
                },
            ),
            (
                "9090".to_string(),
                MutualTls {
                    mode: MtlsMode::Unset,
                },
            ),
        ]);
        let mut ns_wide = mk_pa("shop", "default", 0, &[], MtlsMode::Permissive);
        ns_wide.spec.port_level_mtls = BTreeMap::from([(
            "7070".to_string(),
            MutualTls {
                mode: MtlsMode::Strict,
            },
        )]);
        let got = effective_mtls(&[pa, ns_wide], ROOT, "shop", &labels(&[("app", "web")]));
        assert_eq!(got.mode, MtlsMode::Strict);
        assert_eq!(got.port_mode(8080), MtlsMode::Disable);
        assert_eq!(got.port_mode(9090), MtlsMode::Strict);
        assert_eq!(
            got.port_mode(7070),
            MtlsMode::Strict,
            "namespace-wide port modes are ignored"
        );
        assert_eq!(got.ports.len(), 2);
    }

    #[test]
    fn manifests_use_istio_field_names() {
        let pa: PeerAuthentication = serde_json::from_value(serde_json::json!({
            "apiVersion": "security.meshplane.io/v1alpha1",
            "kind": "PeerAuthentication",
            "metadata": {"name": "default", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"},
                     "portLevelMtls": {"8080": {"mode": "DISABLE"}}},
        }))
        .expect("parses");
        assert_eq!(pa.spec.mode(), MtlsMode::Strict);
        assert_eq!(pa.spec.port_level_mtls["8080"].mode, MtlsMode::Disable);
    }
}
