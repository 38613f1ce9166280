//! The peer link ([`PeerLink`]): datagrams straight from one host of a
//! group to another for the messages a packet waits on — a pull's request
//! and answer, a suspected host's probe and its answer — beside the bus,
//! which carries everything else (and these too where a link is not set up
//! or a message is too big for one datagram).
//!
//! Through the bus a request and its answer each cross two processes and
//! two TCP connections (host → NATS → host); on a shared machine every
//! crossing waits for a time slice. A datagram crosses one socket.
//!
//! **Authentication.** A datagram is accepted only with a valid HMAC-SHA256
//! tag under a key the *receiver* chose for that one sender and handed to
//! it over the bus ([`LinkOffer`], on the sender's own peer subject, which
//! NATS permissions keep to the two hosts): a host cannot speak for another
//! on the link, and nothing from outside the group can speak at all. Each
//! datagram carries the sender's sequence number; one already seen, or
//! older than the last [`WINDOW`] numbers, is refused (a replay). Keys are
//! made at random per process and per sender, so a restarted host's old
//! datagrams are refused too. Only the messages listed above are accepted
//! from the link (see [`crate::Peer::receive_link`]): a link offer, a
//! commit or a pool binding never travels on it.
//!
//! **Loss.** Datagrams may be lost (a full socket buffer); a lost pull
//! ends as the pull wait's timeout, a lost probe is sent again with the
//! next one — the same as a slow bus.
//!
//! Datagram: `SLK1`, the sender's name (a length byte, then its bytes),
//! its sequence number (8 bytes, little-endian), the message, the tag
//! (32 bytes) over everything before it.

use crate::HashMap;
use hmac::{Hmac, Mac};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of one datagram at most; bigger messages take the bus.
pub const MAX_DATAGRAM: usize = 32 * 1024;
/// Bytes of a link key.
pub const KEY: usize = 32;
/// Bytes of a datagram's tag.
const TAG: usize = 32;
/// Bytes before a datagram's sender name.
const MAGIC: &[u8; 4] = b"SLK1";
/// Sequence numbers behind the newest seen that are still accepted (once).
pub const WINDOW: u64 = 128;
/// Hosts a link keeps offers for or from, at most (a group's hosts).
pub const MAX_PEERS: usize = 1024;
/// Bytes of an offered address at most.
const MAX_ADDR: usize = 64;

type HmacSha256 = Hmac<Sha256>;

/// Why a datagram or an offer was refused.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Not a datagram of this format.
    #[error("malformed link datagram: {0}")]
    Malformed(&'static str),
    /// From a host this one offered no key to.
    #[error("link datagram from host '{0}', which was offered no link")]
    Unknown(String),
    /// The tag does not match.
    #[error("link datagram from '{0}' with a bad tag (forged, or under an old key)")]
    Forged(String),
    /// A sequence number seen before or too old.
    #[error("link datagram from '{0}' replayed (sequence number {1})")]
    Replayed(String, u64),
    /// An offer that cannot be used.
    #[error("link offer from '{0}' refused: {1}")]
    Offer(String, String),
    /// The socket failed.
    #[error("peer link socket: {0}")]
    Io(#[from] std::io::Error),
}

/// A host's offer of its link to one other host: send datagrams to
/// `addr`, tagged with `key` (chosen for that host alone). Travels on the
/// bus only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkOffer {
    /// `ip:port` the offering host receives datagrams at.
    pub addr: String,
    /// The key the receiving host tags its datagrams to it with.
    pub key: Vec<u8>,
}

impl LinkOffer {
    /// Checks the offer's bounds (a wire message).
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.addr.len() > MAX_ADDR {
            return Err(format!("link address of {} bytes (at most {MAX_ADDR})", self.addr.len()));
        }
        if self.key.len() != KEY {
            return Err(format!("link key of {} bytes (must be {KEY})", self.key.len()));
        }
        Ok(())
    }
}

