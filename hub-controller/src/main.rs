//! hub-controller: runs on the OCM hub next to Argo CD.

#![forbid(unsafe_code)]

use argocd_pull_hub_controller::{Args, run};
use clap::Parser;

/// jemalloc instead of glibc's malloc: with 10,000 agents x 10 Applications
/// on one replica the peak was 1,417 MiB against 1,553 MiB, the same
/// before the status writes began (docs/benchmarks.md, "The fleet"):
/// glibc kept more of what the writes' parsing freed. The feature
/// `system-allocator` keeps glibc's, for heap profilers that hook malloc.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = argocd_pull_runtime::telemetry::init(&args.log, "hub-controller")?;
    run(args).await
}
