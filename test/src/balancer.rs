//! A stand-in for a Kubernetes Service in front of several replicas on
//! loopback: a TCP balancer that hands each new connection to the next
//! backend, in turn, that accepts it, as kube-proxy does with the Ready
//! endpoints. A backend that dies ends its connections (the kernel closes
//! them), so clients reconnect through the balancer to the others.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// Each new connection goes to the next backend, in turn, that accepts it.
pub struct Balancer {
    pub addr: SocketAddr,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Balancer {
    /// Listens on a free loopback port; no backends yet ([`Self::set`]).
    pub async fn start() -> std::io::Result<Balancer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let backends: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
        let b = backends.clone();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((mut inbound, _)) = listener.accept().await {
                let list = b.lock().expect("never poisoned").clone();
                next = next.wrapping_add(1);
                let start = next;
                tokio::spawn(async move {
                    for i in 0..list.len() {
                        let to = list[(start + i) % list.len()];
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                            let _ = inbound.set_nodelay(true);
                            let _ = outbound.set_nodelay(true);
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            return;
                        }
                    }
                });
            }
        });
        Ok(Balancer {
            addr,
            backends,
            task,
        })
    }

    /// The endpoints: the Ready replicas' addresses.
    pub fn set(&self, backends: &[SocketAddr]) {
        *self.backends.lock().expect("never poisoned") = backends.to_vec();
    }

    pub fn address(&self) -> String {
        format!("https://{}", self.addr)
    }
}
