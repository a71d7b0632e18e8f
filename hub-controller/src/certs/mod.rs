//! The certificates of the gRPC transport, kept by the hub-controller when
//! `--grpc-manage-certificates` is on:
//!
//! - Secret `argocd-pull-signing-ca` (`kubernetes.io/tls`): the CA OCM's
//!   addon-manager signs agent client certificates with (the addon's
//!   CustomSigner). Valid a year, replaced when a third is left; its
//!   `ca-bundle.crt` keeps the previous CA until that expires, and is what
//!   the gRPC server trusts, so agents signed by the old CA keep working
//!   until OCM re-signs them (within a day).
//! - Secret `argocd-pull-serving-ca`: the CA of the gRPC serving
//!   certificate, valid ten years. Agents trust it through the addon's
//!   AddOnDeploymentConfig variable `HUB_CA`, which this module keeps set.
//! - The serving certificate itself, issued by the leader for the
//!   `--grpc-san` names, valid 90 days and renewed when a third is left;
//!   it never leaves the process's files.
//!
//! Everything is written to the files the gRPC server reads
//! (`--grpc-tls-cert`, `--grpc-tls-key`, `--grpc-client-ca`), which it picks
//! up without a restart.

pub mod pki;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use argocd_pull_apis::ocm::AddOnDeploymentConfig;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pki::Issued;
use serde_json::json;

use crate::transport::grpc::tls::TlsFiles;

pub use argocd_pull_apis::keys::SERVING_CA_SECRET;
const SIGNING_CA_NAME: &str = "argocd-pull agent signing CA";
const SERVING_CA_NAME: &str = "argocd-pull serving CA";
const SIGNING_CA_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
const SERVING_CA_LIFETIME: Duration = Duration::from_secs(3650 * 24 * 3600);
const SERVING_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);
const BUNDLE_KEY: &str = "ca-bundle.crt";
const MANAGER: &str = "argocd-pull-hub-controller";

/// Flags of the certificate keeper (docs/configuration.md).
#[derive(clap::Args, Clone, Debug)]
pub struct CertArgs {
    /// Create and rotate the agents' signing CA, the serving CA and the gRPC
    /// serving certificate, write them to the `--grpc-tls-*` files and
    /// publish the serving CA to the addon (see docs/addon.md). Without it
    /// the files are expected to be provided.
    #[arg(
        long = "grpc-manage-certificates",
        env = "ARGOCD_PULL_GRPC_MANAGE_CERTIFICATES"
    )]
    pub manage: bool,
    /// Name or IP address agents dial the gRPC server at, for the serving
    /// certificate; repeat or separate with commas.
    #[arg(
        long = "grpc-san",
        env = "ARGOCD_PULL_GRPC_SANS",
        value_delimiter = ','
    )]
    pub grpc_sans: Vec<String>,
    /// Namespace of the CA Secrets and of the addon's AddOnDeploymentConfig.
    #[arg(long = "addon-namespace", env = "ARGOCD_PULL_ADDON_NAMESPACE", default_value = argocd_pull_addon::HUB_NAMESPACE)]
    pub addon_namespace: String,
    /// The addon's default AddOnDeploymentConfig. `HUB_CA` (the serving CA)
    /// is published on it and on every other AddOnDeploymentConfig in
    /// --addon-namespace (per-cluster configs).
    #[arg(long = "addon-deployment-config", env = "ARGOCD_PULL_ADDON_DEPLOYMENT_CONFIG", default_value = argocd_pull_addon::DEPLOYMENT_CONFIG)]
    pub addon_deployment_config: String,
    /// How often the certificates are checked (renewed when a third of
    /// their lifetime is left, or re-created when deleted or broken).
    #[arg(long = "certificate-check-interval", env = "ARGOCD_PULL_CERTIFICATE_CHECK_INTERVAL", default_value = "1m", value_parser = argocd_pull_runtime::parse_duration)]
    pub certificate_check_interval: Duration,
}

impl CertArgs {
    pub fn config(&self, files: TlsFiles) -> CertConfig {
        CertConfig {
            namespace: self.addon_namespace.clone(),
            sans: self.grpc_sans.clone(),
            deployment_config: self.addon_deployment_config.clone(),
            files,
            interval: self.certificate_check_interval,
        }
    }
}

/// What the certificate keeper needs.
#[derive(Clone, Debug)]
pub struct CertConfig {
    /// Namespace of the CA Secrets and of the AddOnDeploymentConfig.
    pub namespace: String,
    /// Names and addresses agents dial, for the serving certificate.
    pub sans: Vec<String>,
    /// The default AddOnDeploymentConfig (in `namespace`); `HUB_CA` goes on every one there.
    pub deployment_config: String,
    /// Where the gRPC server reads its TLS material.
    pub files: TlsFiles,
    /// How often everything is checked.
    pub interval: Duration,
}

