//! `--local-steps`: how many inner steps each worker's next phase takes, and how answers of
//! different lengths are weighed against each other.
//!
//! **Fixed** (`--local-steps H`): every phase is H steps.
//!
//! **Auto** (`--local-steps auto`): each worker's H is chosen from what its own answers
//! show: its step time `s` (the compute time it reports, divided by the phase's steps) and
//! its communication time `c` (from sending its weights to its answer being in, less the
//! compute time), both as exponential means. Communication is at most 10 % of its wall time
//! when `H·s ≥ 9·c`, so the next phase takes `H = ⌈9·c / s⌉`, within
//! `--min-local-steps..=--max-local-steps` (an Adam-family inner optimizer starts each phase
//! with fresh moments, and its first steps move every weight by about the learning rate
//! whatever its gradient: a floor of 16 steps by default, where a phase of one step on a fast
//! link plateaued a GPT at 2.03 against the per-step exchange's 1.89). A first phase, before
//! anything is measured, takes 4 steps (or the floor); an
//! answer whose weights followed a shard or the frozen tensors measures nothing (its wait
//! was theirs, not the link's: a first shard of MNIST takes 5 s at 10 Mbit/s). The
//! reported compute time is not trusted for anything else: a worker that lies about it only
//! changes its own H, within the bound, and every phase is still replayable.
//!
//! **Phases that end together** (sync mode, under `auto`): a sync round waits for its
//! slowest answer, so a worker whose own H ended sooner waited, idle, and one far worker
//! whose link asked for a long phase stretched every round. Each measured worker's phase
//! instead ends at the round's time `T`: `H_i = ⌊(T − c_i) / s_i⌋` steps, within the same
//! bounds (never below `--min-local-steps`). `T` is the typical worker's own phase (the
//! lower median of what each wants for itself), or the longest floor (`--min-local-steps`
//! and its link) where that does not fit in it: a worker at half speed still takes its 16
//! steps, and the others fill its time; a worker whose link asks for a longer phase than
//! most takes one of `T`, its link a larger share of its time (a far tab no longer holds
//! every round). `T` is judged by what each worker wants for itself, never by a phase it was
//! given, so it does not feed on itself; a worker that pretends to be slow moves the median
//! by one place, and its floor (which it must then take) only fills the others' time, up to
//! `--max-local-steps`. (Added 2026-11-28: a mixed crowd of eight, two at half speed and
//! two on far links, had its tabs busy 53 % of the time; docs/BENCHMARKS.md, "The crowd".)
//!
//! **Phases no longer than the noise scale asks** (sync rounds, under `auto`, once the run
//! has a positive estimate of the gradient noise scale `B_noise`, from its first update
//! on, `noise.rs`): the link's tenth ignores that a crowd whose answers already average
//! many noise scales gains little from longer phases. Count a round as one step of the
//! crowd's batch `B = B_step·H` (`B_step = Σ batch_k`, the samples of one inner step of
//! every answer): steps to a loss grow as `1 + B_noise/B` (McCandlish et al. 2018, eq.
//! 2.11) and a round takes `H·s + c`, so the time to a loss goes as
//! `(1 + B_noise/(B_step·H))·(H·s + c)`, least at `H = √(B_noise·c / (B_step·s))`. A
//! worker's H is at most that (never more than the link's tenth asks), but never less than
//! its link's time (`c / s` steps: it computes at least half the time; the estimate grows
//! with the phases, which drift apart, so without this a floor of 1 slid back to the
//! per-step exchange) and never below `--min-local-steps`. The count is pessimistic where
//! local steps still add up (a small crowd, a noise scale past the crowd's batch), which is
//! why it only shortens. `--phases-by-noise false` leaves the link alone. (Added
//! 2026-11-29: sixteen tabs of the 0.8M GPT, whose answers of 29 steps averaged nine noise
//! scales, reached 2.0 in 310 s under the tenth alone and in 224 s with the bound; two,
//! four and eight sooner too; docs/BENCHMARKS.md, "The phase length chosen by the noise
//! scale".)
//!
//! **Weighing** (after FedNova, Wang et al. 2020): an answer of `H_i` steps moved the weights
//! about `H_i` times as far as one step does. Each pseudo-gradient is brought to a common
//! length before the norm bound and the aggregator see it, multiplied by `H̄ / H_i`, where
//! `H̄` is the mean length of the last answers (an exponential mean over about 16): a fast
//! worker then counts as much as a slow one, neither more because it did more steps nor
//! less, and the outer step is that of `H̄` steps. With a fixed H every factor is exactly 1.

