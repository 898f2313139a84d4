//! `/api/params` in the safetensors format (an 8-byte little-endian header length, a JSON
//! header naming each tensor's dtype, shape and byte range, then the raw data), so that
//! `safetensors.numpy.load` or candle read the weights directly.

use model::ParamLayout;
use serde_json::{json, Map, Value};

/// Encodes `data` (the parameters as raw little-endian f32 bytes, in `layout` order).
pub fn encode(layout: &ParamLayout, data: &[u8], round: u64) -> Vec<u8> {
    let mut header = Map::new();
    header.insert(
        "__metadata__".into(),
        json!({ "round": round.to_string(), "format": "crowdtrain" }),
    );
    for t in layout.tensors() {
        header.insert(
            t.name.clone(),
            json!({
                "dtype": "F32",
                "shape": t.shape,
                "data_offsets": [t.offset * 4, (t.offset + t.len()) * 4],
            }),
        );
    }
    let mut header = Value::Object(header).to_string().into_bytes();
    // Pad with spaces so the data starts 8-byte aligned, as the reference implementation does.
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + data.len());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_describes_every_tensor_and_data_follows_aligned() {
        let mlp = model::Mlp::new(&[3, 2]).expect("valid");
        let params: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let data: Vec<u8> = params.iter().flat_map(|p| p.to_le_bytes()).collect();
        let out = encode(mlp.layout(), &data, 5);
        let n = u64::from_le_bytes(out[..8].try_into().expect("8 bytes")) as usize;
        assert_eq!(n % 8, 0);
        let header: Value = serde_json::from_slice(&out[8..8 + n]).expect("json");
        assert_eq!(header["l0.weight"]["shape"], json!([3, 2]));
        assert_eq!(header["l0.bias"]["data_offsets"], json!([24, 32]));
        assert_eq!(header["__metadata__"]["round"], "5");
        assert_eq!(&out[8 + n..], &data[..]);
    }
}
