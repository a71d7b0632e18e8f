//! argocd-pull-addon: prints the OCM addon manifests.

#![forbid(unsafe_code)]

use argocd_pull_addon::{AddonConfig, render};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "argocd-pull-addon",
    version,
    about = "Renders the OCM addon manifests of argocd-pull"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the ClusterManagementAddOn, AddOnTemplate, default
    /// AddOnDeploymentConfig and the addon-manager's RBAC as YAML.
    Render {
        /// Default image of the spoke-agent.
        #[arg(long, default_value_t = AddonConfig::default().agent_image)]
        agent_image: String,
        /// Namespace of the managed clusters' Argo CD.
        #[arg(long, default_value_t = AddonConfig::default().argocd_namespace)]
        argocd_namespace: String,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Cmd::Render {
            agent_image,
            argocd_namespace,
        } => print!(
            "{}",
            render(&AddonConfig {
                agent_image,
                argocd_namespace,
            })
        ),
    }
    Ok(())
}
