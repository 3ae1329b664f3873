//! Config that cannot apply or crosses the tenant boundary: objects the mesh skips, the
//! validating webhook's rules (`meshplane_webhooks::validate`) applied to what is stored (config
//! written before its namespace joined, or while the webhook was unreachable), Sidecars that
//! shadow each other, and EnvoyFilter patches rendered against the proxies they select.

use std::collections::BTreeMap;

use meshplane_crds::envoyfilter_policy::EnvoyFilterPolicy;
use meshplane_crds::membership::TenantMembership;
use meshplane_crds::Sidecar;
use meshplane_webhooks::validate::{validate_config, ConfigKind, ConfigViolation};
use meshplane_webhooks::StaticTenant;
use meshplane_xds_core::model::Object;

use super::codes;
use super::{Context, Finding};
use crate::render::{self, Workload};
use crate::state::{Decoded, Entry};

/// The tenant whose namespace (member or control) `namespace` is.
fn tenant_of<'a>(
    cx: &'a Context<'_>,
    namespace: &str,
) -> Option<(&'a String, &'a TenantMembership)> {
    cx.membership
        .tenants
        .iter()
        .find(|(_, t)| t.control_namespace == namespace || t.members.contains(namespace))
}

/// The EnvoyFilter policies of the revisions that read config in `namespace`: the revisions
/// attached to it, or every revision of the tenant for its control namespace; the safe default
/// when no MeshControlPlane of the tenant is known.
fn revision_policies(
    cx: &Context<'_>,
    tenant: &str,
    namespace: &str,
) -> Vec<(String, EnvoyFilterPolicy)> {
    let mut out: Vec<(String, EnvoyFilterPolicy)> =
        cx.state
            .control_planes()
            .into_iter()
            .filter(|m| m.spec.tenant == tenant)
            .filter(|m| {
                cx.membership.revisions.get(&m.revision()).is_some_and(|r| {
                    r.control_namespace == namespace || r.attached.contains(namespace)
                })
            })
            .map(|m| (m.revision(), m.spec.mesh_config.envoy_filter_policy.clone()))
            .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    if out.is_empty() {
        out.push((String::new(), EnvoyFilterPolicy::default()));
    }
    out
}

fn api_group(entry: &Entry) -> &str {
    entry
        .raw
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .and_then(|v| v.split_once('/'))
        .map_or("", |(g, _)| g)
}

pub(super) fn check(cx: &Context<'_>, out: &mut Vec<Finding>) {
    for (file, reason) in &cx.state.unreadable {
        // Parsers explain over several lines (a snippet of the file); the first says what.
        let first = reason.lines().next().unwrap_or_default();
        out.push(
            Finding::new(codes::INVALID_CONFIG, format!("file {file}"), first).at(file.clone()),
        );
    }
    for entry in &cx.state.entries {
        if let Decoded::Invalid(reason) = &entry.decoded {
            out.push(
                Finding::new(
                    codes::INVALID_CONFIG,
                    entry.describe(),
                    format!("{reason}; the mesh skips this object"),
                )
                .at(entry.origin.clone()),
            );
        }
        if !entry.is_mesh_config() {
            continue;
        }
        let namespace = entry.namespace().unwrap_or("default");
        let Some((tenant, t)) = tenant_of(cx, namespace) else {
            out.push(
                Finding::new(
                    codes::CONFIG_OUTSIDE_MESH,
                    entry.describe(),
                    format!(
                        "namespace {namespace:?} belongs to no tenant, so no instance reads this {}",
                        entry.kind()
                    ),
                )
                .at(entry.origin.clone()),
            );
            continue;
        };
        let Some(kind) = ConfigKind::from_group_kind(api_group(entry), entry.kind()) else {
            continue;
        };
        let view = StaticTenant::new(
            tenant.clone(),
            t.control_namespace.clone(),
            t.members.iter().cloned(),
        );
        // Each revision reading the object holds it to its own EnvoyFilter policy: a member
        // namespace's revisions, or every revision of the tenant for the control namespace.
        let policies = revision_policies(cx, tenant, namespace);
        let mut reported = std::collections::BTreeSet::new();
        for (revision, policy) in &policies {
            let view = view.clone().with_envoy_filter_policy(policy.clone());
            let Err(violations) = validate_config(kind, &entry.raw, &view) else {
                continue;
            };
            let already_invalid = matches!(entry.decoded, Decoded::Invalid(_));
            for v in violations {
                let (code, message) = match &v {
                    ConfigViolation::ForeignNamespace { .. } => {
                        (codes::CROSS_TENANT_REFERENCE, v.to_string())
                    }
                    ConfigViolation::ProxySelection { .. } => {
                        (codes::UNSUPPORTED_PROXY_SELECTION, v.to_string())
                    }
                    ConfigViolation::Policy(p) => (
                        codes::ENVOY_FILTER_BEYOND_POLICY,
                        format!("revision {revision:?}: {p}"),
                    ),
                    // The same cause as the decode failure reported above.
                    _ if already_invalid => continue,
                    _ => (codes::INVALID_CONFIG, v.to_string()),
                };
                if reported.insert((code.id, message.clone())) {
                    out.push(
                        Finding::new(code, entry.describe(), message).at(entry.origin.clone()),
                    );
                }
            }
        }
    }
    conflicting_sidecars(cx, out);
    envoy_filter_patches(cx, out);
}

