//! spoke-agent: runs on each managed cluster next to its Argo CD.

#![forbid(unsafe_code)]

use argocd_pull_spoke_agent::{Args, run};
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = argocd_pull_runtime::telemetry::init(&args.log, "spoke-agent")?;
    run(args).await
}
