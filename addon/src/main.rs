//! argocd-pull-addon: prints the OCM addon manifests.

#![forbid(unsafe_code)]

use argocd_pull_addon::{AddonConfig, render, render_helm_template};
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
        /// Where agents dial the hub (the default HUB_GRPC_ADDRESS).
        #[arg(long, default_value_t = AddonConfig::default().hub_grpc_address)]
        hub_grpc_address: String,
        /// Print the Helm chart's template (deploy/helm/argocd-pull/templates/addon.yaml) instead.
        #[arg(long, conflicts_with_all = ["agent_image", "argocd_namespace", "hub_grpc_address"])]
        helm: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Cmd::Render { helm: true, .. } => print!("{}", render_helm_template()),
        Cmd::Render {
            agent_image,
            argocd_namespace,
            hub_grpc_address,
            ..
        } => print!(
            "{}",
            render(&AddonConfig {
                agent_image,
                argocd_namespace,
                hub_grpc_address,
                ..AddonConfig::default()
            })
        ),
    }
    Ok(())
}
