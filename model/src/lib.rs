//! crowdtrain's model maths, shared by the coordinator, the native worker and the browser.
//!
//! Plain Rust on ndarray with no I/O, so it builds for `wasm32-unknown-unknown` unchanged:
//! the gradient a tab computes is the gradient the coordinator would have computed.
//!
//! # Layout
//! - [`params`]: [`ParamLayout`], the named tensors behind a flat `f32` vector (the wire form).
//! - [`spec`]: [`NetSpec`], a model as an input shape and a list of layers, with its text form.
//! - [`network`]: [`Network`], forward and backward of any spec; one file per layer type in `layers/`.
//! - [`gpt`]: [`gpt::Gpt`], GPT-2's architecture, which a spec holds as its one layer.
//! - [`loss`]: softmax cross-entropy.
//! - [`gemm`]: every matrix product, in the library's float order or wasm's ([`Order`]).
//! - [`grad`]: [`GradientSum`], the streaming sample-weighted mean the coordinator aggregates with.
//! - [`optim`]: the [`Optimizer`] trait with SGD, momentum and Adam.
//! - [`data`]: [`Dataset`] (u8 or f32 values, normalisation, IDX parsing, seeded split), shard assignment and batch selection.
//! - [`eval`]: test accuracy and loss.
//! - [`rng`]: a small seeded generator, so initial weights depend only on the seed.

pub mod data;
#[cfg(feature = "digits")]
pub mod digits;
pub mod error;
pub mod eval;
mod exp;
pub mod gemm;
pub mod gpt;
pub mod grad;
mod layers;
pub mod local;
pub mod loss;
pub mod network;
pub mod optim;
pub mod params;
pub mod rng;
pub mod robust;
mod scalar;
pub mod schedule;
pub mod spec;
mod spec_parse;

pub use data::{assign_shards, batch_positions, Dataset, Normalization, Values};
pub use error::ModelError;
pub use eval::{evaluate, Evaluation};
pub use gemm::{with_order, Order};
pub use grad::GradientSum;
pub use local::{LocalPhase, PhaseResult};
pub use network::{
    add_parts, batch_seed, Branch, Envelope, Forced, Network, Part, Refusal, Stage, FORCE_MARGIN,
    MAX_BRANCHES, MAX_PARTS, MIN_PART_ROWS,
};
pub use optim::{
    Adam, AdamW, Momentum, Nesterov, Optimizer, OptimizerKind, OptimizerState, Sgd, StateError,
};
pub use params::{ParamLayout, TensorSpec};
pub use rng::SplitMix64;
pub use scalar::Scalar;
pub use schedule::{clip_global_norm, LrSchedule};
pub use spec::{ChainSpec, Layer, LayerSpec, NetSpec, Shape, SpecError};
