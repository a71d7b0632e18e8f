//! Listening sockets, one way for every port of every binary.
//!
//! An unspecified address (`0.0.0.0` or `[::]`, what the chart gives)
//! listens on both IP families, as Go's `net.Listen` does and so every
//! Kubernetes component: the same flag serves a pod of an IPv4, an IPv6 or
//! a dual-stack cluster at its pod IP. Where the kernel has no IPv6,
//! `0.0.0.0` listens on IPv4 alone; any other address is taken as it is.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// Listens on `addr` with room for `backlog` connections waiting to be
/// accepted (the kernel caps it at `net.core.somaxconn`). A restarted
/// process takes its port back at once (`SO_REUSEADDR`, as
/// `TcpListener::bind`).
pub fn listen(addr: SocketAddr, backlog: u32) -> io::Result<tokio::net::TcpListener> {
    let socket = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            let both = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), addr.port());
            match bind(both, backlog) {
                Ok(s) => s,
                // No IPv6 in this kernel (or none configured): IPv4 alone.
                Err(e) if no_ipv6(&e) => bind(addr, backlog)?,
                Err(e) => return Err(e),
            }
        }
        _ => bind(addr, backlog)?,
    };
    tokio::net::TcpListener::from_std(socket.into())
}

/// The next connection of `listener`, with its peer's address as the
/// peer gave it: an IPv4 client of a socket on both families shows as
/// `10.0.0.5:41234`, not `[::ffff:10.0.0.5]:41234`.
pub async fn accept(
    listener: &tokio::net::TcpListener,
) -> io::Result<(tokio::net::TcpStream, SocketAddr)> {
    let (stream, peer) = listener.accept().await?;
    Ok((stream, canonical(peer)))
}

/// `addr` with an IPv4-mapped IPv6 address written as IPv4.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// An HTTP head, up to its blank line and not a byte further (what
/// follows belongs to the next layer), at most `max` bytes.
pub async fn read_head<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    max: usize,
) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an HTTP head longer than {max} bytes"),
            ));
        }
        tokio::io::AsyncReadExt::read_exact(stream, &mut byte).await?;
        head.push(byte[0]);
    }
    Ok(head)
}

fn bind(addr: SocketAddr, backlog: u32) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // Both families, whatever `net.ipv6.bindv6only` says.
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    Ok(socket)
}

/// Whether binding failed because the kernel has no IPv6 to offer.
fn no_ipv6(e: &io::Error) -> bool {
    // EAFNOSUPPORT (IPv6 disabled at boot) and EADDRNOTAVAIL (no IPv6
    // address configured): the same on every Linux architecture.
    matches!(e.raw_os_error(), Some(97) | Some(99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_head_ends_at_its_blank_line_and_an_endless_one_is_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        b.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nrest")
            .await
            .unwrap();
        let head = read_head(&mut a, 100).await.unwrap();
        assert_eq!(head, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut rest = [0u8; 4];
        a.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"rest");
        b.write_all(&[b'x'; 200]).await.unwrap();
        let e = read_head(&mut a, 100).await.unwrap_err();
        assert!(e.to_string().contains("longer than 100 bytes"), "{e}");
    }

    async fn reaches(addr: SocketAddr) -> bool {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    }

    fn ipv6_loopback() -> bool {
        std::net::TcpListener::bind("[::1]:0").is_ok()
    }

    #[tokio::test]
    async fn an_unspecified_ipv4_address_listens_on_both_families() {
        let listener = listen("0.0.0.0:0".parse().unwrap(), 16).unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(reaches(SocketAddr::from(([127, 0, 0, 1], port))).await);
        if ipv6_loopback() {
            assert!(listener.local_addr().unwrap().is_ipv6());
            assert!(reaches(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port)).await);
        }
    }

    #[tokio::test]
    async fn an_unspecified_ipv6_address_listens_on_both_families() {
        if !ipv6_loopback() {
            return;
        }
        let listener = listen("[::]:0".parse().unwrap(), 16).unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(reaches(SocketAddr::from(([127, 0, 0, 1], port))).await);
        assert!(reaches(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port)).await);
    }

    #[tokio::test]
    async fn an_ipv4_peer_of_a_socket_on_both_families_is_written_as_ipv4() {
        let listener = listen("0.0.0.0:0".parse().unwrap(), 16).unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = tokio::net::TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap();
        let (_, peer) = accept(&listener).await.unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let mapped: SocketAddr = "[::ffff:10.0.0.5]:41234".parse().unwrap();
        assert_eq!(canonical(mapped), "10.0.0.5:41234".parse().unwrap());
        let v6: SocketAddr = "[fd00::5]:41234".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }

    #[tokio::test]
    async fn a_given_address_is_taken_as_it_is() {
        let listener = listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(addr.ip(), IpAddr::from([127, 0, 0, 1]));
        assert!(reaches(addr).await);
        if ipv6_loopback() {
            assert!(!reaches(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())).await);
        }
    }
}
