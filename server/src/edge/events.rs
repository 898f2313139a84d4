//! `/api/events`: the status pushed to the dashboard as Server-Sent Events. First
//! `event: history` (the run so far, as `/api/history`), then `event: status` (the same JSON
//! as `/api/status`) when it changes, at most four times a second, with keep-alives. The
//! stream ends when the coordinator stops.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::edge::state::AppState;
use crate::status::Status;

/// At most one event per this long: a status is published per gradient.
const THROTTLE: Duration = Duration::from_millis(250);

pub async fn events(
    State(state): State<AppState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let history = state.coordinator.history().await.unwrap_or_default();
    let history = serde_json::to_string(&history).unwrap_or_else(|_| "[]".into());
    let history = stream::once(async move { Ok(Event::default().event("history").data(history)) });
    let status = state.published.status.clone();
    let stream = stream::unfold(
        (status, state.shutdown.clone(), true),
        |(mut status, shutdown, first): (watch::Receiver<Status>, CancellationToken, bool)| async move {
            if !first {
                tokio::select! {
                    changed = status.changed() => changed.ok()?,
                    () = shutdown.cancelled() => return None,
                }
                tokio::select! {
                    () = tokio::time::sleep(THROTTLE) => {}
                    () = shutdown.cancelled() => return None,
                }
            }
            let json = serde_json::to_string(&*status.borrow_and_update()).ok()?;
            let event = Event::default().event("status").data(json);
            Some((Ok(event), (status, shutdown, false)))
        },
    );
    Sse::new(history.chain(stream)).keep_alive(KeepAlive::default())
}
