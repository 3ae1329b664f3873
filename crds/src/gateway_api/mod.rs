//! The Kubernetes Gateway API (`gateway.networking.k8s.io`), as of the specification's
//! release v1.2.1: the standard channel's `GatewayClass`, `Gateway`, `HTTPRoute` and
//! `GRPCRoute` (`v1`) and `ReferenceGrant` (`v1beta1`), and the experimental channel's
//! `TLSRoute` and `TCPRoute` (`v1alpha2`) and `HTTPRoute` rule `retry`.
//!
//! Field names, defaults, enums and validation follow the specification, so manifests written
//! for any implementation apply unchanged. On a real cluster users install the upstream CRDs
//! of that release (experimental channel for TLSRoute and TCPRoute); the CRDs `crdgen`
//! writes from these types are equivalent for every field meshplane reads (schema, defaults,
//! the CEL rules that refuse invalid filters, paths and references) and are what the local
//! cluster stand-in serves.
//!
//! meshplane's controller name is [`CONTROLLER_NAME`]: a route's status entries for parents it
//! handles carry it, and it writes no other entries.

pub mod gateway;
pub mod gatewayclass;
pub mod grpcroute;
pub mod httproute;
pub mod reference_grant;
pub mod shared;
pub mod tcproute;
pub mod tlsroute;

pub use gateway::{Gateway, GatewaySpec, GatewayStatus, Listener};
pub use gatewayclass::{GatewayClass, GatewayClassSpec, GatewayClassStatus};
pub use grpcroute::{GRPCRoute, GRPCRouteSpec};
pub use httproute::{HTTPRoute, HTTPRouteSpec};
pub use reference_grant::{ReferenceGrant, ReferenceGrantSpec};
pub use shared::{
    BackendObjectReference, BackendRef, ParentReference, RouteParentStatus, RouteStatus,
};
pub use tcproute::{TCPRoute, TCPRouteSpec};
pub use tlsroute::{TLSRoute, TLSRouteSpec};

/// API group of the Gateway API.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// Release of the specification these types follow (and whose CRDs users install).
pub const SPEC_VERSION: &str = "v1.2.1";

/// The controller name of meshplane's GatewayClasses and of its route status entries.
pub const CONTROLLER_NAME: &str = "meshplane.io/gateway-controller";
