//! A live host's peer state with its group's other hosts: replicas of
//! their flows (fed from its inbox), what its workers replicate (sent from
//! a thread of its own), global eventual tables, and the group's ownership
//! table it follows.

use crate::config::{AgentConfig, PeerConfig};
use crate::error::AgentError;
use futures::StreamExt;
use sluice_control::Bus;
use sluice_peer::{Direct, Outgoing, Peer, PeerLink, PeerOut, PeerStore};
use std::sync::Arc;
use std::time::Duration;

/// Starts a live host's peer state: the store of replicas its peers send,
/// fed from its inbox, and the publisher of what its workers replicate.
pub(crate) async fn start_peer(
    bus: &Arc<dyn Bus>,
    cfg: &AgentConfig,
    pc: &PeerConfig,
) -> Result<Arc<Peer>, AgentError> {
    if pc.interval.is_zero() {
        return Err(AgentError::Config("the replication interval must be above 0".into()));
    }
    if pc.pull_wait > sluice_peer::pull::MAX_WAIT {
        return Err(AgentError::Config(format!(
            "a pull wait of {:?} is over the {:?} packets may wait (--pull-wait-us)",
            pc.pull_wait,
            sluice_peer::pull::MAX_WAIT
        )));
    }
    let (tx, rx) = crossbeam_channel::bounded::<Outgoing>(4096);
    let store = PeerStore::new(pc.max_flows, pc.max_bytes, pc.lifetime);
    // Straight to the bus from the worker when it takes the message at
    // once; else through the sender thread below.
    let (direct_bus, group, me) = (bus.clone(), cfg.group.clone(), cfg.host.clone());
    let direct: Direct =
        Box::new(move |to: &str, body: Vec<u8>| match direct_bus.try_publish_peer(&group, to, &me, body) {
            Ok(back) => back,
            Err(e) => {
                tracing::debug!(to, "peer state not sent: {e}");
                None
            }
        });
    let peer = Peer::new(&cfg.host, pc.interval, pc.pull_wait, store, PeerOut::new(tx, Some(direct)));
    if let Some(addr) = pc.link {
        start_link(&peer, &cfg.host, addr)?;
    }
    let mut inbox = bus.peer_inbox(&cfg.group, &cfg.host).await?;
    let p = peer.clone();
    tokio::spawn(async move {
        while let Some(m) = inbox.next().await {
            if let Err(e) = p.receive(&m.host, &m.message, std::time::Instant::now(), wall_ns()) {
                tracing::warn!(from = %m.host, "peer state refused: {e}");
            }
        }
    });
    // This host's values of global eventual tables go to every other host,
    // and its split release pools follow the table.
    let (p, global_bus, group, me) = (peer.clone(), bus.clone(), cfg.group.clone(), cfg.host.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(sluice_peer::GLOBAL_EVERY);
        loop {
            tick.tick().await;
            // Release pools follow the table: blocks handed over, waited
            // for, replicated (see sluice_peer::pools).
            p.pool_tick(std::time::Instant::now());
            // Hosts taken for dead before the controller says so are asked
            // whether they live (see sluice_peer::Peer::suspect).
            p.probe_suspects();
            p.offer_links(std::time::Instant::now());
            let peers = p.peers();
            let messages = p.global_messages(peers.len(), wall_ns());
            for body in &messages {
                for to in &peers {
                    if let Err(e) = global_bus.publish_peer(&group, to, &me, body.clone()).await {
                        tracing::debug!(to, "global table values not sent: {e}");
                    }
                }
            }
        }
    });
    // Workers hand messages over without waiting; this thread sends them.
    let (out_bus, group, me, sender) = (bus.clone(), cfg.group.clone(), cfg.host.clone(), peer.clone());
    let handle = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("peer-out".into())
        .spawn(move || {
            while let Ok(o) = rx.recv() {
                if let Err(e) = handle.block_on(out_bus.publish_peer(&group, &o.to, &me, o.body)) {
                    tracing::debug!(to = %o.to, flows = o.flows, "peer state not sent: {e}");
                }
                sender.sent();
            }
        })
        .map_err(|e| AgentError::Config(format!("cannot start the peer-state sender: {e}")))?;
    follow_table(bus.as_ref(), &cfg.group, &peer).await;
    Ok(peer)
}

