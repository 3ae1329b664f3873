//! The tenant CA (contract 11 of docs/architecture.md): one Secret
//! [`names::TENANT_CA_SECRET`](meshplane_crds::names::TENANT_CA_SECRET) in the tenant's control
//! namespace, in Istio's `cacerts` layout, that every instance of the tenant mounts and signs
//! workload certificates with; its `root-cert.pem` is the trust bundle of every bootstrap
//! ConfigMap of the tenant.
//!
//! - [`plan`]: pure. Which revision's setting is the tenant's (the oldest revision's), and the
//!   next content of the Secret: a self-signed root issued and rotated by
//!   [`meshplane_ca::rotation`], or a plugged-in `cacerts` Secret checked and copied.
//! - [`store`]: the Secret read, created (a POST; the loser of a race re-reads the winner's) and
//!   replaced with the resourceVersion it was read at, so two revisions reconciling at once
//!   never write two different roots.
//!
//! The Secret carries the tenant label but no revision label and no owner reference: it is the
//! tenant's, outlives any one revision, and pruning never reaches it. No RBAC grants it to
//! anyone but the operator: instances get it as a volume.

pub mod plan;
pub mod store;

pub use plan::{plan_tenant_ca, tenant_ca_setting, CaPlan, CaProblem, CaSource, TenantCaInput};
pub use store::{ensure_tenant_ca, EnsureCa, StoreError, TenantCa};
