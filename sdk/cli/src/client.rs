//! A client of the gateway's HTTP API, for the tenant subcommands
//! (`sluice tenant`, `nf upload`, `deploy`, `usage`, `bill`).

use serde::de::DeserializeOwned;
use serde_json::Value;
use std::time::Duration;

/// What a gateway call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer.
    #[error("cannot reach the gateway at {url}: {reason} (is it running? set --url or SLUICE_URL)")]
    Unreachable {
        /// URL.
        url: String,
        /// Cause.
        reason: String,
    },
    /// The gateway said no.
    #[error("{method} {path}: {status} {code}: {message}")]
    Api {
        /// Method.
        method: &'static str,
        /// Path.
        path: String,
        /// HTTP status.
        status: u16,
        /// Error code.
        code: String,
        /// The gateway's message.
        message: String,
    },
    /// An answer that is not what the API documents.
    #[error("{method} {path}: unexpected answer: {reason}")]
    Decode {
        /// Method.
        method: &'static str,
        /// Path.
        path: String,
        /// Cause.
        reason: String,
    },
    /// Missing credentials.
    #[error("{0}")]
    Credentials(String),
}

/// A gateway answer read as the API's model `T`, with the JSON it came
/// as. Serializing it writes that JSON unchanged, which is what `--output
/// json` prints; people's tables read `model`.
#[derive(Debug, Clone)]
pub struct Answer<T> {
    /// The answer as it came.
    pub json: Value,
    /// The same answer as the API's model.
    pub model: T,
}

impl<'de, T: DeserializeOwned> serde::Deserialize<'de> for Answer<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let json = <Value as serde::Deserialize>::deserialize(d)?;
        let model = T::deserialize(&json).map_err(serde::de::Error::custom)?;
        Ok(Answer { json, model })
    }
}

impl<T> serde::Serialize for Answer<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&self.json, s)
    }
}

/// A gateway and the credential to call it with.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    /// A client of the gateway at `base` (e.g. `http://127.0.0.1:8080`).
    pub fn new(base: &str, token: Option<String>) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        Client { base: base.trim_end_matches('/').to_string(), token, agent }
    }

    /// Fails as a request would when the client has no credential, so
    /// that a command can say so before long work (a build).
    pub fn check_key(&self) -> Result<(), ClientError> {
        self.auth().map(|_| ())
    }

    fn auth(&self) -> Result<String, ClientError> {
        self.token.as_ref().map(|t| format!("Bearer {t}")).ok_or_else(|| {
            ClientError::Credentials(
                "no API key: pass --api-key or set SLUICE_API_KEY (the admin token for tenant commands)".into(),
            )
        })
    }

    fn finish(
        &self,
        method: &'static str,
        path: &str,
        r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Vec<u8>, ClientError> {
        let mut resp = r.map_err(|e| ClientError::Unreachable { url: self.base.clone(), reason: e.to_string() })?;
        let status = resp.status().as_u16();
        let body = resp.body_mut().with_config().limit(256 << 20).read_to_vec().map_err(|e| ClientError::Decode {
            method,
            path: path.into(),
            reason: e.to_string(),
        })?;
        if status >= 400 {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let text = String::from_utf8_lossy(&body).into_owned();
            return Err(ClientError::Api {
                method,
                path: path.into(),
                status,
                code: v.get("error").and_then(Value::as_str).unwrap_or("error").into(),
                message: v.get("message").and_then(Value::as_str).map(str::to_string).unwrap_or(text),
            });
        }
        Ok(body)
    }

    fn json<T: DeserializeOwned>(method: &'static str, path: &str, body: &[u8]) -> Result<T, ClientError> {
        serde_json::from_slice(body).map_err(|e| ClientError::Decode {
            method,
            path: path.into(),
            reason: e.to_string(),
        })
    }

    /// GET, JSON answer.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let r = self.agent.get(format!("{}{path}", self.base)).header("Authorization", self.auth()?).call();
        Self::json("GET", path, &self.finish("GET", path, r)?)
    }

    /// GET every item of a paged list: the first page at `path`, then
    /// each page its answer's `Link: <...>; rel="next"` names.
    pub fn get_all<T: DeserializeOwned>(&self, path: &str) -> Result<Vec<T>, ClientError> {
        let mut all = Vec::new();
        let mut next = Some(path.to_string());
        // A bound on pages, should a gateway's links go round in circles.
        for _ in 0..10_000 {
            let Some(p) = next.take() else { break };
            let r = self.agent.get(format!("{}{p}", self.base)).header("Authorization", self.auth()?).call();
            let link =
                r.as_ref().ok().and_then(|r| r.headers().get("link")).and_then(|v| v.to_str().ok()).and_then(next_link);
            let page: Vec<T> = Self::json("GET", &p, &self.finish("GET", &p, r)?)?;
            all.extend(page);
            next = link;
        }
        Ok(all)
    }

    /// GET, text answer.
    pub fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let r = self.agent.get(format!("{}{path}", self.base)).header("Authorization", self.auth()?).call();
        Ok(String::from_utf8_lossy(&self.finish("GET", path, r)?).into_owned())
    }

    /// POST a JSON body.
    pub fn post<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, ClientError> {
        let r = self.agent.post(format!("{}{path}", self.base)).header("Authorization", self.auth()?).send_json(body);
        Self::json("POST", path, &self.finish("POST", path, r)?)
    }

    /// PUT a JSON body.
    pub fn put<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, ClientError> {
        let r = self.agent.put(format!("{}{path}", self.base)).header("Authorization", self.auth()?).send_json(body);
        Self::json("PUT", path, &self.finish("PUT", path, r)?)
    }

    /// POST raw bytes.
    pub fn post_bytes<T: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<T, ClientError> {
        let r = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", self.auth()?)
            .header("Content-Type", content_type)
            .send(body);
        Self::json("POST", path, &self.finish("POST", path, r)?)
    }

    /// POST with no body and no answer expected (204).
    pub fn post_empty(&self, path: &str) -> Result<(), ClientError> {
        let r = self.agent.post(format!("{}{path}", self.base)).header("Authorization", self.auth()?).send_empty();
        self.finish("POST", path, r).map(|_| ())
    }

    /// DELETE.
    pub fn delete(&self, path: &str) -> Result<(), ClientError> {
        let r = self.agent.delete(format!("{}{path}", self.base)).header("Authorization", self.auth()?).call();
        self.finish("DELETE", path, r).map(|_| ())
    }
}