/// What this host offered one sender: its key and the sequence numbers
/// seen from it.
#[derive(Debug)]
struct Inbound {
    key: [u8; KEY],
    /// The newest sequence number accepted (0: none yet).
    newest: u64,
    /// Bit `i`: `newest - i` was accepted.
    seen: u128,
}

impl Inbound {
    /// Accepts `seq` once, within the window.
    fn accept(&mut self, seq: u64) -> bool {
        if seq > self.newest {
            let shift = seq - self.newest;
            self.seen = if shift >= 128 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.newest = seq;
            return true;
        }
        let back = self.newest - seq;
        if back >= WINDOW || self.seen & (1u128 << back) != 0 {
            return false;
        }
        self.seen |= 1u128 << back;
        true
    }
}

/// What one receiver offered this host.
#[derive(Debug)]
struct Outbound {
    addr: SocketAddr,
    key: [u8; KEY],
    seq: AtomicU64,
}

/// What a link did, for the host report.
#[derive(Debug, Default)]
pub(crate) struct LinkCounts {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub refused: AtomicU64,
    /// Bytes of the datagrams refused.
    pub refused_bytes: AtomicU64,
    /// Windows in which datagrams that failed their check came as a
    /// flood ([`PeerLink::note_flood`]).
    pub floods: AtomicU64,
    /// Messages for the link that took the bus (no offer from the
    /// receiver, too big, or the socket would not take them).
    pub by_bus: AtomicU64,
}

/// A host's end of its group's peer links.
#[derive(Debug)]
pub struct PeerLink {
    me: String,
    /// Where datagrams arrive (blocking reads by the link's thread).
    socket: UdpSocket,
    /// Where they leave from (never blocks a worker).
    sender: UdpSocket,
    addr: SocketAddr,
    inbound: Mutex<HashMap<String, Inbound>>,
    outbound: RwLock<HashMap<String, Arc<Outbound>>>,
    pub(crate) counts: LinkCounts,
}

