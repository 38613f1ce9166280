//! Modules: uploads (checked with the host's own loader, stored by
//! digest), listing, reading and deleting a tenant's modules.

use super::{PageParams, check_name, check_version, created_key, now, page, quota};
use crate::auth::Tenant;
use crate::error::{ApiError, ApiPath, ApiQuery, ErrorBody};
use crate::secrets::random_hex;
use crate::state::AppState;
use crate::store::ModuleRow;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sluice_runtime::RuntimeError;
use utoipa::{IntoParams, ToSchema};

/// An uploaded module.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModuleOut {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Version.
    pub version: String,
    /// SHA-256 of the component, hex.
    pub digest: String,
    /// Size in bytes.
    pub size: i64,
    /// The `sluice:nf` contract version it targets.
    pub contract: String,
    /// Uploaded, ms since the epoch.
    pub created_ms: i64,
    /// Deployments using it.
    pub deployed_in: Vec<String>,
}

fn module_out(st: &AppState, m: ModuleRow) -> Result<ModuleOut, ApiError> {
    let deployed_in = st.store.module_users(&m.id)?;
    Ok(ModuleOut {
        id: m.id,
        name: m.name,
        version: m.version,
        digest: m.digest,
        size: m.size,
        contract: m.contract,
        created_ms: m.created_ms,
        deployed_in,
    })
}

/// Name and version of an upload.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadParams {
    /// Module name: 1-64 letters, digits, '-' or '_', starting with a
    /// letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub name: String,
    /// Module version: 1-64 letters, digits, '.', '_', '+' or '-'.
    #[param(pattern = "^[A-Za-z0-9._+-]{1,64}$")]
    pub version: String,
}

/// Upload a module (the raw `.wasm` as the body).
///
/// The component is validated, compiled and pre-instantiated against the
/// host's linker, exactly as hosts will load it.
#[utoipa::path(post, path = "/v1/modules", tag = "modules", security(("bearer" = [])), params(UploadParams),
    request_body(content = Vec<u8>, content_type = "application/wasm"),
    responses((status = 201, body = ModuleOut),
        (status = 400, description = "not WebAssembly, or bad name/version", body = ErrorBody),
        (status = 409, description = "name and version exist, or a quota (`quota_exceeded`)", body = ErrorBody),
        (status = 429, description = "too many uploads of this tenant in flight", body = ErrorBody),
        (status = 413, description = "over the size limit", body = ErrorBody),
        (status = 422, description = "a core module, an invalid component, or not the sluice:nf world", body = ErrorBody)))]
pub async fn upload_module(
    State(st): State<AppState>,
    tenant: Result<Tenant, ApiError>,
    query: Result<Query<UploadParams>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<(StatusCode, [(header::HeaderName, String); 1], Json<ModuleOut>), ApiError> {
    // The body is read before credentials and parameters are judged: a
    // client is still sending it, and answering first would reset the
    // connection under it instead of telling it what is wrong.
    let tenant = match tenant {
        Ok(t) => t,
        Err(e) => {
            // Unauthenticated: discard (a bounded amount), keep nothing.
            drain(body, st.config.max_module_bytes()).await;
            return Err(e);
        }
    };
    let quotas = &st.config.quotas;
    let Some(_turn) = st.upload_turn(&tenant.id, quotas.uploads_in_flight) else {
        drain(body, st.config.max_module_bytes()).await;
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_uploads",
            format!(
                "this tenant has {} uploads being checked already (quotas.uploads-in-flight); retry when one is done",
                quotas.uploads_in_flight
            ),
        ));
    };
    let bytes = read_limited(body, st.config.max_module_bytes()).await?;
    let Query(q) = query
        .map_err(|e| ApiError::bad_request(format!("{}; give ?name=<module name>&version=<version>", e.body_text())))?;
    check_name("module name", &q.name)?;
    check_version(&q.version)?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request("empty body: send the .wasm file as the request body"));
    }
    if st.store.module(&tenant.id, &format!("{}@{}", q.name, q.version))?.is_some() {
        return Err(ApiError::conflict(format!(
            "module {}@{} exists already; versions are immutable, upload under a new version",
            q.name, q.version
        )));
    }
    let held = st.store.modules(&tenant.id)?;
    let held_bytes: u64 = held.iter().map(|m| u64::try_from(m.size).unwrap_or(0)).sum();
    if held.len() >= quotas.modules as usize {
        return Err(quota(format!(
            "this tenant holds {} module versions, its quota (quotas.modules); delete unused ones first",
            held.len()
        )));
    }
    if held_bytes.saturating_add(bytes.len() as u64) > quotas.module_mb << 20 {
        return Err(quota(format!(
            "this tenant's modules would take {} bytes, over its quota of {} MiB (quotas.module-mb); delete unused ones first",
            held_bytes.saturating_add(bytes.len() as u64),
            quotas.module_mb
        )));
    }
    let runtime = st.runtime.clone();
    let name = q.name.clone();
    let data = bytes.clone();
    // Compiling is the gateway's most expensive work: a few at a time.
    let _compile = st.compiles.clone().acquire_owned().await.map_err(ApiError::internal)?;
    let loaded = tokio::task::spawn_blocking(move || runtime.load(&name, &data).map(|m| m.contract_version()))
        .await
        .map_err(ApiError::internal)?;
    let contract = loaded.map_err(|e| match e {
        RuntimeError::NotWasm { .. } => ApiError::bad_request(e.to_string()).with_code("not_wasm"),
        RuntimeError::CoreModule { .. } => ApiError::unprocessable("core_module", e.to_string()),
        RuntimeError::WrongWorld { .. } => ApiError::unprocessable("wrong_world", e.to_string()),
        other => ApiError::unprocessable("invalid_component", other.to_string()),
    })?;
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    let path = st.blob_path(&digest);
    // Blobs are shared by digest between tenants: writing one and adding
    // its row, or removing a row and then the unused blob, happen under
    // one lock, so a concurrent delete never takes a blob just uploaded.
    let _blobs = st.blob_lock.lock().await;
    if !path.exists() {
        let tmp = path.with_extension(format!("tmp-{}", random_hex(4)?));
        tokio::fs::write(&tmp, &bytes).await.map_err(ApiError::internal)?;
        tokio::fs::rename(&tmp, &path).await.map_err(ApiError::internal)?;
    }
    let row = ModuleRow {
        id: format!("m_{}", random_hex(6)?),
        tenant_id: tenant.id.clone(),
        name: q.name.clone(),
        version: q.version.clone(),
        digest,
        size: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
        contract: contract.to_string(),
        created_ms: now(),
    };
    if !st.store.insert_module(&row)? {
        return Err(ApiError::conflict(format!("module {}@{} exists already", q.name, q.version)));
    }
    tracing::info!(tenant = %tenant.id, module = %row.id, name = %row.name, version = %row.version, "module uploaded");
    let location = format!("/v1/modules/{}", row.id);
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(module_out(&st, row)?)))
}

