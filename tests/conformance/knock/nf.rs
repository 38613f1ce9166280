//! Port knocking on a single-writer byte table `stage` (key-size 4: the
//! IPv4 source address in network order; max-value-size 1;
//! sync-interval-ns 10,000,000): a source that sends TCP SYNs to ports
//! 7000, 8000 and 9000, in that order, may then open connections to port
//! 22. A TCP packet is an IPv4 packet whose whole TCP header was
//! captured; a knock is a TCP SYN without ACK. Each knock, in packet
//! order, reads its source's stage s with one `get-many` (0 when absent,
//! else the value's byte), then: to port 22, it is forwarded when s is 3
//! and dropped otherwise; to port 7000, 8000 or 9000 when that is the
//! next port of the sequence (s < 3 and the port is the (s+1)-th), one
//! `put-many` sets the stage to s + 1; to any other port while 0 < s < 3,
//! one `put-many` removes the key (an empty value: the sequence starts
//! over). Knocks to other ports than 22 are forwarded; every other packet
//! is forwarded and touches no table. A stage of 3 stays. Each packet sees
//! the writes of the packets before it, in the same batch too.

use sluice_sdk::state::{Bytes, TableSpec, frames, push_frame};
use sluice_sdk::{Batch, NetworkFunction, NfInfo, Verdict};

const SEQUENCE: [u16; 3] = [7000, 8000, 9000];
const OPENED: u8 = 3;
const GUARDED: u16 = 22;

struct Knock {
    stage: Bytes,
}

fn state_err(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

impl Knock {
    fn stage_of(&self, src: [u8; 4]) -> Result<u8, String> {
        let mut keys = Vec::new();
        push_frame(&mut keys, &src);
        let values = self.stage.get_many(&keys).map_err(state_err)?;
        let value = frames(&values).next().transpose().map_err(|i| format!("bad framing at {i}"))?;
        Ok(value.and_then(|v| v.first().copied()).unwrap_or(0))
    }

    fn set_stage(&self, src: [u8; 4], value: &[u8]) -> Result<(), String> {
        let mut entries = Vec::new();
        push_frame(&mut entries, &src);
        push_frame(&mut entries, value);
        self.stage.put_many(&entries).map_err(state_err)
    }
}

impl NetworkFunction for Knock {
    fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
        let spec = TableSpec::single_writer_bytes("stage", 4, 1, 10_000_000);
        let stage = Bytes::declare(spec).map_err(state_err)?;
        Ok((Knock { stage }, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut drops = Vec::new();
        for (i, p) in batch.packets().enumerate() {
            let (Some(ip), Some(t)) = (p.ipv4(), p.tcp()) else { continue };
            if !t.syn() || t.ack() {
                continue;
            }
            let src = ip.src();
            let s = self.stage_of(src)?;
            let port = t.dst_port();
            if port == GUARDED {
                if s != OPENED {
                    drops.push(i);
                }
            } else if SEQUENCE.get(usize::from(s)) == Some(&port) {
                self.set_stage(src, &[s + 1])?;
            } else if s > 0 && s < OPENED {
                self.set_stage(src, &[])?;
            }
        }
        for i in drops {
            batch.set_verdict(i, Verdict::Drop);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Knock);
