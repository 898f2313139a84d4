//! `--optimizer`, `--lr`, `--momentum` and the local-steps flags (`--local-steps`,
//! `--max-local-steps`, `--inner-optimizer`, `--inner-lr`), checked together: with local
//! steps, `--optimizer` is the outer optimizer and defaults to DiLoCo's Nesterov (sync) or
//! to plain averaging (async and hogwild). A GPT steps as nanoGPT does: AdamW, warm-up and
//! cosine decay, clipping (`--weight-decay`, `--warmup`, `--lr-decay-steps`, `--min-lr`,
//! `--clip`), all on the coordinator's step.

use coordinator_core::{Local, LocalSteps};
use model::{LrSchedule, OptimizerKind};
use protocol::MAX_LOCAL_STEPS;

use super::cli::{Cli, InnerChoice, ModeChoice, OptimizerChoice};
use super::ConfigError;

/// How the coordinator steps: the optimizer, the learning rate's schedule, the clip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stepping {
    pub optimizer: OptimizerKind,
    pub schedule: Option<LrSchedule>,
    pub clip: Option<f32>,
}

/// The outer optimizer with its schedule and clip, and the local phases if any. `gpt`:
/// the model is a language model, whose defaults are nanoGPT's.
pub(super) fn optimizers(cli: &Cli, gpt: bool) -> Result<(Stepping, Option<Local>), ConfigError> {
    let local = local(cli, gpt)?;
    let inner_adamw = matches!(
        local,
        Some(Local {
            inner: OptimizerKind::AdamW { .. },
            ..
        })
    );
    let per_step = local.is_none();
    // Local steps: DiLoCo's outer Nesterov in sync mode. Its momentum on a partial async
    // buffer diverged in the simulator (35 % after 300 updates, where plain averaging
    // reached 94 %), so async and hogwild average (FedBuff): outer SGD at 1.
    let averaging = local.is_some() && cli.mode != ModeChoice::Sync;
    let choice = cli.optimizer.unwrap_or(match (local.is_some(), averaging) {
        (false, _) if gpt => OptimizerChoice::Adamw,
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
        OptimizerChoice::Adamw => (0.001, "adamw"),
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
    let weight_decay = cli.weight_decay.unwrap_or(0.1);
    if choice != OptimizerChoice::Adamw && !inner_adamw {
        if cli.weight_decay.is_some() {
            return Err(ConfigError::DecayWithoutAdamW(name));
        }
    } else if !((0.0..1.0).contains(&weight_decay) && lr * weight_decay < 1.0) {
        return Err(ConfigError::WeightDecay(weight_decay));
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
        // nanoGPT's betas for its small models (β₂ 0.99: few tokens per step).
        OptimizerChoice::Adamw => OptimizerKind::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay,
        },
    };
    // With local phases the schedule counts outer steps (one a round in sync mode), only
    // when asked ([`schedule`]), and the rate holds at `--lr` after the warm-up unless
    // `--lr-decay-steps` asks for the decay.
    let schedule = if per_step {
        schedule(cli, lr, gpt.then_some(100), cli.max_rounds)?
    } else {
        schedule(cli, lr, None, None)?
    };
    let stepping = Stepping {
        optimizer,
        schedule,
        clip: clip(cli, gpt && per_step)?,
    };
    if !per_step && stepping.clip.is_some() {
        return Err(ConfigError::ClipWithLocalSteps);
    }
    Ok((stepping, local))
}

/// `--inner-optimizer`, or its default: AdamW for a GPT (DiLoCo's), SGD otherwise.
fn inner_choice(cli: &Cli, gpt: bool) -> InnerChoice {
    (cli.inner_optimizer).unwrap_or(if gpt {
        InnerChoice::Adamw
    } else {
        InnerChoice::Sgd
    })
}

/// Whether a GPT's default is `--local-steps auto`: its coordinator listens beyond loopback
/// (`--host` is not `localhost`, `127.0.0.1` or `::1`), so its volunteers' links are not
/// the machine's own, and none of the flags of nanoGPT's per-step recipe (`--warmup`,
/// `--lr-decay-steps`, `--min-lr`, `--clip`) asks for that exchange (with `--local-steps`
/// given, the first three schedule the outer step instead). On a home
/// link one step per exchange keeps a volunteer about 5 % busy; `auto` gives each worker
/// the phase length at which its link takes a tenth of its time. `--local-steps 1` asks for
/// the per-step exchange anywhere.
fn remote_default(cli: &Cli) -> bool {
    let loopback = cli.host == "localhost"
        || (cli.host.trim_matches(['[', ']']))
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let per_step_asked = cli.warmup.is_some()
        || cli.lr_decay_steps.is_some()
        || cli.min_lr.is_some()
        || cli.clip.is_some();
    !loopback && !per_step_asked
}

/// `--warmup`, `--lr-decay-steps`, `--min-lr`; on by default where there is a `default`
/// warm-up (a GPT's per-step exchange), and the decay over `decay` steps unless told (none:
/// the rate holds after the warm-up).
///
/// With phases, `--warmup N` warms the outer rate up over N rounds; off by default.
/// Nesterov's first outer move is `lr · (1 + μ)` = 1.33 times the first phase's, from
/// untrained weights: one tab of the 0.8M GPT at the crowd bench's seed 43 went from 4.29
/// to 4.66 on it and reached 2.0 in 653 s, with `--warmup 4` in 250 s. Not the default:
/// sixteen tabs at seed 42 took 4-6 rounds more with it (1.08-1.12 times as long;
/// docs/BENCHMARKS.md, "The outer step's warm-up").
fn schedule(
    cli: &Cli,
    lr: f32,
    default: Option<u64>,
    decay: Option<u64>,
) -> Result<Option<LrSchedule>, ConfigError> {
    let given = cli.warmup.is_some() || cli.lr_decay_steps.is_some() || cli.min_lr.is_some();
    if !given && default.is_none() {
        return Ok(None);
    }
    let warmup = cli.warmup.or(default).unwrap_or(0);
    let decay_steps = cli.lr_decay_steps.or(decay).unwrap_or(u64::MAX);
    if decay_steps <= warmup {
        return Err(ConfigError::DecayBeforeWarmup {
            decay: decay_steps,
            warmup,
        });
    }
    let min_lr = cli.min_lr.unwrap_or(lr / 10.0);
    if !(min_lr.is_finite() && (0.0..=lr).contains(&min_lr)) {
        return Err(ConfigError::MinLr(min_lr));
    }
    Ok(Some(LrSchedule {
        warmup,
        decay_steps,
        min_lr,
    }))
}

/// `--clip`; 1 by default for a GPT (`default_on`).
fn clip(cli: &Cli, default_on: bool) -> Result<Option<f32>, ConfigError> {
    match cli.clip {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(ConfigError::Clip(c)),
        Some(c) => Ok(Some(c)),
        None => Ok(default_on.then_some(1.0)),
    }
}

/// `--local-steps` and what goes with it; a GPT's phases step with AdamW (DiLoCo's inner
/// optimizer) unless told otherwise. A GPT whose coordinator listens beyond loopback takes
/// local phases by default ([`remote_default`]).
fn local(cli: &Cli, gpt: bool) -> Result<Option<Local>, ConfigError> {
    let steps = match cli.local_steps.as_deref() {
        Some(steps) => Some(steps),
        None if gpt && remote_default(cli) => Some("auto"),
        None => None,
    };
    let Some(steps) = steps else {
        if cli.max_local_steps.is_some()
            || cli.min_local_steps.is_some()
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
            // Fresh Adam moments each phase: their first steps move every weight by
            // about the learning rate whatever its gradient (`local.rs`).
            let adam = matches!(
                inner_choice(cli, gpt),
                InnerChoice::Adam | InnerChoice::Adamw
            );
            let min = cli.min_local_steps.unwrap_or(if adam { 16 } else { 1 });
            if !(1..=max).contains(&min) {
                return Err(ConfigError::MinLocalSteps { min, max });
            }
            LocalSteps::Auto { min, max, passes }
        }
        // One step per answer is today's exchange, the gradient itself, bit for bit.
        "1" if cli.inner_optimizer.is_some() || cli.inner_lr.is_some() => {
            return Err(ConfigError::InnerWithOneStep)
        }
        "1" if cli.max_local_steps.is_none()
            && cli.max_local_epochs.is_none()
            && cli.min_local_steps.is_none() =>
        {
            return Ok(None)
        }
        n => match n.parse::<u32>() {
            Ok(_)
                if cli.max_local_steps.is_some()
                    || cli.max_local_epochs.is_some()
                    || cli.min_local_steps.is_some() =>
            {
                return Err(ConfigError::MaxLocalStepsWithoutAuto)
            }
            Ok(h) if (1..=MAX_LOCAL_STEPS).contains(&h) => LocalSteps::Fixed(h),
            _ => return Err(ConfigError::LocalSteps(n.to_string())),
        },
    };
    let choice = inner_choice(cli, gpt);
    let lr = cli.inner_lr.unwrap_or(match choice {
        InnerChoice::Sgd => 0.1,
        InnerChoice::Momentum => 0.05,
        InnerChoice::Adam | InnerChoice::Adamw => 0.001,
    });
    if !(lr.is_finite() && lr > 0.0 && lr <= 10.0) {
        return Err(ConfigError::InnerLearningRate(lr));
    }
    let inner = match choice {
        InnerChoice::Sgd => OptimizerKind::Sgd { lr },
        InnerChoice::Momentum => OptimizerKind::Momentum { lr, momentum: 0.9 },
        InnerChoice::Adam => OptimizerKind::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        // nanoGPT's betas, and the decay the coordinator's own AdamW would use.
        InnerChoice::Adamw => {
            let weight_decay = cli.weight_decay.unwrap_or(0.1);
            if !((0.0..1.0).contains(&weight_decay) && lr * weight_decay < 1.0) {
                return Err(ConfigError::WeightDecay(weight_decay));
            }
            OptimizerKind::AdamW {
                lr,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay,
            }
        }
    };
    // Calibrated on the GPT (docs/BENCHMARKS.md, "A tab's GPU"); a ReLU model's phases
    // log their near-ties' branches, which the replay forces (model's `branches.rs`).
    let segment = cli.segment_steps.unwrap_or(8);
    if segment > MAX_LOCAL_STEPS {
        return Err(ConfigError::LocalSteps(format!(
            "--segment-steps {segment}"
        )));
    }
    Ok(Some(Local {
        steps,
        inner,
        segment,
    }))
}
