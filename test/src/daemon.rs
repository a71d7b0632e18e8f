//! One tool from the tools' bin folder serving on a free loopback port,
//! with a run folder of its own (its configuration, logs and state) and
//! its process the harness's: killed on drop, or by the reaper when the
//! test process dies. The proxies of the tests (tinyproxy, nginx) are
//! such daemons.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{Group, wait_listening};
use crate::{Error, Result, net, paths};

pub(crate) struct Daemon {
    /// Where it listens (loopback).
    pub addr: SocketAddr,
    name: &'static str,
    dir: tempfile::TempDir,
    group: Group,
}

impl Daemon {
    /// A daemon named `name` (its binary's name in the bin folder), not
    /// started yet: a free loopback port and a run folder.
    pub fn new(name: &'static str) -> Result<Self> {
        std::fs::create_dir_all(paths::run_dir())?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir_in(paths::run_dir())?;
        let keep = std::env::var_os("ARGOCD_PULL_KEEP_DATA").is_some();
        let group = Group::new(dir.path().to_path_buf(), keep)?;
        Ok(Self {
            addr: net::free_addr()?,
            name,
            dir,
            group,
        })
    }

    /// Its run folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `config` into `file` of its folder and starts the binary
    /// with `args` (given that file's path), once it accepts connections;
    /// a failure shows `log` (a file of its folder), or its output.
    pub async fn spawn(
        &mut self,
        file: &str,
        config: &str,
        args: impl FnOnce(&Path) -> Vec<std::ffi::OsString>,
        log: Option<&str>,
    ) -> Result<()> {
        let binary = paths::bin_dir().join(self.name);
        if !binary.exists() {
            return Err(Error::MissingTool(binary));
        }
        let path = self.dir.path().join(file);
        std::fs::write(&path, config)?;
        let mut cmd = Command::new(binary);
        cmd.args(args(&path));
        self.group.spawn(self.name, cmd)?;
        let name = self.name;
        let log: Option<PathBuf> = log.map(|l| self.dir.path().join(l));
        let group = std::sync::Mutex::new(&mut self.group);
        wait_listening(
            name,
            self.addr,
            Duration::from_secs(20),
            || group.lock().unwrap().exited(Some(name)),
            || match &log {
                Some(file) => std::fs::read_to_string(file).unwrap_or_default(),
                None => group.lock().unwrap().log_tail(name, 20),
            },
        )
        .await
    }

    /// Kills it with SIGKILL.
    pub fn kill(&mut self) {
        self.group.stop(self.name);
    }

    /// Its process id while it runs.
    pub fn pid(&mut self) -> Option<u32> {
        self.group.pid(self.name)
    }
}
