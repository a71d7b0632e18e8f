//! What the benchmarks (`bench-grpc`, `bench-manifestwork`) share and what
//! can be checked without a cluster: the hub API server's own write
//! ceiling, percentiles of latency samples, the order two sides run in,
//! how figures over repeated runs are summarised, compared and printed,
//! and the OCM work agent's feedback as the benchmarks play it.

#![forbid(unsafe_code)]

pub mod ceiling;
pub mod order;
pub mod stats;
pub mod table;
pub mod work_agent;
