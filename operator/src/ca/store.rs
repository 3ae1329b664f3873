//! The tenant CA Secret in the API: read, then created or replaced as [`plan_tenant_ca`] says.
//!
//! Two revisions of a tenant may reconcile at once. A create that loses (409 AlreadyExists) and
//! a replace that loses (409 Conflict on the resourceVersion it read) both read again and plan
//! again from the winner's content, so the tenant never has two roots in flight.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use meshplane_ca::authority::ROOT_CERT;
use meshplane_ca::rotation::{CaSecretState, RotationPolicy};
use meshplane_crds::names;
use time::OffsetDateTime;

use super::plan::{plan_tenant_ca, CaPlan, CaProblem, CaSource, TenantCaInput};

/// Attempts before a race that keeps being lost is reported.
const ATTEMPTS: usize = 4;

/// The tenant CA as the reconcile leaves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantCa {
    /// `root-cert.pem`: the trust bundle for the bootstrap ConfigMaps; `None` while the tenant
    /// has no CA yet.
    pub trust_bundle: Option<String>,
    /// Bad input that keeps the Secret as it is (a missing or unusable plugged Secret).
    pub problem: Option<CaProblem>,
    /// What this call wrote (`created` or `updated`), for an Event; `None` when nothing.
    pub written: Option<&'static str>,
    /// The rotation phase recorded on the Secret (self-signed CAs).
    pub phase: Option<String>,
}

/// Why the tenant CA could not be ensured.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{action} Secret {namespace}/{name}: {source}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the tenant CA Secret {0} kept changing under the operator")]
    Contended(String),
}

impl StoreError {
    /// The control namespace does not exist yet (the first reconcile creates it).
    pub fn is_namespace_missing(&self) -> bool {
        matches!(self, StoreError::Api { source: kube::Error::Api(s), .. } if s.code == 404)
    }
}

fn decoded(secret: &Secret) -> BTreeMap<String, String> {
    let mut data: BTreeMap<String, String> = secret
        .data
        .iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.0.clone()).ok()?)))
        .collect();
    data.extend(
        secret
            .string_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    data
}

fn state_of(secret: &Secret) -> CaSecretState {
    CaSecretState {
        data: decoded(secret),
        annotations: secret.metadata.annotations.clone().unwrap_or_default(),
    }
}

fn body(
    namespace: &str,
    tenant: &str,
    state: &CaSecretState,
    resource_version: Option<String>,
    base: Option<&Secret>,
) -> Secret {
    let mut labels = base
        .and_then(|b| b.metadata.labels.clone())
        .unwrap_or_default();
    labels.insert(
        names::MANAGED_BY_LABEL.into(),
        names::MANAGED_BY_VALUE.into(),
    );
    labels.insert(names::TENANT_LABEL.into(), tenant.into());
    Secret {
        metadata: ObjectMeta {
            name: Some(names::TENANT_CA_SECRET.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels),
            annotations: Some(state.annotations.clone()),
            resource_version,
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(
            state
                .data
                .iter()
                .map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// What [`ensure_tenant_ca`] needs besides the client.
pub struct EnsureCa<'a> {
    pub tenant: &'a str,
    pub control_namespace: &'a str,
    pub trust_domain: &'a str,
    pub source: &'a CaSource,
    pub policy: &'a RotationPolicy,
    pub now: OffsetDateTime,
}

/// Brings the tenant CA Secret to its planned content. Bad input (a missing or unusable
/// plugged Secret) writes nothing: the tenant keeps the CA it has, and the problem is returned.
pub async fn ensure_tenant_ca(
    client: &Client,
    args: &EnsureCa<'_>,
) -> Result<TenantCa, StoreError> {
    let ns = args.control_namespace;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let api_error = |action: &'static str, name: &str| {
        let (namespace, name) = (ns.to_string(), name.to_string());
        move |source| StoreError::Api {
            action,
            namespace,
            name,
            source,
        }
    };
    for _ in 0..ATTEMPTS {
        let current = secrets
            .get_opt(names::TENANT_CA_SECRET)
            .await
            .map_err(api_error("get", names::TENANT_CA_SECRET))?;
        let plugged = match args.source {
            CaSource::Plugged(name) => secrets
                .get_opt(name)
                .await
                .map_err(api_error("get", name))?
                .map(|s| decoded(&s)),
            CaSource::SelfSigned => None,
        };
        let current_state = current.as_ref().map(state_of);
        let plan = plan_tenant_ca(&TenantCaInput {
            tenant: args.tenant,
            control_namespace: ns,
            trust_domain: args.trust_domain,
            source: args.source,
            current: current_state.as_ref(),
            plugged: plugged.as_ref(),
            policy: args.policy,
            now: args.now,
        });
        let plan = match plan {
            Ok(p) => p,
            Err(problem) => {
                return Ok(TenantCa {
                    trust_bundle: current_state
                        .as_ref()
                        .and_then(|c| c.data.get(ROOT_CERT).cloned()),
                    problem: Some(problem),
                    written: None,
                    phase: None,
                })
            }
        };
        let written = match (&plan, &current) {
            (CaPlan::Keep(_), _) => None,
            (CaPlan::Write(state), None) => {
                match secrets
                    .create(
                        &PostParams::default(),
                        &body(ns, args.tenant, state, None, None),
                    )
                    .await
                {
                    Ok(_) => Some("created"),
                    // Another revision created it first: plan again from its content.
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(api_error("create", names::TENANT_CA_SECRET)(e)),
                }
            }
            (CaPlan::Write(state), Some(existing)) => {
                let rv = existing.metadata.resource_version.clone();
                match secrets
                    .replace(
                        names::TENANT_CA_SECRET,
                        &PostParams::default(),
                        &body(ns, args.tenant, state, rv, Some(existing)),
                    )
                    .await
                {
                    Ok(_) => Some("updated"),
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(api_error("replace", names::TENANT_CA_SECRET)(e)),
                }
            }
        };
        let state = plan.state();
        return Ok(TenantCa {
            trust_bundle: state.data.get(ROOT_CERT).cloned(),
            problem: None,
            written,
            phase: state
                .annotations
                .get(meshplane_ca::rotation::PHASE_ANNOTATION)
                .cloned(),
        });
    }
    Err(StoreError::Contended(format!(
        "{ns}/{}",
        names::TENANT_CA_SECRET
    )))
}