use std::collections::HashMap;
use std::time::Duration;

use model::OptimizerKind;
use protocol::{LocalPhase, WorkerId};

use crate::noise::NoiseReport;

/// `--local-steps`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalSteps {
    Fixed(u32),
    /// At least `min` steps, at most `max`, and at most `passes` passes over the worker's
    /// own shard (but `min`).
    Auto {
        min: u32,
        max: u32,
        passes: f64,
    },
}

/// The run's local-phase settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Local {
    pub steps: LocalSteps,
    pub inner: OptimizerKind,
    /// `--segment-steps`: a GPU may take a phase in its own order, committing to its state
    /// every this many steps, and is checked by segments (0: never; a phase in one
    /// ordered part, replayed whole).
    pub segment: u32,
}

impl Local {
    /// The most steps a phase may take.
    pub fn max_steps(&self) -> u32 {
        match self.steps {
            LocalSteps::Fixed(h) => h,
            LocalSteps::Auto { max, .. } => max,
        }
    }
}

/// Steps of a first phase under `auto`, before anything is measured.
const FIRST_STEPS: u32 = 4;
/// Communication may take this share of a worker's wall time.
const COMM_SHARE: f64 = 0.1;
/// Weight of the newest measurement in the exponential means.
const NEWEST: f64 = 0.25;
/// Weight of the newest answer's length in `H̄`.
const NEWEST_LENGTH: f64 = 1.0 / 16.0;

/// What one worker's answers showed.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    /// Seconds per inner step.
    step: Option<f64>,
    /// Seconds of communication per answer.
    comm: Option<f64>,
    steps: Option<u32>,
    /// Steps of one pass over its shard.
    pass: Option<usize>,
}

/// The plan of local phases: each worker's next H, and `H̄`.
#[derive(Debug)]
pub struct LocalPlan {
    local: Local,
    workers: HashMap<WorkerId, Measured>,
    mean_steps: f64,
    /// The worker whose next phase should take longest, and how long (seconds), kept as
    /// measurements come so that reading it costs nothing (every input reads it).
    slowest: Option<(WorkerId, f64)>,
    /// Phases end together, at the round's time (sync rounds, under `auto`).
    fill: bool,
    /// The round's time `T` (seconds) and the worker that set it; looked for among everyone
    /// once every worker answered since (about once a round), or when its setter leaves, and
    /// raised in between by a worker whose floor alone no longer fits in it.
    round: Option<(WorkerId, f64)>,
    /// Measured answers since `round` was looked for.
    since_round: usize,
    /// `B_noise / B_step` (module docs), once the run's noise scale is known.
    noise_steps: Option<f64>,
    /// `--phases-by-noise`.
    by_noise: bool,
}

impl LocalPlan {
    pub fn new(local: Local) -> Self {
        let mean_steps = match local.steps {
            LocalSteps::Fixed(h) => f64::from(h),
            LocalSteps::Auto { min, max, .. } => f64::from(FIRST_STEPS.max(min).min(max)),
        };
        Self {
            local,
            workers: HashMap::new(),
            mean_steps,
            slowest: None,
            fill: false,
            round: None,
            since_round: 0,
            noise_steps: None,
            by_noise: true,
        }
    }

    /// `--phases-by-noise false`: the link alone sizes a phase under `auto`.
    pub fn by_noise(mut self, on: bool) -> Self {
        self.by_noise = on;
        self
    }

    /// Each measured worker's phase ends at the round's time (module docs): for rounds
    /// that wait for every answer (sync mode). Nothing changes under a fixed H.
    pub fn filling_rounds(mut self) -> Self {
        self.fill = true;
        self
    }

    pub fn settings(&self) -> Local {
        self.local
    }