impl PeerLink {
    /// Binds host `me`'s link at `addr` (port 0: any free port), which
    /// must be an address its peers reach it at, not `0.0.0.0` or `::`.
    pub fn bind(me: &str, addr: SocketAddr) -> Result<PeerLink, LinkError> {
        if addr.ip().is_unspecified() {
            return Err(LinkError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{addr} is not an address peers can send to: give this host's own address (e.g. 10.0.0.5:7401)"
                ),
            )));
        }
        let socket = UdpSocket::bind(addr)?;
        let addr = socket.local_addr()?;
        let sender = UdpSocket::bind(SocketAddr::new(addr.ip(), 0))?;
        sender.set_nonblocking(true)?;
        Ok(PeerLink {
            me: me.to_string(),
            socket,
            sender,
            addr,
            inbound: Mutex::new(HashMap::default()),
            outbound: RwLock::new(HashMap::default()),
            counts: LinkCounts::default(),
        })
    }

    /// Datagrams refused so far, and their bytes (what checking them
    /// cost).
    pub fn refused(&self) -> (u64, u64) {
        (self.counts.refused.load(Ordering::Relaxed), self.counts.refused_bytes.load(Ordering::Relaxed))
    }

    /// Counts a window in which the datagrams refused were a flood (the
    /// receiving thread's judgement: see the host's peer link thread).
    pub fn note_flood(&self) {
        self.counts.floods.fetch_add(1, Ordering::Relaxed);
    }

    /// Where this link receives.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This host's offer to host `to` (its key for `to` is made on the
    /// first offer and kept); `None` when it already keeps [`MAX_PEERS`].
    pub fn offer_for(&self, to: &str) -> Option<LinkOffer> {
        let mut inbound = self.inbound.lock();
        if !inbound.contains_key(to) {
            if inbound.len() >= MAX_PEERS {
                return None;
            }
            let mut key = [0u8; KEY];
            getrandom::fill(&mut key).ok()?;
            inbound.insert(to.to_string(), Inbound { key, newest: 0, seen: 0 });
        }
        let key = inbound.get(to)?.key;
        Some(LinkOffer { addr: self.addr.to_string(), key: key.to_vec() })
    }

    /// Takes host `from`'s offer: this host now sends it datagrams there.
    /// True when it is new (another address or key: the host is new or
    /// was restarted, and may need this host's offer in turn).
    pub fn take_offer(&self, from: &str, offer: &LinkOffer) -> Result<bool, LinkError> {
        let refuse = |why: String| LinkError::Offer(from.to_string(), why);
        offer.check().map_err(refuse)?;
        let addr: SocketAddr = offer.addr.parse().map_err(|e| refuse(format!("address '{}': {e}", offer.addr)))?;
        if addr.ip().is_unspecified() || addr.port() == 0 {
            return Err(refuse(format!("address {addr} cannot be sent to")));
        }
        let mut key = [0u8; KEY];
        key.copy_from_slice(&offer.key);
        let mut outbound = self.outbound.write();
        if let Some(o) = outbound.get(from)
            && o.addr == addr
            && o.key == key
        {
            return Ok(false);
        }
        if !outbound.contains_key(from) && outbound.len() >= MAX_PEERS {
            return Err(refuse(format!("this host keeps links to {MAX_PEERS} hosts at most")));
        }
        outbound.insert(from.to_string(), Arc::new(Outbound { addr, key, seq: AtomicU64::new(1) }));
        Ok(true)
    }

    /// Sends `body` to host `to` as one datagram: false when it cannot go
    /// this way (no offer from `to`, too big, the socket full), for the
    /// caller to send it on the bus.
    pub fn send(&self, to: &str, body: &[u8]) -> bool {
        let Some(o) = self.outbound.read().get(to).cloned() else {
            self.counts.by_bus.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let seq = o.seq.fetch_add(1, Ordering::Relaxed);
        let Some(d) = seal(&self.me, seq, body, &o.key) else {
            self.counts.by_bus.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        match self.sender.send_to(&d, o.addr) {
            Ok(_) => {
                self.counts.sent.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.counts.by_bus.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Waits for the next datagram (at most `timeout`) into `buf` and
    /// checks it: its sender and message. `Ok(None)` when none came.
    pub fn receive<'b>(
        &self,
        buf: &'b mut [u8],
        timeout: std::time::Duration,
    ) -> Result<Option<(String, &'b [u8])>, LinkError> {
        self.socket.set_read_timeout(Some(timeout.max(std::time::Duration::from_millis(1))))?;
        let n = match self.socket.recv_from(buf) {
            Ok((n, _)) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let d = buf.get(..n).ok_or(LinkError::Malformed("longer than the buffer"))?;
        match self.open(d) {
            Ok(m) => {
                self.counts.received.fetch_add(1, Ordering::Relaxed);
                Ok(Some(m))
            }
            Err(e) => {
                self.counts.refused.fetch_add(1, Ordering::Relaxed);
                self.counts.refused_bytes.fetch_add(n as u64, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Checks datagram `d`: its sender, tag and sequence number.
    fn open<'d>(&self, d: &'d [u8]) -> Result<(String, &'d [u8]), LinkError> {
        let (from, seq, body, signed, tag) = split(d)?;
        let mut inbound = self.inbound.lock();
        let Some(i) = inbound.get_mut(from) else {
            return Err(LinkError::Unknown(from.to_string()));
        };
        let mut mac = HmacSha256::new_from_slice(&i.key).map_err(|_| LinkError::Malformed("key"))?;
        mac.update(signed);
        if mac.verify_slice(tag).is_err() {
            return Err(LinkError::Forged(from.to_string()));
        }
        if !i.accept(seq) {
            return Err(LinkError::Replayed(from.to_string(), seq));
        }
        Ok((from.to_string(), body))
    }
}

/// A datagram from `me` with sequence number `seq` carrying `body`,
/// tagged under `key`; `None` when over [`MAX_DATAGRAM`].
fn seal(me: &str, seq: u64, body: &[u8], key: &[u8; KEY]) -> Option<Vec<u8>> {
    let name = u8::try_from(me.len()).ok()?;
    let len = MAGIC.len() + 1 + me.len() + 8 + body.len() + TAG;
    if len > MAX_DATAGRAM {
        return None;
    }
    let mut d = Vec::with_capacity(len);
    d.extend_from_slice(MAGIC);
    d.push(name);
    d.extend_from_slice(me.as_bytes());
    d.extend_from_slice(&seq.to_le_bytes());
    d.extend_from_slice(body);
    let mut mac = HmacSha256::new_from_slice(key).ok()?;
    mac.update(&d);
    d.extend_from_slice(&mac.finalize().into_bytes());
    Some(d)
}

/// A datagram's parts: sender, sequence number, message, the bytes the
/// tag covers and the tag.
type Parts<'d> = (&'d str, u64, &'d [u8], &'d [u8], &'d [u8]);

fn split(d: &[u8]) -> Result<Parts<'_>, LinkError> {
    let rest = d.strip_prefix(MAGIC.as_slice()).ok_or(LinkError::Malformed("not a peer link datagram"))?;
    let (&n, rest) = rest.split_first().ok_or(LinkError::Malformed("no sender"))?;
    let n = usize::from(n);
    if rest.len() < n + 8 + TAG {
        return Err(LinkError::Malformed("shorter than its header and tag"));
    }
    let (name, rest) = rest.split_at(n);
    let from = std::str::from_utf8(name).map_err(|_| LinkError::Malformed("sender name not UTF-8"))?;
    let (seq, rest) = rest.split_at(8);
    let mut s = [0u8; 8];
    s.copy_from_slice(seq);
    let (body, tag) = rest.split_at(rest.len() - TAG);
    let signed = d.get(..d.len() - TAG).ok_or(LinkError::Malformed("shorter than its tag"))?;
    Ok((from, u64::from_le_bytes(s), body, signed, tag))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use std::time::Duration;

    fn pair() -> (PeerLink, PeerLink) {
        let a = PeerLink::bind("h1", "127.0.0.1:0".parse().unwrap()).unwrap();
        let b = PeerLink::bind("h2", "127.0.0.1:0".parse().unwrap()).unwrap();
        // b offers a link to a, a to b.
        assert!(a.take_offer("h2", &b.offer_for("h1").unwrap()).unwrap());
        assert!(b.take_offer("h1", &a.offer_for("h2").unwrap()).unwrap());
        (a, b)
    }

    fn next(l: &PeerLink) -> Result<Option<(String, Vec<u8>)>, LinkError> {
        let mut buf = vec![0u8; 65_536];
        l.receive(&mut buf, Duration::from_secs(2)).map(|m| m.map(|(f, b)| (f, b.to_vec())))
    }

    #[test]
    fn a_datagram_reaches_the_host_that_offered_the_link() {
        let (a, b) = pair();
        assert!(a.send("h2", b"pull"));
        assert_eq!(next(&b).unwrap(), Some(("h1".to_string(), b"pull".to_vec())));
        assert!(b.send("h1", b"answer"));
        assert_eq!(next(&a).unwrap(), Some(("h2".to_string(), b"answer".to_vec())));
        // The same offer again is not new; no offer: the bus.
        assert!(!a.take_offer("h2", &b.offer_for("h1").unwrap()).unwrap());
        assert!(!a.send("h3", b"x"));
        assert!(!a.send("h2", &vec![0u8; MAX_DATAGRAM]));
        assert_eq!(a.counts.by_bus.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn forged_replayed_and_unknown_datagrams_are_refused() {
        let (a, b) = pair();
        let key = a.outbound.read().get("h2").unwrap().key;
        let good = seal("h1", 7, b"pull", &key).unwrap();
        let to = b.addr();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(&good, to).unwrap();
        assert_eq!(next(&b).unwrap().unwrap().1, b"pull");
        // The same datagram again: a replay.
        s.send_to(&good, to).unwrap();
        assert!(matches!(next(&b), Err(LinkError::Replayed(_, 7))));
        // A changed byte, another key, another host's name, garbage.
        let mut bad = seal("h1", 8, b"pull", &key).unwrap();
        let i = bad.len() - TAG - 1;
        bad[i] ^= 1;
        s.send_to(&bad, to).unwrap();
        assert!(matches!(next(&b), Err(LinkError::Forged(_))));
        s.send_to(&seal("h1", 9, b"pull", &[7u8; KEY]).unwrap(), to).unwrap();
        assert!(matches!(next(&b), Err(LinkError::Forged(_))));
        s.send_to(&seal("h3", 9, b"pull", &key).unwrap(), to).unwrap();
        assert!(matches!(next(&b), Err(LinkError::Unknown(_))));
        for junk in [&b""[..], b"SLK1", b"SLK1\x05h1", &[0xffu8; 100][..]] {
            s.send_to(junk, to).unwrap();
            assert!(matches!(next(&b), Err(LinkError::Malformed(_))));
        }
        assert_eq!(b.counts.refused.load(Ordering::Relaxed), 8);
        // Within the window, out of order, once each; older ones refused.
        s.send_to(&seal("h1", 300, b"a", &key).unwrap(), to).unwrap();
        s.send_to(&seal("h1", 250, b"b", &key).unwrap(), to).unwrap();
        s.send_to(&seal("h1", 100, b"c", &key).unwrap(), to).unwrap();
        assert_eq!(next(&b).unwrap().unwrap().1, b"a");
        assert_eq!(next(&b).unwrap().unwrap().1, b"b");
        assert!(matches!(next(&b), Err(LinkError::Replayed(_, 100))));
    }

    #[test]
    fn offers_are_bounded_and_checked() {
        let a = PeerLink::bind("h1", "127.0.0.1:0".parse().unwrap()).unwrap();
        let bad = [
            LinkOffer { addr: "127.0.0.1:9".into(), key: vec![1; 16] },
            LinkOffer { addr: "0.0.0.0:9".into(), key: vec![1; KEY] },
            LinkOffer { addr: "127.0.0.1:0".into(), key: vec![1; KEY] },
            LinkOffer { addr: "not an address".into(), key: vec![1; KEY] },
            LinkOffer { addr: "1".repeat(100), key: vec![1; KEY] },
        ];
        for o in &bad {
            assert!(matches!(a.take_offer("h2", o), Err(LinkError::Offer(..))), "{o:?}");
        }
        assert!(PeerLink::bind("h1", "0.0.0.0:0".parse().unwrap()).is_err());
        // A restarted host's new key replaces the old one.
        let o = LinkOffer { addr: "127.0.0.1:9".into(), key: vec![1; KEY] };
        assert!(a.take_offer("h2", &o).unwrap());
        assert!(a.take_offer("h2", &LinkOffer { key: vec![2; KEY], ..o }).unwrap());
        // Keys per sender differ.
        assert_ne!(a.offer_for("h2").unwrap().key, a.offer_for("h3").unwrap().key);
    }

    #[test]
    fn the_replay_window_accepts_each_number_once() {
        let mut i = Inbound { key: [0; KEY], newest: 0, seen: 0 };
        assert!(i.accept(1) && i.accept(3) && i.accept(2));
        assert!(!i.accept(2) && !i.accept(3));
        assert!(i.accept(1000) && !i.accept(1000 - WINDOW) && i.accept(1000 - WINDOW + 1));
        assert!(i.accept(u64::MAX) && !i.accept(1000));
    }
}
