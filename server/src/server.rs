//! Wiring: build the coordinator, serve HTTP, and own shutdown end to end.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::Config;
use crate::coordinator::{Checkpoints, Coordinator, Driver, Outcome, WeightsSnapshot};
use crate::edge::admission::Admission;
use crate::edge::assets::WebSource;
use crate::edge::exposition::Exposition;
use crate::edge::routes::app;
use crate::edge::session::Limits;
use crate::edge::state::AppState;
use crate::edge::tls::TlsListener;
use crate::edge::upload::UploadSlots;
use crate::status::Status;
use crate::storage::checkpoint::{CheckpointError, Fingerprint, SavedTokenizer, Store, Writer};

/// How long shutdown waits for sessions to send their close frames.
const SESSION_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("--data {0}")]
    Dataset(#[source] crate::dataset::DataError),
    #[error("--init {path}: {reason}")]
    Init { path: PathBuf, reason: String },
    #[error("building the model: {0}")]
    Model(#[source] model::ModelError),
    #[error("reading the listener address: {0}")]
    Listener(#[source] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] crate::edge::tls::TlsError),
    #[error("HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
    #[error("a server task panicked: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("checkpoints: {0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("resuming from {}: {error}", path.display())]
    Resume {
        path: std::path::PathBuf,
        error: String,
    },
    #[error("cluster: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub rounds: u64,
    pub test_accuracy: Option<f64>,
    pub test_loss: Option<f64>,
    pub reached_target: bool,
    /// The checkpoint of the end (or on stopping) failed.
    pub checkpoint_error: Option<String>,
}

/// A started coordinator: its address, its live status, and the task to wait on.
#[derive(Debug)]
pub struct RunningServer {
    pub addr: SocketAddr,
    pub status: watch::Receiver<Status>,
    /// The latest weights (what `/api/params` serves), also readable after the server stopped.
    pub weights: watch::Receiver<WeightsSnapshot>,
    /// Cancelling this stops the server as a signal would.
    pub shutdown: CancellationToken,
    task: JoinHandle<Result<Summary, ServerError>>,
}

impl RunningServer {
    /// Waits until the server has stopped (training finished or shutdown requested).
    pub async fn wait(self) -> Result<Summary, ServerError> {
        self.task.await?
    }

    /// Stops the server as a signal would, and waits until it has.
    pub async fn stop(self) -> Result<Summary, ServerError> {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// What the log says of a run as it starts: its model, its data, its phases, and how many
/// gradients it receives at once.
fn announce(
    config: &Config,
    net: &model::Network,
    data: &crate::dataset::Split,
    slots: &UploadSlots,
) {
    info!(
        slots = slots.slots(),
        per_address = slots.per_address(),
        upload_memory_mib = config.upload_memory >> 20,
        "gradients received at once"
    );
    info!(model = %net.spec(), parameters = net.param_count(), data = %data.describe(), "training");
    match config.training.local {
        Some(local) => info!(steps = ?local.steps, inner = ?local.inner, "local phases"),
        None => info!("one step per answer, answered with its gradient"),
    }
}

/// The names of the optimizer's state tensors, as checkpoints store them.
fn optimizer_tensors(config: &Config) -> Vec<String> {
    let state = config.training.optimizer.build(0).state();
    state.tensors.into_iter().map(|(name, _)| name).collect()
}

/// Starts the coordinator on `listener`. It stops when `signal` completes, or, with
/// `--exit-when-finished`, by itself when training finishes (a plateau, a target,
/// `--max-rounds`).
pub async fn start(
    listener: TcpListener,
    config: Config,
    signal: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, ServerError> {
    let addr = listener.local_addr().map_err(ServerError::Listener)?;
    let tls = match &config.tls {
        Some(files) => Some(crate::edge::tls::load(&files.cert, &files.key)?),
        None => None,
    };
    let data = config
        .load_data(config.training.seed)
        .map_err(ServerError::Dataset)?;
    let shutdown = CancellationToken::new();
    let web = WebSource::new(config.web_dir.clone());
    web.announce();
    let admin_token: Option<Arc<str>> = config.admin_token.as_deref().map(Arc::from);
    let admission = Arc::new(Admission::new(
        config.allowed_origins.clone(),
        config.max_per_ip,
    ));
    let checkpoints = config.checkpoints.clone();
    let net = data.network(&config.model).map_err(ServerError::Model)?;
    let (liveness, upload_rate) = (config.liveness, config.upload_rate);
    let slots = UploadSlots::new(
        config.upload_memory,
        net.trainable_count(),
        config.upload_slots_per_ip,
    );
    announce(&config, &net, &data, &slots);
    let fingerprint = Fingerprint::of(&config, &data, &net);
    let init = match config.init.clone() {
        Some(path) => Some((read_init(&path, &net)?, path)),
        None => None,
    };
    let names = optimizer_tensors(&config);
    let core_data = part_of(data.data(), config.data_part);
    let core = Coordinator::new(config.training.clone(), net.clone(), core_data, now())
        .map_err(ServerError::Model)?;
    let mut driver = Driver::new(core, shutdown.clone());
    if !config.exit_when_finished {
        driver = driver.serving_when_finished();
    }
    // `--role edge`: the link to the root, connected before anything is served.
    let edge_link = match (&config.cluster, config.role) {
        (Some(cluster), crate::cluster::Role::Edge) => {
            let nats = crate::cluster::Nats::connect(cluster).await?;
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            driver = driver.with_partials(tx);
            Some((nats, cluster.name.clone(), cluster.public_url.clone(), rx))
        }
        _ => None,
    };
    if let Some((params, path)) = init {
        let frozen = net.param_count() - net.trainable_count();
        driver
            .core()
            .start_from(params)
            .map_err(|reason| ServerError::Init {
                path: path.clone(),
                reason,
            })?;
        info!(init = %path.display(), frozen_parameters = frozen, "starting from given weights");
    }
    if let Some(c) = checkpoints {
        driver = with_checkpoints(driver, c, &net, fingerprint, &names, &data)?;
    }
    let (handle, published) = (driver.sender(), driver.published());
    let status = published.status.clone();
    let weights = published.weights.clone();
    let sessions = TaskTracker::new();
    let exposition = Arc::new(Exposition::new(
        published.status.clone(),
        &published.histograms,
        slots.clone(),
    ));
    let state_admission = admission.clone();
    let state = AppState {
        exposition,
        admin_token,
        coordinator: handle,
        published,
        shutdown: shutdown.clone(),
        sessions: sessions.clone(),
        limits: Limits {
            liveness,
            upload_rate,
            slots,
        },
        admission,
    };
    let router = app(state, &web);

    if let Some((nats, name, public_url, partials)) = edge_link {
        let scheme = if tls.is_some() { "wss" } else { "ws" };
        spawn_edge_link(crate::cluster::edge::EdgeLink {
            nats,
            name,
            url: public_url.unwrap_or_else(|| format!("{scheme}://{addr}/ws")),
            params: net.param_count(),
            partials,
            coordinator: driver.sender(),
            status: status.clone(),
            admission: state_admission,
            shutdown: shutdown.clone(),
        });
    }
    let coordinator_task = tokio::spawn(driver.run());
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = signal => shutdown.cancel(),
                () = shutdown.cancelled() => {}
            }
        });
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    info!(%addr, "coordinator listening; volunteers open {scheme}://{addr}/");
    let task = tokio::spawn(serve(
        listener,
        addr,
        tls,
        router,
        shutdown.clone(),
        sessions,
        coordinator_task,
    ));
    Ok(RunningServer {
        addr,
        status,
        weights,
        shutdown,
        task,
    })
}

/// `--checkpoint-dir`: the store probed, the newest checkpoint resumed from with
/// `--resume`, and the writer handed to the driver.
fn with_checkpoints(
    mut driver: Driver,
    c: crate::config::CheckpointConfig,
    net: &model::Network,
    fingerprint: Fingerprint,
    names: &[String],
    data: &crate::dataset::Split,
) -> Result<Driver, ServerError> {
    info!(dir = %c.dir.display(), every = c.every, keep = c.keep, "checkpoints go to {}", c.dir.display());
    let store = Store::new(c.dir, c.keep, net.layout().clone());
    store.probe()?;
    let resume = if c.resume {
        Some(store.load_newest(&fingerprint, names)?)
    } else {
        None
    };
    let tokenizer = data
        .text
        .as_ref()
        .map(|t| SavedTokenizer::from(&t.tokenizer));
    let mut checkpoints = Checkpoints::new(Writer::spawn(store), fingerprint, tokenizer);
    if let Some(loaded) = resume {
        let snapshot = loaded.checkpoint.into_snapshot();
        checkpoints.resumed_at(snapshot.version);
        driver
            .core()
            .restore(snapshot, now())
            .map_err(|error| ServerError::Resume {
                path: loaded.path.clone(),
                error,
            })?;
        info!(checkpoint = %loaded.path.display(), passed_over = loaded.skipped.len(), "resuming");
    }
    driver = driver.with_checkpoints(checkpoints);
    Ok(driver)
}

/// Serves `router` on `listener` until `shutdown`, then drains the sessions and waits for
/// the driver: the run's summary.
async fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    router: axum::Router,
    shutdown: CancellationToken,
    sessions: TaskTracker,
    coordinator_task: JoinHandle<Outcome>,
) -> Result<Summary, ServerError> {
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    let stop = shutdown.clone().cancelled_owned();
    let served = match tls {
        // Chunk frames go out back to back: no waiting on Nagle's algorithm between
        // them.
        None => {
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, service)
                .with_graceful_shutdown(stop)
                .await
        }
        // `tap_io` gives the TLS listener axum's `ConnectInfo<SocketAddr>` (the peer
        // address admission and bans need); it does nothing else.
        Some(config) => {
            let tls = TlsListener::new(listener, addr, config, shutdown.clone());
            axum::serve(tls.tap_io(|_| {}), service)
                .with_graceful_shutdown(stop)
                .await
        }
    };
    // Serving stopped: make sure everything else stops too, then drain sessions.
    shutdown.cancel();
    sessions.close();
    if tokio::time::timeout(SESSION_DRAIN_TIMEOUT, sessions.wait())
        .await
        .is_err()
    {
        warn!("some sessions did not close in time");
    }
    let outcome: Outcome = coordinator_task.await?;
    served.map_err(ServerError::Serve)?;
    Ok(Summary {
        rounds: outcome.rounds,
        test_accuracy: outcome.evaluation.map(|e| e.accuracy),
        test_loss: outcome.evaluation.map(|e| e.loss),
        reached_target: outcome.reached_target,
        checkpoint_error: outcome.checkpoint_error,
    })
}

