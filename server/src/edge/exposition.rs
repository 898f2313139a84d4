//! `/metrics`: the Prometheus exposition (OpenMetrics text, which Prometheus scrapes), through
//! `prometheus-client`.
//!
//! Counters and gauges are read from the published [`Status`] at scrape time, so they are
//! exactly what `/api/status` says; the two histograms (round duration, per-gradient latency)
//! are observed by the coordinator as things happen. Names carry the `crowdtrain_` prefix,
//! counters end in `_total`, durations are in seconds.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::edge::upload::UploadSlots;
use crate::status::Status;

/// The histograms the coordinator observes into (cheap clones of shared atomics).
#[derive(Debug, Clone)]
pub struct Histograms {
    /// From a round's opening to its update (sync), or between updates (async).
    pub round_seconds: Histogram,
    /// From weights sent to a worker to its gradient arriving at the coordinator.
    pub gradient_latency_seconds: Histogram,
}

impl Default for Histograms {
    fn default() -> Self {
        // 1 ms to ~33 s, doubling.
        let buckets = || exponential_buckets(0.001, 2.0, 16);
        Self {
            round_seconds: Histogram::new(buckets()),
            gradient_latency_seconds: Histogram::new(buckets()),
        }
    }
}

/// The registry `/metrics` renders.
#[derive(Debug)]
pub struct Exposition(Registry);

impl Exposition {
    pub fn new(
        status: watch::Receiver<Status>,
        histograms: &Histograms,
        slots: UploadSlots,
    ) -> Self {
        let mut registry = Registry::with_prefix("crowdtrain");
        registry.register(
            "round_duration_seconds",
            "Round duration: from a round's opening to its update (sync), between updates (async)",
            histograms.round_seconds.clone(),
        );
        registry.register(
            "gradient_latency_seconds",
            "From weights sent to a worker to its gradient arriving",
            histograms.gradient_latency_seconds.clone(),
        );
        registry.register_collector(Box::new(FromStatus(status)));
        registry.register_collector(Box::new(FromSlots(slots)));
        Self(registry)
    }

    /// The exposition, as Prometheus scrapes it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.0)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Content type of [`Exposition::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug)]
struct FromStatus(watch::Receiver<Status>);

type Fmt = Result<(), std::fmt::Error>;

fn counter(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> Fmt {
    let c = ConstCounter::new(value);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: f64) -> Fmt {
    let g = ConstGauge::new(value);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// `--upload-memory` at work: slots, slots free, one address's share, and sessions waiting.
#[derive(Debug)]
struct FromSlots(UploadSlots);

impl Collector for FromSlots {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Fmt {
        let s = &self.0;
        gauge(
            &mut e,
            "upload_slots",
            "Gradients the coordinator receives at once (--upload-memory)",
            s.slots() as f64,
        )?;
        gauge(
            &mut e,
            "upload_slots_free",
            "Upload slots free right now",
            s.available() as f64,
        )?;
        gauge(
            &mut e,
            "upload_slots_per_ip",
            "Upload slots one address may hold at once (--upload-slots-per-ip)",
            s.per_address() as f64,
        )?;
        gauge(
            &mut e,
            "uploads_waiting",
            "Workers whose gradient waits, unread, for an upload slot (or for their address's turn)",
            s.waiting() as f64,
        )
    }
}

impl Collector for FromStatus {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Fmt {
        let s = self.0.borrow().clone();
        let replicas = [
            (
                "replicas_agreed",
                "Replicated answers that agreed",
                s.replicas_agreed,
            ),
            (
                "replicas_disputed",
                "Replicated answers that disagreed",
                s.replicas_disputed,
            ),
        ];
        for (name, help, value) in s.counters.each().chain(replicas) {
            counter(&mut e, name, help, value)?;
        }
        if let Some(c) = &s.checkpoints {
            counter(
                &mut e,
                "checkpoints_written",
                "Checkpoints written",
                c.written,
            )?;
            counter(
                &mut e,
                "checkpoints_failed",
                "Checkpoints that failed",
                c.failed,
            )?;
        }
        let gauges: [(&str, &str, Option<f64>); 16] = [
            (
                "round",
                "Updates applied (the current round or version)",
                Some(s.round as f64),
            ),
            ("workers", "Workers connected", Some(s.workers as f64)),
            (
                "workers_on_probation",
                "Workers whose every answer is recomputed (--probation)",
                Some(s.on_probation as f64),
            ),
            (
                "workers_skipped",
                "Sync: workers skipped after missed deadlines",
                Some(s.skipped_workers as f64),
            ),
            (
                "round_participants",
                "Participants of the open round",
                Some(s.round_participants as f64),
            ),
            (
                "test_accuracy",
                "Test accuracy at the last evaluation (0-1)",
                s.test_accuracy,
            ),
            ("test_loss", "Test loss at the last evaluation", s.test_loss),
            (
                "test_perplexity",
                "A language model's validation perplexity at the last evaluation",
                s.language.map(|l| l.perplexity),
            ),
            (
                "test_bits_per_token",
                "A language model's validation bits per token (per character with a character tokeniser)",
                s.language.map(|l| l.bits_per_token),
            ),
            (
                "train_loss",
                "Mean training loss of the last update",
                s.train_loss,
            ),
            (
                "grad_norm_bound",
                "The L2 norm a gradient is clipped to",
                Some(s.grad_norm_bound),
            ),
            (
                "local_steps",
                "--local-steps: the mean length of the latest local phases",
                s.local_steps,
            ),
            (
                "utilisation",
                "The workers' mean compute share of their connected time (0-1)",
                s.utilisation,
            ),
            (
                "bytes_per_sample",
                "Bytes both ways per sample trained on",
                s.bytes_per_sample,
            ),
            (
                "gradient_noise_scale",
                "Sync: the gradient noise scale B_noise in samples, from the answers' spread",
                s.noise_scale.and_then(|n| n.samples),
            ),
            (
                "crowd_batch",
                "Sync: the samples one update takes (batch times phase steps, summed)",
                s.noise_scale.map(|n| n.crowd_batch),
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                gauge(&mut e, name, help, value)?;
            }
        }
        gauge(
            &mut e,
            "bans",
            "Workers and addresses banned",
            s.bans.len() as f64,
        )?;
        let recompute = ConstCounter::new(s.recompute_seconds);
        recompute.encode(e.encode_descriptor(
            "recompute",
            "Seconds of a core the coordinator spent recomputing answers (--verify-cores)",
            Some(&prometheus_client::registry::Unit::Seconds),
            recompute.metric_type(),
        )?)?;
        gauge(
            &mut e,
            "recomputing",
            "Answers held while the coordinator recomputes them, running or waiting for a core",
            s.recomputing as f64,
        )?;
        gauge(
            &mut e,
            "parameters",
            "Parameters of the model",
            s.param_count as f64,
        )?;
        let info = ConstGauge::new(1i64);
        let mut family =
            e.encode_descriptor("run_info", "What is being run", None, info.metric_type())?;
        let labels = [("mode", s.mode), ("aggregator", s.aggregator)];
        info.encode(family.encode_family(&labels)?)
    }
}
