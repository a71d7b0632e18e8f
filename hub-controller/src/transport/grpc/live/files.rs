//! The live endpoint's files (its tokens, its serving certificate), read
//! again when they change on disk, so that a rotation needs no restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The tokens of `file`, one per line, blank lines skipped.
pub fn tokens(file: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

/// The modification times of a [`Reloaded`]'s files.
type Stamps = Vec<Option<SystemTime>>;

/// A value read from files, read again when one of them changes.
pub struct Reloaded<T> {
    files: Vec<PathBuf>,
    load: fn(&[PathBuf]) -> anyhow::Result<T>,
    last: Mutex<Option<(Stamps, Arc<T>)>>,
}

impl<T> Reloaded<T> {
    pub fn new(files: Vec<PathBuf>, load: fn(&[PathBuf]) -> anyhow::Result<T>) -> Self {
        Self {
            files,
            load,
            last: Mutex::new(None),
        }
    }

    /// The value, read again if a file's modification time changed; the
    /// last good one while the files cannot be read.
    pub fn get(&self) -> anyhow::Result<Arc<T>> {
        let stamps: Stamps = self
            .files
            .iter()
            .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
            .collect();
        let mut last = self.last.lock().expect("not poisoned");
        if let Some((seen, value)) = &*last
            && *seen == stamps
        {
            return Ok(value.clone());
        }
        match (self.load)(&self.files) {
            Ok(value) => {
                let value = Arc::new(value);
                *last = Some((stamps, value.clone()));
                Ok(value)
            }
            Err(e) => match &*last {
                Some((_, value)) => {
                    tracing::warn!(error = %e, "keeping the live endpoint's last good files");
                    Ok(value.clone())
                }
                None => Err(e),
            },
        }
    }
}

pub fn load_tokens(files: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    tokens(&files[0])
}

pub fn load_tls(files: &[PathBuf]) -> anyhow::Result<Arc<ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files[0])
        .and_then(|i| i.collect())
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", files[0].display()))?;
    let key = PrivateKeyDer::from_pem_file(&files[1])
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", files[1].display()))?;
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
