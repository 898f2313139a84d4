//! `docs/REFERENCE.md` lists every flag, status field and metric: checked here against the
//! code, both ways, so that neither can change without the other.

use std::collections::BTreeSet;
use std::sync::Arc;

use clap::CommandFactory;
use coordinator_core::noise::NoiseReport;
use coordinator_core::status::{CheckpointReport, RoundReport, WorkerStatus};

use crate::config::Cli;
use crate::edge::exposition::{Exposition, Histograms};
use crate::edge::upload::UploadSlots;
use crate::status::Status;

const REFERENCE: &str = include_str!("../../docs/REFERENCE.md");

/// The backticked names at the start of each row of the table under `heading`.
fn listed(heading: &str) -> BTreeSet<String> {
    let section = REFERENCE
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("REFERENCE.md has no section {heading:?}"));
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect()
}

fn assert_same(what: &str, documented: &BTreeSet<String>, actual: &BTreeSet<String>) {
    let missing: Vec<_> = actual.difference(documented).collect();
    let stale: Vec<_> = documented.difference(actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "{what}: not in docs/REFERENCE.md: {missing:?}; in it but not in the code: {stale:?}"
    );
}

#[test]
fn every_flag_is_in_the_reference_and_every_listed_flag_exists() {
    let actual: BTreeSet<String> = Cli::command()
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|long| !matches!(*long, "help" | "version"))
        .map(|long| format!("--{long}"))
        .collect();
    assert_same("flags", &listed("`coordinator` flags"), &actual);
}

fn noise() -> NoiseReport {
    NoiseReport {
        samples: Some(500.0),
        crowd_batch: 96.0,
        doubling_gain: Some(1.6),
        readings: 20,
    }
}

/// A status with every optional part present, its keys as the reference writes them.
fn status_fields() -> BTreeSet<String> {
    let status = Status {
        last_round: Some(RoundReport::default()),
        checkpoints: Some(Arc::new(CheckpointReport::default())),
        worker_list: Arc::new(vec![WorkerStatus::default()]),
        noise_scale: Some(noise()),
        ..Status::default()
    };
    let json = serde_json::to_value(&status).expect("serialises");
    let mut fields = BTreeSet::new();
    for (key, value) in json.as_object().expect("an object") {
        fields.insert(key.clone());
        let inner = match value {
            serde_json::Value::Object(map) => Some((key.clone(), map)),
            serde_json::Value::Array(items) => items
                .first()
                .and_then(|first| first.as_object())
                .map(|map| (format!("{key}[]"), map)),
            _ => None,
        };
        // `rejected` is a map by reason: its keys are data, not fields.
        if let Some((prefix, map)) = inner.filter(|(k, _)| k != "rejected") {
            for inner_key in map.keys() {
                fields.insert(format!("{prefix}.{inner_key}"));
            }
        }
    }
    fields
}

#[test]
fn every_status_field_is_in_the_reference_and_every_listed_field_exists() {
    assert_same(
        "status fields",
        &listed("`/api/status` fields"),
        &status_fields(),
    );
}

#[test]
fn every_metric_is_in_the_reference_and_every_listed_metric_exists() {
    // Every optional part present: a metric only shows when its value does.
    let full = Status {
        test_accuracy: Some(0.9),
        test_loss: Some(0.3),
        language: Some(coordinator_core::language::LossReadings::of(
            0.3,
            "character",
        )),
        train_loss: Some(0.4),
        local_steps: Some(16.0),
        utilisation: Some(0.9),
        bytes_per_sample: Some(12.5),
        noise_scale: Some(noise()),
        checkpoints: Some(Arc::new(CheckpointReport::default())),
        ..Status::default()
    };
    let (_, status) = tokio::sync::watch::channel(full);
    let slots = UploadSlots::new(16 << 20, 1000, None);
    let exposition = Exposition::new(status, &Histograms::default(), slots);
    let actual: BTreeSet<String> = exposition
        .render()
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| match kind {
            "counter" => format!("{name}_total"),
            _ => name.to_string(),
        })
        .collect();
    assert_same("metrics", &listed("Metrics"), &actual);
}
