//! What one client (one peer address) holds of the live port: its
//! connections, handshaking or open, and its handshakes under way, each
//! bounded, so that no one client takes the endpoint's places for
//! everyone (the live port is reachable before any token is checked).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// A client's share of the endpoint's handshakes under way at once.
pub const HANDSHAKES_PER_CLIENT: usize = 16;

/// What each client holds now.
#[derive(Debug)]
pub struct Clients {
    held: Mutex<HashMap<IpAddr, Held>>,
    max_connections: usize,
}

#[derive(Clone, Copy, Debug, Default)]
struct Held {
    connections: usize,
    handshakes: usize,
}

/// Which bound a client reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    Connections,
    Handshakes,
}

impl Clients {
    /// At most `max_connections` connections of one client at once.
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::default(),
            max_connections,
        })
    }

    /// A new connection of `ip`, through its handshake: its place, and its
    /// handshake's (dropped when the handshake ends).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<(Slot, Slot), Full> {
        let mut held = self.held.lock().expect("never poisoned");
        let h = held.entry(ip).or_default();
        if h.connections >= self.max_connections {
            return Err(Full::Connections);
        }
        if h.handshakes >= HANDSHAKES_PER_CLIENT {
            return Err(Full::Handshakes);
        }
        h.connections += 1;
        h.handshakes += 1;
        let slot = |handshake| Slot {
            clients: self.clone(),
            ip,
            handshake,
        };
        Ok((slot(false), slot(true)))
    }

    fn release(&self, ip: IpAddr, handshake: bool) {
        let mut held = self.held.lock().expect("never poisoned");
        if let Some(h) = held.get_mut(&ip) {
            match handshake {
                true => h.handshakes = h.handshakes.saturating_sub(1),
                false => h.connections = h.connections.saturating_sub(1),
            }
            if h.connections == 0 && h.handshakes == 0 {
                held.remove(&ip);
            }
        }
    }
}

/// One place of a client: a connection's, or its handshake's; given back
/// when dropped.
#[derive(Debug)]
pub struct Slot {
    clients: Arc<Clients>,
    ip: IpAddr,
    handshake: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.clients.release(self.ip, self.handshake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_is_held_to_its_share_and_others_are_not() {
        let clients = Clients::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let (a1, h1) = clients.admit(a).unwrap();
        let (a2, _h2) = clients.admit(a).unwrap();
        assert_eq!(clients.admit(a).unwrap_err(), Full::Connections);
        // Another client is not held back by the first.
        let (_b1, _) = clients.admit(b).unwrap();
        // A connection that ends gives its place back; its handshake's
        // place went when the handshake did.
        drop(h1);
        drop(a1);
        let (_a3, _) = clients.admit(a).unwrap();
        drop(a2);
        assert!(clients.held.lock().unwrap().contains_key(&a));
    }

    #[test]
    fn handshakes_under_way_are_bounded_per_client() {
        let clients = Clients::new(1000);
        let a: IpAddr = "::1".parse().unwrap();
        let held: Vec<_> = (0..HANDSHAKES_PER_CLIENT)
            .map(|_| clients.admit(a).unwrap())
            .collect();
        assert_eq!(clients.admit(a).unwrap_err(), Full::Handshakes);
        // Handshakes done, connections open: room for more handshakes.
        let connections: Vec<_> = held.into_iter().map(|(c, _h)| c).collect();
        assert!(clients.admit(a).is_ok());
        assert_eq!(connections.len(), HANDSHAKES_PER_CLIENT);
    }
}
