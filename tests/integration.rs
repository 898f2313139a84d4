//! Integration tests: a real coordinator on port 0, real WebSockets, real workers.
//!
//! Synchronisation is by explicit events only: the coordinator's status watch channel, the
//! frames a client receives, a process exiting. Timeouts exist only so a broken build fails
//! instead of hanging.

#[path = "integration/util.rs"]
mod util;

/// A real nats-server for the cluster's tests.
#[path = "integration/nats.rs"]
mod nats;

/// Edges and a root on NATS JetStream: one coordinator's training, spread over processes.
#[path = "integration/cluster.rs"]
mod cluster;

/// A GPU's local phases, committed, challenged and replayed by segments; cheats banned.
#[path = "integration/gpu_phases.rs"]
mod gpu_phases;

/// A GPT on text: trained by native workers, every answer replayed, exported for Hugging
/// Face and read back.
#[path = "integration/language.rs"]
mod language;

/// Four native workers train the default model to ≥ 93 % test accuracy.
#[path = "integration/training.rs"]
mod training;

/// The parameter server's promise: distributed sync SGD equals single-process minibatch SGD.
#[path = "integration/equivalence.rs"]
mod equivalence;

/// A finished run keeps its model in a run directory and serves its dashboard until stopped.
#[path = "integration/finished.rs"]
mod finished;

/// Workers dying mid-round and joining late.
#[path = "integration/churn.rs"]
mod churn;

/// Garbage, wrong versions, bad shapes, NaN: refused, and the model is untouched.
#[path = "integration/bad_input.rs"]
mod bad_input;

/// `/api/status`, `/api/params`, `/healthz`, static files.
#[path = "integration/http.rs"]
mod http;

/// SIGTERM to the real binary with workers connected.
#[path = "integration/shutdown.rs"]
mod shutdown;

/// Real headless Chromium tabs training through the served page and the wasm worker.
#[path = "integration/browser.rs"]
mod browser;

/// Deadlines, quorum, skipped stragglers, churn with resume tokens, async and hogwild.
#[path = "integration/robust.rs"]
mod robust;

/// Hostile clients speaking the real protocol: poisoned gradients, replays, lies.
#[path = "integration/attacks.rs"]
mod attacks;

/// Colluding attackers who come back under fresh identities, against probation.
#[path = "integration/strangers.rs"]
mod strangers;

/// Admission: origins, connections per address, a flood of visitors.
#[path = "integration/admission.rs"]
mod admission;

/// https/wss served by the coordinator, with a test-generated private CA.
#[path = "integration/tls.rs"]
mod tls;

/// Checkpoints: exact resume, kill -9, export.
#[path = "integration/durability.rs"]
mod durability;

/// A full disk and a read-only checkpoint directory, at start and mid-run.
#[path = "integration/disk_faults.rs"]
mod disk_faults;

/// The admin API: pause, resume, learning rate, checkpoint, weights, kick, ban, stop.
#[path = "integration/admin.rs"]
mod admin;

/// `--upload-memory`: gradients take turns for the upload slots; a stalled one gives its up.
#[path = "integration/uploads.rs"]
mod uploads;

/// The operator's dashboard in headless Chromium.
#[path = "integration/dashboard.rs"]
mod dashboard;

/// Operators' own data (CSV, IDX, image folders) and model specs (TOML, JSON).
#[path = "integration/datasets.rs"]
mod datasets;

#[path = "integration/links.rs"]
mod links;

/// The suite's own configuration (the heavy group nextest runs one at a time).
#[path = "integration/suite.rs"]
mod suite;
