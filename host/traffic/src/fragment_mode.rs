//! What a deployment's NFs see of fragmented IP datagrams.

/// What a chain's NFs see of a fragmented IP datagram: each deployment
/// chooses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FragmentMode {
    /// The NFs see the first fragment; the later ones follow its verdict
    /// and rewrites (per IP identification, as stateless firewalls do).
    /// Nothing is buffered; a later fragment that comes before its first
    /// is dropped and counted.
    #[default]
    Follow,
    /// The host holds fragments until their datagram is whole; the NFs see
    /// the whole datagram once, and it leaves cut again to the largest
    /// fragment it came in (as Linux's `nf_defrag` does for conntrack; see
    /// `reassembly` in `sluice-runtime`). Fragments may come in any order; buffers
    /// are bounded per deployment and per source.
    Reassemble,
}

impl FragmentMode {
    /// Its name in configuration and APIs.
    pub fn name(self) -> &'static str {
        match self {
            FragmentMode::Follow => "follow",
            FragmentMode::Reassemble => "reassemble",
        }
    }
}

impl std::fmt::Display for FragmentMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FragmentMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "follow" => Ok(FragmentMode::Follow),
            "reassemble" => Ok(FragmentMode::Reassemble),
            other => Err(format!("unknown fragment mode '{other}': use 'follow' or 'reassemble'")),
        }
    }
}
