//! hub-controller: runs on the OCM hub next to Argo CD.

#![forbid(unsafe_code)]

use argocd_pull_hub_controller::{Args, run};
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    argocd_pull_runtime::telemetry::init(&args.log)?;
    run(args).await
}
