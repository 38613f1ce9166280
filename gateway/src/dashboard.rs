//! The tenant dashboard: one self-contained page (no assets fetched from
//! anywhere else) that reads the same API a client does.

use axum::response::{Html, Redirect};

/// `/dashboard`.
pub async fn page() -> ([(axum::http::HeaderName, &'static str); 1], Html<&'static str>) {
    ([(axum::http::header::CONTENT_SECURITY_POLICY, CSP.as_str())], Html(PAGE))
}

const PAGE: &str = include_str!("../assets/dashboard.html");

/// The dashboard's content security policy: its own inline script (by
/// hash) and style, requests to this origin only, never framed.
static CSP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use base64::Engine;
    use sha2::Digest;
    let script = PAGE.split_once("<script>").and_then(|(_, rest)| rest.split_once("</script>")).map_or("", |(s, _)| s);
    let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(script.as_bytes()));
    format!(
        "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
});

/// `/` goes to the dashboard.
pub async fn redirect() -> Redirect {
    Redirect::temporary("/dashboard")
}
