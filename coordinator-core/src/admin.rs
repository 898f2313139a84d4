//! The operator's commands (the admin API): pause and resume, the learning rate, a
//! checkpoint now, kick or ban a worker, stop, replace the weights. Each is logged with who
//! asked (the client's address) and what came of it.

use std::ops::Range;
use std::time::Instant;

use protocol::{ErrorCode, WorkerId};
use tracing::{info, warn};

use crate::io::{Outbound, Outcome};
use crate::refusal::Refusal;
use crate::settings::Mode;
use crate::Coordinator;

/// New values for one flat range of the parameters.
pub type Patch = (Range<usize>, Vec<f32>);

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Pause,
    Resume,
    SetLr(f32),
    /// A checkpoint now: the driver, which writes them, answers this one (with
    /// [`Coordinator::snapshot`]).
    Checkpoint,
    Kick(WorkerId),
    Ban(WorkerId),
    Stop,
    /// New parameters, already checked against the model's tensor names and shapes.
    /// New values for some tensors, by flat range (the others keep theirs).
    ReplaceParams(Vec<Patch>),
}

impl Command {
    fn name(&self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::SetLr(_) => "lr",
            Self::Checkpoint => "checkpoint",
            Self::Kick(_) => "kick",
            Self::Ban(_) => "ban",
            Self::Stop => "stop",
            Self::ReplaceParams(_) => "replace_params",
        }
    }
}

impl Coordinator {
    /// Input: the operator's `command`, from `from` (the caller's address). Carried out and
    /// logged; answered with what was done, or why not.
    pub fn admin(&mut self, command: Command, from: &str, now: Instant) -> Result<String, String> {
        self.now = now;
        let action = command.name();
        let result = self.command(command);
        match &result {
            Ok(done) => info!(from, action, %done, "admin"),
            Err(refused) => warn!(from, action, %refused, "admin command refused"),
        }
        self.done(now);
        result
    }

    pub(crate) fn is_sync(&self) -> bool {
        matches!(self.settings.mode, Mode::Sync { .. })
    }

    /// The current parameters with `patches` written over them.
    fn patched(&self, patches: Vec<Patch>) -> Vec<f32> {
        let mut params = self.trainer.params().to_vec();
        for (range, values) in patches {
            params[range].copy_from_slice(&values);
        }
        params
    }

    /// After a sync round's update: weights uploaded while it was open replace the model now.
    pub(crate) fn replace_pending(&mut self) {
        if let Some(patches) = self.pending_params.take() {
            match self.trainer.replace(self.patched(patches)) {
                Ok(version) => {
                    self.registry.frozen_stale();
                    info!(version, "uploaded weights replaced the model");
                }
                Err(error) => warn!(%error, "uploaded weights could not replace the model"),
            }
        }
    }

    /// In async modes while paused: `id` waits for weights until training resumes.
    pub(crate) fn holding(&mut self, id: WorkerId) -> bool {
        let async_mode = !self.is_sync();
        match &mut self.paused {
            Some(waiting) if async_mode => {
                waiting.insert(id);
                true
            }
            _ => false,
        }
    }

    fn command(&mut self, command: Command) -> Result<String, String> {
        let version = self.trainer.version();
        match command {
            Command::Pause if self.paused.is_some() => Ok("already paused".into()),
            Command::Pause => {
                self.paused = Some(Default::default());
                Ok(format!(
                    "paused at round {version}; an open round still completes"
                ))
            }
            Command::Resume => {
                let Some(waiting) = self.paused.take() else {
                    return Ok("not paused".into());
                };
                let waiting: Vec<_> = waiting
                    .into_iter()
                    .map(crate::schedule::Action::Weights)
                    .collect();
                self.execute(waiting);
                Ok(format!("resumed at round {version}"))
            }
            Command::SetLr(lr) => {
                if !(lr.is_finite() && lr > 0.0 && lr <= 10.0) {
                    return Err(format!("the learning rate must be in (0, 10], got {lr}"));
                }
                let was = self.settings.optimizer.lr();
                self.settings.optimizer = self.settings.optimizer.with_lr(lr);
                self.trainer.set_lr(lr);
                self.metrics
                    .set_optimizer(format!("{:?}", self.settings.optimizer));
                Ok(format!(
                    "learning rate {was} -> {lr} from round {}",
                    version + 1
                ))
            }
            Command::Checkpoint if self.settings.checkpoint_every.is_none() => {
                Err("checkpoints are off: start the coordinator with --checkpoint-dir".into())
            }
            Command::Checkpoint => Err("checkpoints are taken by the coordinator's driver".into()),
            Command::Kick(id) => {
                self.close(id, ErrorCode::Kicked, "the operator removed this worker")?;
                Ok(format!("{id} kicked"))
            }
            Command::Ban(id) => {
                if !self.registry.contains(id) {
                    return Err(format!("no worker {} is connected", id.0));
                }
                if self.registry.ban(id) {
                    self.ban_close(id, None);
                }
                Ok(format!("{id} banned"))
            }
            Command::Stop => {
                self.stop(Outcome {
                    rounds: version,
                    evaluation: self.last_eval,
                    reached_target: false,
                    plateaued: false,
                    checkpoint_error: None,
                });
                Ok(format!("stopping at round {version}"))
            }
            // A sync round open now was computed on the old weights: its update must not land
            // on the new ones, so they replace the model when it closes instead.
            Command::ReplaceParams(patches)
                if self.is_sync() && self.schedule.standing().training =>
            {
                let len = self.trainer.params().len();
                if patches
                    .iter()
                    .any(|(r, v)| r.end > len || r.len() != v.len())
                {
                    return Err("the tensors do not fit the model".into());
                }
                self.pending_params
                    .get_or_insert_with(Vec::new)
                    .extend(patches);
                Ok(format!(
                    "the weights replace the model when round {} closes",
                    version + 1
                ))
            }
            Command::ReplaceParams(patches) => {
                let len = self.trainer.params().len();
                if patches
                    .iter()
                    .any(|(r, v)| r.end > len || r.len() != v.len())
                {
                    return Err("the tensors do not fit the model".into());
                }
                let version = self.trainer.replace(self.patched(patches))?;
                self.registry.frozen_stale();
                self.registry.mark_changed();
                Ok(format!("weights replaced: now version {version}"))
            }
        }
    }

    fn close(&mut self, id: WorkerId, code: ErrorCode, why: &str) -> Result<(), String> {
        if !self.registry.contains(id) {
            return Err(format!("no worker {} is connected", id.0));
        }
        self.send(id, Outbound::Close(Refusal::new(code, why)));
        self.registry.drop_worker(id);
        Ok(())
    }
}
