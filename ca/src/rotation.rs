//! Rotation of a self-signed tenant root, with both roots trusted during the overlap.
//!
//! The state lives in the tenant's CA Secret (the `cacerts` keys plus the keys and annotations
//! below); [`plan`] is the pure step function the operator runs on every reconcile:
//!
//! 1. `Stable`: one root signs and is the whole bundle. A rotation starts when an admin asks
//!    for one (annotation [`ROTATE_ANNOTATION`] set to a new value) or when less than
//!    [`RotationPolicy::renew_before`] of the root's life is left: a new root is generated and
//!    added to the bundle, the old one keeps signing. Phase `Introduced`.
//! 2. `Introduced`: after [`RotationPolicy::propagation`] (time for the two-root bundle to reach
//!    every bootstrap ConfigMap and every proxy), the new root starts signing; the old root
//!    stays in the bundle. Phase `Switched`.
//! 3. `Switched`: after [`RotationPolicy::overlap`] (longer than any workload certificate the
//!    old root signed can live), the old root leaves the bundle. Phase `Stable`.

use std::collections::BTreeMap;

use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

use crate::authority::{CaFiles, CA_CERT, CA_KEY, CERT_CHAIN, MAX_WORKLOAD_TTL, ROOT_CERT};
use crate::pem;
use crate::root::{generate_root, self_signed_files, CaCert, DEFAULT_ROOT_VALIDITY};
use crate::CaError;

/// Secret key of the next root during `Introduced`.
pub const NEXT_CA_CERT: &str = "next-ca-cert.pem";
/// Secret key of the next root's key during `Introduced`.
pub const NEXT_CA_KEY: &str = "next-ca-key.pem";
/// Annotation an admin sets (to any new value) to rotate the root now.
pub const ROTATE_ANNOTATION: &str = "meshplane.io/rotate-root";
/// Annotation holding the last [`ROTATE_ANNOTATION`] value acted on.
pub const ROTATE_HANDLED_ANNOTATION: &str = "meshplane.io/rotate-root-handled";
/// Annotation holding the phase (`Stable`, `Introduced`, `Switched`).
pub const PHASE_ANNOTATION: &str = "meshplane.io/ca-rotation-phase";
/// Annotation holding when the phase began (RFC 3339).
pub const PHASE_SINCE_ANNOTATION: &str = "meshplane.io/ca-rotation-since";

/// Where a rotation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Stable,
    /// Both roots in the bundle, the old one signs.
    Introduced,
    /// Both roots in the bundle, the new one signs.
    Switched,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Stable => "Stable",
            Phase::Introduced => "Introduced",
            Phase::Switched => "Switched",
        }
    }
}

/// Timing of rotations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RotationPolicy {
    /// Lifetime of a generated root.
    pub root_validity: Duration,
    /// Start a rotation when the signing root has less than this left.
    pub renew_before: Duration,
    /// Time between adding the new root to the bundle and signing with it.
    pub propagation: Duration,
    /// Time between signing with the new root and dropping the old one from the bundle.
    pub overlap: Duration,
}

impl Default for RotationPolicy {
    fn default() -> Self {
        Self {
            root_validity: DEFAULT_ROOT_VALIDITY,
            renew_before: Duration::days(365),
            propagation: Duration::minutes(30),
            overlap: MAX_WORKLOAD_TTL + Duration::hours(1),
        }
    }
}

/// The self-signed CA Secret's content: its data (decoded) and its annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaSecretState {
    pub data: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl CaSecretState {
    /// The `cacerts` layout the instance signs with.
    pub fn files(&self) -> Result<CaFiles, CaError> {
        CaFiles::from_lookup(|k| self.data.get(k).cloned())
    }

    fn phase(&self) -> (Phase, Option<OffsetDateTime>) {
        let phase = match self.annotations.get(PHASE_ANNOTATION).map(String::as_str) {
            Some("Introduced") => Phase::Introduced,
            Some("Switched") => Phase::Switched,
            _ => Phase::Stable,
        };
        let since = self
            .annotations
            .get(PHASE_SINCE_ANNOTATION)
            .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok());
        (phase, since)
    }

    fn with_layout(&self, files: &CaFiles, next: Option<&CaCert>) -> Self {
        let mut data = BTreeMap::new();
        for (k, v) in files.entries() {
            data.insert(k.to_owned(), v.to_owned());
        }
        if let Some(next) = next {
            data.insert(NEXT_CA_CERT.to_owned(), next.cert_pem.clone());
            data.insert(NEXT_CA_KEY.to_owned(), next.key_pem.clone());
        }
        Self {
            data,
            annotations: self.annotations.clone(),
        }
    }

    fn set_phase(&mut self, phase: Phase, now: OffsetDateTime) {
        self.annotations
            .insert(PHASE_ANNOTATION.to_owned(), phase.as_str().to_owned());
        self.annotations.insert(
            PHASE_SINCE_ANNOTATION.to_owned(),
            now.format(&Rfc3339).unwrap_or_default(),
        );
    }

    /// A rotation request not acted on yet.
    fn pending_request(&self) -> Option<String> {
        let asked = self.annotations.get(ROTATE_ANNOTATION)?;
        (self.annotations.get(ROTATE_HANDLED_ANNOTATION) != Some(asked)).then(|| asked.clone())
    }
}