/// `--data-part k/n`: an edge trains on its part of the train split only.
fn part_of(
    mut data: coordinator_core::Data,
    part: Option<(usize, usize)>,
) -> coordinator_core::Data {
    if let Some((part, parts)) = part {
        let range = model::assign_shards(parts, data.train.len())[part].clone();
        info!(
            part = part + 1,
            parts,
            samples = range.len(),
            "training on a part of the train split"
        );
        data.train = data.train.slice(range);
    }
    data
}

/// `--role edge`: the link to the cluster, beside the driver until shutdown.
fn spawn_edge_link(link: crate::cluster::edge::EdgeLink) {
    tokio::spawn(async move {
        if let Err(e) = link.run().await {
            warn!(error = %e, "the edge's link to the cluster stopped");
        }
    });
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Starts the coordinator and waits for it to stop.
pub async fn run(
    listener: TcpListener,
    config: Config,
    signal: impl Future<Output = ()> + Send + 'static,
) -> Result<Summary, ServerError> {
    start(listener, config, signal).await?.wait().await
}

/// `--init`: the file's tensors (or a Hugging Face directory's, for a GPT), checked against
/// the model's names, shapes and dtype.
fn read_init(path: &Path, net: &model::Network) -> Result<Vec<f32>, ServerError> {
    let fail = |reason: String| ServerError::Init {
        path: path.to_path_buf(),
        reason,
    };
    let params = if path.is_dir() {
        // A Hugging Face GPT-2 directory (`coordinator export` writes one).
        let (spec, params) = crate::storage::hf::read_dir(path).map_err(|e| fail(e.to_string()))?;
        if Some(spec) != net.as_gpt().map(|g| *g.spec()) {
            return Err(fail(format!(
                "its model is `{}`, this run's `{}` (a GPT's vocabulary comes from --tokenizer and the text)",
                model::NetSpec::gpt(spec),
                net.spec()
            )));
        }
        params
    } else {
        let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        crate::storage::tensors_file::decode_params(&bytes, net.layout())
            .map_err(|e| fail(e.to_string()))?
            .0
    };
    if let Some(i) = params.iter().position(|p| !p.is_finite()) {
        return Err(fail(format!("value {i} is not finite")));
    }
    Ok(params)
}
