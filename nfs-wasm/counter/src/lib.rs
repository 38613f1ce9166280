//! A pass-through counter: forwards every packet and counts packets and
//! bytes per protocol, reporting the totals as an event every
//! `report-every` packets (and never touching a packet).

use serde::Deserialize;
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, emit};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Config {
    /// Emit a `counter.totals` event each time this many more packets were
    /// seen; 0 disables the events.
    #[serde(default)]
    report_every: u64,
}

/// The counter NF.
#[derive(Debug, Default)]
pub struct Counter {
    report_every: u64,
    next_report: u64,
    /// Totals: packets, bytes.
    pub packets: u64,
    /// Bytes on the wire.
    pub bytes: u64,
    /// Packets per class: TCP, UDP, ICMP, other IP, non-IP.
    pub by_class: [u64; 5],
}

impl NetworkFunction for Counter {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let c: Config = if config.iter().all(u8::is_ascii_whitespace) {
            Config::default()
        } else {
            serde_json::from_slice(config).map_err(|e| format!("counter config: {e}"))?
        };
        let nf = Counter { report_every: c.report_every, next_report: c.report_every, ..Counter::default() };
        Ok((nf, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        for p in batch.packets() {
            self.packets += 1;
            self.bytes += u64::from(p.wire_len());
            let class = match p.protocol() {
                Some(6) => 0,
                Some(17) => 1,
                Some(1 | 58) => 2,
                Some(_) => 3,
                None => 4,
            };
            if let Some(c) = self.by_class.get_mut(class) {
                *c += 1;
            }
        }
        if self.report_every > 0 && self.packets >= self.next_report {
            self.next_report = self.packets + self.report_every;
            let [tcp, udp, icmp, other, non_ip] = self.by_class;
            emit(&[Event {
                kind: "counter.totals".into(),
                level: Level::Info,
                packet: None,
                fields: vec![
                    ("packets".into(), self.packets.to_string()),
                    ("bytes".into(), self.bytes.to_string()),
                    ("tcp".into(), tcp.to_string()),
                    ("udp".into(), udp.to_string()),
                    ("icmp".into(), icmp.to_string()),
                    ("other-ip".into(), other.to_string()),
                    ("non-ip".into(), non_ip.to_string()),
                ],
            }]);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Counter);
