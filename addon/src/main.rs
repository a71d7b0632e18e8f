//! argocd-pull-addon: prints the OCM addon manifests.

#![forbid(unsafe_code)]

use argocd_pull_addon::{AddonConfig, cluster_management_addon};
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
    /// Print the addon manifests as YAML on standard output.
    Render {
        /// Name of the addon, as given to `clusteradm addon enable --names`.
        #[arg(long, env = "ARGOCD_PULL_ADDON_NAME", default_value = "argocd-pull")]
        addon_name: String,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Cmd::Render { addon_name } => {
            let config = AddonConfig { addon_name };
            print!(
                "{}",
                serde_yaml::to_string(&cluster_management_addon(&config))?
            );
        }
    }
    Ok(())
}