/// Keeps the CAs, the serving certificate and the files; one pass now
/// (so that the gRPC server can start), then one per interval until
/// `shutdown`.
pub struct Keeper {
    client: kube::Client,
    config: CertConfig,
    /// The serving certificate in use, with the CA certificate that issued it.
    serving: Option<(Issued, String)>,
}

impl Keeper {
    pub fn new(client: kube::Client, config: CertConfig) -> Self {
        Self {
            client,
            config,
            serving: None,
        }
    }

    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(self.config.interval) => {}
            }
            if let Err(e) = self.pass().await {
                tracing::error!(error = %e, "cannot keep the gRPC certificates; the current ones stay in use");
            }
        }
    }

    /// One pass: every certificate present and not due, files up to date,
    /// `HUB_CA` set.
    pub async fn pass(&mut self) -> anyhow::Result<()> {
        let now = SystemTime::now();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let signing = ensure_ca(
            &secrets,
            argocd_pull_addon::SIGNING_CA_SECRET,
            SIGNING_CA_NAME,
            pki::KeyKind::Rsa2048,
            SIGNING_CA_LIFETIME,
            now,
        )
        .await?;
        let serving_ca = ensure_ca(
            &secrets,
            SERVING_CA_SECRET,
            SERVING_CA_NAME,
            pki::KeyKind::EcdsaP256,
            SERVING_CA_LIFETIME,
            now,
        )
        .await?;
        let serving = match &self.serving {
            Some((s, ca)) if !needs_new_serving(s, ca, &serving_ca.issued.cert_pem, now) => {
                s.clone()
            }
            _ => {
                let s = pki::issue_serving(
                    &serving_ca.issued,
                    SERVING_CA_NAME,
                    &self.config.sans,
                    now,
                    SERVING_LIFETIME,
                )?;
                tracing::info!(sans = ?self.config.sans, "issued the gRPC serving certificate");
                s
            }
        };
        // Both halves of the pair land together (the server also checks
        // that what it reads is a pair, and keeps the old one if not).
        write_together(&[
            (&self.config.files.key, &serving.key_pem),
            (
                &self.config.files.cert,
                &(serving.cert_pem.clone() + &serving_ca.issued.cert_pem),
            ),
        ])?;
        write_together(&[(&self.config.files.client_ca, &signing.bundle)])?;
        self.serving = Some((serving, serving_ca.issued.cert_pem.clone()));
        self.publish_hub_ca(&serving_ca.issued.cert_pem).await
    }

    /// Sets `HUB_CA` on every AddOnDeploymentConfig in the addon's
    /// namespace (the default one and any per-cluster one, which replaces
    /// the default for its clusters and so needs the CA too), owning only
    /// that entry (the list is a map keyed by name). Nothing to do when the
    /// addon is not installed.
    async fn publish_hub_ca(&self, pem: &str) -> anyhow::Result<()> {
        let api: Api<AddOnDeploymentConfig> =
            Api::namespaced(self.client.clone(), &self.config.namespace);
        let configs = api.list(&Default::default()).await?.items;
        if !configs
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(&self.config.deployment_config))
        {
            tracing::debug!(name = %self.config.deployment_config, "no default AddOnDeploymentConfig to publish the serving CA in");
        }
        let value = argocd_pull_addon::hub_ca_variable(pem);
        for config in configs {
            let name = config.metadata.name.clone().unwrap_or_default();
            let set = config.spec.customized_variables.iter().flatten().any(|v| {
                v.name == argocd_pull_addon::HUB_CA_VARIABLE && v.value.as_ref() == Some(&value)
            });
            if set {
                continue;
            }
            let patch = json!({
                "apiVersion": "addon.open-cluster-management.io/v1alpha1",
                "kind": "AddOnDeploymentConfig",
                "metadata": { "name": name, "namespace": self.config.namespace },
                "spec": { "customizedVariables": [
                    { "name": argocd_pull_addon::HUB_CA_VARIABLE, "value": value }
                ] },
            });
            api.patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
            tracing::info!(%name, "published the gRPC serving CA to the addon's agents");
        }
        Ok(())
    }
}

/// A CA from its Secret, with the bundle to trust.
struct Ca {
    issued: Issued,
    bundle: String,
}

