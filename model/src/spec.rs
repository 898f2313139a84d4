//! What a model is, with a canonical one-line text form: a [`ChainSpec`] (an input shape and a
//! list of layers) or a GPT-2 ([`crate::gpt::GptSpec`]), each an arm of [`NetSpec`]. A new
//! kind of model is a new arm here and in `Network`'s body.
//!
//! The text form is what travels in `Welcome` (so a worker builds exactly the coordinator's
//! model) and what the page and the status show, e.g.
//! `input 1x28x28; conv2d 16 k5; relu; maxpool 2; flatten; dense 10`. [`NetSpec::fingerprint`]
//! hashes it, so two sides that parse it differently notice.

use std::fmt;

use thiserror::Error;

/// Channels × height × width of one sample. A vector of `n` features is `n × 1 × 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub c: usize,
    pub h: usize,
    pub w: usize,
}

impl Shape {
    pub fn new(c: usize, h: usize, w: usize) -> Self {
        Self { c, h, w }
    }
    pub fn flat(n: usize) -> Self {
        Self::new(n, 1, 1)
    }
    pub fn len(&self) -> usize {
        self.c * self.h * self.w
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.h == 1 && self.w == 1 {
            write!(f, "{}", self.c)
        } else {
            write!(f, "{}x{}x{}", self.c, self.h, self.w)
        }
    }
}

/// One layer. Sizes are what the layer produces; its input size comes from the layer before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Layer {
    /// Fully connected to `units` outputs (any input shape is taken flat).
    Dense {
        units: usize,
    },
    /// `filters` square `kernel × kernel` filters with `stride` and zero `padding`.
    Conv2d {
        filters: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    },
    MaxPool {
        size: usize,
        stride: usize,
    },
    AvgPool {
        size: usize,
        stride: usize,
    },
    Flatten,
    Relu,
    Tanh,
    Gelu,
    /// Zeroes each activation with probability `p` while training (scaling the rest by
    /// `1 / (1 - p)`); the mask is drawn from the batch's seed, so it can be recomputed.
    Dropout {
        p: f32,
    },
}

impl Layer {
    pub fn has_params(&self) -> bool {
        matches!(self, Self::Dense { .. } | Self::Conv2d { .. })
    }

    /// The shape this layer produces from `input`, or why it cannot take it.
    pub fn output(&self, input: Shape) -> Result<Shape, String> {
        let window = |size: usize, stride: usize, pad: usize, what: &str| {
            if size == 0 || stride == 0 {
                return Err(format!("{what} size and stride must be at least 1"));
            }
            if input.h + 2 * pad < size || input.w + 2 * pad < size {
                return Err(format!(
                    "a {size}×{size} {what} does not fit a {}×{} input",
                    input.h, input.w
                ));
            }
            Ok((
                (input.h + 2 * pad - size) / stride + 1,
                (input.w + 2 * pad - size) / stride + 1,
            ))
        };
        match *self {
            Self::Dense { units: 0 } => Err("dense needs at least 1 unit".into()),
            Self::Dense { units } => Ok(Shape::flat(units)),
            Self::Conv2d { filters: 0, .. } => Err("conv2d needs at least 1 filter".into()),
            Self::Conv2d {
                filters,
                kernel,
                stride,
                padding,
            } => {
                if input.h == 1 && input.w == 1 && kernel > 1 {
                    return Err(format!(
                        "conv2d needs an image input, got {input} flat features"
                    ));
                }
                let (h, w) = window(kernel, stride, padding, "kernel")?;
                Ok(Shape::new(filters, h, w))
            }
            Self::MaxPool { size, stride } | Self::AvgPool { size, stride } => {
                let (h, w) = window(size, stride, 0, "pool")?;
                Ok(Shape::new(input.c, h, w))
            }
            Self::Flatten => Ok(Shape::flat(input.len())),
            Self::Relu | Self::Tanh | Self::Gelu => Ok(input),
            Self::Dropout { p } if !(0.0..1.0).contains(&p) => {
                Err(format!("dropout p must be in [0, 1), got {p}"))
            }
            Self::Dropout { .. } => Ok(input),
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Dense { units } => write!(f, "dense {units}"),
            Self::Conv2d {
                filters,
                kernel,
                stride,
                padding,
            } => write!(f, "conv2d {filters} k{kernel} s{stride} p{padding}"),
            Self::MaxPool { size, stride } => write!(f, "maxpool {size} s{stride}"),
            Self::AvgPool { size, stride } => write!(f, "avgpool {size} s{stride}"),
            Self::Flatten => f.write_str("flatten"),
            Self::Relu => f.write_str("relu"),
            Self::Tanh => f.write_str("tanh"),
            Self::Gelu => f.write_str("gelu"),
            Self::Dropout { p } => write!(f, "dropout {p}"),
        }
    }
}

/// A layer and whether its parameters are trained (`frozen` ones keep their values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    pub layer: Layer,
    pub frozen: bool,
}

/// A whole model.
#[derive(Debug, Clone, PartialEq)]
pub enum NetSpec {
    /// Layers one after the other.
    Chain(ChainSpec),
    /// A GPT-2 ([`crate::gpt`]): windows of `context + 1` token ids in, the vocabulary's
    /// logits at each of `context` positions out.
    Gpt(crate::gpt::GptSpec),
}

/// A chain of layers: the input shape and the layers, the last one producing the class
/// logits.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainSpec {
    pub input: Shape,
    pub layers: Vec<LayerSpec>,
}

