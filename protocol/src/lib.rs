//! The crowdtrain wire protocol.
//!
//! Workers (browser tabs or native processes) and the coordinator exchange the messages of
//! [`message`] as binary WebSocket frames, encoded by [`codec`]. This crate is plain Rust with
//! no I/O and no async, so the coordinator, the native worker and the wasm32 browser worker
//! all link the very same code. `docs/PROTOCOL.md` is the prose specification.
//!
//! # Layout
//! - [`message`]: the two enums, one per direction, and their payload types.
//! - [`codec`]: `encode` / `decode` to and from bytes, and [`DecodeError`].
//! - [`ids`]: the `WorkerId` and `Round` newtypes.
//! - [`tensor`]: tensors as raw `f32`, or compressed to `f16` / `int8`.
//! - [`chunk`]: tensors split into chunks of at most 64 KiB, and their order.
//! - [`commit`]: a GPU phase's commitments, the coordinator's challenge and the reveal.
//! - [`delta`]: the weights as deltas from the version a worker holds.

pub mod chunk;
pub mod codec;
pub mod commit;
pub mod delta;
pub mod ids;
pub mod message;
pub mod tensor;

pub use chunk::{ChunkPos, CHUNK_VALUES};
pub use codec::{
    decode_from_coordinator, decode_from_worker, decode_worker_frame, encode_from_coordinator,
    encode_from_worker, encode_frozen, encode_gradient, encode_reveal, encode_weights,
    encode_weights_delta, gradient_wire_len, DecodeError, RawGradientChunk, WorkerFrame,
};
pub use commit::{
    log_values, log_words, state_hash, Challenge, Commitments, RevealChunk, LOG_WORDS,
};
pub use ids::{Round, WorkerId};
pub use message::{
    CoordinatorToWorker, ErrorCode, Gradient, GradientChunk, Hello, LocalPhase, ModelSpec, Shard,
    ShardValues, Task, Weights, Welcome, WorkerKind, WorkerToCoordinator, MAX_LOCAL_STEPS,
    UNORDERED,
};
pub use tensor::Compression;

/// Version of the wire format. Every frame starts with it; a peer speaking another version
/// is refused with [`ErrorCode::VersionMismatch`]. Bump it on any incompatible change.
pub const PROTOCOL_VERSION: u16 = 15;
