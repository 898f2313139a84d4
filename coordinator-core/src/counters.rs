//! The run's counters, each defined once: its field, its name on `/metrics` and what it
//! counts. From this one list the status publishes them (flattened into `/api/status`), a
//! checkpoint keeps them (so totals survive a restart; a checkpoint written before a counter
//! existed reads it as 0) and `/metrics` exposes each as `crowdtrain_<name>_total`. Adding a
//! counter is one line here, and the line of the coordinator that counts it.

use serde::{Deserialize, Serialize};

/// Defines [`Counters`] and [`Counters::each`] from `field => "metric", "help";` lines.
macro_rules! counters {
    ($( $field:ident => $metric:literal, $help:literal; )*) => {
        /// The run's counters: what a checkpoint keeps, so that totals survive a restart.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct Counters {
            $(
                #[doc = $help]
                pub $field: u64,
            )*
        }

        impl Counters {
            /// Each counter: its name on `/metrics` (before `_total`), what it counts, and its
            /// value.
            pub fn each(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> {
                [$( ($metric, $help, self.$field), )*].into_iter()
            }
        }
    };
}

counters! {
    samples_seen => "samples", "Training samples behind applied updates";
    gradients_accepted => "gradients_accepted", "Gradients accepted into an update";
    gradients_rejected => "gradients_rejected", "Gradients dropped, for any reason (late, stale, duplicate, not a participant, a mismatch, ...)";
    late => "gradients_late", "Gradients for a round already closed";
    stale_rejected => "gradients_stale", "Async gradients computed on weights more than --max-staleness versions old";
    duplicate_rejected => "gradients_duplicate", "Second answers to one round (or to the same weights, in async)";
    gradients_clipped => "gradients_clipped", "Gradients longer than the norm bound, scaled down to it before they were combined";
    updates_refused => "updates_refused", "Updates not applied: they would have made a parameter non-finite";
    gradients_verified => "gradients_verified", "Gradients recomputed by the coordinator (--verify-fraction, probation)";
    verification_mismatches => "verification_mismatches", "Recomputed gradients that did not match (dropped, a strike each)";
    answered_total => "answered", "Answers in applied updates (with the open round's, every accepted gradient once)";
    deadline_closes => "deadline_closes", "Rounds closed by their deadline rather than by every participant answering";
    deadline_extensions => "deadline_extensions", "Deadlines extended for lack of quorum";
    resumed => "resumed", "Joins that resumed an identity with its token";
    sessions_rejected => "sessions_rejected", "Sessions closed for bad input";
    bytes_in => "bytes_in", "Bytes of gradient frames received";
    bytes_out => "bytes_out", "Bytes of frames queued to workers";
    probation_checks => "probation_checks", "Answers recomputed because their worker was on probation";
    probation_unchecked => "probation_unchecked", "Answers on probation dropped for lack of room to recompute them";
    sampled_aside => "sampled_aside", "Trusted workers' sampled phases excused from their sync round rather than holding it while their replay waited behind others (still replayed; a mismatch strikes)";
    sampling_floored => "sampling_floored", "Pulls past probation sampled at --verify-fraction rather than their higher decaying rate: the replays already asked for would keep the checks' cores busy for a round of local phases";
    branches_logged => "branches_logged", "Near-tie branches named by the revealed logs of GPU phases";
    branches_forced => "branches_forced", "Logged branches a replay took only because they were logged";
    evaluations_replaced => "evaluations_replaced", "Evaluations that fell due while one ran and were replaced by a newer one before they could run";
    phases_challenged => "phases_challenged", "GPU phases challenged for their committed states";
    bytes_revealed => "revealed_bytes", "Bytes of committed states that challenged workers revealed";
    segments_replayed => "segments_replayed", "Segments of challenged GPU phases replayed";
    segment_replay_ms => "segment_replay_milliseconds", "Milliseconds of a core spent replaying challenged GPU phases' segments";
    segments_marginal => "segments_marginal", "Replayed segments outside the tolerance but within four times it: their neighbours asked for, no strike";
    states_missing => "states_missing", "Challenged phases whose states did not come in time, or whose worker left";
    answers_dropped => "answers_dropped", "Answers whose check could not be finished (states missing, marginal twice, a challenge given up): dropped without a strike";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_counter_has_one_metric_name_and_a_help() {
        let c = Counters {
            late: 3,
            ..Counters::default()
        };
        let all: Vec<_> = c.each().collect();
        let mut names: Vec<_> = all.iter().map(|(name, _, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len(), "a metric name twice");
        assert!(all.iter().all(|(_, help, _)| !help.is_empty()));
        assert_eq!(
            all.iter().find(|(name, _, _)| *name == "gradients_late"),
            Some(&("gradients_late", "Gradients for a round already closed", 3))
        );
    }

    #[test]
    fn a_checkpoint_from_before_a_counter_existed_reads_it_as_zero() {
        let old = r#"{"gradients_accepted": 7, "late": 2}"#;
        let c: Counters = serde_json::from_str(old).expect("reads");
        assert_eq!((c.gradients_accepted, c.late, c.branches_forced), (7, 2, 0));
        let json = serde_json::to_value(&c).expect("writes");
        assert_eq!(json["gradients_accepted"], 7);
    }
}
