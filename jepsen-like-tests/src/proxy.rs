//! The harness's network: one userspace TCP proxy per directed peer link, so partitions need
//! no root, no iptables and no network namespaces (etcd's robustness tests do the same).
//!
//! Node `a` dials node `b` through the proxy of link `a→b` (the node's `--peer-route`). A gRPC
//! connection carries bytes both ways, so each proxied connection has two pumps: the upstream
//! pump (bytes `a→b`) obeys link `a→b`, the downstream pump (bytes `b→a`, the replies) obeys
//! link `b→a`. That is how a one-way partition behaves on a real network: `a` cannot reach `b`
//! on any connection, whoever opened it.
//!
//! A cut link is a blackhole, not a reset: bytes are read and dropped, and the connection stays
//! open and silent, so a peer finds out the way it would in a real partition, by timing out.
//! A connection that lost bytes carries a broken HTTP/2 stream, so when the link heals it is
//! closed and the node reconnects: what a real network gives after a long partition, once TCP
//! gives up on the old connection.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One direction between two nodes.
#[derive(Default)]
pub struct Link {
    cut: AtomicBool,
    /// Bytes dropped while cut, for the run's report.
    dropped: AtomicU64,
}

/// Every link of the cluster and the proxies that serve them.
pub struct Net {
    links: BTreeMap<(u64, u64), Arc<Link>>,
    /// Bumped on every change so pumps stalled on a read re-check their links at once.
    changes: watch::Sender<u64>,
    proxies: BTreeMap<(u64, u64), SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Net {
    /// Starts a proxy for every ordered pair of `nodes`, each forwarding to `peer_addr(b)`.
    pub async fn start(nodes: &[u64], peer_addr: impl Fn(u64) -> SocketAddr) -> std::io::Result<Net> {
        let (changes, _) = watch::channel(0);
        let mut net = Net { links: BTreeMap::new(), changes, proxies: BTreeMap::new(), tasks: Vec::new() };
        for &a in nodes {
            for &b in nodes {
                if a != b {
                    net.links.insert((a, b), Arc::new(Link::default()));
                }
            }
        }
        for &a in nodes {
            for &b in nodes {
                if a == b {
                    continue;
                }
                let listener = TcpListener::bind("127.0.0.1:0").await?;
                net.proxies.insert((a, b), listener.local_addr()?);
                let up = net.links[&(a, b)].clone();
                let down = net.links[&(b, a)].clone();
                let target = peer_addr(b);
                let changes = net.changes.subscribe();
                net.tasks.push(tokio::spawn(accept_loop(listener, target, up, down, changes)));
            }
        }
        Ok(net)
    }

    /// The address node `a` dials to reach node `b`.
    pub fn proxy_addr(&self, a: u64, b: u64) -> Option<SocketAddr> {
        self.proxies.get(&(a, b)).copied()
    }

    /// Cuts (`true`) or heals (`false`) the direction `a→b`.
    pub fn set_cut(&self, a: u64, b: u64, cut: bool) {
        if let Some(l) = self.links.get(&(a, b)) {
            l.cut.store(cut, Ordering::SeqCst);
        }
        self.changes.send_modify(|g| *g += 1);
    }

    /// Cuts exactly the given directed links and heals every other one.
    pub fn set_cuts(&self, cuts: &[(u64, u64)]) {
        for (pair, l) in &self.links {
            l.cut.store(cuts.contains(pair), Ordering::SeqCst);
        }
        self.changes.send_modify(|g| *g += 1);
    }

    /// Heals every link.
    pub fn heal(&self) {
        self.set_cuts(&[]);
    }

    /// The directed links that are cut now.
    pub fn cuts(&self) -> Vec<(u64, u64)> {
        self.links.iter().filter(|(_, l)| l.cut.load(Ordering::SeqCst)).map(|(p, _)| *p).collect()
    }

    /// Bytes dropped by cut links so far.
    pub fn dropped_bytes(&self) -> u64 {
        self.links.values().map(|l| l.dropped.load(Ordering::Relaxed)).sum()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    up: Arc<Link>,
    down: Arc<Link>,
    changes: watch::Receiver<u64>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else { continue };
        let (up, down, changes) = (up.clone(), down.clone(), changes.clone());
        tokio::spawn(async move {
            // A dead target refuses the connection: pass that on by closing ours, as a real
            // peer's kernel would with a reset.
            let Ok(outbound) = TcpStream::connect(target).await else { return };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let poisoned = Arc::new(AtomicBool::new(false));
            let (ir, iw) = inbound.into_split();
            let (or, ow) = outbound.into_split();
            let a = pump(ir, ow, up, poisoned.clone(), changes.clone());
            let b = pump(or, iw, down, poisoned, changes);
            // Either direction ending ends the connection.
            tokio::select! {
                _ = a => {}
                _ = b => {}
            }
        });
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Arc<Link>,
    poisoned: Arc<AtomicBool>,
    mut changes: watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if poisoned.load(Ordering::SeqCst) && !link.cut.load(Ordering::SeqCst) {
            return;
        }
        tokio::select! {
            r = from.read(&mut buf) => {
                let n = match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if link.cut.load(Ordering::SeqCst) {
                    poisoned.store(true, Ordering::SeqCst);
                    link.dropped.fetch_add(n as u64, Ordering::Relaxed);
                    continue;
                }
                if poisoned.load(Ordering::SeqCst) || to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut b = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut b)).await.ok()?.ok()?;
        Some(b)
    }

    #[tokio::test]
    async fn forwards_blackholes_and_resets_after_heal() {
        let echo = echo_server().await;
        let net = Net::start(&[1, 2], |_| echo).await.unwrap_or_else(|e| panic!("{e}"));
        let proxy = net.proxy_addr(1, 2).unwrap_or_else(|| panic!("no proxy"));
        let mut s = TcpStream::connect(proxy).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(round_trip(&mut s, b"hello").await.as_deref(), Some(&b"hello"[..]));

        // One-way: replies (2→1) vanish, the connection stays open.
        net.set_cut(2, 1, true);
        assert_eq!(round_trip(&mut s, b"lost").await, None);
        assert!(net.dropped_bytes() > 0);
        assert_eq!(net.cuts(), vec![(2, 1)]);

        // Healing closes the damaged connection; a new one works.
        net.heal();
        let mut b = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(2), s.read(&mut b)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        let mut s = TcpStream::connect(proxy).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(round_trip(&mut s, b"again").await.as_deref(), Some(&b"again"[..]));
    }
}
