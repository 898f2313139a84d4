//! What every route of the edge shares: the handle to the coordinator, what it publishes,
//! the shutdown, the sessions, the limits and the views' own state.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::coordinator::{CoordinatorHandle, Published};
use crate::edge::admission::Admission;
use crate::session;

#[derive(Debug, Clone)]
pub struct AppState {
    pub coordinator: CoordinatorHandle,
    pub published: Published,
    pub shutdown: CancellationToken,
    pub sessions: TaskTracker,
    pub limits: session::Limits,
    pub admission: Arc<Admission>,
    /// `/metrics`.
    pub exposition: Arc<crate::edge::exposition::Exposition>,
    /// `--admin-token`: the admin API answers 401 without it.
    pub admin_token: Option<Arc<str>>,
}
