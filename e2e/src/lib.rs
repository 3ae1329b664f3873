//! e2e fixtures
pub mod standin;
pub mod podrunner;
pub mod harness;
