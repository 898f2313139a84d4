//! The admin API, behind `--admin-token` (`Authorization: Bearer <token>`):
//! `POST /api/admin/{pause,resume,checkpoint,stop}`, `POST /api/admin/lr` `{"lr": 0.01}`,
//! `POST /api/admin/{kick,ban}` `{"worker": 3}`, and `PUT /api/params` with a safetensors
//! body, checked against the model's tensor names and shapes before anything changes.
//! Without the token configured, or without the right one, it answers 401.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::{Json, Router};
use protocol::WorkerId;
use serde_json::json;
use subtle::ConstantTimeEq;

use crate::coordinator::Command;
use crate::edge::params::params;
use crate::edge::state::AppState;

pub fn routes(param_count: usize) -> Router<AppState> {
    Router::new()
        .route("/api/admin/{action}", post(command))
        .route(
            "/api/params",
            put(replace_params)
                .get(params)
                .layer(DefaultBodyLimit::max(param_count * 4 + (1 << 20))),
        )
}

/// A refusal: its status and why, as `{"error": "..."}`.
#[derive(Debug)]
struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Refused {
    Refused(status, message.into())
}

/// `Ok` if the request carries the configured token.
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), Refused> {
    let Some(token) = &state.admin_token else {
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "the admin API is off: start the coordinator with --admin-token",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
        Ok(())
    } else {
        Err(refuse(
            StatusCode::UNAUTHORIZED,
            "missing or wrong admin token (Authorization: Bearer <token>)",
        ))
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Lr {
    lr: f32,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Worker {
    worker: u32,
}

fn body<T: serde::de::DeserializeOwned>(bytes: &[u8], example: &str) -> Result<T, Refused> {
    serde_json::from_slice(bytes).map_err(|e| {
        refuse(
            StatusCode::BAD_REQUEST,
            format!("expected a JSON body like {example}: {e}"),
        )
    })
}

fn parse(action: &str, bytes: &[u8]) -> Result<Command, Refused> {
    Ok(match action {
        "pause" => Command::Pause,
        "resume" => Command::Resume,
        "checkpoint" => Command::Checkpoint,
        "stop" => Command::Stop,
        "lr" => Command::SetLr(body::<Lr>(bytes, r#"{"lr": 0.01}"#)?.lr),
        "kick" => Command::Kick(WorkerId(body::<Worker>(bytes, r#"{"worker": 3}"#)?.worker)),
        "ban" => Command::Ban(WorkerId(body::<Worker>(bytes, r#"{"worker": 3}"#)?.worker)),
        other => {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                format!(
                    "no admin action {other:?}: pause, resume, lr, checkpoint, kick, ban, stop"
                ),
            ))
        }
    })
}

async fn command(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(action): Path<String>,
    bytes: Bytes,
) -> Response {
    if let Err(refused) = authorize(&state, &headers) {
        return refused.into_response();
    }
    match parse(&action, &bytes) {
        Ok(command) => send(&state, command, peer).await,
        Err(refused) => refused.into_response(),
    }
}

async fn replace_params(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    if let Err(refused) = authorize(&state, &headers) {
        return refused.into_response();
    }
    let layout = state.published.net.layout();
    let patches = match crate::storage::tensors_file::decode_some(&bytes, layout) {
        Ok(patches) => patches,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("not this model's weights: {e}"),
            )
            .into_response()
        }
    };
    let bad = patches.iter().find_map(|(range, values)| {
        values
            .iter()
            .position(|p| !p.is_finite())
            .map(|i| range.start + i)
    });
    if let Some(at) = bad {
        let name = layout
            .tensors()
            .iter()
            .find(|t| t.range().contains(&at))
            .map_or("?", |t| t.name.as_str());
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("tensor {name:?} holds a non-finite value"),
        )
        .into_response();
    }
    send(&state, Command::ReplaceParams(patches), peer).await
}

async fn send(state: &AppState, command: Command, peer: SocketAddr) -> Response {
    match state.coordinator.admin(command, peer.to_string()).await {
        Some(Ok(done)) => Json(json!({ "done": done })).into_response(),
        Some(Err(refused)) => refuse(StatusCode::CONFLICT, refused).into_response(),
        None => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the coordinator is stopping",
        )
        .into_response(),
    }
}
