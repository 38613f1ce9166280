//! A Snort-like rule subset:
//!
//! ```text
//! alert tcp any any -> 10.0.0.0/24 80 (msg:"exe download"; content:"evil.exe"; nocase; sid:1000001;)
//! drop  udp any any -> any 53 (msg:"bad domain"; content:"|03|bad|03|com"; offset:12; depth:64; sid:1000002;)
//! ```
//!
//! Header: action (`alert` or `drop`), protocol (`tcp`, `udp`, `ip`/`any`),
//! source address and ports, `->` (or `<>` for both directions),
//! destination address and ports. Options: `msg`, one `content` (with
//! `|hex|` bytes), `nocase`, `offset`, `depth`, `sid` (required, unique),
//! `rev`. Anything else is an error that names the rule's line.

use sluice_sdk::FlowKey;
use sluice_sdk::matchers::{Cidr, Ports};

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Emit an alert.
    Alert,
    /// Emit an alert, and in IPS mode drop the packet and the rest of its
    /// flow.
    Drop,
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Action.
    pub action: Action,
    /// IP protocol, `None` for any.
    pub protocol: Option<u8>,
    src: Cidr,
    src_ports: Ports,
    dst: Cidr,
    dst_ports: Ports,
    bidirectional: bool,
    /// Bytes to find.
    pub content: Vec<u8>,
    /// Case-insensitive (ASCII).
    pub nocase: bool,
    /// Match must start at or after this payload offset (within one packet).
    pub offset: Option<usize>,
    /// Match must end within this many bytes after `offset` (within one packet).
    pub depth: Option<usize>,
    /// Signature id.
    pub sid: u32,
    /// Revision.
    pub rev: u32,
    /// Message.
    pub msg: String,
}

impl Rule {
    /// Whether the rule's header matches a packet's 5-tuple.
    pub fn header_matches(&self, k: &FlowKey) -> bool {
        if self.protocol.is_some_and(|p| p != k.protocol) {
            return false;
        }
        let fwd = self.src.contains(k.src)
            && self.src_ports.contains(k.src_port)
            && self.dst.contains(k.dst)
            && self.dst_ports.contains(k.dst_port);
        fwd || (self.bidirectional
            && self.src.contains(k.dst)
            && self.src_ports.contains(k.dst_port)
            && self.dst.contains(k.src)
            && self.dst_ports.contains(k.src_port))
    }

    /// Whether the rule's content may span packets: only without offset or
    /// depth, which are positions within one packet's payload.
    pub fn streams(&self) -> bool {
        self.offset.is_none() && self.depth.is_none()
    }
}

fn addr(s: &str) -> Result<Cidr, String> {
    Cidr::parse(s)
}

fn ports(s: &str) -> Result<Ports, String> {
    Ports::parse(s.replace(':', "-").as_str())
}

/// Decodes Snort content: text with `|41 42|` hex runs.
fn content(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut parts = s.split('|');
    let mut hex = false;
    for part in parts.by_ref() {
        if hex {
            for h in part.split_whitespace() {
                out.push(u8::from_str_radix(h, 16).map_err(|_| format!("bad hex byte '{h}' in content"))?);
            }
        } else {
            out.extend_from_slice(part.as_bytes());
        }
        hex = !hex;
    }
    if !hex {
        return Err("unbalanced '|' in content".into());
    }
    if out.is_empty() {
        return Err("empty content".into());
    }
    Ok(out)
}

/// Splits the option block `a:b; c; d:"e;f";` respecting quotes.
fn options(s: &str) -> Result<Vec<(String, Option<String>)>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
            continue;
        }
        match c {
            '\\' if quoted => escaped = true,
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ';' if !quoted => {
                let t = cur.trim().to_string();
                if !t.is_empty() {
                    out.push(match t.split_once(':') {
                        Some((k, v)) => (k.trim().to_string(), Some(v.trim().to_string())),
                        None => (t, None),
                    });
                }
                cur.clear();
            }
            _ => cur.push(c),
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    if !cur.trim().is_empty() {
        return Err(format!("option '{}' is not terminated by ';'", cur.trim()));
    }
    Ok(out)
}

fn number(k: &str, v: Option<&str>) -> Result<usize, String> {
    v.ok_or_else(|| format!("{k} needs a value"))?
        .parse()
        .map_err(|_| format!("{k}: '{}' is not a number", v.unwrap_or("")))
}

