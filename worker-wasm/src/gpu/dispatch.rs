//! What the GPU runs, as data: one kernel launch ([`Dispatch`]), a batch's launches and
//! buffers ([`Plan`]), and why a model cannot be planned ([`TooLarge`]). The plans that make
//! them (`plan.rs` for a chain, `gpt_plan.rs` for a GPT, `dense.rs` for the dense kernels'
//! tiles) import these; nothing here imports them.

/// Values a workgroup computes (`@workgroup_size` in `kernels.wgsl`).
pub const WORKGROUP: u32 = 64;
/// Most workgroups along one dimension of a dispatch (WebGPU's default limit).
const MAX_GROUPS: u32 = 65_535;

/// One kernel launch: its entry point and its parameters (`p0` is the values it computes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    pub kernel: &'static str,
    pub p: [u32; 16],
}

impl Dispatch {
    pub(super) fn new(kernel: &'static str, values: usize, rest: &[usize]) -> Self {
        let mut p = [0u32; 16];
        p[0] = values as u32;
        for (slot, &v) in p[1..].iter_mut().zip(rest) {
            *slot = v as u32;
        }
        Self { kernel, p }
    }

    /// Workgroups along x and y.
    pub fn groups(&self) -> (u32, u32) {
        let groups = self.p[0].div_ceil(WORKGROUP).max(1);
        let x = groups.min(MAX_GROUPS);
        (x, groups.div_ceil(x))
    }
}

/// A batch's forward pass, loss and backward pass on the GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Rows of the loss: the batch's samples (a GPT's: its positions, every sample's
    /// context), whose losses' sum over `rows` is the batch's mean loss.
    pub rows: usize,
    /// Values of the label buffer: a label a row (a GPT's: each position's target, then
    /// its token).
    pub labels: usize,
    /// Values of the weights and of the gradient (full layout).
    pub params: usize,
    /// Values of all activations (and of their gradients, laid out alike).
    pub acts: usize,
    /// Where each layer's output starts in the activations (`[rows, len]` row-major; a
    /// flatten's is its input's). Empty for a GPT, whose branches are not logged.
    pub outputs: Vec<usize>,
    /// The dropout layers, in order, whose masks fill the mask buffer one after the other.
    pub dropouts: Vec<usize>,
    pub masks: usize,
    pub dispatches: Vec<Dispatch>,
}

/// Why the GPU cannot run a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooLarge {
    /// An offset past what its 32-bit indices reach.
    Values(usize),
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Values(n) => write!(f, "{n} values are more than the GPU path indexes"),
        }
    }
}
