//! Parsing the canonical text form of a [`NetSpec`](crate::spec::NetSpec).
//!
//! `input C[xHxW]; layer; layer ...` where a layer is `dense N`, `conv2d N [kK] [sS] [pP]`,
//! `maxpool K [sS]`, `avgpool K [sS]`, `flatten`, `relu`, `tanh`, `gelu` or `dropout P`, any
//! of them optionally followed by `frozen`. Omitted options take their defaults (kernel 3,
//! stride 1 for convolutions and the window size for pools, padding 0). A GPT is
//! `input T+1; gpt vocab V context T layers L heads H width C`: one model, never a layer
//! among others.

use std::str::FromStr;

use crate::gpt::GptSpec;
use crate::spec::{ChainSpec, Layer, LayerSpec, NetSpec, Shape, SpecError};

/// Longest spec text accepted (a worker parses what the coordinator sends).
const MAX_TEXT: usize = 4096;
/// Most layers accepted.
const MAX_LAYERS: usize = 64;
/// Largest size of any dimension or count.
const MAX_SIZE: usize = 1 << 20;

impl FromStr for NetSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        parse(text).map_err(|reason| SpecError::Parse {
            text: text.chars().take(200).collect(),
            reason,
        })
    }
}

fn parse(text: &str) -> Result<NetSpec, String> {
    if text.len() > MAX_TEXT {
        return Err(format!("longer than {MAX_TEXT} bytes"));
    }
    let mut parts = text.split(';').map(str::trim);
    let input = parts.next().unwrap_or_default();
    let input = input
        .strip_prefix("input ")
        .ok_or("it must start with `input <shape>`")?;
    let input = shape(input.trim())?;
    let parts: Vec<&str> = parts.collect();
    if let [part] = parts[..] {
        if let Some((&"gpt", args)) = part.split_whitespace().collect::<Vec<_>>().split_first() {
            return whole_gpt(input, args).map_err(|e| format!("layer 0 `{part}`: {e}"));
        }
    }
    let mut layers = Vec::new();
    for (index, part) in parts.into_iter().enumerate() {
        if layers.len() == MAX_LAYERS {
            return Err(format!("more than {MAX_LAYERS} layers"));
        }
        layers.push(layer(part).map_err(|e| format!("layer {index} `{part}`: {e}"))?);
    }
    Ok(NetSpec::Chain(ChainSpec { input, layers }))
}

/// A GPT, the model's one part: its input must be its windows.
fn whole_gpt(input: Shape, args: &[&str]) -> Result<NetSpec, String> {
    if args.last() == Some(&"frozen") {
        return Err("a frozen gpt has nothing to train".into());
    }
    let gpt = gpt(args)?;
    if input != Shape::flat(gpt.context + 1) {
        return Err(format!(
            "a gpt of context {} reads windows of {} token ids, got {input}",
            gpt.context,
            gpt.context + 1
        ));
    }
    Ok(NetSpec::Gpt(gpt))
}

fn shape(s: &str) -> Result<Shape, String> {
    let dims = s
        .split('x')
        .map(|d| number(d, "a dimension"))
        .collect::<Result<Vec<_>, _>>()?;
    match dims[..] {
        [n] => Ok(Shape::flat(n)),
        [c, h, w] => Ok(Shape::new(c, h, w)),
        _ => Err(format!("input shape `{s}` is neither N nor CxHxW")),
    }
}

fn number(s: &str, what: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_SIZE).contains(&n) => Ok(n),
        Ok(n) if n > MAX_SIZE => Err(format!("{what} of {n} is over the limit {MAX_SIZE}")),
        _ => Err(format!(
            "{what} must be a whole number of at least 1, got `{s}`"
        )),
    }
}

/// `gpt vocab V context T layers L heads H width C`, every key once, in any order.
fn gpt(args: &[&str]) -> Result<GptSpec, String> {
    let mut values = [None; 5];
    const KEYS: [&str; 5] = ["vocab", "context", "layers", "heads", "width"];
    let mut words = args.iter();
    while let Some(&key) = words.next() {
        let k = KEYS
            .iter()
            .position(|&k| k == key)
            .ok_or_else(|| format!("unknown gpt option `{key}` (expected {})", KEYS.join(", ")))?;
        let value = words
            .next()
            .ok_or_else(|| format!("gpt option `{key}` needs a value"))?;
        if values[k].replace(number(value, key)?).is_some() {
            return Err(format!("gpt option `{key}` given twice"));
        }
    }
    let need = |k: usize| values[k].ok_or_else(|| format!("gpt needs `{} N`", KEYS[k]));
    let spec = crate::gpt::GptSpec {
        vocab: need(0)?,
        context: need(1)?,
        layers: need(2)?,
        heads: need(3)?,
        width: need(4)?,
    };
    spec.check()?;
    Ok(spec)
}

fn layer(part: &str) -> Result<LayerSpec, String> {
    let mut words: Vec<&str> = part.split_whitespace().collect();
    let frozen = words.last() == Some(&"frozen");
    if frozen {
        words.pop();
    }
    let (&kind, args) = words.split_first().ok_or("empty layer")?;
    let positional = |i: usize, what: &str| -> Result<usize, String> {
        let arg = args.get(i).ok_or_else(|| format!("{kind} needs {what}"))?;
        number(arg, what)
    };
    let option = |prefix: char, default: usize, zero_ok: bool| -> Result<usize, String> {
        match args.iter().skip(1).find(|a| a.starts_with(prefix)) {
            None => Ok(default),
            Some(a) if zero_ok && a[1..] == *"0" => Ok(0),
            Some(a) => number(&a[1..], &format!("option {prefix}")),
        }
    };
    let known = |allowed: &[char]| -> Result<(), String> {
        match args
            .iter()
            .skip(1)
            .find(|a| !allowed.iter().any(|&c| a.starts_with(c)))
        {
            Some(bad) => Err(format!("unknown option `{bad}` for {kind}")),
            None => Ok(()),
        }
    };
    let pool = || -> Result<(usize, usize), String> {
        known(&['s'])?;
        let size = positional(0, "a window size")?;
        Ok((size, option('s', size, false)?))
    };
    let none = || match args.is_empty() {
        true => Ok(()),
        false => Err(format!("{kind} takes no arguments")),
    };
    let layer = match kind {
        "dense" => {
            known(&[])?;
            Layer::Dense {
                units: positional(0, "a number of units")?,
            }
        }
        "conv2d" => {
            known(&['k', 's', 'p'])?;
            Layer::Conv2d {
                filters: positional(0, "a number of filters")?,
                kernel: option('k', 3, false)?,
                stride: option('s', 1, false)?,
                padding: option('p', 0, true)?,
            }
        }
        "maxpool" => {
            let (size, stride) = pool()?;
            Layer::MaxPool { size, stride }
        }
        "avgpool" => {
            let (size, stride) = pool()?;
            Layer::AvgPool { size, stride }
        }
        "flatten" => none().map(|()| Layer::Flatten)?,
        "relu" => none().map(|()| Layer::Relu)?,
        "tanh" => none().map(|()| Layer::Tanh)?,
        "gelu" => none().map(|()| Layer::Gelu)?,
        "dropout" => {
            let p = args
                .first()
                .and_then(|a| a.parse::<f32>().ok())
                .filter(|p| (0.0..1.0).contains(p))
                .ok_or("dropout needs a probability in [0, 1)")?;
            Layer::Dropout { p }
        }
        "gpt" => return Err("a gpt is a whole model: it must be the only layer".into()),
        other => return Err(format!("unknown layer type `{other}`")),
    };
    Ok(LayerSpec { layer, frozen })
}