/// The target of a `Link` header's `rel="next"` entry.
pub fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|entry| {
        let (target, params) = entry.trim().split_once(';')?;
        let rel_next = params.split(';').any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"));
        rel_next.then(|| target.trim().trim_start_matches('<').trim_end_matches('>').to_string())
    })
}

/// Percent-encodes a query value.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A horizontal bar of `width` cells for `value` out of `max`.
pub fn bar(value: f64, max: f64, width: usize) -> String {
    if max <= 0.0 || value <= 0.0 {
        return String::new();
    }
    let cells = (value / max * width as f64 * 8.0).round() as usize;
    let full = cells / 8;
    let part = cells % 8;
    let mut s = "█".repeat(full.min(width));
    if full < width && part > 0 {
        s.push(['▏', '▎', '▍', '▌', '▋', '▊', '▉'].get(part - 1).copied().unwrap_or('▏'));
    }
    s
}

/// Human-readable count (1.2k, 3.4M).
pub fn human(n: f64) -> String {
    match n {
        x if x >= 1e9 => format!("{:.2}G", x / 1e9),
        x if x >= 1e6 => format!("{:.2}M", x / 1e6),
        x if x >= 1e3 => format!("{:.1}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_and_bars() {
        assert_eq!(encode("a b&c=1"), "a%20b%26c%3D1");
        assert_eq!(bar(10.0, 10.0, 4), "████");
        assert_eq!(bar(0.0, 10.0, 4), "");
        assert_eq!(bar(5.0, 10.0, 4), "██");
        assert_eq!(human(1_500_000.0), "1.50M");
        assert_eq!(human(999.0), "999");
        assert_eq!(
            next_link("</v1/modules?limit=2&after=61>; rel=\"next\"").as_deref(),
            Some("/v1/modules?limit=2&after=61")
        );
        assert_eq!(next_link("</a>; rel=\"prev\", </b>; rel=next").as_deref(), Some("/b"));
        assert_eq!(next_link("</a>; rel=\"prev\""), None);
    }
}
