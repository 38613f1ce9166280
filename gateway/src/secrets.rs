//! Secrets: random tokens, API keys, and the SHA-256 hashes that are all
//! the gateway keeps of them (API keys, the admin token, dashboard tickets
//! and sessions).
//!
//! API keys are 256-bit random strings. A slow password hash buys nothing
//! for keys with that much entropy, and a plain hash keeps the lookup an
//! index probe on every request.

use crate::error::ApiError;
use sha2::{Digest, Sha256};

/// SHA-256 of a secret, hex.
pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// `n` random bytes, hex.
pub fn random_hex(n: usize) -> Result<String, ApiError> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
    Ok(hex::encode(b))
}

/// A new API key and its display prefix.
pub fn new_key() -> Result<(String, String), ApiError> {
    let secret = random_hex(32)?;
    let prefix: String = secret.chars().take(8).collect();
    Ok((format!("sk_{secret}"), prefix))
}
