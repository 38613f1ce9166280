//! An IDS/IPS: Snort-like content rules matched with Aho-Corasick over TCP
//! and UDP payloads, including matches that span packets of a flow.
//!
//! Each flow keeps, in host-owned flow state, the automaton state reached at
//! the end of its last packet in each direction, so the next packet resumes
//! the search where the previous one stopped: a signature split across two
//! segments is found without reassembly. Rules with `offset`/`depth` are
//! positions in one packet's payload and match within a packet only. See
//! README.md for the rule syntax and the config.

pub mod rules;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind, StartKind};
use rules::{Action, Rule, parse_rules};
use serde::Deserialize;
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, Verdict, emit};

/// IDS only reports; IPS also drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Alerts only; nothing is dropped.
    #[default]
    Ids,
    /// `drop` rules drop the matching packet and the rest of its flow.
    Ips,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RuleText {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    #[serde(default)]
    mode: Mode,
    rules: RuleText,
    #[serde(default)]
    idle_timeout_s: Option<u64>,
}

/// One automaton over the rules of one case mode.
#[derive(Debug)]
struct Matcher {
    dfa: DFA,
    /// Rule index of each pattern id.
    rule_of: Vec<usize>,
    start: StateID,
}

impl Matcher {
    fn build(rules: &[Rule], nocase: bool) -> Result<Option<Matcher>, String> {
        let rule_of: Vec<usize> =
            rules.iter().enumerate().filter(|(_, r)| r.nocase == nocase).map(|(i, _)| i).collect();
        if rule_of.is_empty() {
            return Ok(None);
        }
        let patterns: Vec<&[u8]> = rule_of.iter().filter_map(|&i| rules.get(i)).map(|r| r.content.as_slice()).collect();
        let dfa = aho_corasick::dfa::Builder::new()
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(nocase)
            .start_kind(StartKind::Unanchored)
            .build(patterns)
            .map_err(|e| format!("ids rules: cannot build the matcher: {e}"))?;
        let start = dfa.start_state(Anchored::No).map_err(|e| format!("ids rules: {e}"))?;
        Ok(Some(Matcher { dfa, rule_of, start }))
    }
}

/// Flow state layout: version, flags, rules fingerprint, then the
/// automaton state of each direction for each matcher.
const STATE_VERSION: u8 = 1;
const FLAG_BLOCKED: u8 = 1;
const STATE_LEN: usize = 2 + 8 + 4 * 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlowState {
    blocked: bool,
    /// [direction][matcher]: forward/reverse × case-sensitive/insensitive.
    sids: [[u32; 2]; 2],
}

impl FlowState {
    fn decode(bytes: &[u8], fingerprint: u64) -> Option<FlowState> {
        let b: &[u8; STATE_LEN] = bytes.try_into().ok()?;
        let [v, flags, f @ .., _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _] = *b;
        if v != STATE_VERSION || u64::from_le_bytes(f) != fingerprint {
            // Written by other rules (a config change): start over.
            return None;
        }
        let word =
            |i: usize| b.get(10 + 4 * i..14 + 4 * i).and_then(|w| <[u8; 4]>::try_from(w).ok()).map(u32::from_le_bytes);
        Some(FlowState { blocked: flags & FLAG_BLOCKED != 0, sids: [[word(0)?, word(1)?], [word(2)?, word(3)?]] })
    }

    fn encode(&self, fingerprint: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(STATE_LEN);
        v.push(STATE_VERSION);
        v.push(if self.blocked { FLAG_BLOCKED } else { 0 });
        v.extend_from_slice(&fingerprint.to_le_bytes());
        for dir in self.sids {
            for s in dir {
                v.extend_from_slice(&s.to_le_bytes());
            }
        }
        v
    }
}

/// The IDS NF.
#[derive(Debug)]
pub struct Ids {
    mode: Mode,
    rules: Vec<Rule>,
    /// Case-sensitive and case-insensitive automata.
    matchers: [Option<Matcher>; 2],
    fingerprint: u64,
    /// Scratch: rules that matched the current packet.
    hits: Vec<usize>,
}

