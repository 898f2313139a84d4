//! What a checkpoint was trained with, and what must match for it to be resumed.
//!
//! The model (its layer widths), the dataset (a CRC-32 of every train and test sample and
//! label, so the seed's split is part of it), the optimizer with its betas or momentum (its
//! state means nothing to another one) and the mode. Everything else (learning rate,
//! aggregator, deadlines, verification, worker limits) may change across a restart.

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::dataset::Split;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fingerprint {
    pub model: String,
    pub param_count: usize,
    pub dataset: String,
    pub optimizer: String,
    pub mode: String,
}

impl Fingerprint {
    pub fn of(config: &Config, data: &Split, net: &model::Network) -> Self {
        let mut crc = crc32fast::Hasher::new();
        for part in [&data.train, &data.test] {
            match part.values() {
                model::Values::U8(v) => crc.update(v),
                model::Values::F32(v) => v.iter().for_each(|x| crc.update(&x.to_le_bytes())),
            }
            crc.update(part.labels());
            let norm = part.normalization();
            for x in norm.mean().iter().chain(norm.std()) {
                crc.update(&x.to_le_bytes());
            }
        }
        let optimizer = match config.training.optimizer {
            model::OptimizerKind::Sgd { .. } => "sgd".to_string(),
            model::OptimizerKind::Momentum { momentum, .. } => format!("momentum {momentum}"),
            model::OptimizerKind::Nesterov { momentum, .. } => format!("nesterov {momentum}"),
            model::OptimizerKind::Adam {
                beta1, beta2, eps, ..
            } => format!("adam beta1 {beta1} beta2 {beta2} eps {eps}"),
            // The decay may change across a restart, as the learning rate may.
            model::OptimizerKind::AdamW {
                beta1, beta2, eps, ..
            } => format!("adamw beta1 {beta1} beta2 {beta2} eps {eps}"),
        };
        Self {
            model: net.spec().to_string(),
            param_count: net.param_count(),
            dataset: format!(
                "{} train + {} test samples of {}, crc32 {:08x}",
                data.train.len(),
                data.test.len(),
                data.train.shape(),
                crc.finalize()
            ),
            optimizer,
            mode: config.training.mode.name().to_string(),
        }
    }

    /// What differs, one line per field: `model: checkpoint mlp 784-64-10, now mlp 784-128-10`.
    pub fn differences(&self, now: &Self) -> Vec<String> {
        let fields: [(&str, String, String); 5] = [
            ("model", self.model.clone(), now.model.clone()),
            (
                "parameters",
                self.param_count.to_string(),
                now.param_count.to_string(),
            ),
            ("dataset", self.dataset.clone(), now.dataset.clone()),
            ("optimizer", self.optimizer.clone(), now.optimizer.clone()),
            ("mode", self.mode.clone(), now.mode.clone()),
        ];
        fields
            .into_iter()
            .filter(|(_, was, is)| was != is)
            .map(|(name, was, is)| format!("{name}: checkpoint {was}, now {is}"))
            .collect()
    }
}
