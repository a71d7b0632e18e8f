//! What the benchmarks (`bench-grpc`, `bench-manifestwork`) share and what
//! can be checked without a cluster: percentiles of latency samples, and
//! how figures over repeated runs are summarised and printed.

#![forbid(unsafe_code)]

pub mod stats;
