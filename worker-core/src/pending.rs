//! A batch's gradient under way: computed by the core on its threads, or left to its
//! transport ([`Compute::Deferred`]: a tab's Web Workers), then made into what it is for,
//! the answer to a `Weights` or the next inner step of a local phase.

use std::borrow::Cow;

use ndarray::Array2;
use protocol::{Gradient, Round};

use crate::{Job, Joined, Phase, WorkerCore, WorkerError};

/// A batch's gradient the core is computing, or waiting for its transport to compute
/// ([`Compute::Deferred`]).
#[derive(Debug)]
pub(crate) struct Pending {
    pub x: Array2<f32>,
    pub labels: Vec<u8>,
    pub seed: u64,
    pub parts: usize,
    /// The [`crate::ComputeClock`] when it was set.
    pub started: u64,
    pub of: Of,
}

/// What a [`Pending`] gradient is for.
#[derive(Debug)]
pub(crate) enum Of {
    /// The answer to these weights.
    Answer { round: Round, weights: Vec<f32> },
    /// The next inner step of the local phase under way.
    Step,
}

impl WorkerCore {
    /// The gradient the transport is to compute ([`Compute::Deferred`]), if one is due:
    /// compute it, in its parts, and hand the result to [`WorkerCore::complete`].
    pub fn job(&self) -> Option<Job<'_>> {
        job_of(
            self.pending.as_ref()?,
            self.joined.as_ref()?,
            self.phase.as_ref(),
        )
    }

    /// Takes the result of [`WorkerCore::job`] (the loss and the full-layout gradient, its
    /// parts added in order); returns the frames to send, if that finished an answer.
    /// A step of a committed phase of a model with branches ([`WorkerCore::logs_branches`])
    /// is logged from a forward pass here, on this machine's CPU: where the job was
    /// computed elsewhere (a GPU), [`WorkerCore::complete_logged`] brings its own log.
    pub fn complete(&mut self, loss: f32, grads: Vec<f32>) -> Result<Vec<Vec<u8>>, WorkerError> {
        let Some(pending) = self.pending.take() else {
            return Ok(Vec::new());
        };
        let answer = self.finish(pending, loss, &grads, None)?;
        Ok(self.frames(answer))
    }

    /// [`WorkerCore::complete`] for a job computed where its forward pass's branches were
    /// logged (a GPU's activations, `Network::branches_in`).
    pub fn complete_logged(
        &mut self,
        loss: f32,
        grads: Vec<f32>,
        branches: &[model::Branch],
    ) -> Result<Vec<Vec<u8>>, WorkerError> {
        let Some(pending) = self.pending.take() else {
            return Ok(Vec::new());
        };
        let answer = self.finish(pending, loss, &grads, Some(branches))?;
        Ok(self.frames(answer))
    }

    /// Whether the job due is a committed phase's step whose near-tie branches are logged
    /// (a model with ReLUs or max-pools): a GPU computing it reads its activations back
    /// for [`WorkerCore::complete_logged`].
    pub fn logs_branches(&self) -> bool {
        let (Some(pending), Some(joined), Some(phase)) = (&self.pending, &self.joined, &self.phase)
        else {
            return false;
        };
        matches!(pending.of, Of::Step) && phase.committing.is_some() && joined.net.has_branches()
    }

    /// Sets `pending` and, unless the transport computes it, computes it now; returns the
    /// answer it finished, if any.
    pub(crate) fn start(&mut self, pending: Pending) -> Result<Option<Gradient>, WorkerError> {
        if self.compute.deferred() {
            self.pending = Some(pending);
            return Ok(None);
        }
        let Some(joined) = self.joined.as_ref() else {
            return Ok(None);
        };
        let Some(job) = job_of(&pending, joined, self.phase.as_ref()) else {
            return Ok(None);
        };
        let loss = job.run_on(&mut self.cores)?;
        let grads = self.cores.take_gradient();
        let answer = self.finish(pending, loss, &grads, None);
        self.cores.put_back(grads);
        answer
    }

    /// Uses a computed gradient: the answer to its weights, or the phase's next step (and
    /// the phase's answer after its last).
    fn finish(
        &mut self,
        pending: Pending,
        loss: f32,
        grads: &[f32],
        branches: Option<&[model::Branch]>,
    ) -> Result<Option<Gradient>, WorkerError> {
        let Some(joined) = self.joined.as_ref() else {
            return Ok(None);
        };
        let samples = pending.labels.len() as u64;
        let compute_us = self.clock.elapsed(pending.started, 1);
        // 0: unordered (a GPU), which the verifier checks within rounding.
        let parts = match pending.parts {
            0 => 0,
            k => model::Part::count(pending.labels.len(), k) as u8,
        };
        self.stats.samples_computed += samples;
        self.stats.last_loss = Some(loss);
        let Of::Answer { round, .. } = pending.of else {
            let Some(phase) = self.phase.as_mut() else {
                return Ok(None);
            };
            let net = &joined.net;
            if let Some(committing) = phase.committing.as_mut().filter(|_| net.has_branches()) {
                let mine;
                let branches = match branches {
                    Some(b) => b,
                    None => {
                        let weights = phase.phase.weights(net);
                        mine = net.branches(&weights, pending.x.view(), pending.seed)?;
                        &mine
                    }
                };
                committing.log(phase.phase.taken(), branches);
            }
            phase.phase.apply(net, loss, grads);
            return Ok(self.stepped(1, samples, compute_us, parts));
        };
        // Frozen layers' gradients are not sent: only the trained tensors, in layout order.
        let grads = joined.net.trained_part(grads);
        self.stats.gradients_sent += 1;
        self.stats.compute_us += compute_us;
        Ok(Some(Gradient {
            round,
            samples: samples as u32,
            loss,
            compute_us: u32::try_from(compute_us).unwrap_or(u32::MAX),
            parts,
            grads,
        }))
    }

    /// After `steps` steps of the phase under way (on `samples` samples, in `compute_us`,
    /// each in `parts` parts): its counts, its commitment at a boundary, and its answer
    /// once it is done.
    pub(crate) fn stepped(
        &mut self,
        steps: u32,
        samples: u64,
        compute_us: u64,
        parts: u8,
    ) -> Option<Gradient> {
        let phase = self.phase.as_mut()?;
        phase.samples += samples;
        phase.compute_us += compute_us;
        self.stats.local_steps += u64::from(steps);
        if let Some(committing) = phase.committing.as_mut() {
            committing.after_step(&phase.phase);
        }
        if !phase.phase.is_done() {
            return None;
        }
        let Phase {
            round,
            phase,
            samples,
            compute_us,
            committing,
            ..
        } = self.phase.take().expect("under way");
        if let Some(committing) = committing {
            let (commitments, revealable) = committing.finish(round);
            self.commitments = Some(commitments);
            self.revealable = Some(revealable);
        }
        let result = phase.finish();
        self.stats.gradients_sent += 1;
        self.stats.compute_us += compute_us;
        Some(Gradient {
            round,
            samples: u32::try_from(samples).unwrap_or(u32::MAX),
            loss: result.mean_loss,
            compute_us: u32::try_from(compute_us).unwrap_or(u32::MAX),
            parts,
            grads: result.delta,
        })
    }
}

/// The job of computing `pending`, on its weights or the phase's.
fn job_of<'a>(
    pending: &'a Pending,
    joined: &'a Joined,
    phase: Option<&'a Phase>,
) -> Option<Job<'a>> {
    let net = &joined.net;
    let weights = match &pending.of {
        Of::Answer { weights, .. } => Cow::Borrowed(weights.as_slice()),
        Of::Step => phase?.phase.weights(net),
    };
    let batch = (pending.x.view(), pending.labels.as_slice());
    let mut job = Job::new(net, weights, batch, pending.seed, pending.parts);
    job.step = matches!(pending.of, Of::Step);
    Some(job)
}
