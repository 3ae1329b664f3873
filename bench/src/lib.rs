//! meshplane benchmarks: a mesh-state generator for the directory source, an ADS load
//! generator, process sampling, and the benchmark scenarios S1 to S5 (S5: the operator against
//! the API stand-in), and the HTTP/1.1 client and upstream of the benches that drive real Envoys.

pub mod ads_view;
pub mod chart;
pub mod envoy;
pub mod fleet;
pub mod http1;
pub mod load;
pub mod meshgen;
pub mod operator_scale;
pub mod procstat;
pub mod scenario;
pub mod stats;
