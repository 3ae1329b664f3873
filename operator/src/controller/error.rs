//! Why a reconcile failed, and what the controllers do about it ([`error_policy`]).

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::finalizer;
use kube::Resource;
use tracing::warn;

use super::Context;
use crate::apply::ApplyError;
use crate::tls::TlsError;

/// Retry after a finalizer patch lost a race with the controller's own previous write.
const FINALIZER_RACE_RETRY: Duration = Duration::from_millis(500);

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("{action}: {source}")]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Ca(#[from] crate::ca::StoreError),
    #[error("serializing status: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("deletion waits: {pods} pod(s) injected by the revision still run")]
    InUse { pods: usize },
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    #[error("the controller's caches stopped")]
    CacheClosed,
    /// The control namespace found when writing is not the one membership admitted (created
    /// or replaced since the caches saw it): nothing is written into it.
    #[error("control namespace {namespace:?} {why}")]
    ControlNamespaceNotOwned { namespace: String, why: String },
}

impl Error {
    /// Short reason for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Apply(_) => "ApplyFailed",
            Error::Kube { .. } => "ApiError",
            Error::Tls(_) => "TlsIssueFailed",
            Error::Ca(_) => "TenantCaFailed",
            Error::Serialize(_) => "SerializeFailed",
            Error::InUse { .. } => "InUse",
            Error::CacheClosed => "CacheClosed",
            Error::ControlNamespaceNotOwned { .. } => "ControlNamespaceNotOwned",
            Error::Finalizer(e) => match e.as_ref() {
                finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => {
                    inner.reason()
                }
                _ => "FinalizerFailed",
            },
        }
    }

    pub(crate) fn kube(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Kube { action, source }
    }
}

/// When a failed reconcile of `controller`'s object runs again: soon after a lost finalizer
/// race, at the in-use interval while injected pods block a deletion, else with the object's
/// own growing backoff ([`super::backoff::Failures`]).
pub(super) fn error_policy<K: Resource<DynamicType = ()>>(
    controller: &'static str,
) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |obj, err, ctx| {
        let key = format!(
            "{controller}/{}",
            obj.meta().name.clone().unwrap_or_default()
        );
        ctx.metrics.record_error(controller, err.reason());
        if err.reason() == "InUse" {
            return Action::requeue(ctx.settings.in_use_retry);
        }
        if let Error::Finalizer(e) = err {
            if matches!(
                e.as_ref(),
                finalizer::Error::AddFinalizer(_) | finalizer::Error::RemoveFinalizer(_)
            ) {
                // The cached object was older than our own finalizer write (its guard failed):
                // the watch catches up within moments, so retry soon, not with the backoff.
                return Action::requeue(FINALIZER_RACE_RETRY);
            }
        }
        let delay = ctx.failures.failed(&key);
        warn!(object = %key, error = %err, retry_in = ?delay, "reconcile failed");
        Action::requeue(delay)
    }
}