    /// The run's gradient noise scale changed (after an update): under `auto`, each measured
    /// worker's next H is at most `√(B_noise·c / (B_step·s))` (module docs), from the next
    /// phase asked for. `B_step`, the samples of one inner step of the crowd, is the update's
    /// samples over `H̄`. An estimate whose signal the noise drowns (any batch helps) bounds
    /// nothing; nor does any under `--phases-by-noise false`.
    pub fn noise(&mut self, report: Option<&NoiseReport>) {
        let before = self.noise_steps;
        self.noise_steps = report
            .filter(|_| self.by_noise)
            .and_then(|r| {
                let step_batch = r.crowd_batch / self.mean_steps;
                Some(r.samples? / step_batch)
            })
            .filter(|n| n.is_finite() && *n > 0.0);
        // Every worker's own phase moved: the slowest and the round's time are looked for
        // again (once an update).
        if self.noise_steps != before {
            self.slowest = self.find_slowest();
            if self.fill {
                self.round = self.find_round();
            }
        }
    }

    /// The inner learning rate changed (the admin API).
    pub fn set_inner(&mut self, inner: OptimizerKind) {
        self.local.inner = inner;
    }

    /// The phase `id`'s next pull asks for; `pass`: the steps of one pass over its shard.
    pub fn phase(&mut self, id: WorkerId, pass: usize) -> LocalPhase {
        self.workers.entry(id).or_default().pass = Some(pass.max(1));
        self.refresh(id);
        let steps = self.steps(id);
        LocalPhase {
            steps,
            optimizer: self.local.inner,
            segment: self.local.segment.min(steps),
        }
    }

    /// The phase before anything is known (the norm bound's reference).
    pub fn first_phase(&self) -> LocalPhase {
        let steps = self.steps(WorkerId(0));
        LocalPhase {
            steps,
            optimizer: self.local.inner,
            segment: self.local.segment.min(steps),
        }
    }

    /// `id`'s next H: its own, or in a sync round what ends at the round's time (module
    /// docs).
    pub fn steps(&self, id: WorkerId) -> u32 {
        let own = self.own_steps(id);
        let LocalSteps::Auto { min, max, .. } = self.local.steps else {
            return own;
        };
        let Some(filled) = self.filled(id) else {
            return own;
        };
        filled.min(self.shard_steps(id)).max(min).clamp(1, max)
    }

    /// The steps of `id`'s phase that end at the round's time, once both are measured.
    fn filled(&self, id: WorkerId) -> Option<u32> {
        if !self.fill {
            return None;
        }
        let (_, round) = self.round?;
        let m = self.workers.get(&id)?;
        let (step, comm) = (m.step?, m.comm?);
        if step <= 0.0 {
            return None;
        }
        // The worker that set the time takes its own steps, not one fewer for a rounding.
        let fits = ((round - comm) / step + 1e-6).floor();
        Some(fits.clamp(0.0, f64::from(u32::MAX)) as u32)
    }

    /// `id`'s own next H, from its link and step alone, and the noise scale once known.
    fn own_steps(&self, id: WorkerId) -> u32 {
        let LocalSteps::Auto { min, max, .. } = self.local.steps else {
            return self.local.max_steps();
        };
        let m = self.workers.get(&id);
        let wanted = m.and_then(|m| m.steps).unwrap_or(FIRST_STEPS);
        let noise = m.and_then(|m| self.noise_bound(m)).unwrap_or(u32::MAX);
        wanted
            .min(noise)
            .min(self.shard_steps(id))
            .max(min)
            .clamp(1, max)
    }

    /// `⌈√(B_noise·c / (B_step·s))⌉` for a measured worker, once the noise scale is known,
    /// but no shorter than its link's time (`c / s` steps: it computes at least half the
    /// time).
    fn noise_bound(&self, m: &Measured) -> Option<u32> {
        let (n, step, comm) = (self.noise_steps?, m.step?, m.comm?);
        let bound = (n * comm / step).sqrt().max(comm / step).ceil();
        // A step of no time measures nothing: the link's rule alone.
        bound
            .is_finite()
            .then(|| bound.clamp(1.0, f64::from(u32::MAX)) as u32)
    }

    /// At most `--max-local-epochs` passes over `id`'s shard, under `auto`.
    fn shard_steps(&self, id: WorkerId) -> u32 {
        let LocalSteps::Auto { passes, .. } = self.local.steps else {
            return u32::MAX;
        };
        self.workers
            .get(&id)
            .and_then(|m| m.pass)
            .map_or(u32::MAX, |pass| {
                (passes * pass as f64)
                    .ceil()
                    .clamp(1.0, f64::from(u32::MAX)) as u32
            })
    }