fn sidecar_rank(
    s: &Sidecar,
) -> (
    Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    String,
) {
    (
        s.metadata.creation_timestamp.clone(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

fn sidecar_id(s: &Sidecar) -> String {
    format!(
        "Sidecar {}/{}",
        s.metadata.namespace.as_deref().unwrap_or_default(),
        s.metadata.name.as_deref().unwrap_or_default()
    )
}

fn origin_of(cx: &Context<'_>, kind: &str, namespace: &str, name: &str) -> Option<String> {
    cx.state
        .entries
        .iter()
        .rev()
        .find(|e| e.kind() == kind && e.namespace() == Some(namespace) && e.name() == name)
        .map(|e| e.origin.clone())
}

fn with_origin(cx: &Context<'_>, f: Finding, kind: &str, namespace: &str, name: &str) -> Finding {
    match origin_of(cx, kind, namespace, name) {
        Some(o) => f.at(o),
        None => f,
    }
}

/// Sidecars without a workloadSelector beyond the oldest of a namespace, and pods selected by
/// several Sidecars: the translator takes the oldest, the others do nothing for them.
fn conflicting_sidecars(cx: &Context<'_>, out: &mut Vec<Finding>) {
    let mut by_namespace: BTreeMap<String, Vec<&Sidecar>> = BTreeMap::new();
    for o in cx.state.objects() {
        if let Object::Sidecar(s) = o {
            let ns = s.metadata.namespace.clone().unwrap_or_default();
            if tenant_of(cx, &ns).is_some() {
                by_namespace.entry(ns).or_default().push(s);
            }
        }
    }
    for (ns, mut sidecars) in by_namespace {
        sidecars.sort_by_key(|s| sidecar_rank(s));
        let defaults: Vec<&&Sidecar> = sidecars
            .iter()
            .filter(|s| s.spec.workload_selector.is_none())
            .collect();
        if let Some((oldest, rest)) = defaults.split_first() {
            for s in rest {
                let name = s.metadata.name.clone().unwrap_or_default();
                let f = Finding::new(
                    codes::CONFLICTING_SIDECARS,
                    sidecar_id(s),
                    format!(
                        "namespace {ns:?} has several Sidecars without workloadSelector; only the oldest, {:?}, applies",
                        oldest.metadata.name.as_deref().unwrap_or_default()
                    ),
                );
                out.push(with_origin(cx, f, "Sidecar", &ns, &name));
            }
        }
        for pod in cx.state.pods() {
            if pod.metadata.namespace.as_deref() != Some(ns.as_str()) {
                continue;
            }
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            let selecting: Vec<&&Sidecar> = sidecars
                .iter()
                .filter(|s| {
                    s.spec
                        .workload_selector
                        .as_ref()
                        .is_some_and(|sel| sel.labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
                })
                .collect();
            if let Some((first, rest)) = selecting.split_first() {
                for s in rest {
                    let name = s.metadata.name.clone().unwrap_or_default();
                    let f = Finding::new(
                        codes::CONFLICTING_SIDECARS,
                        sidecar_id(s),
                        format!(
                            "pod {ns}/{} is also selected by the older Sidecar {:?}, which applies instead",
                            pod.metadata.name.as_deref().unwrap_or_default(),
                            first.metadata.name.as_deref().unwrap_or_default()
                        ),
                    );
                    out.push(with_origin(cx, f, "Sidecar", &ns, &name));
                }
            }
        }
    }
}

/// Renders every distinct workload of each tenant (and, for an EnvoyFilter that selects no
/// running pod, a workload with its selector's labels) and reports the patches that failed.
fn envoy_filter_patches(cx: &Context<'_>, out: &mut Vec<Finding>) {
    for (tenant, t) in &cx.membership.tenants {
        let filters: Vec<&meshplane_crds::EnvoyFilter> = cx
            .state
            .objects()
            .into_iter()
            .filter_map(|o| match o {
                Object::EnvoyFilter(f) => Some(f.as_ref()),
                _ => None,
            })
            .filter(|f| {
                let ns = f.metadata.namespace.as_deref().unwrap_or_default();
                ns == t.control_namespace || t.members.contains(ns)
            })
            .collect();
        if filters.is_empty() {
            continue;
        }
        let Some(revision) = t.revisions.iter().next() else {
            continue;
        };
        let index = render::tenant_index(cx.state, tenant, revision, &t.control_namespace);
        // One workload per distinct (namespace, labels, capture): they render alike.
        type Key = (String, BTreeMap<String, String>, bool);
        let key = |w: &Workload| -> Key {
            (
                w.namespace.clone(),
                w.labels.clone(),
                w.capture_mode == meshplane_crds::networking::CaptureMode::None,
            )
        };
        let mut workloads: BTreeMap<Key, Workload> = BTreeMap::new();
        for pod in cx.state.pods() {
            let w = Workload::from_pod(pod);
            if t.members.contains(&w.namespace) {
                workloads.entry(key(&w)).or_insert(w);
            }
        }
        for f in &filters {
            let ns = f.metadata.namespace.clone().unwrap_or_default();
            let labels = f
                .spec
                .workload_selector
                .as_ref()
                .map(|s| s.labels.clone())
                .unwrap_or_default();
            let target_ns = if ns == t.control_namespace {
                t.members.iter().next().cloned().unwrap_or(ns)
            } else {
                ns
            };
            let selected = workloads.values().any(|w| {
                w.namespace == target_ns && labels.iter().all(|(k, v)| w.labels.get(k) == Some(v))
            });
            if !selected {
                let w = Workload::hypothetical(&target_ns, labels);
                workloads.entry(key(&w)).or_insert(w);
            }
        }
        // (filter, patch index, reason) -> workloads it failed for.
        let mut failed: BTreeMap<(String, usize, String), Vec<String>> = BTreeMap::new();
        for workload in workloads.values() {
            let (_, errors) = index.render_checked(&workload.node());
            for e in errors {
                failed
                    .entry((e.filter.clone(), e.index, e.reason.clone()))
                    .or_default()
                    .push(workload.describe());
            }
        }
        for ((filter, index, reason), targets) in failed {
            let (ns, name) = filter.split_once('/').unwrap_or(("", filter.as_str()));
            let f = Finding::new(
                codes::ENVOY_FILTER_PATCH_NOT_APPLIED,
                format!("EnvoyFilter {filter}"),
                format!(
                    "configPatches[{index}]: {reason} (for {} workload{}, e.g. {})",
                    targets.len(),
                    if targets.len() == 1 { "" } else { "s" },
                    targets[0]
                ),
            );
            out.push(with_origin(cx, f, "EnvoyFilter", ns, name));
        }
    }
}
