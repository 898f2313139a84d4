//! Named parameter tensors over one flat vector.
//!
//! The flat `f32` vector is what travels on the wire and what optimizers step; the layout
//! names its pieces (for `/api/params` in safetensors form, and for the maths).

/// One named tensor inside the flat parameter vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Index of its first element in the flat vector.
    pub offset: usize,
}

impl TensorSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// The ordered list of tensors making up a model's parameters, stored back to back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParamLayout {
    tensors: Vec<TensorSpec>,
    total: usize,
}

impl ParamLayout {
    pub fn push(&mut self, name: impl Into<String>, shape: Vec<usize>) {
        let spec = TensorSpec {
            name: name.into(),
            shape,
            offset: self.total,
        };
        self.total += spec.len();
        self.tensors.push(spec);
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Number of scalars in the flat vector.
    pub fn total(&self) -> usize {
        self.total
    }
}