/// A key of a Secret, as text (empty when it is not there).
pub fn secret_text(secret: &Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

/// Reads the CA Secret `name`; creates it, or replaces a CA that is due or
/// unusable (keeping the old certificate in the bundle while it is valid).
/// Writes carry the resourceVersion read, so two writers cannot both win.
async fn ensure_ca(
    secrets: &Api<Secret>,
    name: &str,
    common_name: &str,
    kind: pki::KeyKind,
    lifetime: Duration,
    now: SystemTime,
) -> anyhow::Result<Ca> {
    let existing = secrets.get_opt(name).await?;
    if let Some(s) = &existing {
        let issued = Issued {
            cert_pem: secret_text(s, "tls.crt"),
            key_pem: secret_text(s, "tls.key"),
        };
        if pki::usable(&issued) && pki::validity(&issued.cert_pem).is_some_and(|v| !v.due(now)) {
            let mut bundle = secret_text(s, BUNDLE_KEY);
            if bundle.is_empty() {
                bundle = issued.cert_pem.clone();
            }
            return Ok(Ca { issued, bundle });
        }
    }
    let issued = pki::new_ca(common_name, kind, now, lifetime)?;
    let previous = existing
        .as_ref()
        .map(|s| secret_text(s, BUNDLE_KEY) + &secret_text(s, "tls.crt"))
        .unwrap_or_default();
    let bundle = pki::bundle(&issued.cert_pem, &previous, now);
    let data = [
        ("tls.crt", issued.cert_pem.clone()),
        ("tls.key", issued.key_pem.clone()),
        (BUNDLE_KEY, bundle.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    let mut secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                [(
                    "app.kubernetes.io/part-of".to_string(),
                    "argocd-pull".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    match existing {
        None => {
            secrets.create(&PostParams::default(), &secret).await?;
            tracing::info!(secret = %name, "created the CA");
        }
        Some(old) => {
            secret.metadata.resource_version = old.metadata.resource_version;
            secrets
                .replace(name, &PostParams::default(), &secret)
                .await?;
            tracing::warn!(secret = %name, "replaced a CA that was due for renewal or unusable; the previous certificate stays trusted until it expires");
        }
    }
    Ok(Ca { issued, bundle })
}

/// Whether the serving certificate `serving`, issued by the CA certificate
/// `issuer`, must be replaced now that the serving CA is `ca`.
fn needs_new_serving(serving: &Issued, issuer: &str, ca: &str, now: SystemTime) -> bool {
    issuer != ca || pki::validity(&serving.cert_pem).is_none_or(|v| v.due(now))
}

/// Writes each `(path, content)` whose file differs: every content to a
/// temporary file next to its path first (owner-only, synced), then the
/// renames one after the other, so that a reader never sees half a file
/// and the window in which one file is new and the other old is two
/// renames wide (the gRPC server refuses such a pair and keeps its own).
fn write_together(files: &[(&Path, &str)]) -> anyhow::Result<()> {
    let changed: Vec<(&Path, &str)> = files
        .iter()
        .filter(|(path, content)| !std::fs::read(path).is_ok_and(|c| c == content.as_bytes()))
        .copied()
        .collect();
    let mut staged = Vec::new();
    for (path, content) in &changed {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = temporary(path);
        stage(&tmp, content).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
        staged.push((tmp, *path));
    }
    for (tmp, path) in &staged {
        std::fs::rename(tmp, path)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    for (_, path) in &staged {
        // The renames survive a crash too.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
    }
    Ok(())
}

/// `tls.key` -> `.tls.key.tmp`: one temporary file per target.
fn temporary(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Owner-only from the start: a key must never be readable by others, not
/// even for a moment, and a temporary file left by a crash (whatever its
/// mode) is replaced, not reused.
fn stage(tmp: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)?;
    f.write_all(content.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn the_serving_certificate_is_renewed_for_a_new_ca_or_when_due() {
        let now = SystemTime::now();
        let ca = pki::new_ca(SERVING_CA_NAME, pki::KeyKind::EcdsaP256, now, 90 * DAY).unwrap();
        let other = pki::new_ca(SERVING_CA_NAME, pki::KeyKind::EcdsaP256, now, 90 * DAY).unwrap();
        let leaf = pki::issue_serving(&ca, SERVING_CA_NAME, &["a".into()], now, 90 * DAY).unwrap();
        assert!(!needs_new_serving(&leaf, &ca.cert_pem, &ca.cert_pem, now));
        assert!(
            needs_new_serving(&leaf, &ca.cert_pem, &other.cert_pem, now),
            "same name, other key"
        );
        assert!(needs_new_serving(
            &leaf,
            &ca.cert_pem,
            &ca.cert_pem,
            now + 61 * DAY
        ));
    }

    #[test]
    fn files_are_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/tls.crt");
        write_together(&[(&path, "a")]).unwrap();
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        write_together(&[(&path, "a")]).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            before
        );
        write_together(&[(&path, "b")]).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b");
    }

    #[test]
    fn a_pair_is_staged_owner_only_then_renamed_into_place() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        // A temporary file a crash left behind, readable by all.
        std::fs::write(temporary(&key), "old").unwrap();
        std::fs::set_permissions(temporary(&key), std::fs::Permissions::from_mode(0o644)).unwrap();
        write_together(&[(&key, "KEY"), (&cert, "CERT")]).unwrap();
        for (path, want) in [(&key, "KEY"), (&cert, "CERT")] {
            assert_eq!(std::fs::read_to_string(path).unwrap(), want);
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", path.display());
        }
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["tls.crt", "tls.key"], "no temporary file left");
    }
}
