//! Signed-in dashboard links (`sluice dashboard`): the API key never
//! travels in a URL.
//!
//! A tenant asks for a link with its API key (`POST /v1/me/dashboard-link`)
//! and gets `/dashboard#sign-in=<ticket>`: a random ticket in the URL's
//! fragment, which browsers never send to a server, so no access log or
//! proxy sees it. The page trades the ticket, once and within
//! [`TICKET_TTL`], for a session token (`POST /v1/dashboard/session`) that
//! it keeps in the tab's session storage. A session reads (GET only) as
//! the key that made the link for [`SESSION_TTL`], and ends when that key
//! is revoked. Tickets and sessions live in the gateway's memory: a
//! restart signs dashboards out. Only SHA-256 hashes of both are kept.

use crate::error::ApiError;
use crate::secrets::{hash, random_hex};
use axum::http::StatusCode;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a link's ticket can be traded for a session.
pub const TICKET_TTL: Duration = Duration::from_secs(60);
/// How long a dashboard session reads.
pub const SESSION_TTL: Duration = Duration::from_secs(3600);
/// Unused tickets one tenant may hold at once.
pub const TICKETS_PER_TENANT: usize = 16;
/// Live sessions and tickets the gateway holds, all tenants together.
pub const MAX_GRANTS: usize = 10_000;
/// The prefix of session tokens (API keys start with `sk_`).
pub const SESSION_PREFIX: &str = "ds_";

/// What a ticket or session stands for.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The tenant.
    pub tenant_id: String,
    /// SHA-256 of the API key that asked for the link.
    pub key_hash: String,
    /// When it stops working.
    pub expires: Instant,
}

/// The outstanding tickets and sessions, by hash.
#[derive(Debug, Default)]
pub struct SignIns {
    tickets: Mutex<HashMap<String, Grant>>,
    sessions: Mutex<HashMap<String, Grant>>,
}

fn full() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "too many dashboard sign-ins at once; try again in a minute",
    )
}

impl SignIns {
    /// A new ticket for the tenant whose key hashes to `key_hash`.
    pub fn issue(&self, tenant_id: &str, key_hash: &str) -> Result<String, ApiError> {
        let now = Instant::now();
        let mut tickets = self.tickets.lock();
        tickets.retain(|_, g| g.expires > now);
        if tickets.values().filter(|g| g.tenant_id == tenant_id).count() >= TICKETS_PER_TENANT {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_sign_ins",
                format!("{TICKETS_PER_TENANT} dashboard links are waiting to be opened; open one or wait a minute"),
            ));
        }
        if tickets.len() >= MAX_GRANTS {
            return Err(full());
        }
        let ticket = random_hex(32)?;
        let grant = Grant { tenant_id: tenant_id.into(), key_hash: key_hash.into(), expires: now + TICKET_TTL };
        tickets.insert(hash(&ticket), grant);
        Ok(ticket)
    }

    /// Trades a ticket (once) for a session token.
    pub fn redeem(&self, ticket: &str) -> Result<String, ApiError> {
        let now = Instant::now();
        let grant = self.tickets.lock().remove(&hash(ticket)).filter(|g| g.expires > now).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this sign-in link is used, expired or unknown; make a new one with `sluice dashboard`",
            )
        })?;
        let mut sessions = self.sessions.lock();
        sessions.retain(|_, g| g.expires > now);
        if sessions.len() >= MAX_GRANTS {
            return Err(full());
        }
        let token = format!("{SESSION_PREFIX}{}", random_hex(32)?);
        sessions.insert(hash(&token), Grant { expires: now + SESSION_TTL, ..grant });
        Ok(token)
    }

    /// The live session of `token`.
    pub fn session(&self, token: &str) -> Option<Grant> {
        let now = Instant::now();
        let mut sessions = self.sessions.lock();
        let key = hash(token);
        match sessions.get(&key) {
            Some(g) if g.expires > now => Some(g.clone()),
            Some(_) => {
                sessions.remove(&key);
                None
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_ticket_works_once_and_sessions_are_not_keys() {
        let s = SignIns::default();
        let t = s.issue("t1", "kh").unwrap();
        let token = s.redeem(&t).unwrap();
        assert!(token.starts_with(SESSION_PREFIX));
        let g = s.session(&token).unwrap();
        assert_eq!((g.tenant_id.as_str(), g.key_hash.as_str()), ("t1", "kh"));
        assert!(s.redeem(&t).is_err(), "a ticket is used once");
        assert!(s.redeem("made-up").is_err());
        assert!(s.session("ds_made-up").is_none());
        assert!(s.session(&t).is_none(), "a ticket is not a session");
    }

    #[test]
    fn tickets_per_tenant_are_bounded() {
        let s = SignIns::default();
        for _ in 0..TICKETS_PER_TENANT {
            s.issue("t1", "kh").unwrap();
        }
        assert_eq!(s.issue("t1", "kh").unwrap_err().status, StatusCode::TOO_MANY_REQUESTS);
        assert!(s.issue("t2", "kh2").is_ok(), "another tenant is not held up");
    }

    #[test]
    fn expired_grants_do_not_work() {
        let s = SignIns::default();
        let t = s.issue("t1", "kh").unwrap();
        s.tickets.lock().values_mut().for_each(|g| g.expires = Instant::now());
        assert!(s.redeem(&t).is_err());
        let t = s.issue("t1", "kh").unwrap();
        let token = s.redeem(&t).unwrap();
        s.sessions.lock().values_mut().for_each(|g| g.expires = Instant::now());
        assert!(s.session(&token).is_none());
    }
}
