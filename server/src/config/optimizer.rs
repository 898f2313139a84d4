//! `--optimizer`, `--lr`, `--momentum` and the local-steps flags (`--local-steps`,
//! `--max-local-steps`, `--inner-optimizer`, `--inner-lr`), checked together: with local
//! steps, `--optimizer` is the outer optimizer and defaults to DiLoCo's Nesterov (sync) or
//! to plain averaging (async and hogwild).

use coordinator_core::{Local, LocalSteps};
use model::OptimizerKind;
use protocol::{InnerOptimizer, MAX_LOCAL_STEPS};

use super::cli::{Cli, InnerChoice, ModeChoice, OptimizerChoice};
use super::ConfigError;

/// The outer optimizer, and the local phases if any.
pub(super) fn optimizers(cli: &Cli) -> Result<(OptimizerKind, Option<Local>), ConfigError> {
    let local = local(cli)?;
    // Local steps: DiLoCo's outer Nesterov in sync mode. Its momentum on a partial async
    // buffer diverged in the simulator (35 % after 300 updates, where plain averaging
    // reached 94 %), so async and hogwild average (FedBuff): outer SGD at 1.
    let averaging = local.is_some() && cli.mode != ModeChoice::Sync;
    let choice = cli.optimizer.unwrap_or(match (local.is_some(), averaging) {
        (false, _) => OptimizerChoice::Adam,
        (true, false) => OptimizerChoice::Nesterov,
        (true, true) => OptimizerChoice::Sgd,
    });
    let (default_lr, name) = match choice {
        OptimizerChoice::Sgd if averaging => (1.0, "sgd"),
        OptimizerChoice::Sgd => (0.1, "sgd"),
        OptimizerChoice::Momentum => (0.05, "momentum"),
        OptimizerChoice::Nesterov => (0.7, "nesterov"),
        OptimizerChoice::Adam => (0.001, "adam"),
    };
    let lr = cli.lr.unwrap_or(default_lr);
    if !(lr.is_finite() && lr > 0.0 && lr <= 10.0) {
        return Err(ConfigError::LearningRate(lr));
    }
    let momentum = cli.momentum.unwrap_or(0.9);
    if !matches!(
        choice,
        OptimizerChoice::Momentum | OptimizerChoice::Nesterov
    ) {
        if cli.momentum.is_some() {
            return Err(ConfigError::MomentumWithoutMomentumOptimizer(name));
        }
    } else if !(0.0..1.0).contains(&momentum) {
        return Err(ConfigError::Momentum(momentum));
    }
    let optimizer = match choice {
        OptimizerChoice::Sgd => OptimizerKind::Sgd { lr },
        OptimizerChoice::Momentum => OptimizerKind::Momentum { lr, momentum },
        OptimizerChoice::Nesterov => OptimizerKind::Nesterov { lr, momentum },
        OptimizerChoice::Adam => OptimizerKind::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    };
    Ok((optimizer, local))
}

/// `--local-steps` and what goes with it.
fn local(cli: &Cli) -> Result<Option<Local>, ConfigError> {
    let Some(steps) = cli.local_steps.as_deref() else {
        if cli.max_local_steps.is_some()
            || cli.max_local_epochs.is_some()
            || cli.inner_optimizer.is_some()
            || cli.inner_lr.is_some()
        {
            return Err(ConfigError::InnerWithoutLocalSteps);
        }
        return Ok(None);
    };
    let max = cli.max_local_steps.unwrap_or(4096);
    if !(1..=MAX_LOCAL_STEPS).contains(&max) {
        return Err(ConfigError::LocalSteps(max.to_string()));
    }
    let steps = match steps.trim() {
        "auto" => {
            let passes = cli.max_local_epochs.unwrap_or(1.0);
            if !(passes.is_finite() && passes > 0.0 && passes <= 1e6) {
                return Err(ConfigError::LocalEpochs(passes));
            }
            LocalSteps::Auto { max, passes }
        }
        // One step per answer is today's exchange, the gradient itself, bit for bit.
        "1" if cli.inner_optimizer.is_some() || cli.inner_lr.is_some() => {
            return Err(ConfigError::InnerWithOneStep)
        }
        "1" if cli.max_local_steps.is_none() && cli.max_local_epochs.is_none() => return Ok(None),
        n => match n.parse::<u32>() {
            Ok(_) if cli.max_local_steps.is_some() || cli.max_local_epochs.is_some() => {
                return Err(ConfigError::MaxLocalStepsWithoutAuto)
            }
            Ok(h) if (1..=MAX_LOCAL_STEPS).contains(&h) => LocalSteps::Fixed(h),
            _ => return Err(ConfigError::LocalSteps(n.to_string())),
        },
    };
    let choice = cli.inner_optimizer.unwrap_or(InnerChoice::Sgd);
    let lr = cli.inner_lr.unwrap_or(match choice {
        InnerChoice::Sgd => 0.1,
        InnerChoice::Momentum => 0.05,
        InnerChoice::Adam => 0.001,
    });
    if !(lr.is_finite() && lr > 0.0 && lr <= 10.0) {
        return Err(ConfigError::InnerLearningRate(lr));
    }
    let inner = match choice {
        InnerChoice::Sgd => InnerOptimizer::Sgd { lr },
        InnerChoice::Momentum => InnerOptimizer::Momentum { lr, momentum: 0.9 },
        InnerChoice::Adam => InnerOptimizer::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    };
    Ok(Some(Local { steps, inner }))
}
