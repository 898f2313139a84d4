//! Safetensors files of named f32 tensors, through the `safetensors` crate: an 8-byte header
//! length, a JSON header naming each tensor's dtype, shape and byte range, then the raw
//! little-endian data. `/api/params`, checkpoints and `coordinator export` write them, so
//! Python's `safetensors.numpy.load_file`, candle and burn read the weights directly.

use std::collections::HashMap;

use model::{ParamLayout, TensorSpec};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

/// A tensor as it is checked on reading: its name and shape.
pub type Expected<'a> = (&'a str, &'a [usize]);

/// Tensors' values, in the order asked for, and the file's metadata.
pub type Decoded = (Vec<Vec<f32>>, HashMap<String, String>);

/// What is wrong with a safetensors file, naming the tensor at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorsFileError {
    #[error("not a safetensors file: {0}")]
    Format(String),
    #[error("tensor {0:?} is missing")]
    Missing(String),
    #[error("tensor {0:?} is not expected here")]
    Unexpected(String),
    #[error("tensor {name:?} is {dtype}, expected F32")]
    Dtype { name: String, dtype: String },
    #[error("tensor {name:?} has shape {got:?}, expected {expected:?}")]
    Shape {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
}

/// One metadata entry (`key`, `value`). Only one: the crate keeps metadata in a `HashMap`,
/// so two would be written in a random order, and the same tensors would not always give the
/// same bytes.
pub type Metadata<'a> = (&'a str, String);

/// Encodes tensors given as raw little-endian f32 bytes, with one `metadata` entry.
pub fn encode<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [u8])>,
    metadata: Metadata<'_>,
) -> Vec<u8> {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .into_iter()
        .map(|(name, shape, data)| {
            let view = TensorView::new(Dtype::F32, shape.to_vec(), data)
                .expect("a shape's product times 4 is its data's length");
            (name, view)
        })
        .collect();
    let metadata = HashMap::from([(metadata.0.to_string(), metadata.1)]);
    safetensors::serialize(views, Some(metadata)).expect("f32 tensors with distinct names")
}

/// The parameters (raw little-endian f32 bytes, in `layout` order) as one tensor per layer.
pub fn encode_params(layout: &ParamLayout, data: &[u8], metadata: Metadata<'_>) -> Vec<u8> {
    encode(
        layout.tensors().iter().map(|t| {
            let bytes = &data[t.offset * 4..(t.offset + t.len()) * 4];
            (t.name.as_str(), t.shape.as_slice(), bytes)
        }),
        metadata,
    )
}