/// What the operator does with the CA Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RotationStep {
    /// Nothing to change.
    Keep,
    /// Write this content (create when the Secret is absent, else a guarded replace).
    Write(CaSecretState),
}

/// The next state of a tenant's self-signed CA at `now`; `None` is a missing (or unreadable)
/// Secret, which gets a new root.
pub fn plan(
    current: Option<&CaSecretState>,
    tenant: &str,
    trust_domain: &str,
    policy: &RotationPolicy,
    now: OffsetDateTime,
) -> Result<RotationStep, CaError> {
    let fresh = |base: &CaSecretState| -> Result<CaSecretState, CaError> {
        let root = generate_root(tenant, trust_domain, now, policy.root_validity)?;
        let mut state = base.with_layout(&self_signed_files(&root), None);
        state.set_phase(Phase::Stable, now);
        Ok(state)
    };
    let Some(current) = current else {
        return Ok(RotationStep::Write(fresh(&CaSecretState::default())?));
    };
    let Ok(files) = current.files() else {
        return Ok(RotationStep::Write(fresh(current)?));
    };
    let Some(signing) = pem::certificates(&files.ca_cert)?.into_iter().next() else {
        return Ok(RotationStep::Write(fresh(current)?));
    };
    let (_, signing_not_after) = pem::validity(&signing.parse()?)?;
    let (phase, since) = current.phase();
    let since = since.unwrap_or(now);

    match phase {
        Phase::Stable => {
            let request = current.pending_request();
            let due = signing_not_after - now < policy.renew_before;
            if request.is_none() && !due {
                return Ok(RotationStep::Keep);
            }
            let next = generate_root(tenant, trust_domain, now, policy.root_validity)?;
            let layout = CaFiles {
                root_cert: format!("{}{}", files.ca_cert, next.cert_pem),
                ..files
            };
            let mut state = current.with_layout(&layout, Some(&next));
            if let Some(request) = request {
                state
                    .annotations
                    .insert(ROTATE_HANDLED_ANNOTATION.to_owned(), request);
            }
            state.set_phase(Phase::Introduced, now);
            Ok(RotationStep::Write(state))
        }
        Phase::Introduced => {
            if now - since < policy.propagation {
                return Ok(RotationStep::Keep);
            }
            let (Some(cert), Some(key)) = (
                current.data.get(NEXT_CA_CERT),
                current.data.get(NEXT_CA_KEY),
            ) else {
                // The next root went missing: start over from the signing root.
                let mut state = current.with_layout(&self_signed_files_of(&files), None);
                state.set_phase(Phase::Stable, now);
                return Ok(RotationStep::Write(state));
            };
            let layout = CaFiles {
                ca_cert: cert.clone(),
                ca_key: key.clone(),
                root_cert: format!("{}{}", cert, files.ca_cert),
                cert_chain: String::new(),
            };
            let mut state = current.with_layout(&layout, None);
            state.set_phase(Phase::Switched, now);
            Ok(RotationStep::Write(state))
        }
        Phase::Switched => {
            if now - since < policy.overlap {
                return Ok(RotationStep::Keep);
            }
            let mut state = current.with_layout(&self_signed_files_of(&files), None);
            state.set_phase(Phase::Stable, now);
            Ok(RotationStep::Write(state))
        }
    }
}

fn self_signed_files_of(files: &CaFiles) -> CaFiles {
    CaFiles {
        root_cert: files.ca_cert.clone(),
        cert_chain: String::new(),
        ..files.clone()
    }
}

/// Keys of the CA Secret's data that the instance reads (the `cacerts` layout).
pub const LAYOUT_KEYS: [&str; 4] = [CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT];
