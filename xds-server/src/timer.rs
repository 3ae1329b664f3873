//! Waiting for an optional deadline inside a `select!`.

use std::time::Instant;

/// Resolves at `deadline`; never when there is none, so a `select!` arm with no deadline
/// simply never fires.
pub async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