/// Reads a body of at most `limit` bytes. A larger one is read on (up to
/// a hard cap) and discarded before answering 413, so the client gets the
/// answer instead of a connection reset in the middle of its upload.
async fn read_limited(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let hard_cap = limit.saturating_mul(4).max(limit.saturating_add(64 << 20));
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
        total = total.saturating_add(chunk.len());
        if total <= limit {
            buf.extend_from_slice(&chunk);
        } else if total > hard_cap {
            break;
        }
    }
    if total > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "the module is larger than the {limit}-byte limit (max-module-mb); shrink it (release build, strip) or ask the operator"
            ),
        ));
    }
    Ok(Bytes::from(buf))
}

/// Reads and discards up to `limit` bytes of a body.
async fn drain(body: Body, limit: usize) {
    let mut stream = body.into_data_stream();
    let mut total = 0usize;
    while let Some(Ok(chunk)) = stream.next().await {
        total = total.saturating_add(chunk.len());
        if total > limit {
            break;
        }
    }
}

impl ApiError {
    fn with_code(mut self, code: &'static str) -> Self {
        self.code = code;
        self
    }
}

/// List the tenant's modules by name, then upload time, paged.
#[utoipa::path(get, path = "/v1/modules", tag = "modules", security(("bearer" = [])), params(PageParams),
    responses((status = 200, body = [ModuleOut], headers(("Link" = String, description = "the next page, `<path?limit=N&after=CURSOR>; rel=\"next\"`, while more items follow"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_modules(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiQuery(p): ApiQuery<PageParams>,
) -> Result<Response, ApiError> {
    let rows = st.store.modules(&tenant.id)?;
    let items = rows
        .into_iter()
        .map(|m| {
            let key = format!("{}\u{1}{}", m.name, created_key(m.created_ms, &m.id));
            module_out(&st, m).map(|o| (key, o))
        })
        .collect::<Result<_, _>>()?;
    page("/v1/modules", items, &p)
}

/// Get a module by id or `name@version`.
#[utoipa::path(get, path = "/v1/modules/{id}", tag = "modules", security(("bearer" = [])),
    params(("id" = String, Path, description = "Module id or name@version")),
    responses((status = 200, body = ModuleOut), (status = 404, body = ErrorBody)))]
pub async fn get_module(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ModuleOut>, ApiError> {
    let m = st.store.module(&tenant.id, &id)?.ok_or_else(|| ApiError::not_found("module", &id))?;
    Ok(Json(module_out(&st, m)?))
}

/// Delete a module (refused while a deployment uses it).
#[utoipa::path(delete, path = "/v1/modules/{id}", tag = "modules", security(("bearer" = [])),
    params(("id" = String, Path, description = "Module id or name@version")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, description = "deployed", body = ErrorBody)))]
pub async fn delete_module(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let m = st.store.module(&tenant.id, &id)?.ok_or_else(|| ApiError::not_found("module", &id))?;
    let _blobs = st.blob_lock.lock().await;
    match st.store.delete_module(&tenant.id, &m.id)? {
        Err(users) => Err(ApiError::conflict(format!(
            "module {}@{} is used by deployment(s) {}; delete or update them first",
            m.name,
            m.version,
            users.join(", ")
        ))),
        Ok(false) => Err(ApiError::not_found("module", &id)),
        Ok(true) => {
            if !st.store.digest_in_use(&m.digest)? {
                let _ = tokio::fs::remove_file(st.blob_path(&m.digest)).await;
            }
            Ok(StatusCode::NO_CONTENT)
        }
    }
}
