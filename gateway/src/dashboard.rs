//! The tenant dashboard: one self-contained page (no assets fetched from
//! anywhere else) that reads the same API a client does.

use axum::response::{Html, Redirect};

/// `/dashboard`.
pub async fn page() -> Html<&'static str> {
    Html(include_str!("../assets/dashboard.html"))
}

/// `/` goes to the dashboard.
pub async fn redirect() -> Redirect {
    Redirect::temporary("/dashboard")
}
