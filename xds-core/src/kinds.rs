//! The kinds of object the instance reads, declared once.
//!
//! One row per kind in the [`watched_kinds!`] table below generates everything that used to
//! list the kinds by hand: the [`Kind`] and [`Object`] enums, [`Kind::ALL`] (the scope of a
//! full resync), how each kind is read in Kubernetes mode ([`Read`]), whether it is namespaced,
//! its semantic validation (the rules of `meshplane_crds::validation` the webhook applies), and
//! typed dispatch ([`Kind::visit`], [`Kind::visit_namespaced`]) through which the Kubernetes
//! source starts its watchers, the directory source decodes manifests and meshctl lists a
//! cluster. API group, version, kind name and plural come from the Rust type's
//! `kube::core::Resource` implementation, so they are not written here at all.
//!
//! The row order is the order of [`Kind`] (the index keys objects by kind first, so ranges of
//! one kind are contiguous); adding a kind is adding a row.

use std::fmt::Debug;

use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use kube_core::Resource as KubeResource;
use meshplane_crds::gateway_api::{
    GRPCRoute, Gateway as KubernetesGateway, GatewayClass, HTTPRoute, ReferenceGrant, TCPRoute,
    TLSRoute,
};
use meshplane_crds::validation::{self, ValidationErrors};
use meshplane_crds::{
    AuthorizationPolicy, DestinationRule, EnvoyFilter, Gateway, MeshControlPlane, MeshRevisionTag,
    PeerAuthentication, RequestAuthentication, ServiceEntry, Sidecar, Telemetry, VirtualService,
};
use serde::de::DeserializeOwned;

/// How the instance reads a kind in Kubernetes mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// One watch per member namespace (or one cluster-wide watch filtered to the members, in
    /// Shared mode).
    MemberNamespaces,
    /// Only the TLS Secrets of the namespaces the tenant's gateways run in, by name.
    GatewaySecrets,
    /// Only in directory mode: in Kubernetes mode membership comes from the members ConfigMap
    /// (contract 2), not from these objects.
    DirectoryOnly,
}

/// A Rust type of a kind the instance reads.
pub trait WatchedObject:
    KubeResource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// Its kind.
    const KIND: Kind;
    /// Wraps it into the object the sources deliver.
    fn into_object(self) -> Object;
}

/// A namespaced [`WatchedObject`] (what `kube::Api::namespaced` takes).
pub trait NamespacedObject: WatchedObject + KubeResource<Scope = NamespaceResourceScope> {}

/// Something done with a kind's Rust type ([`Kind::visit`]).
pub trait KindVisitor {
    type Output;
    fn visit<T: WatchedObject>(self) -> Self::Output;
}

/// Something done with a namespaced kind's Rust type ([`Kind::visit_namespaced`]).
pub trait NamespacedKindVisitor {
    type Output;
    fn visit<T: NamespacedObject>(self) -> Self::Output;
}

impl Kind {
    /// The kind's name, qualified by its API group where another kind has the same name
    /// (`Gateway.gateway.networking.k8s.io`, as kubectl spells it): unique among the kinds.
    pub fn unique_name(self) -> &'static str {
        match self {
            Kind::KubernetesGateway => "Gateway.gateway.networking.k8s.io",
            k => k.name(),
        }
    }
}

/// Rules an object passes without checks of its own.
fn no_rules<T>(_: &T) -> Result<(), ValidationErrors> {
    Ok(())
}

macro_rules! namespaced_visit {
    (namespaced, $visitor:ident, $ty:ty) => {
        Some($visitor.visit::<$ty>())
    };
    (cluster, $visitor:ident, $ty:ty) => {
        None
    };
}

macro_rules! namespaced_impl {
    (namespaced, $ty:ty) => {
        impl NamespacedObject for $ty {}
    };
    (cluster, $ty:ty) => {};
}

macro_rules! is_namespaced {
    (namespaced) => {
        true
    };
    (cluster) => {
        false
    };
}

/// A kind's name: its variant's, unless the row gives one (two groups may share a kind name,
/// such as Istio's and the Gateway API's `Gateway`).
macro_rules! kind_name {
    ($variant:ident) => {
        stringify!($variant)
    };
    ($variant:ident, $name:literal) => {
        $name
    };
}

