//! A real HTTP/1.1-only reverse proxy for tests of the agent's WebSocket
//! wire: Debian's nginx (unpacked by `test/tools/build.sh`) on a free
//! loopback port, passing every request to the hub over HTTP/1.1 with the
//! `Upgrade` and `Connection` headers, as an ingress in front of a hub
//! does. Its `http` module cannot speak HTTP/2 to an upstream, so gRPC
//! through it fails and a WebSocket works. Its access log is readable; its
//! process is the harness's: killed on drop, or by the reaper when the
//! test process dies.

use std::net::SocketAddr;
use std::time::Duration;

use crate::Result;
use crate::daemon::Daemon;

/// What the proxy is configured with.
#[derive(Clone, Debug)]
pub struct NginxOptions {
    /// Where requests go (`proxy_pass http://<upstream>`).
    pub upstream: SocketAddr,
    /// `proxy_read_timeout`: an upstream connection that sends nothing
    /// this long is closed (a WebSocket too).
    pub read_timeout: Duration,
}

pub struct Nginx {
    pub addr: SocketAddr,
    options: NginxOptions,
    daemon: Daemon,
}

impl Nginx {
    /// Starts nginx on a free loopback port, once it accepts connections.
    pub async fn start(options: NginxOptions) -> Result<Self> {
        let daemon = Daemon::new("nginx")?;
        let mut nginx = Self {
            addr: daemon.addr,
            options,
            daemon,
        };
        let config = nginx.config();
        nginx
            .daemon
            .spawn(
                "nginx.conf",
                &config,
                // Its prefix (`-p`) is the run folder, where the file is.
                |file| {
                    let dir = file.parent().unwrap_or(file);
                    vec!["-p".into(), dir.into(), "-c".into(), file.into()]
                },
                None,
            )
            .await?;
        Ok(nginx)
    }

    /// `host:port` of the proxy, what the agent's `--hub-address` or
    /// `--websocket-url` name.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Its access log: one line per request, with the request line and
    /// the status it answered.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.daemon.dir().join("access.log")).unwrap_or_default()
    }

    /// How many requests with `path` were answered `status`.
    pub fn requests(&self, path: &str, status: u16) -> usize {
        let path = format!(" {path} ");
        let status = format!("\" {status} ");
        self.access_log()
            .lines()
            .filter(|l| l.contains(&path) && l.contains(&status))
            .count()
    }

    /// How many requests whose request line is not HTTP at all (what a TLS
    /// ClientHello reads as) it answered 400.
    pub fn garbage_requests(&self) -> usize {
        self.access_log()
            .lines()
            .filter(|l| l.contains("\" 400 ") && !l.contains(" HTTP/1."))
            .count()
    }

    /// Kills it with SIGKILL.
    pub fn kill(&mut self) {
        self.daemon.kill();
    }

    /// One process in the foreground, every path in its own folder, this
    /// port on loopback only, HTTP/1.1 to the upstream with `Upgrade`.
    fn config(&self) -> String {
        let d = self.daemon.dir().display();
        format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log stderr info;
events {{ worker_connections 256; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
  server {{
    listen {addr};
    location / {{
      proxy_pass http://{upstream};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_set_header Host $host;
      proxy_read_timeout {read}s;
      proxy_send_timeout {read}s;
    }}
  }}
}}
"#,
            addr = self.addr,
            upstream = self.options.upstream,
            read = self.options.read_timeout.as_secs().max(1),
        )
    }
}
