//! A real HTTP `CONNECT` proxy for tests of the agent's egress: Debian's
//! tinyproxy (unpacked by `test/tools/build.sh`) on a free loopback port,
//! with Basic authentication and an idle timeout as a corporate proxy
//! has, its log readable, and killed (or frozen) the way a proxy host
//! fails. Its process is the harness's: killed on drop, or by the reaper
//! when the test process dies.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::daemon::Daemon;
use crate::{Error, Result};

/// What the proxy is configured with.
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    /// `BasicAuth user password`: clients must authenticate.
    pub basic_auth: Option<(String, String)>,
    /// `Timeout`: a connection idle this long (no byte either way) is
    /// closed.
    pub idle_timeout: Duration,
    /// `ConnectPort`s: the only ports `CONNECT` may reach.
    pub connect_ports: Vec<u16>,
}

pub struct TinyProxy {
    pub addr: SocketAddr,
    options: ProxyOptions,
    daemon: Daemon,
}

impl TinyProxy {
    /// Starts the proxy on a free loopback port, once it accepts
    /// connections.
    pub async fn start(options: ProxyOptions) -> Result<Self> {
        let daemon = Daemon::new("tinyproxy")?;
        let mut proxy = Self {
            addr: daemon.addr,
            options,
            daemon,
        };
        proxy.spawn().await?;
        Ok(proxy)
    }

    /// `http://127.0.0.1:<port>`, what `HTTPS_PROXY` or `--proxy` take.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything it has logged, across restarts.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// How many `CONNECT`s to `target` (`host:port`) it has logged.
    pub fn connects_to(&self, target: &str) -> usize {
        let request = format!("CONNECT {target} ");
        self.log_text()
            .lines()
            .filter(|l| l.contains(&request))
            .count()
    }

    /// Kills it with SIGKILL: no goodbye on any connection it carried
    /// beyond what the kernel says for a dead process.
    pub fn kill(&mut self) {
        self.daemon.kill();
    }

    /// Stops it with SIGSTOP: its connections stay open and nothing moves
    /// on them, as with a proxy host that hung or vanished from the
    /// network. [`TinyProxy::kill`] still ends it.
    pub fn freeze(&mut self) -> Result<()> {
        let pid = self
            .daemon
            .pid()
            .ok_or_else(|| Error::Command {
                command: "kill -STOP".into(),
                output: "tinyproxy is not running".into(),
            })?
            .to_string();
        let out = Command::new("kill").args(["-STOP", &pid]).output()?;
        if !out.status.success() {
            return Err(Error::Command {
                command: format!("kill -STOP {pid}"),
                output: String::from_utf8_lossy(&out.stderr).into(),
            });
        }
        Ok(())
    }

    /// Starts it again on the same port (after [`TinyProxy::kill`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.daemon.kill();
        self.spawn().await
    }

    fn log(&self) -> PathBuf {
        self.daemon.dir().join("proxy.log")
    }

    async fn spawn(&mut self) -> Result<()> {
        let config = self.config();
        self.daemon
            .spawn(
                "tinyproxy.conf",
                &config,
                |file| vec!["-d".into(), "-c".into(), file.into()],
                Some("proxy.log"),
            )
            .await
    }

    /// The configuration file: this port on loopback only, clients from
    /// loopback only, the options' authentication, timeout and ports.
    fn config(&self) -> String {
        let o = &self.options;
        let mut c = format!(
            "Port {}\nListen 127.0.0.1\nAllow 127.0.0.1\nTimeout {}\nLogFile \"{}\"\nLogLevel Info\nMaxClients 32\nDisableViaHeader Yes\n",
            self.addr.port(),
            o.idle_timeout.as_secs().max(1),
            self.log().display(),
        );
        if let Some((user, password)) = &o.basic_auth {
            c.push_str(&format!("BasicAuth {user} {password}\n"));
        }
        for port in &o.connect_ports {
            c.push_str(&format!("ConnectPort {port}\n"));
        }
        c
    }
}