macro_rules! watched_kinds {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident($ty:ty) {
            scope: $scope:ident,
            read: $read:ident,
            validate: $validate:expr
            $(, name: $name:literal)? $(,)?
        }
    )*) => {
        /// Kind of an [`Object`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Kind {
            $($variant,)*
        }

        /// A Kubernetes object a source delivers.
        #[derive(Clone, Debug)]
        pub enum Object {
            $($(#[doc = $doc])* $variant(Box<$ty>),)*
        }

        impl Kind {
            /// Every kind, in [`Kind`]'s order.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant,)*];

            /// How it is read in Kubernetes mode.
            pub fn read(self) -> Read {
                match self {
                    $(Kind::$variant => Read::$read,)*
                }
            }

            /// Whether its objects live in a namespace.
            pub fn namespaced(self) -> bool {
                match self {
                    $(Kind::$variant => is_namespaced!($scope),)*
                }
            }

            /// Does `visitor`'s work with the kind's Rust type.
            pub fn visit<V: KindVisitor>(self, visitor: V) -> V::Output {
                match self {
                    $(Kind::$variant => visitor.visit::<$ty>(),)*
                }
            }

            /// Does `visitor`'s work with the kind's Rust type; `None` for a cluster-scoped kind.
            pub fn visit_namespaced<V: NamespacedKindVisitor>(self, visitor: V) -> Option<V::Output> {
                match self {
                    $(Kind::$variant => namespaced_visit!($scope, visitor, $ty),)*
                }
            }

            /// The kind an `apiVersion` and `kind` name.
            pub fn from_api(api_version: &str, kind: &str) -> Option<Kind> {
                $(
                    if <$ty as KubeResource>::kind(&()) == kind
                        && <$ty as KubeResource>::api_version(&()) == api_version
                    {
                        return Some(Kind::$variant);
                    }
                )*
                None
            }

            /// The kind's name, as in a manifest's `kind`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$variant => kind_name!($variant $(, $name)?),)*
                }
            }
        }

        impl Object {
            /// The object's kind.
            pub fn kind(&self) -> Kind {
                match self {
                    $(Object::$variant(_) => Kind::$variant,)*
                }
            }

            /// The object's metadata.
            pub fn metadata(&self) -> &ObjectMeta {
                match self {
                    $(Object::$variant(o) => &o.metadata,)*
                }
            }

            /// The semantic validation of `meshplane_crds::validation` that the validating
            /// webhook applies; the directory source and the index skip an object that breaks
            /// it. Kinds without rules of their own pass (an invalid AuthorizationPolicy is
            /// kept: it denies what it selects, failing closed).
            pub fn validate(&self) -> Result<(), ValidationErrors> {
                match self {
                    $(Object::$variant(o) => {
                        let rules: fn(&$ty) -> Result<(), ValidationErrors> = $validate;
                        rules(o)
                    })*
                }
            }
        }

        $(
            impl WatchedObject for $ty {
                const KIND: Kind = Kind::$variant;
                fn into_object(self) -> Object {
                    Object::$variant(Box::new(self))
                }
            }
            namespaced_impl!($scope, $ty);
        )*
    };
}

