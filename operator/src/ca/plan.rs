//! The next content of a tenant's CA Secret, as a pure function of what is there now, the
//! tenant's setting and the clock.

use std::collections::BTreeMap;

use meshplane_ca::authority::{CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT};
use meshplane_ca::rotation::{self, CaSecretState, RotationPolicy, RotationStep, PHASE_ANNOTATION};
use meshplane_ca::{Authority, CaError, CaFiles};
use meshplane_crds::MeshControlPlane;
use time::OffsetDateTime;

/// Annotation of the CA Secret saying where its content comes from ([`CaSource::annotation`]).
pub const SOURCE_ANNOTATION: &str = "meshplane.io/ca-source";

/// Where a tenant's CA comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaSource {
    /// A root issued and rotated by the operator.
    SelfSigned,
    /// The `cacerts` Secret of this name in the control namespace.
    Plugged(String),
}

impl CaSource {
    /// The source a control plane asks for.
    pub fn of(mcp: &MeshControlPlane) -> Self {
        match mcp
            .spec
            .certificate_authority
            .as_ref()
            .and_then(|ca| ca.plugged_secret())
        {
            Some(name) => CaSource::Plugged(name.to_string()),
            None => CaSource::SelfSigned,
        }
    }

    /// Value of [`SOURCE_ANNOTATION`].
    pub fn annotation(&self) -> String {
        match self {
            CaSource::SelfSigned => "SelfSigned".into(),
            CaSource::Plugged(name) => format!("Plugged/{name}"),
        }
    }
}

/// The control plane whose CA setting is the tenant's: the tenant's oldest (creation time, then
/// name), so that adding a canary revision never changes the tenant's CA.
pub fn tenant_ca_setting<'a>(
    control_planes: &'a [MeshControlPlane],
    tenant: &str,
) -> Option<&'a MeshControlPlane> {
    control_planes
        .iter()
        .filter(|c| c.spec.tenant == tenant)
        .min_by(|a, b| {
            (&a.metadata.creation_timestamp, &a.metadata.name)
                .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
        })
}

/// Why the tenant CA cannot be kept as asked; the Secret is left as it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CaProblem {
    #[error("spec.certificateAuthority.plugged: Secret {namespace}/{name} does not exist")]
    PluggedMissing { namespace: String, name: String },
    #[error(
        "spec.certificateAuthority.plugged: Secret {namespace}/{name} is not a usable CA: {reason}"
    )]
    PluggedInvalid {
        namespace: String,
        name: String,
        reason: CaError,
    },
    #[error("the tenant CA Secret cannot be renewed: {0}")]
    SelfSigned(CaError),
}

/// What [`plan_tenant_ca`] reads.
pub struct TenantCaInput<'a> {
    pub tenant: &'a str,
    pub control_namespace: &'a str,
    pub trust_domain: &'a str,
    pub source: &'a CaSource,
    /// The tenant CA Secret now (decoded data and annotations), if it exists.
    pub current: Option<&'a CaSecretState>,
    /// The decoded data of the plugged-in Secret, if the source is one and it exists.
    pub plugged: Option<&'a BTreeMap<String, String>>,
    pub policy: &'a RotationPolicy,
    pub now: OffsetDateTime,
}

/// The next content of the tenant CA Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaPlan {
    /// What is there is right.
    Keep(CaSecretState),
    /// Write this (create when absent, else replace what was read).
    Write(CaSecretState),
}

impl CaPlan {
    /// The content the Secret has once the plan is carried out.
    pub fn state(&self) -> &CaSecretState {
        match self {
            CaPlan::Keep(s) | CaPlan::Write(s) => s,
        }
    }
}

