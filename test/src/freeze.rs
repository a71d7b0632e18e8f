//! A TCP proxy on 127.0.0.1 in front of an API server that can be frozen:
//! connections stay open, but no byte moves either way until it thaws, as
//! with a hung connection or an API server that stopped answering. Counts
//! the bytes clients sent.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::Cluster;

pub struct FreezingProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    frozen: watch::Sender<bool>,
    sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezingProxy {
    /// A proxy to `cluster`'s API server.
    pub async fn start(cluster: &Cluster) -> std::io::Result<Self> {
        let upstream: SocketAddr = cluster
            .server()
            .trim_start_matches("https://")
            .parse()
            .map_err(|e| std::io::Error::other(format!("the API server's address: {e}")))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (frozen, rx) = watch::channel(false);
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                conns.spawn(pump(cr, sw, rx.clone(), Some(counter.clone())));
                conns.spawn(pump(sr, cw, rx.clone(), None));
            }
        });
        Ok(Self {
            addr,
            upstream,
            frozen,
            sent,
            task,
        })
    }

    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Bytes clients sent through it so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// `https://<proxy>`: the API server's address through the proxy (its
    /// certificate is for 127.0.0.1, like the proxy's address).
    pub fn server(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// A copy of `cluster`'s admin kubeconfig at `path` that goes through
    /// the proxy, for a process.
    pub fn kubeconfig(&self, cluster: &Cluster, path: &Path) -> std::io::Result<PathBuf> {
        let text = std::fs::read_to_string(cluster.kubeconfig())?;
        let through = text.replace(&format!("https://{}", self.upstream), &self.server());
        if through == text {
            return Err(std::io::Error::other(
                "the kubeconfig does not name the API server's address",
            ));
        }
        std::fs::write(path, through)?;
        Ok(path.to_path_buf())
    }

    /// A client of `cluster` (admin) that goes through the proxy.
    pub async fn client(&self, cluster: &Cluster) -> crate::Result<kube::Client> {
        let kc = kube::config::Kubeconfig::read_from(cluster.kubeconfig())?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        config.cluster_url = self
            .server()
            .parse()
            .map_err(|e| std::io::Error::other(format!("{e}")))?;
        Ok(kube::Client::try_from(config)?)
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        // Ends the accept loop and, with its JoinSet, every connection.
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
    counter: Option<Arc<AtomicU64>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Read before the freeze, held after it: nothing reaches the other side.
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if let Some(c) = &counter {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
