//! Guest stdout/stderr and `host-log.log`, routed to the host log with a
//! per-instance rate limit.
//!
//! Guests from C, Python and JavaScript print; the host must show it (it is
//! often the only clue to a broken NF) without letting a chatty NF flood
//! the log. Lines are tagged with the NF's name.

use bytes::Bytes;
use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Longest line kept; longer lines are cut (a guest could print megabytes
/// without a newline).
pub(crate) const MAX_LINE: usize = 4096;

/// Log lines kept for the tenant between two collections at most (the
/// rate limit keeps it far lower; this bounds a host that stops
/// collecting).
pub const MAX_KEPT_LINES: usize = 1024;

/// One log line let through the limiter, kept for the NF's tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptLine {
    /// `debug`, `info`, `warn` or `error`.
    pub level: &'static str,
    /// `stdout`, `stderr` or `host-log`.
    pub source: &'static str,
    /// The line (cut at [`MAX_LINE`] bytes).
    pub text: String,
}

/// A token bucket over wall time: `rate` lines per second, bursts of `rate`.
#[derive(Debug)]
pub struct LogLimiter {
    rate: f64,
    tokens: f64,
    last: Instant,
    /// Whether lines let through are kept for the tenant.
    keep: bool,
    kept: Vec<KeptLine>,
    /// Lines dropped so far; an atomic so the host can read it after every
    /// batch without taking the limiter's lock.
    dropped: Arc<AtomicU64>,
}

impl LogLimiter {
    /// A limiter allowing `per_second` lines per second.
    pub fn new(per_second: u32) -> Self {
        let rate = f64::from(per_second.max(1));
        LogLimiter {
            rate,
            tokens: rate,
            last: Instant::now(),
            keep: false,
            kept: Vec::new(),
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A limiter that also keeps the lines it lets through for the tenant
    /// ([`take_kept`](Self::take_kept)).
    pub fn keeping(per_second: u32) -> Self {
        LogLimiter { keep: true, ..LogLimiter::new(per_second) }
    }

    /// Lets a line through (true) or counts it dropped, keeping it for the
    /// tenant if it passes and lines are kept.
    pub fn admit(&mut self, level: &'static str, source: &'static str, text: &str) -> bool {
        if !self.allow() {
            return false;
        }
        if self.keep && self.kept.len() < MAX_KEPT_LINES {
            self.kept.push(KeptLine { level, source, text: text.to_string() });
        }
        true
    }

    /// Whether a host record of the NF (a trap) is kept for the tenant now:
    /// lines are kept and the rate allows one more.
    pub fn admit_record(&mut self) -> bool {
        self.keep && self.allow()
    }

    /// The lines kept since the last call.
    pub fn take_kept(&mut self) -> Vec<KeptLine> {
        std::mem::take(&mut self.kept)
    }

    /// A handle on the count of dropped lines.
    pub fn dropped(&self) -> Arc<AtomicU64> {
        self.dropped.clone()
    }

    /// Whether a line may be written now.
    pub fn allow(&mut self) -> bool {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// Which guest stream a line came from.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    /// stdout.
    Stdout,
    /// stderr.
    Stderr,
}

#[derive(Debug)]
struct Inner {
    nf: Arc<str>,
    owner: Option<Arc<crate::owner::NfOwner>>,
    stream: Stream,
    line: Vec<u8>,
    limiter: Arc<Mutex<LogLimiter>>,
}

impl Inner {
    fn write(&mut self, mut data: &[u8]) {
        while let Some(pos) = data.iter().position(|&b| b == b'\n') {
            let (head, rest) = data.split_at(pos);
            self.push(head);
            self.flush_line();
            data = rest.get(1..).unwrap_or(&[]);
        }
        self.push(data);
    }

    fn push(&mut self, d: &[u8]) {
        let room = MAX_LINE.saturating_sub(self.line.len());
        self.line.extend_from_slice(d.get(..room.min(d.len())).unwrap_or(&[]));
    }

    fn flush_line(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let (level, source) = match self.stream {
            Stream::Stdout => ("info", "stdout"),
            Stream::Stderr => ("warn", "stderr"),
        };
        let allowed = self.limiter.lock().admit(level, source, &text);
        if allowed {
            let (tenant, deployment, version) = crate::owner::NfOwner::fields(self.owner.as_deref());
            match self.stream {
                Stream::Stdout => {
                    tracing::info!(target: "sluice::guest", nf = %self.nf, tenant, deployment, version, "{text}")
                }
                Stream::Stderr => {
                    tracing::warn!(target: "sluice::guest", nf = %self.nf, tenant, deployment, version, "{text}")
                }
            }
        }
        self.line.clear();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.flush_line();
        }
    }
}

/// A guest output stream writing lines to the host log.
#[derive(Debug, Clone)]
pub struct GuestOutput {
    inner: Arc<Mutex<Inner>>,
}

impl GuestOutput {
    /// A stream for NF `nf` sharing `limiter` with the instance's other
    /// outputs.
    pub fn new(
        nf: Arc<str>,
        owner: Option<Arc<crate::owner::NfOwner>>,
        stream: Stream,
        limiter: Arc<Mutex<LogLimiter>>,
    ) -> Self {
        GuestOutput { inner: Arc::new(Mutex::new(Inner { nf, owner, stream, line: Vec::new(), limiter })) }
    }

    fn write_bytes(&self, data: &[u8]) {
        self.inner.lock().write(data);
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_bytes(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.write_bytes(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_drops_beyond_the_rate() {
        let mut l = LogLimiter::new(5);
        let allowed = (0..100).filter(|_| l.allow()).count();
        assert!((5..=6).contains(&allowed), "{allowed}");
        assert_eq!(l.dropped().load(Ordering::Relaxed) as usize, 100 - allowed);
    }

    #[test]
    fn long_lines_are_cut() {
        let limiter = Arc::new(Mutex::new(LogLimiter::new(10)));
        let out = GuestOutput::new("t".into(), None, Stream::Stdout, limiter);
        out.write_bytes(&vec![b'a'; 10_000]);
        assert_eq!(out.inner.lock().line.len(), MAX_LINE);
        out.write_bytes(b"\n");
        assert!(out.inner.lock().line.is_empty());
    }
}
