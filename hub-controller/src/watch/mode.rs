//! Which mode the hub accepts from a cluster's agent. An agent does not
//! pick its own: the hub reads the same setting that deploys it, the
//! `AGENT_MODE` variable of the AddOnDeploymentConfig that configures the
//! cluster's argocd-pull addon, and refuses an agent that claims another.

use argocd_pull_addon::{DEFAULT_MODE, MODE_VARIABLE};
use argocd_pull_apis::ocm::{AddOnDeploymentConfig, ManagedClusterAddOn};
use argocd_pull_proto::v1::AgentMode;

const GROUP: &str = "addon.open-cluster-management.io";
const RESOURCE: &str = "addondeploymentconfigs";

/// An AddOnDeploymentConfig by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ConfigRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AddOnDeploymentConfig {}/{}", self.namespace, self.name)
    }
}

/// The mode a cluster's agent must run in, and where that was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Configured {
    pub mode: AgentMode,
    pub source: String,
}

/// The config that applies to the cluster: the one OCM reports applying
/// (`status.configReferences`, which also covers configs chosen by the
/// ClusterManagementAddOn's placements), else the one the
/// ManagedClusterAddOn names (`spec.configs`), else the addon's default.
pub fn config_ref(addon: &ManagedClusterAddOn, default: &ConfigRef) -> ConfigRef {
    let namespace = |ns: &Option<String>| ns.clone().unwrap_or_default();
    let reported = addon.status.as_ref().and_then(|s| {
        s.config_references.iter().flatten().find_map(|r| {
            let ours = r.resource == RESOURCE && r.group.as_deref().unwrap_or(GROUP) == GROUP;
            let desired = r.desired_config.as_ref()?;
            ours.then(|| ConfigRef {
                namespace: namespace(&desired.namespace),
                name: desired.name.clone(),
            })
        })
    });
    let named = || {
        addon.spec.configs.iter().flatten().find_map(|c| {
            let ours = c.resource == RESOURCE && c.group.as_deref().unwrap_or(GROUP) == GROUP;
            ours.then(|| ConfigRef {
                namespace: namespace(&c.namespace),
                name: c.name.clone(),
            })
        })
    };
    reported.or_else(named).unwrap_or_else(|| default.clone())
}

/// The configured mode, from the config [`config_ref`] picks (looked up
/// with `config`). A config that does not exist or sets no `AGENT_MODE`
/// leaves the template's default (`managed`), as it does for the agent; a
/// value the agent cannot run with is an error that says what to fix.
pub fn configured(
    reference: &ConfigRef,
    config: Option<&AddOnDeploymentConfig>,
) -> Result<Configured, String> {
    let value = config.and_then(|c| {
        c.spec
            .customized_variables
            .iter()
            .flatten()
            .find(|v| v.name == MODE_VARIABLE)
            .and_then(|v| v.value.clone())
    });
    let (value, source) = match value {
        Some(v) => (v, format!("{MODE_VARIABLE} of {reference}")),
        None => (
            DEFAULT_MODE.to_string(),
            format!("the default: {reference} does not set {MODE_VARIABLE}"),
        ),
    };
    let mode = match value.as_str() {
        "managed" => AgentMode::Managed,
        "autonomous" => AgentMode::Autonomous,
        other => {
            return Err(format!(
                "{MODE_VARIABLE} of {reference} is {other:?}; set it to managed or autonomous"
            ));
        }
    };
    Ok(Configured { mode, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn default() -> ConfigRef {
        ConfigRef {
            namespace: "argocd-pull".into(),
            name: "argocd-pull".into(),
        }
    }

    fn addon(spec: serde_json::Value, status: serde_json::Value) -> ManagedClusterAddOn {
        serde_json::from_value(json!({
            "apiVersion": "addon.open-cluster-management.io/v1alpha1",
            "kind": "ManagedClusterAddOn",
            "metadata": { "name": "argocd-pull", "namespace": "c1" },
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    fn adc(vars: serde_json::Value) -> AddOnDeploymentConfig {
        serde_json::from_value(json!({
            "apiVersion": "addon.open-cluster-management.io/v1alpha1",
            "kind": "AddOnDeploymentConfig",
            "metadata": { "name": "x", "namespace": "argocd-pull" },
            "spec": { "customizedVariables": vars },
        }))
        .unwrap()
    }

    fn named(name: &str) -> ConfigRef {
        ConfigRef {
            namespace: "argocd-pull".into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_reported_config_wins_over_the_named_one_and_the_default() {
        let spec = json!({ "configs": [
            { "group": GROUP, "resource": "addontemplates", "name": "t" },
            { "group": GROUP, "resource": RESOURCE, "namespace": "argocd-pull", "name": "named" },
        ] });
        let status = json!({ "configReferences": [
            { "group": GROUP, "resource": RESOURCE, "name": "", "desiredConfig":
              { "namespace": "argocd-pull", "name": "reported", "specHash": "h" } },
        ] });
        let d = default();
        assert_eq!(config_ref(&addon(json!({}), json!({})), &d), d);
        assert_eq!(
            config_ref(&addon(spec.clone(), json!({})), &d),
            named("named")
        );
        assert_eq!(config_ref(&addon(spec, status), &d), named("reported"));
    }

    #[test]
    fn the_mode_is_agent_mode_or_managed_and_nothing_else() {
        let r = named("x");
        let set = |v: &str| {
            adc(
                json!([{ "name": "HUB_GRPC_ADDRESS", "value": "h" }, { "name": MODE_VARIABLE, "value": v }]),
            )
        };
        assert_eq!(
            configured(&r, Some(&set("autonomous"))).unwrap().mode,
            AgentMode::Autonomous
        );
        assert_eq!(
            configured(&r, Some(&set("managed"))).unwrap().mode,
            AgentMode::Managed
        );
        let unset = configured(&r, Some(&adc(json!([])))).unwrap();
        assert_eq!(unset.mode, AgentMode::Managed);
        assert!(
            unset.source.contains("does not set AGENT_MODE"),
            "{unset:?}"
        );
        assert_eq!(configured(&r, None).unwrap().mode, AgentMode::Managed);
        let bad = configured(&r, Some(&set("Autonomous"))).unwrap_err();
        assert!(bad.contains("AddOnDeploymentConfig argocd-pull/x"), "{bad}");
        assert!(bad.contains("managed or autonomous"), "{bad}");
    }
}