/// FNV-1a over the rules' patterns and case modes: identifies the automata
/// that flow states were computed with.
fn fingerprint(rules: &[Rule]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in rules {
        for &b in r.content.iter().chain([r.nocase as u8, 0xff].iter()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl Ids {
    /// Rules, for native callers and tests.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Runs one matcher over `payload` from state `sid`, recording matching
    /// rules in `hits`; returns the state after the last byte.
    fn scan(&mut self, which: usize, sid: u32, payload: &[u8], key: &sluice_sdk::FlowKey) -> u32 {
        let Some(m) = self.matchers.get(which).and_then(Option::as_ref) else { return sid };
        let mut s = StateID::new(sid as usize).unwrap_or(m.start);
        for (pos, &b) in payload.iter().enumerate() {
            s = m.dfa.next_state(Anchored::No, s, b);
            if !m.dfa.is_match(s) {
                continue;
            }
            for i in 0..m.dfa.match_len(s) {
                let pid = m.dfa.match_pattern(s, i);
                let Some(&ri) = m.rule_of.get(pid.as_usize()) else { continue };
                let Some(rule) = self.rules.get(ri) else { continue };
                let end = pos + 1;
                let within_packet = end >= rule.content.len();
                let placed = match (within_packet, rule.streams()) {
                    // Started in an earlier packet of this flow direction.
                    (false, streams) => streams,
                    (true, true) => true,
                    (true, false) => {
                        let start = end - rule.content.len();
                        let off = rule.offset.unwrap_or(0);
                        start >= off && rule.depth.is_none_or(|d| end <= off + d)
                    }
                };
                if placed && rule.header_matches(key) && !self.hits.contains(&ri) {
                    self.hits.push(ri);
                }
            }
        }
        s.as_u32()
    }
}

impl NetworkFunction for Ids {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let raw: RawConfig = serde_json::from_slice(config).map_err(|e| format!("ids config: {e}"))?;
        let text = match raw.rules {
            RuleText::One(s) => vec![s],
            RuleText::Many(v) => v,
        };
        let rules = parse_rules(&text)?;
        if rules.is_empty() {
            return Err("ids config: no rules".into());
        }
        let matchers = [Matcher::build(&rules, false)?, Matcher::build(&rules, true)?];
        let ids = Ids { mode: raw.mode, fingerprint: fingerprint(&rules), rules, matchers, hits: Vec::new() };
        let timeout = raw.idle_timeout_s.map(|s| s.saturating_mul(1_000_000_000)).unwrap_or(0);
        Ok((ids, NfInfo::with_flow_state(timeout)))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut alerts: Vec<Event> = Vec::new();
        let starts =
            [self.matchers[0].as_ref().map(|m| m.start.as_u32()), self.matchers[1].as_ref().map(|m| m.start.as_u32())];
        let fresh = FlowState { blocked: false, sids: [[starts[0].unwrap_or(0), starts[1].unwrap_or(0)]; 2] };
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            let payload = p.payload();
            let flow = p.flow();
            let mut st = flow
                .and_then(|f| batch.flow_state(f))
                .and_then(|s| FlowState::decode(s, self.fingerprint))
                .unwrap_or(fresh);
            if st.blocked {
                batch.set_verdict(i, Verdict::Drop);
                continue;
            }
            if payload.is_empty() {
                continue;
            }
            let Some(key) = p.key() else { continue };
            let dir = usize::from(p.is_reverse());
            self.hits.clear();
            for which in 0..2 {
                let sid = st.sids.get(dir).and_then(|d| d.get(which)).copied().unwrap_or(0);
                let next = self.scan(which, sid, payload, &key);
                if let Some(slot) = st.sids.get_mut(dir).and_then(|d| d.get_mut(which)) {
                    *slot = next;
                }
            }
            let mut drop = false;
            for &ri in &self.hits {
                let Some(r) = self.rules.get(ri) else { continue };
                let dropping = self.mode == Mode::Ips && r.action == Action::Drop;
                drop |= dropping;
                alerts.push(Event {
                    kind: "ids.alert".into(),
                    level: Level::Warn,
                    packet: Some(i as u32),
                    fields: vec![
                        ("sid".into(), r.sid.to_string()),
                        ("rev".into(), r.rev.to_string()),
                        ("msg".into(), r.msg.clone()),
                        ("action".into(), if dropping { "dropped" } else { "alerted" }.into()),
                    ],
                });
            }
            if drop {
                batch.set_verdict(i, Verdict::Drop);
                st.blocked = true;
            }
            if let Some(f) = flow {
                batch.set_flow_state(f, st.encode(self.fingerprint));
            }
        }
        if !alerts.is_empty() {
            emit(&alerts);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Ids);
