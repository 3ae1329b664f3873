//! e2e fixtures
pub mod harness;
pub mod podrunner;
pub mod standin;