/// Binds the host's peer link at `addr` and starts the thread that takes
/// its datagrams (checked there: forged, replayed and unknown ones are
/// counted and dropped).
fn start_link(peer: &Arc<Peer>, me: &str, addr: std::net::SocketAddr) -> Result<(), AgentError> {
    let link = Arc::new(
        PeerLink::bind(me, addr)
            .map_err(|e| AgentError::Config(format!("cannot bind the peer link at {addr}: {e}")))?,
    );
    tracing::info!(addr = %link.addr(), "peer link");
    peer.attach_link(link.clone());
    let p = peer.clone();
    std::thread::Builder::new()
        .name("peer-link".into())
        .spawn(move || {
            let mut buf = vec![0u8; sluice_peer::link::MAX_DATAGRAM];
            let mut priority = LinkPriority::new();
            loop {
                match link.receive(&mut buf, Duration::from_millis(100)) {
                    Ok(Some((from, body))) => {
                        if let Err(e) = p.receive_link(&from, body, std::time::Instant::now(), wall_ns()) {
                            tracing::debug!(%from, "peer link message refused: {e}");
                        }
                    }
                    Ok(None) => {}
                    Err(e) => tracing::debug!("peer link datagram refused: {e}"),
                }
                priority.check(std::time::Instant::now(), &link);
            }
        })
        .map_err(|e| AgentError::Config(format!("cannot start the peer link's thread: {e}")))?;
    Ok(())
}

/// Datagrams failing their check, and their bytes, within
/// [`FLOOD_WINDOW`] over which the link's thread gives up its real-time
/// priority (checking a MiB costs about 2 ms).
const FLOOD: (u64, u64) = (1000, 1 << 20);
const FLOOD_WINDOW: Duration = Duration::from_millis(100);
/// How long it stays at normal priority after a flood.
const FLOOD_PAUSE: Duration = Duration::from_secs(1);

/// The peer link thread's scheduling: on a machine whose cores the
/// workers and other processes keep busy, a thread woken by a datagram
/// waits for a time slice (hundreds of µs to milliseconds here), and a
/// pull waits with it. So the thread runs at the lowest real-time
/// priority (`SCHED_FIFO` 1) where the host may (root or `CAP_SYS_NICE`),
/// doing bounded work per datagram. Datagrams from outside the group cost
/// it a check each: while more than [`FLOOD`] of them (or of their bytes)
/// fail it per [`FLOOD_WINDOW`], it runs at normal priority, so that a
/// flood cannot take its core from the host's other threads.
struct LinkPriority {
    raised: bool,
    /// The link's refused datagrams and bytes when the window began.
    refused: (u64, u64),
    window: std::time::Instant,
    lowered_until: Option<std::time::Instant>,
}

impl LinkPriority {
    fn new() -> LinkPriority {
        let raised = set_policy(true);
        if raised {
            tracing::info!("the peer link's thread runs at real-time priority (SCHED_FIFO 1)");
        } else {
            tracing::info!("the peer link's thread runs at normal priority (no CAP_SYS_NICE for SCHED_FIFO)");
        }
        LinkPriority { raised, refused: (0, 0), window: std::time::Instant::now(), lowered_until: None }
    }

    /// Lowers the priority when the datagrams `link` refused since the
    /// window began are a flood (counted on the link either way); raises
    /// it again after [`FLOOD_PAUSE`].
    fn check(&mut self, now: std::time::Instant, link: &PeerLink) {
        if self.lowered_until.is_some_and(|t| now >= t) {
            self.lowered_until = None;
            self.raised = set_policy(true);
        }
        if now.saturating_duration_since(self.window) < FLOOD_WINDOW {
            return;
        }
        let refused = link.refused();
        let (n, bytes) = (refused.0.saturating_sub(self.refused.0), refused.1.saturating_sub(self.refused.1));
        let flood = n > FLOOD.0 || bytes > FLOOD.1;
        if flood {
            link.note_flood();
        }
        if self.raised && flood {
            tracing::warn!(
                datagrams = n,
                bytes,
                "peer link flooded with datagrams that fail their check: its thread runs at normal priority for {FLOOD_PAUSE:?}"
            );
            set_policy(false);
            self.raised = false;
            self.lowered_until = Some(now + FLOOD_PAUSE);
        }
        self.window = now;
        self.refused = refused;
    }
}

/// Sets the calling thread to `SCHED_FIFO` 1 (`realtime`) or back to
/// normal scheduling; false when it could not.
fn set_policy(realtime: bool) -> bool {
    sluice_peer::set_fifo(thread_priority::thread_native_id(), realtime)
}

/// Reads the group's ownership table into the host's peer state.
pub(crate) async fn follow_table(bus: &dyn Bus, group: &str, peer: &Peer) {
    match tokio::time::timeout(Duration::from_millis(500), bus.ownership(group)).await {
        Ok(Ok(Some(t))) => {
            let version = t.version();
            if peer.set_table(t) {
                tracing::info!(group, version, "new ownership table");
            }
        }
        Ok(Ok(None)) => {}
        Ok(Err(e)) => tracing::debug!(group, "reading the ownership table: {e}"),
        Err(_) => tracing::debug!(group, "reading the ownership table timed out"),
    }
}

/// The wall clock in ns (live workers' packet time).
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