fn layout(files: &CaFiles) -> BTreeMap<String, String> {
    files
        .entries()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Decides the tenant CA Secret's next content.
///
/// - `SelfSigned`: [`rotation::plan`] issues the first root, then rotates it (admin request or
///   age) with both roots in the bundle during the overlap. A Secret last filled from a plugged
///   CA starts over with a fresh root (switching sources is a root change: see
///   docs/identity.md for doing it without failed handshakes).
/// - `Plugged`: the Secret's `cacerts` files must load as a CA whose signing certificate chains
///   to its `root-cert.pem` and is valid now; they are copied as they are. A missing or bad
///   Secret is a [`CaProblem`] and the tenant keeps the CA it has.
pub fn plan_tenant_ca(input: &TenantCaInput<'_>) -> Result<CaPlan, CaProblem> {
    let source = input.source.annotation();
    match input.source {
        CaSource::SelfSigned => {
            let current = input.current.filter(|c| {
                c.annotations
                    .get(SOURCE_ANNOTATION)
                    .is_none_or(|s| *s == source)
            });
            let step = rotation::plan(
                current,
                input.tenant,
                input.trust_domain,
                input.policy,
                input.now,
            )
            .map_err(CaProblem::SelfSigned)?;
            Ok(match step {
                RotationStep::Keep => CaPlan::Keep(current.cloned().unwrap_or_default()),
                RotationStep::Write(mut state) => {
                    state.annotations.insert(SOURCE_ANNOTATION.into(), source);
                    CaPlan::Write(state)
                }
            })
        }
        CaSource::Plugged(name) => {
            let Some(data) = input.plugged else {
                return Err(CaProblem::PluggedMissing {
                    namespace: input.control_namespace.to_string(),
                    name: name.clone(),
                });
            };
            let invalid = |reason| CaProblem::PluggedInvalid {
                namespace: input.control_namespace.to_string(),
                name: name.clone(),
                reason,
            };
            let files = CaFiles::from_lookup(|k| data.get(k).cloned()).map_err(invalid)?;
            Authority::load(&files, input.now).map_err(invalid)?;
            let wanted = layout(&files);
            if let Some(current) = input.current {
                let same = [CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN]
                    .iter()
                    .all(|k| current.data.get(*k) == wanted.get(*k))
                    && current.data.len() == wanted.len()
                    && current.annotations.get(SOURCE_ANNOTATION) == Some(&source);
                if same {
                    return Ok(CaPlan::Keep(current.clone()));
                }
            }
            let mut annotations = input
                .current
                .map(|c| c.annotations.clone())
                .unwrap_or_default();
            // Rotation bookkeeping of a self-signed past does not apply to plugged material.
            annotations
                .retain(|k, _| !k.starts_with("meshplane.io/ca-rotation") && k != PHASE_ANNOTATION);
            annotations.insert(SOURCE_ANNOTATION.into(), source);
            Ok(CaPlan::Write(CaSecretState {
                data: wanted,
                annotations,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshplane_ca::root::{
        generate_intermediate, generate_root, plugged_in_files, self_signed_files,
    };
    use meshplane_ca::rotation::{NEXT_CA_CERT, ROTATE_ANNOTATION};
    use time::Duration;

    const NS: &str = "meshplane-blue";

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("time")
    }

    fn input<'a>(
        source: &'a CaSource,
        current: Option<&'a CaSecretState>,
        plugged: Option<&'a BTreeMap<String, String>>,
        policy: &'a RotationPolicy,
        at: OffsetDateTime,
    ) -> TenantCaInput<'a> {
        TenantCaInput {
            tenant: "blue",
            control_namespace: NS,
            trust_domain: "blue.example",
            source,
            current,
            plugged,
            policy,
            now: at,
        }
    }

    fn mk_mcp(
        name: &str,
        tenant: &str,
        age_seconds: i64,
        plugged: Option<&str>,
    ) -> MeshControlPlane {
        let mut mcp: MeshControlPlane = serde_json::from_value(serde_json::json!({
            "apiVersion": "meshplane.io/v1alpha1", "kind": "MeshControlPlane",
            "metadata": {"name": name},
            "spec": {"tenant": tenant},
        }))
        .expect("mcp");
        mcp.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 - age_seconds)
                    .expect("time"),
            ));
        mcp.spec.certificate_authority =
            plugged.map(|p| meshplane_crds::controlplane::CertificateAuthority {
                plugged: Some(meshplane_crds::controlplane::PluggedCa {
                    secret_name: p.into(),
                }),
                self_signed: None,
            });
        mcp
    }

    #[test]
    fn the_oldest_revision_decides_the_tenant_ca() {
        let cps = [
            mk_mcp("blue-v2", "blue", 10, None),
            mk_mcp("blue-v1", "blue", 100, Some("cacerts")),
            mk_mcp("green", "green", 1000, None),
        ];
        let chosen = tenant_ca_setting(&cps, "blue").expect("one");
        assert_eq!(CaSource::of(chosen), CaSource::Plugged("cacerts".into()));
        assert_eq!(
            CaSource::of(tenant_ca_setting(&cps, "green").expect("one")),
            CaSource::SelfSigned
        );
        assert!(tenant_ca_setting(&cps, "red").is_none());
    }

    #[test]
    fn self_signed_is_issued_once_then_kept_then_rotated_on_request() {
        let policy = RotationPolicy::default();
        let source = CaSource::SelfSigned;
        let CaPlan::Write(first) =
            plan_tenant_ca(&input(&source, None, None, &policy, now())).expect("plan")
        else {
            panic!("a missing Secret gets a root");
        };
        assert_eq!(first.annotations[SOURCE_ANNOTATION], "SelfSigned");
        let authority =
            Authority::load(&first.files().expect("layout"), now()).expect("a usable CA");
        assert_eq!(authority.trust_bundle_pem(), first.data[ROOT_CERT]);
        let later = now() + Duration::days(30);
        assert_eq!(
            plan_tenant_ca(&input(&source, Some(&first), None, &policy, later)).expect("plan"),
            CaPlan::Keep(first.clone()),
            "a steady state writes nothing"
        );
        let mut asked = first.clone();
        asked
            .annotations
            .insert(ROTATE_ANNOTATION.into(), "1".into());
        let CaPlan::Write(introduced) =
            plan_tenant_ca(&input(&source, Some(&asked), None, &policy, later)).expect("plan")
        else {
            panic!("the request starts a rotation");
        };
        assert!(introduced.data.contains_key(NEXT_CA_CERT));
        assert_eq!(
            meshplane_ca::pem::certificates(&introduced.data[ROOT_CERT])
                .expect("pem")
                .len(),
            2,
            "both roots trusted"
        );
        assert_eq!(
            introduced.data[CA_CERT], first.data[CA_CERT],
            "the old root still signs"
        );
    }

    fn plugged_data(files: &CaFiles) -> BTreeMap<String, String> {
        layout(files)
    }

    #[test]
    fn a_plugged_intermediate_is_checked_and_copied_and_a_bad_one_changes_nothing() {
        let policy = RotationPolicy::default();
        let org = generate_root(
            "org",
            "org.example",
            now() - Duration::days(1),
            Duration::days(3650),
        )
        .expect("root");
        let inter =
            generate_intermediate(&org, "blue", now() - Duration::days(1), Duration::days(365))
                .expect("intermediate");
        let files = plugged_in_files(&inter, &org.cert_pem);
        let data = plugged_data(&files);
        let source = CaSource::Plugged("cacerts".into());
        let CaPlan::Write(copied) =
            plan_tenant_ca(&input(&source, None, Some(&data), &policy, now())).expect("plan")
        else {
            panic!("copied");
        };
        assert_eq!(copied.data, data);
        assert_eq!(copied.annotations[SOURCE_ANNOTATION], "Plugged/cacerts");
        assert_eq!(
            plan_tenant_ca(&input(&source, Some(&copied), Some(&data), &policy, now()))
                .expect("plan"),
            CaPlan::Keep(copied.clone())
        );

        // Missing Secret, wrong key, intermediate not chaining to the root: refused with the reason.
        assert!(matches!(
            plan_tenant_ca(&input(&source, Some(&copied), None, &policy, now())),
            Err(CaProblem::PluggedMissing { .. })
        ));
        let other = generate_root(
            "other",
            "org.example",
            now() - Duration::days(1),
            Duration::days(3650),
        )
        .expect("root");
        let mut wrong_key = data.clone();
        wrong_key.insert(CA_KEY.into(), other.key_pem.clone());
        let err = plan_tenant_ca(&input(
            &source,
            Some(&copied),
            Some(&wrong_key),
            &policy,
            now(),
        ))
        .expect_err("refused");
        assert!(
            matches!(
                err,
                CaProblem::PluggedInvalid {
                    reason: CaError::KeyMismatch,
                    ..
                }
            ),
            "{err}"
        );
        let mut unanchored = data.clone();
        unanchored.insert(ROOT_CERT.into(), other.cert_pem.clone());
        let err = plan_tenant_ca(&input(
            &source,
            Some(&copied),
            Some(&unanchored),
            &policy,
            now(),
        ))
        .expect_err("refused");
        assert!(err.to_string().contains("cacerts"), "{err}");
    }

    #[test]
    fn switching_from_plugged_to_self_signed_issues_a_fresh_root() {
        let policy = RotationPolicy::default();
        let org = generate_root(
            "org",
            "org.example",
            now() - Duration::days(1),
            Duration::days(3650),
        )
        .expect("root");
        let plugged = CaSecretState {
            data: layout(&self_signed_files(&org)),
            annotations: BTreeMap::from([(
                SOURCE_ANNOTATION.to_string(),
                "Plugged/cacerts".to_string(),
            )]),
        };
        let CaPlan::Write(fresh) = plan_tenant_ca(&input(
            &CaSource::SelfSigned,
            Some(&plugged),
            None,
            &policy,
            now(),
        ))
        .expect("plan") else {
            panic!("fresh root");
        };
        assert_ne!(fresh.data[CA_CERT], plugged.data[CA_CERT]);
        assert_eq!(fresh.annotations[SOURCE_ANNOTATION], "SelfSigned");
    }
}
