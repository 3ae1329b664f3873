//! **Test fixture**: an in-memory stand-in for the Kubernetes API server, for the e2e suite (no
//! kube-apiserver can be installed where meshplane is built and tested). It serves HTTPS on
//! loopback with its own CA (in the kubeconfigs it writes; plain HTTP on the same port for raw
//! test clients). It is not a Kubernetes implementation and is never shipped.
//!
//! The real operator, xds-server and `kubectl` talk to it unchanged through the kubeconfigs it
//! writes. Request pipeline (`server`): authenticate (`auth`, 401) → authorize (`rbac`, 403) →
//! custom-resource schema validation and defaulting (`schema`, 422) and RBAC escalation
//! prevention (`rbac::check_escalation`, 403) → admission webhooks (`admission`) → storage
//! (`store`) or watch (`watch`).
//!
//! Implemented:
//! - discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`) for the
//!   built-in kinds in `resources` and for CRDs registered at runtime (scope, short names,
//!   printer columns, status subresource; a CRD gets `Established` at once);
//! - create, get, list, update, JSON / merge / strategic-merge patch, server-side apply with
//!   `managedFields`, conflicts (409) and `force`, delete with Background / Foreground / Orphan
//!   propagation, deletecollection, `dryRun`;
//! - monotonic `resourceVersion`, 409 on stale updates, `generation` on non-metadata/status
//!   changes, `uid`, `creationTimestamp`, `/status` subresource split, finalizers and
//!   `deletionTimestamp`, owner-reference GC (`blockOwnerDeletion` honoured by Foreground),
//!   namespace termination, label selectors and `metadata.name`/`metadata.namespace` field
//!   selectors (plus the few per-kind fields the real API has, e.g. Event `involvedObject.*`),
//!   `limit`/`continue`, Table output for `kubectl get` (also on watches; CRD printer columns;
//!   Kubernetes' own printers for Pods — READY, STATUS such as `Init:0/1`, `CrashLoopBackOff`
//!   or `Terminating`, RESTARTS, AGE, and IP, NODE, NOMINATED NODE, READINESS GATES with
//!   `-o wide` — Services, Deployments, ReplicaSets, StatefulSets, DaemonSets, Namespaces,
//!   ConfigMaps, Secrets and ServiceAccounts (`printers`); Name and Age for the other
//!   built-in kinds), Service ClusterIPs from 198.19.0.0/16 (the `kubernetes` Service in `default` holds
//!   198.19.0.1; its EndpointSlice is `StandInOptions::advertise_address`);
//! - OpenAPI v3 (`/openapi/v3` and one document per group/version, `openapi`): the resource
//!   paths and operations, and `components.schemas` with each CRD version's `openAPIV3Schema`
//!   (named and extended as the API server does: `io.meshplane.v1alpha1.MeshControlPlane`,
//!   `metadata` referring to `ObjectMeta`) and the built-in kinds' Kubernetes schemas
//!   (k8s-openapi), so `kubectl explain` works and `kubectl apply` picks server-side field
//!   validation;
//! - RBAC like the real API: request attributes as `RequestInfo` derives them (a namespace is
//!   inside itself; list/watch with `fieldSelector=metadata.name=<n>` is a request for `<n>`),
//!   non-resource paths (`/api`, `/apis`, `/version`, `/openapi/*`, unknown paths) authorized by
//!   path and method, escalation prevention on Role/ClusterRole/(Cluster)RoleBinding writes
//!   (`escalate`/`bind`; updates of only owner references/finalizers are exempt), and
//!   `SelfSubjectAccessReview`/`SubjectAccessReview` (`kubectl auth can-i`), and impersonation
//!   (`kubectl --as`/`--as-group`, checked against the `impersonate` verb);
//! - `fieldValidation` (Strict, Warn with `Warning` headers, Ignore; Warn when absent) on
//!   create, update, patch and apply, against CRD schemas and the built-in kinds' types
//!   (`field_validation`);
//! - watches: resume by `resourceVersion`, 410 Gone (ERROR event) past the bounded history,
//!   bookmarks, `sendInitialEvents`, `timeoutSeconds`, and fault injection
//!   ([`StandInHandle::drop_all_watches`], [`StandInHandle::expire_history`]);
//! - core/v1 and events.k8s.io/v1 Events are one store with two views, converted field by
//!   field as Kubernetes does (`event_views`), with the Event printer's Table for both;
//! - `pods/<name>[:<port>]/proxy/<path>` (GET, HEAD) to the pod's IP over plain HTTP, authorized
//!   as `get` on `pods/proxy` (`pod_proxy`; how pod addresses are reached is pluggable);
//! - `pods/<name>/log` (`container`, `tailLines`, `limitBytes`) from what the node supplies
//!   (`pod_log`), authorized as `get` on `pods/log`, so `kubectl logs` works;
//! - `pods/<name>/portforward` over WebSocket (`v4.channel.k8s.io`, as kube-rs's
//!   `Api::portforward` speaks it) to `localhost:<port>` inside the pod, authorized as `create`
//!   on `pods/portforward` (`port_forward`; the pod runner supplies the kubelet's part);
//! - instrumentation: a count of resource requests by verb and a log of the latest writes
//!   (`requests`; [`StandInHandle::requests`], and `GET /standin/requests` for other processes).
//!
//! Not implemented (differences a test could notice against a real cluster):
//! - no client-certificate authentication; impersonation of users and groups only (no
//!   `Impersonate-Uid`/`Impersonate-Extra-*`, answered 400); no `selfsubjectrulesreviews` (`kubectl auth can-i --list`) or `localsubjectaccessreviews`;
//!   no CBOR; protobuf request bodies only for the kinds
//!   typed `kubectl create <kind>` commands send (see `protobuf`), responses always JSON;
//! - no aggregated discovery (kubectl falls back to `/apis`); `/openapi/v2` is 404; the
//!   built-in schemas in OpenAPI lack the strategic-merge markers (`x-kubernetes-patch-*`), so
//!   their PATCH operations do not offer strategic merge patch there and `kubectl apply`
//!   computes it from its compiled-in types;
//! - `kubectl get all` covers pods, services, deployments, replicasets, statefulsets and
//!   daemonsets only; StatefulSets and DaemonSets are stored and served, but no controller runs
//!   them (the pod runner runs Deployments only);
//! - list semantics of server-side apply: lists of objects that all have a `name` merge by
//!   name (also in custom resources, where the real server treats unmarked lists as atomic);
//! - no version conversion: all served versions of a CRD share one stored object;
//! - server-side apply decides list semantics by a fixed rule (`fields::list_kind`) instead of
//!   OpenAPI markers, and applies no built-in defaulting (only Namespace labels/phase and
//!   Service clusterIP/ports defaults; a Pod gets no `status.phase: Pending` on create, so
//!   until the pod runner reports on it `kubectl get pods` shows an empty STATUS);
//! - `resourceVersion` on list is ignored (always the latest); continue tokens are not snapshots;
//! - garbage collection is synchronous within the deleting request; no graceful pod deletion;
//! - no `exec`, `attach` (`pods/proxy`, `pods/log` and `pods/portforward` are served; `services/proxy` is not; SPDY port forwarding, what `kubectl port-forward` speaks, is not), `eviction`, `binding` or `scale`
//!   subresources (so no `kubectl exec`, `scale`; `kubectl logs -f`, `--previous` and `--since`
//!   are refused); no `namespaces/finalize`;
//! - `metadata.managedFields` sent by clients is ignored (cannot be reset);
//! - no controllers: nothing runs pods or fills Deployment status (the pod runner does).

pub mod admission;
pub mod admission_policy;
pub mod auth;
pub mod discovery;
pub mod error;
pub mod event_views;
pub mod field_validation;
pub mod fields;
pub mod handle;
pub mod lookup;
pub mod object;
pub mod openapi;
pub mod patch;
pub mod pod_log;
pub mod pod_proxy;
pub mod port_forward;
pub mod printers;
pub mod protobuf;
pub mod query;
pub mod rbac;
pub mod requests;
pub mod resources;
pub mod schema;
pub mod server;
pub mod store;
pub mod table;
pub mod tls;
pub mod tokens;
pub mod watch;

pub use admission::{ClientCertificate, Dialer, WebhookClientCredentials};
pub use auth::Identity;
pub use handle::{StandIn, StandInError, StandInHandle, StandInOptions};
pub use pod_log::PodLogs;
pub use port_forward::{PodConnector, PodRef};
pub use store::KUBERNETES_SERVICE_IP;