/// Why a spec cannot be built, naming the layer at fault.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    #[error("the model has no layers")]
    Empty,
    #[error("layer {index} ({layer}) cannot take its input of shape {input}: {reason}")]
    Layer {
        index: usize,
        layer: String,
        input: String,
        reason: String,
    },
    #[error("the last layer produces {got} values, but the data has {classes} classes")]
    Classes { got: String, classes: usize },
    #[error("the model has {params} parameters, more than the limit of {max}")]
    TooLarge { params: usize, max: usize },
    #[error("cannot parse the model \"{text}\": {reason}")]
    Parse { text: String, reason: String },
}

impl NetSpec {
    /// Today's MLP: `hidden` ReLU layers, then a dense layer to the classes.
    pub fn mlp(input: Shape, hidden: &[usize], classes: usize) -> Self {
        let mut layers = Vec::new();
        for &units in hidden {
            layers.push(Layer::Dense { units });
            layers.push(Layer::Relu);
        }
        layers.push(Layer::Dense { units: classes });
        Self::of(input, layers)
    }

    /// The small conv net: conv 5×5 ×16, ReLU, max-pool 2, conv 5×5 ×32, ReLU, max-pool 2,
    /// dense 128, ReLU, dense to the classes.
    pub fn cnn(input: Shape, classes: usize) -> Self {
        let conv = |filters| Layer::Conv2d {
            filters,
            kernel: 5,
            stride: 1,
            padding: 0,
        };
        let pool = Layer::MaxPool { size: 2, stride: 2 };
        Self::of(
            input,
            vec![
                conv(16),
                Layer::Relu,
                pool,
                conv(32),
                Layer::Relu,
                pool,
                Layer::Flatten,
                Layer::Dense { units: 128 },
                Layer::Relu,
                Layer::Dense { units: classes },
            ],
        )
    }

    /// A GPT-2 ([`crate::gpt`]) reading windows of `context + 1` token ids.
    pub fn gpt(gpt: crate::gpt::GptSpec) -> Self {
        Self::Gpt(gpt)
    }

    /// The GPT this spec is, if it is one.
    pub fn as_gpt(&self) -> Option<crate::gpt::GptSpec> {
        match self {
            Self::Gpt(gpt) => Some(*gpt),
            Self::Chain(_) => None,
        }
    }

    /// The chain of layers this spec is, if it is one.
    pub fn as_chain(&self) -> Option<&ChainSpec> {
        match self {
            Self::Chain(chain) => Some(chain),
            Self::Gpt(_) => None,
        }
    }

    /// A chain's layers (a GPT has none: it is computed whole).
    pub fn layers(&self) -> &[LayerSpec] {
        self.as_chain().map_or(&[], |c| &c.layers)
    }

    /// The shape of one input sample: a GPT's is a window of `context + 1` token ids.
    pub fn input(&self) -> Shape {
        match self {
            Self::Chain(chain) => chain.input,
            Self::Gpt(gpt) => Shape::flat(gpt.context + 1),
        }
    }

    /// A chain of `layers` on `input`, none frozen.
    pub fn of(input: Shape, layers: Vec<Layer>) -> Self {
        Self::Chain(ChainSpec {
            input,
            layers: layers
                .into_iter()
                .map(|layer| LayerSpec {
                    layer,
                    frozen: false,
                })
                .collect(),
        })
    }

    /// Every layer's output shape, checked (a GPT's: its logits); the last must be
    /// `classes` values.
    pub fn shapes(&self, classes: usize) -> Result<Vec<Shape>, SpecError> {
        let shapes = self.layer_shapes()?;
        let last = shapes[shapes.len() - 1];
        if last != Shape::flat(classes) {
            return Err(SpecError::Classes {
                got: last.to_string(),
                classes,
            });
        }
        Ok(shapes)
    }

    /// How many values the last layer produces (the classes, for a spec that is valid).
    pub fn outputs(&self) -> Result<usize, SpecError> {
        self.layer_shapes().map(|s| s[s.len() - 1].len())
    }

    fn layer_shapes(&self) -> Result<Vec<Shape>, SpecError> {
        match self {
            Self::Chain(chain) => chain.layer_shapes(),
            Self::Gpt(gpt) => {
                gpt.check().map_err(|reason| SpecError::Layer {
                    index: 0,
                    layer: gpt.to_string(),
                    input: self.input().to_string(),
                    reason,
                })?;
                Ok(vec![Shape::flat(gpt.vocab)])
            }
        }
    }

    /// FNV-1a of the canonical text: equal on two sides only if both render it identically.
    pub fn fingerprint(&self) -> u64 {
        self.to_string()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
    }
}

impl ChainSpec {
    fn layer_shapes(&self) -> Result<Vec<Shape>, SpecError> {
        if self.layers.is_empty() {
            return Err(SpecError::Empty);
        }
        let mut shapes = Vec::with_capacity(self.layers.len());
        let mut input = self.input;
        for (index, spec) in self.layers.iter().enumerate() {
            input = spec
                .layer
                .output(input)
                .map_err(|reason| SpecError::Layer {
                    index,
                    layer: spec.layer.to_string(),
                    input: input.to_string(),
                    reason,
                })?;
            shapes.push(input);
        }
        Ok(shapes)
    }
}

impl fmt::Display for NetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "input {}", self.input())?;
        match self {
            Self::Chain(chain) => {
                for spec in &chain.layers {
                    write!(f, "; {}", spec.layer)?;
                    if spec.frozen {
                        f.write_str(" frozen")?;
                    }
                }
                Ok(())
            }
            Self::Gpt(gpt) => write!(f, "; {gpt}"),
        }
    }
}

#[cfg(test)]
mod tests;
