//! `--model PRESET|FILE`: which network to train. Presets take their input shape and class
//! count from the data; a file lists layers in TOML or JSON (see the README):
//!
//! ```toml
//! [[layers]]
//! type = "conv2d"
//! filters = 8
//! kernel = 3
//! padding = 1
//! [[layers]]
//! type = "relu"
//! [[layers]]
//! type = "dense"      # no `units`: as many as the data has classes
//! freeze = false
//! ```

use std::path::{Path, PathBuf};

use model::{ChainSpec, Layer, LayerSpec, NetSpec, Shape};
use serde::Deserialize;

use super::error::ConfigError;

/// Widest layer accepted in a preset or a file: keeps one model's weights far below the
/// frame limit.
pub const MAX_WIDTH: usize = 4096;
pub const MAX_HIDDEN_LAYERS: usize = 8;
/// Longest GPT context and most GPT blocks accepted.
pub const MAX_CONTEXT: usize = 4096;
pub const MAX_GPT_LAYERS: usize = 48;

#[derive(Debug, Clone, PartialEq)]
pub enum ModelChoice {
    /// ReLU hidden layers of these widths, then a dense layer to the classes.
    Mlp { hidden: Vec<usize> },
    /// `NetSpec::cnn`: two 5×5 convolutions with max-pools, dense 128, dense to the classes.
    Cnn,
    /// A GPT-2 on text: its vocabulary comes from the data's tokeniser.
    Gpt {
        preset: &'static str,
        context: usize,
        layers: usize,
        heads: usize,
        width: usize,
    },
    /// Layers read from a file, with whether each is frozen. A dense layer without `units`
    /// is read as `units: 0` (a file cannot give 0): one unit per class.
    File {
        path: PathBuf,
        layers: Vec<(Layer, bool)>,
    },
}

impl ModelChoice {
    pub fn from_flags(
        model: &str,
        hidden: &[usize],
        hidden_given: bool,
    ) -> Result<Self, ConfigError> {
        let check_hidden = || {
            if hidden.len() > MAX_HIDDEN_LAYERS {
                return Err(ConfigError::TooManyLayers {
                    got: hidden.len(),
                    max: MAX_HIDDEN_LAYERS,
                });
            }
            match hidden.iter().find(|&&w| w == 0 || w > MAX_WIDTH) {
                Some(&bad) => Err(ConfigError::HiddenWidth {
                    got: bad,
                    max: MAX_WIDTH,
                }),
                None => Ok(()),
            }
        };
        match model {
            "mlp" => check_hidden().map(|()| Self::Mlp {
                hidden: hidden.to_vec(),
            }),
            _ if hidden_given => Err(ConfigError::HiddenWithoutMlp),
            "cnn" => Ok(Self::Cnn),
            "gpt" | "gpt-10m" => {
                let base = model::gpt::GptSpec::cpu(2);
                let big = model::gpt::GptSpec::shakespeare_char(2);
                let s = if model == "gpt" { base } else { big };
                Ok(Self::Gpt {
                    preset: if model == "gpt" { "gpt" } else { "gpt-10m" },
                    context: s.context,
                    layers: s.layers,
                    heads: s.heads,
                    width: s.width,
                })
            }
            path => read_file(Path::new(path)),
        }
    }

    /// A GPT's shape from the flags that change a preset's (`--gpt-layers` and the rest);
    /// they are refused for any other model.
    pub fn with_gpt_flags(
        self,
        layers: Option<usize>,
        heads: Option<usize>,
        width: Option<usize>,
        context: Option<usize>,
    ) -> Result<Self, ConfigError> {
        let given = layers.is_some() || heads.is_some() || width.is_some() || context.is_some();
        match self {
            Self::Gpt {
                preset,
                context: c,
                layers: l,
                heads: h,
                width: w,
            } => {
                let chosen = Self::Gpt {
                    preset,
                    context: context.unwrap_or(c),
                    layers: layers.unwrap_or(l),
                    heads: heads.unwrap_or(h),
                    width: width.unwrap_or(w),
                };
                let spec = chosen.gpt_spec(2).expect("a gpt");
                spec.check().map_err(ConfigError::Gpt)?;
                if spec.width > MAX_WIDTH
                    || spec.context > MAX_CONTEXT
                    || spec.layers > MAX_GPT_LAYERS
                {
                    return Err(ConfigError::Gpt(format!(
                        "width at most {MAX_WIDTH}, context at most {MAX_CONTEXT}, layers at most {MAX_GPT_LAYERS}"
                    )));
                }
                Ok(chosen)
            }
            other if given => Err(ConfigError::Gpt(format!(
                "--gpt-layers, --gpt-heads, --gpt-width and --context shape a GPT, not --model {}",
                other.name()
            ))),
            other => Ok(other),
        }
    }

    /// The GPT of `vocab` tokens this choice makes, if it is one.
    /// Whether this is a language model (`--model gpt`, `gpt-10m`).
    pub fn is_gpt(&self) -> bool {
        matches!(self, Self::Gpt { .. })
    }

    pub fn gpt_spec(&self, vocab: usize) -> Option<model::gpt::GptSpec> {
        match *self {
            Self::Gpt {
                context,
                layers,
                heads,
                width,
                ..
            } => Some(model::gpt::GptSpec {
                vocab,
                context,
                layers,
                heads,
                width,
            }),
            _ => None,
        }
    }