watched_kinds! {
    /// A namespace (its labels decide membership in directory mode).
    Namespace(Namespace) { scope: cluster, read: DirectoryOnly, validate: no_rules }
    /// A Service of a member namespace.
    Service(Service) { scope: namespaced, read: MemberNamespaces, validate: no_rules }
    /// An EndpointSlice of a member namespace.
    EndpointSlice(EndpointSlice) { scope: namespaced, read: MemberNamespaces, validate: no_rules }
    /// A Pod of a member namespace (workload labels and addresses).
    Pod(Pod) { scope: namespaced, read: MemberNamespaces, validate: no_rules }
    /// A ServiceEntry.
    ServiceEntry(ServiceEntry) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: |o| validation::validate_service_entry(&o.spec),
    }
    /// A Sidecar.
    Sidecar(Sidecar) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: |o| validation::validate_sidecar(&o.spec),
    }
    /// An EnvoyFilter.
    EnvoyFilter(EnvoyFilter) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: |o| validation::validate_envoy_filter(&o.spec),
    }
    /// A PeerAuthentication (how workloads accept their peers: mutual TLS modes).
    PeerAuthentication(PeerAuthentication) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: no_rules,
    }
    /// An AuthorizationPolicy (who may call which workloads).
    AuthorizationPolicy(AuthorizationPolicy) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: no_rules,
    }
    /// A RequestAuthentication (which end-user tokens workloads accept). An invalid one is
    /// kept like an invalid AuthorizationPolicy: its workloads refuse every token.
    RequestAuthentication(RequestAuthentication) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: no_rules,
    }
    /// A VirtualService.
    VirtualService(VirtualService) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: |o| validation::validate_virtual_service(&o.spec),
    }
    /// A DestinationRule.
    DestinationRule(DestinationRule) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: |o| validation::validate_destination_rule(&o.spec),
    }
    /// A Gateway.
    Gateway(Gateway) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: |o| validation::validate_gateway(&o.spec),
    }
    /// A Telemetry (access logging, tracing and request metrics of workloads).
    Telemetry(Telemetry) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: |o| validation::validate_telemetry(&o.spec),
    }
    /// A Gateway API HTTPRoute (a Gateway's routes, or with a Service parent the mesh's).
    HTTPRoute(HTTPRoute) { scope: namespaced, read: MemberNamespaces, validate: no_rules }
    /// A Gateway API GRPCRoute.
    GRPCRoute(GRPCRoute) { scope: namespaced, read: MemberNamespaces, validate: no_rules }
    /// A Gateway API TLSRoute.
    TLSRoute(TLSRoute) { scope: namespaced, read: MemberNamespaces, validate: no_rules }
    /// A Gateway API TCPRoute.
    TCPRoute(TCPRoute) { scope: namespaced, read: MemberNamespaces, validate: no_rules }
    /// A Gateway API ReferenceGrant (which references into its namespace are allowed).
    ReferenceGrant(ReferenceGrant) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: no_rules,
    }
    /// A Gateway API Gateway (`gateway.networking.k8s.io`; Istio's is [`Kind::Gateway`]).
    KubernetesGateway(KubernetesGateway) {
        scope: namespaced,
        read: MemberNamespaces,
        validate: no_rules,
        name: "Gateway",
    }
    /// A Gateway API GatewayClass (cluster-scoped; directory mode only: in Kubernetes mode
    /// the instance does not watch cluster-scoped objects).
    GatewayClass(GatewayClass) { scope: cluster, read: DirectoryOnly, validate: no_rules }
    /// A TLS Secret of a gateway's namespace (what Gateway servers' `credentialName` name).
    Secret(Secret) { scope: namespaced, read: GatewaySecrets, validate: no_rules }
    /// A MeshControlPlane (directory mode: the tenant's revisions, for membership).
    MeshControlPlane(MeshControlPlane) {
        scope: cluster,
        read: DirectoryOnly,
        validate: validation::validate_mesh_control_plane,
    }
    /// A MeshRevisionTag (directory mode: tags resolving to the tenant's revisions).
    MeshRevisionTag(MeshRevisionTag) {
        scope: cluster,
        read: DirectoryOnly,
        validate: validation::validate_revision_tag,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API names of a kind's Rust type.
    struct ApiNames;
    impl KindVisitor for ApiNames {
        type Output = (String, String);
        fn visit<T: WatchedObject>(self) -> (String, String) {
            (T::api_version(&()).into_owned(), T::kind(&()).into_owned())
        }
    }

    #[test]
    fn every_kind_is_found_by_its_api_names_and_named_like_its_type() {
        for &kind in Kind::ALL {
            let (api_version, name) = kind.visit(ApiNames);
            assert_eq!(Kind::from_api(&api_version, &name), Some(kind));
            assert_eq!(kind.name(), name);
        }
        assert_eq!(Kind::from_api("apps/v1", "Deployment"), None);
        // Same kind name, other group: not ours.
        assert_eq!(Kind::from_api("networking.istio.io/v1", "Gateway"), None);
        assert_eq!(
            Kind::from_api("gateway.networking.k8s.io/v1", "Gateway"),
            Some(Kind::KubernetesGateway)
        );
        assert_eq!(
            Kind::from_api("networking.meshplane.io/v1alpha1", "Gateway"),
            Some(Kind::Gateway)
        );
    }

    #[test]
    fn unique_names_are_unique() {
        let names: std::collections::BTreeSet<&str> =
            Kind::ALL.iter().map(|k| k.unique_name()).collect();
        assert_eq!(names.len(), Kind::ALL.len());
        assert_eq!(Kind::Gateway.unique_name(), "Gateway");
    }

    #[test]
    fn namespaced_dispatch_covers_exactly_the_namespaced_kinds() {
        struct Unit;
        impl NamespacedKindVisitor for Unit {
            type Output = ();
            fn visit<T: NamespacedObject>(self) {}
        }
        for &kind in Kind::ALL {
            assert_eq!(
                kind.visit_namespaced(Unit).is_some(),
                kind.namespaced(),
                "{kind:?}"
            );
        }
        assert!(!Kind::Namespace.namespaced());
        assert!(!Kind::MeshControlPlane.namespaced());
        assert!(Kind::Secret.namespaced());
    }

    #[test]
    fn only_member_namespace_kinds_are_watched_per_namespace() {
        let members: Vec<Kind> = Kind::ALL
            .iter()
            .copied()
            .filter(|k| k.read() == Read::MemberNamespaces)
            .collect();
        assert!(members.iter().all(|k| k.namespaced()));
        assert!(
            !members.contains(&Kind::Secret),
            "Secrets are read by name only"
        );
        assert!(!members.contains(&Kind::Namespace));
        assert_eq!(members.len(), 19);
    }
}
