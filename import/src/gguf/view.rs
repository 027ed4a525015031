//! [`TensorView`]: one tensor's info and bytes, borrowed from a [`GgufFile`](super::GgufFile),
//! and its conversions to f32.

use super::{TensorInfo, dtype};
use crate::error::{ImportError, Result, finite_weights};

/// A tensor's info and its bytes, borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// Name, dims, type, offset.
    pub info: &'a TensorInfo,
    /// The raw bytes (`info.n_bytes` of them), borrowed from the file.
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// Shape outermost first (see [`TensorInfo::shape`]).
    pub fn shape(&self) -> Vec<usize> {
        self.info.shape()
    }

    /// Dequantizes the whole tensor to f32, row-major in [`Self::shape`]
    /// (which is also the stored element order).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        self.check_supported()?;
        let mut out = vec![0f32; self.info.n_elements];
        self.dequantize_into(self.data, &mut out)?;
        finite_weights(&self.info.name, out)
    }

    /// Dequantizes rows `rows` of the tensor seen as a matrix
    /// `[n_elements / dims[0], dims[0]]` (e.g. a few token embeddings) into
    /// a row-major `[rows.len(), dims[0]]` vector.
    pub fn rows_f32(&self, rows: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let cols = self.info.dims[0] as usize;
        let n_rows = self.info.n_elements.checked_div(cols).unwrap_or(0);
        if rows.start > rows.end || rows.end > n_rows {
            return Err(ImportError::InvalidConfig(format!(
                "rows {rows:?} out of range for tensor {:?} with {n_rows} rows",
                self.info.name
            )));
        }
        self.check_supported()?;
        let row_bytes = self.info.n_bytes.checked_div(n_rows).unwrap_or(0);
        let bytes = &self.data[rows.start * row_bytes..rows.end * row_bytes];
        let mut out = vec![0f32; rows.len() * cols];
        self.dequantize_into(bytes, &mut out)?;
        finite_weights(&self.info.name, out)
    }

    /// Dequantizes column `column` of the tensor seen as a matrix
    /// `[n_elements / dims[0], dims[0]]`: one element per row, decoded alone from
    /// the block that holds it (an outlier shadow reads one input channel's
    /// weights this way, on demand, from the memory map).
    pub fn column_f32(&self, column: usize) -> Result<Vec<f32>> {
        let cols = self.info.dims[0] as usize;
        if column >= cols {
            return Err(ImportError::InvalidConfig(format!(
                "column {column} out of range for tensor {:?} with {cols} columns",
                self.info.name
            )));
        }
        self.check_supported()?;
        let n_rows = self.info.n_elements / cols;
        let block = self.info.ty.block_size() as usize;
        let block_bytes = self.info.ty.type_size() as usize;
        // GGUF rows are whole blocks (checked when the header was parsed).
        let row_bytes = cols / block * block_bytes;
        let at = column / block * block_bytes;
        let cannot = || {
            ImportError::InvalidConfig(format!(
                "tensor {:?}: cannot decode column {column} of its {:?} blocks",
                self.info.name, self.info.ty
            ))
        };
        // The type, the block length and the index in the block are the same for every
        // row: checked once here, on the first row.
        let first = self.data.get(at..at + block_bytes).ok_or_else(cannot)?;
        dtype::dequantize_element(self.info.ty, first, column % block).ok_or_else(cannot)?;
        let column: Vec<f32> = (0..n_rows)
            .map(|row| {
                let start = row * row_bytes + at;
                dtype::decode_element(
                    self.info.ty,
                    &self.data[start..start + block_bytes],
                    column % block,
                )
                .ok_or_else(cannot)
            })
            .collect::<Result<_>>()?;
        finite_weights(&self.info.name, column)
    }

    fn check_supported(&self) -> Result<()> {
        if self.info.ty.is_supported() {
            Ok(())
        } else {
            Err(ImportError::UnsupportedTensorType {
                name: self.info.name.clone(),
                ty: self.info.ty,
            })
        }
    }

    fn dequantize_into(&self, bytes: &[u8], out: &mut [f32]) -> Result<()> {
        self.check_supported()?;
        // Lengths agree by construction (parse checked the sizes).
        if dtype::dequantize(self.info.ty, bytes, out) {
            Ok(())
        } else {
            Err(ImportError::InvalidConfig(format!(
                "tensor {:?}: {} bytes do not hold {} {:?} elements",
                self.info.name,
                bytes.len(),
                out.len(),
                self.info.ty
            )))
        }
    }
}
