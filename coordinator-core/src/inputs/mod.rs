//! The coordinator's inputs, one file each: a `Hello` ([`join`]), a checked gradient
//! ([`gradient`]), a session's end, an unreachable one or one closed for bad input
//! ([`leave`]), a GPU phase's commitments and revealed states ([`reveal`]), a
//! recomputation's verdict ([`recomputed`]).

mod gradient;
mod join;
mod leave;
mod recomputed;
mod reveal;