/// Parses one rule line.
pub fn parse_rule(line: &str) -> Result<Rule, String> {
    let open = line.find('(').ok_or("missing '(' before the options")?;
    let close = line.rfind(')').ok_or("missing ')' after the options")?;
    if close < open {
        return Err("')' before '('".into());
    }
    let header: Vec<&str> = line.get(..open).unwrap_or("").split_whitespace().collect();
    let [action, proto, src, sport, dir, dst, dport] = header.as_slice() else {
        return Err(format!("header must be `action proto src sport -> dst dport`, got {} words", header.len()));
    };
    let action = match *action {
        "alert" => Action::Alert,
        "drop" => Action::Drop,
        a => return Err(format!("unknown action '{a}' (alert or drop)")),
    };
    let protocol = match *proto {
        "tcp" => Some(6),
        "udp" => Some(17),
        "ip" | "any" => None,
        p => return Err(format!("unknown protocol '{p}' (tcp, udp, ip)")),
    };
    let bidirectional = match *dir {
        "->" => false,
        "<>" => true,
        d => return Err(format!("direction must be '->' or '<>', got '{d}'")),
    };
    let mut rule = Rule {
        action,
        protocol,
        src: addr(src)?,
        src_ports: ports(sport)?,
        dst: addr(dst)?,
        dst_ports: ports(dport)?,
        bidirectional,
        content: Vec::new(),
        nocase: false,
        offset: None,
        depth: None,
        sid: 0,
        rev: 1,
        msg: String::new(),
    };
    let mut have_content = false;
    for (k, v) in options(line.get(open + 1..close).unwrap_or(""))? {
        let v = v.as_deref();
        match k.as_str() {
            "msg" => rule.msg = v.unwrap_or("").trim_matches('"').to_string(),
            "content" => {
                if have_content {
                    return Err("only one content per rule is supported".into());
                }
                let raw = v.ok_or("content needs a value")?;
                let quoted = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')).ok_or("content must be quoted")?;
                rule.content = content(quoted)?;
                have_content = true;
            }
            "nocase" => rule.nocase = true,
            "offset" => rule.offset = Some(number("offset", v)?),
            "depth" => rule.depth = Some(number("depth", v)?),
            "sid" => rule.sid = u32::try_from(number("sid", v)?).map_err(|_| "sid too large")?,
            "rev" => rule.rev = u32::try_from(number("rev", v)?).map_err(|_| "rev too large")?,
            other => return Err(format!("unsupported option '{other}'")),
        }
    }
    if !have_content {
        return Err("a rule needs a content".into());
    }
    if rule.sid == 0 {
        return Err("a rule needs a sid".into());
    }
    if rule.depth.is_some_and(|d| d < rule.content.len()) {
        return Err(format!(
            "depth {} is shorter than the content ({} bytes)",
            rule.depth.unwrap_or(0),
            rule.content.len()
        ));
    }
    Ok(rule)
}

/// Parses a rule set: one rule per line; blank lines and `#` comments are
/// skipped. Errors name the line.
pub fn parse_rules(lines: &[String]) -> Result<Vec<Rule>, String> {
    let mut rules: Vec<Rule> = Vec::new();
    let mut n = 0;
    for text in lines {
        for line in text.lines() {
            n += 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let rule = parse_rule(line).map_err(|e| format!("ids rules: line {n}: {e}: {line}"))?;
            if rules.iter().any(|r| r.sid == rule.sid) {
                return Err(format!("ids rules: line {n}: sid {} is used twice", rule.sid));
            }
            rules.push(rule);
        }
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::IpAddr128;

    #[test]
    fn a_full_rule() {
        let r = parse_rule(r#"drop udp any any -> 10.0.0.0/8 53 (msg:"a; b"; content:"|03|bad|03|com"; nocase; offset:12; depth:64; sid:7; rev:2;)"#).unwrap();
        assert_eq!(r.action, Action::Drop);
        assert_eq!(r.content, b"\x03bad\x03com");
        assert!(r.nocase);
        assert_eq!((r.offset, r.depth, r.sid, r.rev), (Some(12), Some(64), 7, 2));
        assert_eq!(r.msg, "a; b");
        let k = FlowKey {
            src: IpAddr128::from_v4([1, 1, 1, 1]),
            dst: IpAddr128::from_v4([10, 0, 0, 1]),
            src_port: 999,
            dst_port: 53,
            protocol: 17,
        };
        assert!(r.header_matches(&k));
        assert!(!r.header_matches(&k.reversed()));
        assert!(!r.streams());
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_rules(&["# comment\nalert tcp any any -> any 80 (content:\"x\";)".into()]).unwrap_err();
        assert!(e.contains("line 2") && e.contains("sid"), "{e}");
        let e = parse_rules(&["alert tcp any any -> any 80 (content:\"x\"; sid:1; frob;)".into()]).unwrap_err();
        assert!(e.contains("frob"), "{e}");
        let e =
            parse_rules(&["alert tcp any any -> any 80 (content:\"a\"; content:\"b\"; sid:1;)".into()]).unwrap_err();
        assert!(e.contains("one content"), "{e}");
        let e = parse_rules(&["alert tcp any any => any 80 (content:\"a\"; sid:1;)".into()]).unwrap_err();
        assert!(e.contains("direction"), "{e}");
        let e =
            parse_rules(&["alert tcp any any -> any 80 (content:\"|zz|\"; sid:1;)".into(), "x".into()]).unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let two = "alert tcp any any -> any 80 (content:\"a\"; sid:1;)";
        assert!(parse_rules(&[two.into(), two.into()]).unwrap_err().contains("twice"));
    }
}
