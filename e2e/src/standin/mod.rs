//! **Test fixture**: an in-memory stand-in for the Kubernetes API server, served over plain
//! HTTP on loopback, for the e2e suite (no kube-apiserver can be installed where meshplane is
//! built and tested). It is not a Kubernetes implementation and is never shipped.
//!
//! The real operator, xds-server and `kubectl` talk to it unchanged through the kubeconfigs it
//! writes. Request pipeline (`server`): authenticate (`auth`, 401) → authorize (`rbac`, 403) →
//! custom-resource schema validation and defaulting (`schema`, 422) → admission webhooks
//! (`admission`) → storage (`store`) or watch (`watch`).
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
//!   `limit`/`continue`, Table output for `kubectl get` (also on watches), Service ClusterIPs
//!   from 127.0.1.0/24 upward;
//! - watches: resume by `resourceVersion`, 410 Gone (ERROR event) past the bounded history,
//!   bookmarks, `sendInitialEvents`, `timeoutSeconds`, and fault injection
//!   ([`StandInHandle::drop_all_watches`], [`StandInHandle::expire_history`]).
//!
//! Not implemented (differences a test could notice against a real cluster):
//! - no TLS on the API itself, no protobuf/CBOR, no aggregated discovery (kubectl falls back
//!   to `/apis`), no OpenAPI documents (`/openapi/v2|v3` are 404: `kubectl explain` does not
//!   work; `kubectl apply` needs `--validate=false` only if it insists on client-side schema);
//! - no version conversion: all served versions of a CRD share one stored object;
//! - server-side apply decides list semantics by a fixed rule (`fields::list_kind`) instead of
//!   OpenAPI markers, and applies no built-in defaulting (only Namespace labels/phase and
//!   Service clusterIP/ports defaults);
//! - `resourceVersion` on list is ignored (always the latest); continue tokens are not snapshots;
//! - garbage collection is synchronous within the deleting request; no graceful pod deletion;
//! - core/v1 and events.k8s.io/v1 Events are stored separately;
//! - no controllers: nothing runs pods or fills Deployment status (the pod runner does).

pub mod admission;
pub mod auth;
pub mod discovery;
pub mod error;
pub mod fields;
pub mod handle;
pub mod lookup;
pub mod object;
pub mod patch;
pub mod query;
pub mod rbac;
pub mod resources;
pub mod schema;
pub mod server;
pub mod store;
pub mod table;
pub mod tokens;
pub mod watch;

pub use auth::Identity;
pub use handle::{StandIn, StandInError, StandInHandle, StandInOptions};
