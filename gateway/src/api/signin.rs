//! Signed-in dashboard links over HTTP: a tenant asks for a link, the
//! dashboard trades its ticket for a read-only session (see
//! [`crate::signin`]).

use crate::auth::Tenant;
use crate::error::{ApiError, ErrorBody};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A dashboard link.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DashboardLink {
    /// The dashboard's path with a one-time sign-in ticket in its fragment
    /// (`/dashboard#sign-in=...`): put the gateway's URL before it and open
    /// it within `expires_in_s`.
    pub path: String,
    /// Seconds the link signs in within (once).
    pub expires_in_s: u64,
}

/// A link that opens the dashboard signed in as the calling tenant
/// (`sluice dashboard`): it works once, within a minute, and the API key
/// is not in it. The ticket is in the URL's fragment, which browsers do
/// not send to servers.
#[utoipa::path(post, path = "/v1/me/dashboard-link", tag = "tenants", security(("bearer" = [])),
    responses((status = 201, body = DashboardLink), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn dashboard_link(
    State(st): State<AppState>,
    tenant: Tenant,
) -> Result<(StatusCode, Json<DashboardLink>), ApiError> {
    let ticket = st.signins.issue(&tenant.id, &tenant.key_hash)?;
    Ok((
        StatusCode::CREATED,
        Json(DashboardLink {
            path: format!("/dashboard#sign-in={ticket}"),
            expires_in_s: crate::signin::TICKET_TTL.as_secs(),
        }),
    ))
}

/// A dashboard link's ticket.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionIn {
    /// The ticket from the link's fragment (`#sign-in=<ticket>`).
    pub ticket: String,
}

/// A dashboard session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionOut {
    /// A bearer token that reads (GET) as the tenant whose key made the
    /// link, until `expires_in_s` pass or that key is revoked.
    pub token: String,
    /// Seconds it lasts.
    pub expires_in_s: u64,
}

/// Trades a dashboard link's ticket, once, for a read-only session.
#[utoipa::path(post, path = "/v1/dashboard/session", tag = "tenants", request_body = SessionIn,
    responses((status = 200, body = SessionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn dashboard_session(
    State(st): State<AppState>,
    body: Result<Json<SessionIn>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<SessionOut>, ApiError> {
    let Json(s) =
        body.map_err(|e| ApiError::bad_request(format!("expected {{\"ticket\": \"...\"}}: {}", e.body_text())))?;
    if s.ticket.len() > 128 {
        return Err(ApiError::bad_request("ticket is longer than any ticket"));
    }
    let token = st.signins.redeem(&s.ticket)?;
    Ok(Json(SessionOut { token, expires_in_s: crate::signin::SESSION_TTL.as_secs() }))
}
