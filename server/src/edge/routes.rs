//! HTTP surface: the WebSocket endpoint, the JSON API, the health check and static files.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::edge::assets::WebSource;
use crate::edge::state::AppState;
use crate::{session, socket};

/// Largest message a worker may send: one gradient chunk (at most 64 KiB of values) plus
/// headroom for its header and a `Hello`. Set explicitly rather than left at the library's
/// 64 MiB default: a connection never buffers more than this, whatever the model's size.
pub const MAX_MESSAGE_SIZE: usize = protocol::CHUNK_VALUES * 4 + 4096;

/// Bytes read from a socket at a time. A connection's read buffer holds one frame being
/// read plus at most this much; tungstenite's default (128 KiB) let each grow to about
/// 512 KiB while frames were being decoded, 33 MB over 64 workers at 1M parameters. 32 KiB
/// costs two or three reads per 64 KiB chunk, and no throughput measured (BENCHMARKS.md).
///
/// Writes do not go through tungstenite: `socket::Connection` writes each frame's header and
/// its shared payload straight to the socket.
pub const READ_BUFFER: usize = 32 << 10;

pub fn app(state: AppState, web: &WebSource) -> Router {
    let router = Router::new()
        .route("/ws", get(ws))
        .route("/api/join-check", get(join_check))
        .route("/api/status", get(status))
        .merge(crate::edge::admin::routes(
            state.published.net.param_count(),
        ))
        .route("/metrics", get(metrics))
        .route("/api/events", get(crate::edge::events::events))
        .route("/api/history", get(history))
        .route(
            "/dashboard",
            get(|| async { axum::response::Redirect::permanent("/dashboard.html") }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state);
    web.serve(router)
}

async fn ws(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
) -> Response {
    if state.shutdown.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    }
    let (response, upgrade) = match socket::accept(&mut req) {
        Ok(accepted) => accepted,
        Err(refused) => return refused.into_response(),
    };
    // An IPv6 peer counts as its /64 for every per-address rule.
    let address = crate::edge::admission::address_of(peer.ip());
    let admitted = match state.admission.admit(req.headers(), address) {
        Ok(admitted) => admitted,
        Err(refused) => {
            tracing::info!(%peer, status = %refused.status, message = %refused.message, "upgrade refused");
            return (refused.status, refused.message).into_response();
        }
    };
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .max_message_size(Some(MAX_MESSAGE_SIZE))
        .max_frame_size(Some(MAX_MESSAGE_SIZE));
    // Tracked so shutdown can wait for every session to send its close frame.
    let session = state.sessions.track_future(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let socket = socket::Connection::new(TokioIo::new(upgraded), config).await;
                session::run(
                    socket,
                    state.coordinator,
                    state.shutdown,
                    state.limits,
                    address,
                )
                .await;
            }
            Err(err) => tracing::debug!(%peer, %err, "upgrade failed"),
        }
        // The address's connection count goes down when the session has ended.
        drop(admitted);
    });
    tokio::spawn(session);
    response
}

/// `?origin=`: the page's origin (a browser sends none with a same-origin GET).
#[derive(Debug, serde::Deserialize)]
struct JoinCheck {
    origin: Option<String>,
}

/// What the WebSocket upgrade would answer this client now, without opening one: browsers
/// do not tell a page why its socket was refused, so the page asks here. `200 ok`, or the
/// upgrade's own status and sentence.
async fn join_check(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<JoinCheck>,
    req: Request,
) -> Response {
    if state.shutdown.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    }
    let mut headers = req.headers().clone();
    headers.remove(header::ORIGIN);
    if let Some(origin) = query.origin.as_deref() {
        match header::HeaderValue::from_str(origin) {
            Ok(value) => {
                headers.insert(header::ORIGIN, value);
            }
            Err(_) => {
                return (StatusCode::BAD_REQUEST, "origin: not a header value").into_response()
            }
        }
    }
    let address = crate::edge::admission::address_of(peer.ip());
    match state.admission.check(&headers, address) {
        Ok(()) => "ok".into_response(),
        Err(refused) => (refused.status, refused.message).into_response(),
    }
}

async fn status(State(state): State<AppState>) -> impl IntoResponse {
    let status = state.published.status.borrow().clone();
    Json(status)
}

async fn history(State(state): State<AppState>) -> Response {
    match state.coordinator.history().await {
        Some(points) => Json(points).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the coordinator is stopping",
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::edge::exposition::CONTENT_TYPE)],
        state.exposition.render(),
    )
}
