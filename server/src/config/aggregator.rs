//! `--aggregator` and its parameters, checked together.

use super::cli::{AggregatorChoice, Cli};
use super::ConfigError;
use crate::aggregate::{AggregatorKind, Rule};

/// `--aggregator` with its parameters.
pub(super) fn aggregator(cli: &Cli) -> Result<AggregatorKind, ConfigError> {
    if !(1..=65536).contains(&cli.aggregator_memory) {
        return Err(ConfigError::AggregatorMemory(cli.aggregator_memory));
    }
    let trim = cli.trim.unwrap_or(0.2);
    if !(0.0..0.5).contains(&trim) {
        return Err(ConfigError::Trim(trim));
    }
    if let Some(radius) = cli.clip_radius {
        if cli.aggregator != AggregatorChoice::CenteredClip {
            return Err(ConfigError::ClipRadiusWithoutCenteredClip);
        }
        if !(radius > 0.0 && radius <= 1e30) {
            return Err(ConfigError::ClipRadius(radius));
        }
    }
    let rule = match (cli.aggregator, cli.trim) {
        (AggregatorChoice::MeanAroundMedian, _) => Rule::MeanAroundMedian { trim },
        (AggregatorChoice::TrimmedMean, _) => Rule::TrimmedMean { trim },
        (AggregatorChoice::MultiKrum, _) => Rule::MultiKrum { hostile: trim },
        (AggregatorChoice::CenteredClip, None) => Rule::CenteredClip {
            radius: cli.clip_radius,
        },
        (_, Some(_)) => return Err(ConfigError::TrimWithoutTrimmedMean),
        (AggregatorChoice::Mean, None) => Rule::Mean,
        (AggregatorChoice::Median, None) => Rule::Median,
    };
    if !(0.0..1.0).contains(&cli.worker_momentum) {
        return Err(ConfigError::WorkerMomentum(cli.worker_momentum));
    }
    Ok(AggregatorKind {
        rule,
        memory: cli.aggregator_memory << 20,
        momentum: cli.worker_momentum,
    })
}
