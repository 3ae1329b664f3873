//! meshplane benchmarks: a mesh-state generator for the directory source, an ADS load
//! generator, process sampling, and the scenarios of issue 8.

pub mod chart;
pub mod load;
pub mod meshgen;
pub mod procstat;
pub mod scenario;
pub mod stats;