    /// The spec for data of `input` shape with `classes` classes (not yet checked: building
    /// the `Network` checks it layer by layer).
    pub fn spec(&self, input: Shape, classes: usize) -> NetSpec {
        match self {
            Self::Mlp { hidden } => NetSpec::mlp(input, hidden, classes),
            Self::Cnn => NetSpec::cnn(input, classes),
            Self::Gpt { .. } => NetSpec::gpt(self.gpt_spec(classes).expect("a gpt")),
            Self::File { layers, .. } => NetSpec::Chain(ChainSpec {
                input,
                layers: layers
                    .iter()
                    .map(|&(layer, frozen)| LayerSpec {
                        layer: match layer {
                            Layer::Dense { units: 0 } => Layer::Dense { units: classes },
                            other => other,
                        },
                        frozen,
                    })
                    .collect(),
            }),
        }
    }

    /// `mlp`, `cnn`, or the file's path, for the status and the logs.
    pub fn name(&self) -> String {
        match self {
            Self::Mlp { .. } => "mlp".into(),
            Self::Cnn => "cnn".into(),
            Self::Gpt { preset, .. } => (*preset).into(),
            Self::File { path, .. } => path.display().to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    layers: Vec<LayerEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LayerEntry {
    #[serde(rename = "type")]
    kind: String,
    units: Option<usize>,
    filters: Option<usize>,
    kernel: Option<usize>,
    size: Option<usize>,
    stride: Option<usize>,
    padding: Option<usize>,
    p: Option<f32>,
    #[serde(default)]
    freeze: bool,
}

fn read_file(path: &Path) -> Result<ModelChoice, ConfigError> {
    let fail = |reason: String| ConfigError::ModelFile {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(if e.kind() == std::io::ErrorKind::NotFound {
            "no such file (and not a preset: use mlp or cnn)".into()
        } else {
            e.to_string()
        })
    })?;
    let file: SpecFile = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?,
        Some("toml") => toml::from_str(&text).map_err(|e| fail(e.to_string()))?,
        _ => return Err(fail("the file name must end in .toml or .json".into())),
    };
    if file.layers.is_empty() {
        return Err(fail("`layers` is empty".into()));
    }
    let mut layers = Vec::with_capacity(file.layers.len());
    for (i, entry) in file.layers.iter().enumerate() {
        let layer =
            entry_layer(entry).map_err(|e| fail(format!("layer {i} ({}): {e}", entry.kind)))?;
        layers.push((layer, entry.freeze));
    }
    Ok(ModelChoice::File {
        path: path.to_path_buf(),
        layers,
    })
}

fn entry_layer(e: &LayerEntry) -> Result<Layer, String> {
    let size = |v: Option<usize>, what: &str| match v {
        Some(n) if (1..=MAX_WIDTH).contains(&n) => Ok(n),
        Some(n) => Err(format!(
            "`{what}` must be between 1 and {MAX_WIDTH}, got {n}"
        )),
        None => Err(format!("needs `{what}`")),
    };
    let allowed = |fields: &[&str]| {
        let given = [
            ("units", e.units.is_some()),
            ("filters", e.filters.is_some()),
            ("kernel", e.kernel.is_some()),
            ("size", e.size.is_some()),
            ("stride", e.stride.is_some()),
            ("padding", e.padding.is_some()),
            ("p", e.p.is_some()),
        ];
        match given
            .iter()
            .find(|(name, set)| *set && !fields.contains(name))
        {
            Some((name, _)) => Err(format!("`{name}` does not apply to {}", e.kind)),
            None => Ok(()),
        }
    };
    let layer = match e.kind.as_str() {
        "dense" => {
            allowed(&["units"])?;
            Layer::Dense {
                units: match e.units {
                    None => 0,
                    units => size(units, "units")?,
                },
            }
        }
        "conv2d" => {
            allowed(&["filters", "kernel", "stride", "padding"])?;
            Layer::Conv2d {
                filters: size(e.filters, "filters")?,
                kernel: size(e.kernel, "kernel")?,
                stride: size(Some(e.stride.unwrap_or(1)), "stride")?,
                padding: e.padding.unwrap_or(0).min(MAX_WIDTH),
            }
        }
        "maxpool" | "avgpool" => {
            allowed(&["size", "stride"])?;
            let size_ = size(e.size, "size")?;
            let stride = size(Some(e.stride.unwrap_or(size_)), "stride")?;
            if e.kind == "maxpool" {
                Layer::MaxPool { size: size_, stride }
            } else {
                Layer::AvgPool { size: size_, stride }
            }
        }
        "dropout" => {
            allowed(&["p"])?;
            match e.p {
                Some(p) if (0.0..1.0).contains(&p) => Layer::Dropout { p },
                _ => return Err("needs `p`, a probability in [0, 1)".into()),
            }
        }
        kind @ ("flatten" | "relu" | "tanh" | "gelu") => {
            allowed(&[])?;
            match kind {
                "flatten" => Layer::Flatten,
                "relu" => Layer::Relu,
                "tanh" => Layer::Tanh,
                _ => Layer::Gelu,
            }
        }
        other => {
            return Err(format!(
                "unknown type `{other}` (dense, conv2d, maxpool, avgpool, flatten, relu, tanh, gelu, dropout)"
            ))
        }
    };
    Ok(layer)
}
