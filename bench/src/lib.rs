//! What the benchmarks (`bench-grpc`, `bench-manifestwork`) share and what
//! can be checked without a cluster: the hub API server's own write
//! ceiling, percentiles of latency samples, the order two sides run in,
//! and how figures over repeated runs are summarised, compared and
//! printed.

#![forbid(unsafe_code)]

pub mod ceiling;
pub mod order;
pub mod stats;
pub mod table;