    /// `id` answered a phase of `steps` steps; `timing`: it says the phase took `compute`
    /// to compute, and the answer came `wall` after its weights were sent (`None` when
    /// more than weights went before them, a shard or the frozen tensors).
    pub fn answered(&mut self, id: WorkerId, steps: u32, timing: Option<(Duration, Duration)>) {
        let steps = steps.max(1);
        self.mean_steps += NEWEST_LENGTH * (f64::from(steps) - self.mean_steps);
        if let Some((compute, wall)) = timing {
            self.measure(id, steps, compute, wall);
            self.since_round += 1;
            self.refresh(id);
        }
    }

    /// Takes one answer's step and link times into `id`'s means, and under `auto` chooses its
    /// next H from them.
    fn measure(&mut self, id: WorkerId, steps: u32, compute: Duration, wall: Duration) {
        let m = self.workers.entry(id).or_default();
        let compute = compute.as_secs_f64().min(wall.as_secs_f64());
        let step = compute / f64::from(steps);
        let comm = wall.as_secs_f64() - compute;
        let mean = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + NEWEST * (new - o)));
        m.step = mean(m.step, step);
        m.comm = mean(m.comm, comm);
        let LocalSteps::Auto { max, .. } = self.local.steps else {
            return;
        };
        let (step, comm) = (m.step.unwrap_or(0.0), m.comm.unwrap_or(0.0));
        let want = if step > 0.0 {
            ((1.0 - COMM_SHARE) / COMM_SHARE * comm / step).ceil()
        } else {
            f64::from(max)
        };
        m.steps = Some(want.clamp(1.0, f64::from(max)) as u32);
    }

    /// The factor an answer of `steps` steps is multiplied by before it is bounded and
    /// aggregated: `H̄ / steps`, exactly 1 under a fixed H.
    pub fn scale(&self, steps: u32) -> f32 {
        if let LocalSteps::Fixed(_) = self.local.steps {
            return 1.0;
        }
        (self.mean_steps / f64::from(steps.max(1))) as f32
    }

    /// How long the longest measured phase should take, its link included: the slowest
    /// worker's own, or in a sync round the round's time, where every measured phase ends.
    /// A round's deadline waits at least 1.5 times that (`schedule/sync.rs`), so a phase
    /// that grew is not cut by a deadline learnt from shorter ones.
    pub fn expected(&self) -> Option<Duration> {
        let longest = if self.fill { self.round } else { self.slowest };
        longest.map(|(_, s)| Duration::from_secs_f64(s))
    }

    /// How long `id`'s own next phase should take, once measured (never a filled one: the
    /// slowest is judged by what each worker wants for itself).
    fn expected_of(&self, id: WorkerId) -> Option<f64> {
        let m = self.workers.get(&id)?;
        Some(f64::from(self.own_steps(id)) * m.step? + m.comm?)
    }

    /// `id`'s expectation changed: the slowest is looked for among everyone only when it
    /// was `id` (once a round at most), else compared with `id` alone.
    fn refresh(&mut self, id: WorkerId) {
        let now = self.expected_of(id);
        self.slowest = match (self.slowest, now) {
            (Some((w, _)), _) if w == id => self.find_slowest(),
            (Some((_, s)), Some(e)) if e > s => Some((id, e)),
            (None, Some(e)) => Some((id, e)),
            (slowest, _) => slowest,
        };
        if !self.fill {
            return;
        }
        self.round = match (self.round, self.floor_of(id)) {
            (None, _) => self.find_round(),
            _ if self.since_round >= self.workers.len() => self.find_round(),
            (Some((_, t)), Some(floor)) if floor > t => Some((id, floor)),
            (kept, _) => kept,
        };
    }

    /// How long `id`'s shortest phase takes: `--min-local-steps` and its link.
    fn floor_of(&self, id: WorkerId) -> Option<f64> {
        let LocalSteps::Auto { min, max, .. } = self.local.steps else {
            return None;
        };
        let m = self.workers.get(&id)?;
        Some(f64::from(min.clamp(1, max)) * m.step? + m.comm?)
    }

    /// The round's time: the typical worker's own phase (the lower median), or the longest
    /// floor where one does not fit in it. Ties go by id, so that a run repeats.
    fn find_round(&mut self) -> Option<(WorkerId, f64)> {
        self.since_round = 0;
        let by_time = |a: &(f64, WorkerId), b: &(f64, WorkerId)| {
            a.0.total_cmp(&b.0).then(b.1 .0.cmp(&a.1 .0))
        };
        let mut own: Vec<(f64, WorkerId)> = self
            .workers
            .keys()
            .filter_map(|&id| Some((self.expected_of(id)?, id)))
            .collect();
        let median = own.len().checked_sub(1)? / 2;
        let (_, &mut (typical, by), _) = own.select_nth_unstable_by(median, by_time);
        let floor = self
            .workers
            .keys()
            .filter_map(|&id| Some((self.floor_of(id)?, id)))
            .max_by(by_time);
        Some(match floor {
            Some((f, id)) if f > typical => (id, f),
            _ => (by, typical),
        })
    }

    fn find_slowest(&self) -> Option<(WorkerId, f64)> {
        self.workers
            .keys()
            .filter_map(|&id| Some((id, self.expected_of(id)?)))
            .reduce(|a, b| if b.1 > a.1 { b } else { a })
    }

    /// `H̄`, the mean length of the latest answers.
    pub fn mean_steps(&self) -> f64 {
        self.mean_steps
    }

    /// `id` left: its measurements go (a reconnect measures its link again).
    pub fn left(&mut self, id: WorkerId) {
        self.workers.remove(&id);
        if self.slowest.is_some_and(|(w, _)| w == id) {
            self.slowest = self.find_slowest();
        }
        if self.round.is_some_and(|(w, _)| w == id) {
            self.round = self.find_round();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(max: u32) -> LocalPlan {
        floored(1, max)
    }

    /// `auto` with a floor of `min` steps.
    fn floored(min: u32, max: u32) -> LocalPlan {
        LocalPlan::new(Local {
            steps: LocalSteps::Auto {
                min,
                max,
                passes: 1e9,
            },
            inner: OptimizerKind::Sgd { lr: 0.1 },
            segment: 0,
        })
    }

    /// The slowest expected phase follows the answers: it rises with a slower one, falls
    /// when the slowest speeds up or leaves, and matches a look over every worker.
    #[test]
    fn the_slowest_expected_phase_follows_the_answers() {
        let mut plan = LocalPlan::new(Local {
            steps: LocalSteps::Fixed(10),
            inner: OptimizerKind::Sgd { lr: 0.1 },
            segment: 0,
        });
        assert_eq!(plan.expected(), None);
        let ms = Duration::from_millis;
        // 10 steps of 1, 3 and 2 ms; 100 ms of link each: 110, 130, 120 ms.
        for (id, step) in [(1, 1), (2, 3), (3, 2)] {
            plan.answered(WorkerId(id), 10, Some((ms(10 * step), ms(10 * step + 100))));
        }
        assert_eq!(plan.expected(), Some(ms(130)));
        assert_eq!(plan.slowest, plan.find_slowest());
        // The slowest speeds up (its mean moves a quarter of the way): 130 → 125 ms.
        plan.answered(WorkerId(2), 10, Some((ms(10), ms(110))));
        assert_eq!(plan.slowest, plan.find_slowest());
        assert_eq!(plan.slowest.map(|(w, _)| w), Some(WorkerId(2)));
        plan.left(WorkerId(2));
        assert_eq!(plan.slowest.map(|(w, _)| w), Some(WorkerId(3)));
        assert_eq!(plan.slowest, plan.find_slowest());
    }

    #[test]
    fn auto_chooses_h_so_that_communication_is_a_tenth_of_the_wall_time() {
        let mut plan = auto(1000);
        let id = WorkerId(1);
        assert_eq!(plan.steps(id), FIRST_STEPS);
        // 4 steps of 2 ms computed, 100 ms of link: H = 9 · 100 / 2 = 450.
        plan.answered(
            id,
            4,
            Some((Duration::from_millis(8), Duration::from_millis(108))),
        );
        assert_eq!(plan.steps(id), 450);
        // A worker on loopback: almost no communication, H stays small.
        let fast = WorkerId(2);
        let timing = (Duration::from_millis(8), Duration::from_micros(8_200));
        plan.answered(fast, 4, Some(timing));
        // An answer after a shard measures nothing.
        plan.answered(WorkerId(3), 4, None);
        assert_eq!(plan.steps(WorkerId(3)), FIRST_STEPS);
        assert_eq!(plan.steps(fast), 1);
        // Bounded by --max-local-steps.
        let mut small = auto(64);
        small.answered(
            id,
            4,
            Some((Duration::from_millis(8), Duration::from_millis(108))),
        );
        assert_eq!(small.steps(id), 64);
        small.left(id);
        assert_eq!(small.steps(id), FIRST_STEPS);
    }

    /// A noise scale of 3,600 samples against a crowd step of 100 (`B_noise/B_step` = 36):
    /// a worker of 10 ms steps and 90 ms of link, whom the link's tenth gives 81 steps,
    /// takes `√(36 · 90 / 10)` = 18; never more than the tenth (a noise scale of 400,000
    /// would ask for 190), never less than its link's time (at 400, `√(4 · 9)` = 6 would
    /// leave it computing 40 % of the time: it takes 9), never below the floor, and not
    /// from an estimate the noise drowns or under `--phases-by-noise false`.
    #[test]
    fn the_noise_scale_shortens_phases_and_never_lengthens_them() {
        let ms = Duration::from_millis;
        let report = |plan: &LocalPlan, samples: Option<f64>| NoiseReport {
            samples,
            crowd_batch: 100.0 * plan.mean_steps(),
            doubling_gain: None,
            readings: 3,
        };
        let with = |plan: &mut LocalPlan, samples: Option<f64>| {
            plan.noise(Some(&report(plan, samples)));
            plan.answered(WorkerId(1), 10, Some((ms(100), ms(190))));
            plan.steps(WorkerId(1))
        };
        let mut plan = auto(1000);
        assert_eq!(with(&mut plan, Some(3_600.0)), 18);
        assert_eq!(with(&mut plan, Some(400_000.0)), 81);
        assert_eq!(with(&mut plan, Some(400.0)), 9);
        assert_eq!(with(&mut plan, None), 81);
        assert_eq!(with(&mut plan, Some(3_600.0)), 18);
        // The bound moves with the estimate, before the worker answers again.
        plan.noise(None);
        assert_eq!(plan.steps(WorkerId(1)), 81);
        plan.noise(Some(&report(&plan, Some(3_600.0))));
        assert_eq!(plan.steps(WorkerId(1)), 18);
        assert_eq!(plan.expected(), Some(ms(270)));
        let mut off = auto(1000).by_noise(false);
        assert_eq!(with(&mut off, Some(3_600.0)), 81);
        let mut sync = floored(24, 1000).filling_rounds();
        assert_eq!(with(&mut sync, Some(3_600.0)), 24);
    }

    /// `--min-local-steps`: a fast link's H (1 here) and the first phase are raised to the
    /// floor; a slow link's is not lowered.
    #[test]
    fn auto_takes_at_least_the_floor() {
        let mut plan = floored(16, 1000);
        let (fast, slow) = (WorkerId(1), WorkerId(2));
        assert_eq!(plan.steps(fast), 16);
        let ms = Duration::from_millis;
        plan.answered(fast, 16, Some((ms(32), ms(33))));
        plan.answered(slow, 16, Some((ms(32), ms(132))));
        assert_eq!((plan.steps(fast), plan.steps(slow)), (16, 450));
    }

    /// Sync rounds (`filling_rounds`): two fast workers and one at half speed on near links
    /// (16 steps: 33 and 65 ms), and one on a far link that wants 90 steps (200 ms). The
    /// round's time is the half-speed one's floor, 65 ms (the typical own phase, 33 ms, is
    /// shorter): the fast ones fill it, the far one's phase ends with it. A phase given
    /// does not move the time; the far one leaving does not either; the shard's passes
    /// still bound a phase, and a fixed H is left alone.
    #[test]
    fn phases_end_together_in_sync_rounds() {
        let settings = |passes| Local {
            steps: LocalSteps::Auto {
                min: 16,
                max: 1000,
                passes,
            },
            inner: OptimizerKind::Sgd { lr: 0.1 },
            segment: 0,
        };
        let ms = Duration::from_millis;
        let ids = [1, 2, 3, 4].map(WorkerId);
        let [fast, other, half, far] = ids;
        let measure = |plan: &mut LocalPlan| {
            plan.answered(fast, 16, Some((ms(32), ms(33))));
            plan.answered(other, 16, Some((ms(32), ms(33))));
            plan.answered(half, 16, Some((ms(64), ms(65))));
            plan.answered(far, 16, Some((ms(32), ms(52))));
        };
        let steps = |plan: &LocalPlan| ids.map(|id| plan.steps(id));
        let mut alone = LocalPlan::new(settings(1e9));
        measure(&mut alone);
        assert_eq!(steps(&alone), [16, 16, 16, 90], "each its own");
        assert_eq!(alone.expected(), Some(ms(200)));
        let mut sync = LocalPlan::new(settings(1e9)).filling_rounds();
        assert_eq!(steps(&sync), [16; 4], "nothing measured: the floor");
        measure(&mut sync);
        // T = 65 ms: (65 − 1) / 2, the floor, (65 − 20) / 2 steps.
        assert_eq!(steps(&sync), [32, 32, 16, 22]);
        assert_eq!(sync.expected(), Some(ms(65)));
        // The fast one took its 32 steps in 64 ms: T stays.
        sync.answered(fast, 32, Some((ms(64), ms(65))));
        assert_eq!(steps(&sync), [32, 32, 16, 22]);
        sync.left(far);
        assert_eq!(sync.expected(), Some(ms(65)));
        assert_eq!([fast, other, half].map(|id| sync.steps(id)), [32, 32, 16]);
        // Without the half-speed one the typical phase sets the time: 33 ms.
        sync.left(half);
        assert_eq!(sync.expected(), Some(ms(33)));
        assert_eq!([fast, other].map(|id| sync.steps(id)), [16, 16]);
        // Alike workers take their own phase, not a step fewer for a rounding.
        let mut alike = LocalPlan::new(settings(1e9)).filling_rounds();
        for id in ids {
            alike.answered(id, 16, Some((ms(47), ms(176))));
        }
        assert_eq!(steps(&alike), [396; 4]);
        // One pass over a shard of 20 batches bounds a filled phase.
        let mut shard = LocalPlan::new(settings(1.0)).filling_rounds();
        measure(&mut shard);
        assert_eq!(shard.phase(fast, 20).steps, 20);
        // Under a fixed H nothing changes.
        let mut fixed = LocalPlan::new(Local {
            steps: LocalSteps::Fixed(16),
            ..settings(1e9)
        })
        .filling_rounds();
        measure(&mut fixed);
        assert_eq!(steps(&fixed), [16; 4]);
    }

    /// `--max-local-epochs`: a worker whose link asks for 450 steps but whose shard is 62
    /// batches long takes 62 (one pass) by default, 124 with 2.
    #[test]
    fn auto_stops_at_the_passes_over_the_shard() {
        for (passes, want) in [(1.0, 62), (2.0, 124), (100.0, 450)] {
            let mut plan = LocalPlan::new(Local {
                steps: LocalSteps::Auto {
                    min: 1,
                    max: 1000,
                    passes,
                },
                inner: OptimizerKind::Sgd { lr: 0.1 },
                segment: 0,
            });
            let id = WorkerId(1);
            assert_eq!(plan.phase(id, 62).steps, FIRST_STEPS);
            plan.answered(
                id,
                4,
                Some((Duration::from_millis(8), Duration::from_millis(108))),
            );
            assert_eq!(plan.phase(id, 62).steps, want, "{passes} passes");
        }
    }

    #[test]
    fn answers_are_brought_to_the_mean_length_and_fixed_h_is_left_alone() {
        let fixed = LocalPlan::new(Local {
            steps: LocalSteps::Fixed(16),
            inner: OptimizerKind::Sgd { lr: 0.1 },
            segment: 0,
        });
        assert_eq!(fixed.scale(16), 1.0);
        let mut plan = auto(1000);
        for _ in 0..400 {
            plan.answered(WorkerId(1), 10, Some((Duration::ZERO, Duration::ZERO)));
            plan.answered(WorkerId(2), 30, Some((Duration::ZERO, Duration::ZERO)));
        }
        assert!(
            (plan.mean_steps() - 20.0).abs() < 1.0,
            "{}",
            plan.mean_steps()
        );
        assert!((plan.scale(10) - 2.0).abs() < 0.1);
        assert!((plan.scale(30) - 2.0 / 3.0).abs() < 0.05);
    }
}
