//! meshplane's end-to-end harness: a fresh API stand-in with the local pod runner (the test
//! fixtures of `testing/`), or a real cluster with `E2E_KUBECONFIG`; the scenarios are in
//! `tests/`.
pub mod harness;
pub mod prometheus;
pub mod reach;
