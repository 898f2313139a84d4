//! What is written to disk and read back: checkpoints ([`checkpoint`], their own format, atomic
//! writes on a thread of their own) and safetensors files ([`tensors_file`]: `/api/params`,
//! `--init`, export).

pub mod checkpoint;
pub mod hf;
pub mod tensors_file;