/// f32 values as little-endian bytes.
pub fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Reads exactly the `expected` tensors, in that order, as f32 values, with the file's
/// metadata. A missing, extra, non-f32 or misshapen tensor is refused by name.
pub fn decode(bytes: &[u8], expected: &[Expected<'_>]) -> Result<Decoded, TensorsFileError> {
    let format = |e: safetensors::SafeTensorError| TensorsFileError::Format(format!("{e:?}"));
    // Parses and checks the header once (offsets within the file, covering its data).
    let (header_len, header) = SafeTensors::read_metadata(bytes).map_err(format)?;
    let data = &bytes[8 + header_len..];
    let tensors = header.tensors();
    if let Some(extra) = tensors
        .keys()
        .find(|n| !expected.iter().any(|(e, _)| e == n))
    {
        return Err(TensorsFileError::Unexpected(extra.clone()));
    }
    let mut out = Vec::with_capacity(expected.len());
    for &(name, shape) in expected {
        let info = tensors
            .get(name)
            .ok_or_else(|| TensorsFileError::Missing(name.to_string()))?;
        if info.dtype != Dtype::F32 {
            return Err(TensorsFileError::Dtype {
                name: name.to_string(),
                dtype: info.dtype.to_string(),
            });
        }
        if info.shape != shape {
            return Err(TensorsFileError::Shape {
                name: name.to_string(),
                got: info.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        let (start, end) = info.data_offsets;
        let values = data[start..end]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.push(values);
    }
    Ok((out, header.metadata().clone().unwrap_or_default()))
}

/// New values for one tensor: its flat range in the parameters, and the values.
pub type Patch = (std::ops::Range<usize>, Vec<f32>);

/// Some of `layout`'s tensors, by name (push by key): each with its flat range. Every tensor
/// in the file must be one of the model's, with its shape; at least one must be there.
pub fn decode_some(bytes: &[u8], layout: &ParamLayout) -> Result<Vec<Patch>, TensorsFileError> {
    let format = |e: safetensors::SafeTensorError| TensorsFileError::Format(format!("{e:?}"));
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(format)?;
    let present: Vec<&TensorSpec> = layout
        .tensors()
        .iter()
        .filter(|t| header.tensors().contains_key(&t.name))
        .collect();
    if present.is_empty() {
        let first = layout.tensors().first().map_or("", |t| t.name.as_str());
        return Err(TensorsFileError::Missing(first.to_string()));
    }
    let expected: Vec<Expected<'_>> = present
        .iter()
        .map(|t| (t.name.as_str(), t.shape.as_slice()))
        .collect();
    let (tensors, _) = decode(bytes, &expected)?;
    Ok(present.iter().map(|t| t.range()).zip(tensors).collect())
}

/// The parameters from a file of one tensor per layer of `layout`, flattened in its order.
pub fn decode_params(
    bytes: &[u8],
    layout: &ParamLayout,
) -> Result<(Vec<f32>, HashMap<String, String>), TensorsFileError> {
    let expected: Vec<Expected<'_>> = layout
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.shape.as_slice()))
        .collect();
    let (tensors, metadata) = decode(bytes, &expected)?;
    Ok((tensors.concat(), metadata))
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn layout() -> model::Network {
        model::Network::mlp(&[3, 2]).expect("valid")
    }

    #[test]
    fn header_describes_every_tensor_and_data_follows_aligned() {
        let mlp = layout();
        let params: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let out = encode_params(mlp.layout(), &le_bytes(&params), ("round", "5".into()));
        assert_eq!(
            out,
            encode_params(mlp.layout(), &le_bytes(&params), ("round", "5".into())),
            "the same tensors, the same bytes"
        );
        let n = u64::from_le_bytes(out[..8].try_into().expect("8 bytes")) as usize;
        assert_eq!(n % 8, 0);
        let header: Value = serde_json::from_slice(&out[8..8 + n]).expect("json");
        assert_eq!(header["l0.weight"]["shape"], json!([3, 2]));
        assert_eq!(header["l0.weight"]["dtype"], "F32");
        assert_eq!(header["__metadata__"]["round"], "5");
        let (back, metadata) = decode_params(&out, mlp.layout()).expect("reads back");
        assert_eq!(back, params);
        assert_eq!(metadata["round"], "5");
    }

    #[test]
    fn a_file_that_does_not_fit_is_refused_by_tensor_name() {
        let mlp = layout();
        let other = model::Network::mlp(&[2, 3]).expect("valid");
        let file = encode_params(other.layout(), &le_bytes(&[0.0; 9]), ("round", "0".into()));
        let err = decode_params(&file, mlp.layout()).expect_err("other shapes");
        assert_eq!(
            err.to_string(),
            "tensor \"l0.weight\" has shape [2, 3], expected [3, 2]"
        );
        let one = encode(
            [("l0.weight", &[3usize, 2][..], &le_bytes(&[0.0; 6])[..])],
            ("round", "0".into()),
        );
        let err = decode_params(&one, mlp.layout()).expect_err("missing");
        assert_eq!(err, TensorsFileError::Missing("l0.bias".into()));
        let extra = encode(
            [("x", &[1usize][..], &le_bytes(&[0.0])[..])],
            ("round", "0".into()),
        );
        assert!(matches!(
            decode(&extra, &[]),
            Err(TensorsFileError::Unexpected(name)) if name == "x"
        ));
        let mut truncated =
            encode_params(mlp.layout(), &le_bytes(&[1.0; 8]), ("round", "0".into()));
        truncated.pop();
        assert!(matches!(
            decode_params(&truncated, mlp.layout()),
            Err(TensorsFileError::Format(_))
        ));
        assert!(decode_params(b"not a file", mlp.layout()).is_err());
        // A header whose offsets lie about the data is refused, never sliced.
        let header = br#"{"l0.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,400]}}"#;
        let mut lying = (header.len() as u64).to_le_bytes().to_vec();
        lying.extend_from_slice(header);
        lying.extend_from_slice(&[0u8; 24]);
        assert!(matches!(
            decode_params(&lying, mlp.layout()),
            Err(TensorsFileError::Format(_))
        ));
    }
}
