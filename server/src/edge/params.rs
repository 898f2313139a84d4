//! `/api/params`: the current weights as a safetensors file, whole or by tensor name.

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::edge::state::AppState;

/// `?tensors=l1.weight,l1.bias`: only those tensors (pull by key).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ParamsQuery {
    tensors: Option<String>,
}

pub(crate) async fn params(
    State(state): State<AppState>,
    Query(query): Query<ParamsQuery>,
) -> Response {
    let snapshot = state.published.weights.borrow().clone();
    let layout = state.published.net.layout();
    let wanted: Option<Vec<&str>> = query.tensors.as_deref().map(|t| t.split(',').collect());
    if let Some(unknown) = wanted
        .iter()
        .flatten()
        .find(|w| !layout.tensors().iter().any(|t| t.name == **w))
    {
        let names: Vec<&str> = layout.tensors().iter().map(|t| t.name.as_str()).collect();
        let error = format!(
            "no tensor named {unknown:?}; this model has {}",
            names.join(", ")
        );
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "error": error })),
        )
            .into_response();
    }
    let data = snapshot.param_bytes();
    let body = crate::storage::tensors_file::encode(
        layout
            .tensors()
            .iter()
            .filter(|t| wanted.as_ref().is_none_or(|w| w.contains(&t.name.as_str())))
            .map(|t| {
                let bytes = &data[t.offset * 4..(t.offset + t.len()) * 4];
                (t.name.as_str(), t.shape.as_slice(), bytes)
            }),
        ("round", snapshot.round.to_string()),
    );
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!(
                    "attachment; filename=\"crowdtrain-round-{}.safetensors\"",
                    snapshot.round
                ),
            ),
            (
                header::HeaderName::from_static("x-crowdtrain-round"),
                snapshot.round.to_string(),
            ),
        ],
        body,
    )
        .into_response()
}
