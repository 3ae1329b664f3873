//! The meshplane API: Kubernetes custom resource types, the names derived from them, and the
//! semantic validation that CRD schemas and CEL rules cannot express.
//!
//! This crate has no runtime: the operator, the validating webhook and the xds-server all link
//! it, so that one implementation decides what is valid.
//!
//! - [`controlplane`]: `meshplane.io/v1alpha1` `MeshControlPlane` and `MeshRevisionTag`.
//! - [`migration`]: `meshplane.io/v1alpha1` `MeshRevisionMigration`, a health-gated move of a
//!   tag to another revision.
//! - [`networking`]: `networking.meshplane.io/v1alpha1` `ServiceEntry`, `EnvoyFilter`,
//!   `Sidecar`, `VirtualService`, `DestinationRule` and `Gateway`, Istio's networking API as
//!   meshplane supports it (see that module for the supported fields).
//! - [`security`]: `security.meshplane.io/v1alpha1` `PeerAuthentication` and
//!   `AuthorizationPolicy` (Istio's fields) and which policies apply to a workload.
//! - [`providers`]: the extension providers of a tenant (`spec.meshConfig.extensionProviders`):
//!   external authorizers and telemetry sinks, and which hosts they may name.
//! - [`gateway_api`]: the Kubernetes Gateway API (`gateway.networking.k8s.io`): GatewayClass,
//!   Gateway, HTTPRoute, GRPCRoute, ReferenceGrant, TLSRoute and TCPRoute.
//! - [`telemetry`]: `telemetry.meshplane.io/v1alpha1` `Telemetry` (Istio's fields): access
//!   logging, tracing and request metrics per tenant, namespace or workload.
//! - [`duration`]: Istio's duration strings (`5s`, `250ms`).
//! - [`capture`]: the grammar of the pod annotations that scope traffic capture.
//! - [`agent`]: the grammar of the pod annotations that configure the node agent (certificate
//!   lifetime).
//! - [`names`]: labels, annotations and the names of every object derived from a revision.
//! - [`validation`]: semantic checks returning typed [`validation::ValidationError`]s.
//! - [`manifest`]: parsing multi-document YAML into typed objects (samples, directory source).
//! - [`crdgen`]: the CustomResourceDefinitions as YAML, written to `config/crd/` by `crdgen`.
//! - [`api_reference`]: the API reference page rendered from those CRDs (`crdgen` writes it).

pub mod agent;
pub mod api_reference;
pub mod capture;
pub mod controlplane;
pub mod crdgen;
pub mod duration;
pub mod envoyfilter_policy;
pub mod gateway_api;
pub mod gateway_tenancy;
pub mod manifest;
pub mod membership;
pub mod migration;
pub mod names;
pub mod networking;
pub mod providers;
pub mod security;
pub mod selector;
pub mod telemetry;
pub mod validation;

pub use controlplane::{
    IsolationMode, MeshConfig, MeshControlPlane, MeshControlPlaneSpec, MeshControlPlaneStatus,
    MeshRevisionTag, MeshRevisionTagSpec, MeshRevisionTagStatus,
};
pub use migration::{
    MeshRevisionMigration, MeshRevisionMigrationSpec, MeshRevisionMigrationStatus,
};
pub use networking::{
    DestinationRule, EnvoyFilter, Gateway, ServiceEntry, Sidecar, VirtualService,
};
pub use security::{AuthorizationPolicy, PeerAuthentication, RequestAuthentication};
pub use telemetry::Telemetry;
