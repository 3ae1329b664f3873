//! Everything the instance writes to the API server, each a task fed by watch channels or a
//! queue, so no write ever waits inside the push loop or a source:
//!
//! - [`proxy_count`]: this pod's connected proxy count, members-stale and refused-watches marks
//!   (contract 3);
//! - [`config_status`]: the `Accepted` conditions on the tenant's traffic config;
//! - [`config_events`]: Warning Events on config objects the instance reads but cannot use.
//!
//! The instance's other API calls only read or ask: watches (the sources), TokenReviews
//! (`tenancy`, `tokens`) and SubjectAccessReviews (`credential_access`).

pub mod config_events;
pub mod config_status;
pub mod proxy_count;
