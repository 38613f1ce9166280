//! The little of DNS the filter needs: a query's header and first question,
//! read without panicking from any bytes.

/// Length of the DNS header.
pub const HEADER_LEN: usize = 12;

/// Longest name accepted (RFC 1035: 255 octets on the wire).
pub const MAX_NAME: usize = 255;

/// A parsed standard query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Lower-cased name, labels joined by dots, no trailing dot.
    pub name: String,
    /// Offset just past the question (QTYPE and QCLASS included).
    pub question_end: usize,
}

/// Parses `msg` as a standard query (QR = 0, opcode 0) with at least one
/// question, and returns its first question's name. `None` for anything
/// else: responses, other opcodes, compressed or malformed names.
pub fn parse_query(msg: &[u8]) -> Option<Query> {
    let flags = u16::from_be_bytes([*msg.get(2)?, *msg.get(3)?]);
    let qdcount = u16::from_be_bytes([*msg.get(4)?, *msg.get(5)?]);
    let is_query = flags & 0x8000 == 0;
    let opcode = (flags >> 11) & 0xf;
    if !is_query || opcode != 0 || qdcount == 0 {
        return None;
    }
    let mut at = HEADER_LEN;
    let mut name = String::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // 0xc0: a compression pointer, which a query's first name never
        // needs; other high bits are reserved.
        if len & 0xc0 != 0 {
            return None;
        }
        let label = msg.get(at..at + len)?;
        if !name.is_empty() {
            name.push('.');
        }
        for &b in label {
            name.push(char::from(b.to_ascii_lowercase()));
        }
        if name.len() > MAX_NAME {
            return None;
        }
        at += len;
    }
    // QTYPE and QCLASS.
    msg.get(at..at + 4)?;
    Some(Query { name, question_end: at + 4 })
}

/// Whether `name` is `suffix` or a subdomain of it.
pub fn matches_suffix(name: &str, suffix: &str) -> bool {
    name == suffix || name.strip_suffix(suffix).is_some_and(|rest| rest.ends_with('.'))
}

/// Turns a query message into an NXDOMAIN answer to it, in place: QR, RA
/// and RCODE 3 set, no answer records, the question kept and anything
/// after it (e.g. EDNS records) cut. Returns the answer's length.
pub fn nxdomain_in_place(msg: &mut [u8], q: &Query) -> Option<usize> {
    let flags = u16::from_be_bytes([*msg.get(2)?, *msg.get(3)?]);
    // Keep the id, opcode and RD bit; set QR, RA and RCODE = 3.
    let answer = (flags & 0x7900) | 0x8000 | 0x0080 | 3;
    msg.get_mut(2..4)?.copy_from_slice(&answer.to_be_bytes());
    // One question, no answer, authority or additional records.
    msg.get_mut(4..12)?.copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    Some(q.question_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn query(name: &str) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            m.push(label.len() as u8);
            m.extend_from_slice(label.as_bytes());
        }
        m.extend_from_slice(&[0, 0, 1, 0, 1]);
        m
    }

    #[test]
    fn parses_a_query() {
        let q = parse_query(&query("Ads.Example.COM")).unwrap();
        assert_eq!(q.name, "ads.example.com");
        assert_eq!(q.question_end, query("ads.example.com").len());
    }

    #[test]
    fn suffixes_match_on_label_boundaries() {
        assert!(matches_suffix("ads.example.com", "example.com"));
        assert!(matches_suffix("example.com", "example.com"));
        assert!(!matches_suffix("badexample.com", "example.com"));
    }

    #[test]
    fn nxdomain_keeps_id_and_question() {
        let mut m = query("x.test");
        let q = parse_query(&m).unwrap();
        let n = nxdomain_in_place(&mut m, &q).unwrap();
        assert_eq!(&m[..2], &[0x12, 0x34]);
        assert_eq!(u16::from_be_bytes([m[2], m[3]]) & 0x800f, 0x8003);
        assert_eq!(n, m.len());
        assert!(parse_query(&m[..n]).is_none(), "an answer is not a query");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            if let Some(q) = parse_query(&bytes) {
                let mut b = bytes.clone();
                let _ = nxdomain_in_place(&mut b, &q);
            }
        }
    }
}
