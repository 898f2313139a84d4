//! What the coordinator checks in a gradient the session validated, before its schedule sees
//! it, as a state machine of its own ([`machine`]: `Checks`, answering each input with
//! [`step`]s the coordinator carries out): recomputation for a sampled fraction ([`audit`],
//! [`verify`](mod@verify), off its task within a budget of cores: [`recompute`], [`job`]),
//! agreement with its replicas (`--replicate`, [`replicas`]). A GPU's local phase is checked
//! by segments instead: [`challenge`] keeps the commitments and asks for the committed
//! states, and [`segment`] replays each segment. What an admitted answer then passes, the
//! norm bound ([`clip`]) and its weight, is the coordinator's (`checked.rs`).

pub mod audit;
pub mod challenge;
pub mod clip;
pub mod job;
pub(crate) mod machine;
pub mod recompute;
pub mod replicas;
pub mod segment;
pub(crate) mod step;
pub mod verdict;
pub mod verify;

use protocol::ErrorCode;

pub(crate) use self::machine::Checks;

/// A seed nobody outside the process can know, for sampling what to verify.
pub(crate) fn unpredictable_seed() -> u64 {
    let mut seed = [0u8; 8];
    // Without the OS's randomness, the time: sampling still happens, only less secretly.
    if getrandom::fill(&mut seed).is_err() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        return now.map_or(0, |d| d.as_nanos() as u64);
    }
    u64::from_le_bytes(seed)
}

/// Bad input that counts against an address (a broken or hostile client), unlike being
/// replaced, too slow, unauthorized or on an old protocol version.
pub(crate) fn strikes_an_address(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::Malformed
            | ErrorCode::UnexpectedMessage
            | ErrorCode::ShapeMismatch
            | ErrorCode::NonFinite
            | ErrorCode::RateLimited
    )
}
