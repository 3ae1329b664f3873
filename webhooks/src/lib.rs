//! Admission webhooks of a meshplane instance.
