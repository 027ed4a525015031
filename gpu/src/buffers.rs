//! Resident device matrices: upload once (weights), reuse across many kernel calls.
//!
//! Every matrix is row-major with its rows padded to a multiple of 16 bytes (`ld` elements),
//! the padding zero-filled. That lets the GEMM kernels read whole `vec4`/`uvec4` words without
//! per-element bounds checks along `k`, and makes zero padding harmless in dot products.
//! Elements narrower than 32 bits are packed little-endian into 32-bit words (two f16 or four
//! i8 per word), so the kernels need neither 8- nor 16-bit storage buffers: that is what lets
//! them run on lavapipe.

use half::f16;
use vulkano::buffer::Subbuffer;

use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::job::Job;

/// Element type of a [`GpuMatrix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// IEEE f32.
    F32,
    /// IEEE half precision, two per 32-bit word.
    F16,
    /// Signed 8-bit, four per 32-bit word.
    I8,
    /// Signed 32-bit (GEMM accumulators).
    I32,
}

impl Elem {
    /// Elements per 32-bit word.
    pub fn per_word(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 1,
            Elem::F16 => 2,
            Elem::I8 => 4,
        }
    }

    /// Row stride in elements for `cols` columns: rounded up to 16 bytes.
    pub fn ld(self, cols: usize) -> usize {
        cols.div_ceil(4 * self.per_word()) * 4 * self.per_word()
    }
}

/// A row-major `[rows, cols]` matrix resident in device memory.
#[derive(Clone, Debug)]
pub struct GpuMatrix {
    pub(crate) buf: Subbuffer<[u32]>,
    rows: usize,
    cols: usize,
    elem: Elem,
}

impl GpuMatrix {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (logical; rows are padded to [`GpuMatrix::ld`]).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row stride in elements.
    pub fn ld(&self) -> usize {
        self.elem.ld(self.cols)
    }

    /// Element type.
    pub fn elem(&self) -> Elem {
        self.elem
    }

    /// Row stride in 32-bit words.
    pub(crate) fn ld_words(&self) -> usize {
        self.ld() / self.elem.per_word()
    }

    /// The matrix's first `rows` rows, sharing its memory (a batch recorded for fewer
    /// rows than its buffers were made for).
    ///
    /// # Errors
    /// [`GpuError::Shape`](crate::GpuError::Shape) for 0 rows or more than the matrix has.
    pub fn first_rows(&self, rows: usize) -> crate::Result<GpuMatrix> {
        if rows == 0 || rows > self.rows {
            return Err(crate::GpuError::Shape {
                op: "first rows",
                problem: format!("{rows} rows of a {}-row matrix", self.rows),
            });
        }
        let words = (rows * self.ld_words()) as u64;
        Ok(GpuMatrix {
            buf: self.buf.clone().slice(0..words),
            rows,
            cols: self.cols,
            elem: self.elem,
        })
    }
}

/// One device buffer holding several matrices at offsets a memory plan chose
/// ([`GpuContext::alloc_arena`]).
#[derive(Clone, Debug)]
pub struct GpuArena {
    buf: Subbuffer<[u32]>,
    alignment: u64,
}

impl GpuArena {
    /// Bytes in the arena.
    pub fn bytes(&self) -> u64 {
        self.buf.size()
    }

    /// The alignment every matrix offset must have (the device's storage-binding offset
    /// alignment, at least 4).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// A `[rows, cols]` matrix at byte `offset`. Only unpadded rows (`cols` a multiple of
    /// the row padding, [`Elem::ld`]): another matrix's data may lie where padding would
    /// be, and chained GEMMs read padding as zeros.
    ///
    /// # Errors
    /// [`GpuError::Shape`](crate::GpuError::Shape) for a misaligned offset, padded rows, or a matrix past the end.
    pub fn matrix(&self, offset: u64, rows: usize, cols: usize, elem: Elem) -> Result<GpuMatrix> {
        let shape = |problem: String| crate::GpuError::Shape {
            op: "arena matrix",
            problem,
        };
        if !offset.is_multiple_of(self.alignment) {
            return Err(shape(format!(
                "offset {offset} is not a multiple of the device's storage offset alignment {}",
                self.alignment
            )));
        }
        if elem.ld(cols) != cols {
            return Err(shape(format!(
                "{cols} columns would be padded to {}; arena matrices need unpadded rows",
                elem.ld(cols)
            )));
        }
        let words = (rows * cols / elem.per_word()) as u64;
        let first = offset / 4;
        if first + words.max(1) > self.buf.len() {
            return Err(shape(format!(
                "a [{rows}, {cols}] matrix at byte {offset} ends past the arena's {} bytes",
                self.bytes()
            )));
        }
        Ok(GpuMatrix {
            buf: self.buf.clone().slice(first..first + words.max(1)),
            rows,
            cols,
            elem,
        })
    }
}

/// Packs a row-major `[rows, cols]` matrix into padded 32-bit words, `per_word` elements of
/// `bits` bits each (from `to_bits`) per word.
fn pack<T: Copy>(
    data: &[T],
    rows: usize,
    cols: usize,
    elem: Elem,
    to_bits: impl Fn(T) -> u32,
) -> Vec<u32> {
    let per = elem.per_word();
    let bits = 32 / per;
    let ld_words = elem.ld(cols) / per;
    let mut words = vec![0u32; rows * ld_words];
    for (r, row) in data.chunks_exact(cols.max(1)).take(rows).enumerate() {
        let out = &mut words[r * ld_words..(r + 1) * ld_words];
        for (c, &v) in row.iter().enumerate() {
            out[c / per] |= to_bits(v) << ((c % per) * bits);
        }
    }
    words
}

/// Unpacks padded words back to `[rows, cols]`.
pub(crate) fn unpack<T>(
    words: &[u32],
    rows: usize,
    cols: usize,
    elem: Elem,
    from_bits: impl Fn(u32) -> T,
) -> Vec<T> {
    let per = elem.per_word();
    let bits = 32 / per;
    let mask = if bits == 32 {
        u32::MAX
    } else {
        (1u32 << bits) - 1
    };
    let ld_words = elem.ld(cols) / per;
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let w = words[r * ld_words + c / per];
            out.push(from_bits((w >> ((c % per) * bits)) & mask));
        }
    }
    out
}

pub(crate) fn pack_f32(data: &[f32], rows: usize, cols: usize) -> Vec<u32> {
    pack(data, rows, cols, Elem::F32, f32::to_bits)
}

pub(crate) fn pack_f16(data: &[f16], rows: usize, cols: usize) -> Vec<u32> {
    pack(data, rows, cols, Elem::F16, |h| u32::from(h.to_bits()))
}

pub(crate) fn pack_i8(data: &[i8], rows: usize, cols: usize) -> Vec<u32> {
    pack(data, rows, cols, Elem::I8, |b| u32::from(b as u8))
}

pub(crate) fn unpack_f32(words: &[u32], rows: usize, cols: usize) -> Vec<f32> {
    unpack(words, rows, cols, Elem::F32, f32::from_bits)
}

pub(crate) fn unpack_i32(words: &[u32], rows: usize, cols: usize) -> Vec<i32> {
    unpack(words, rows, cols, Elem::I32, |w| w as i32)
}

pub(crate) fn unpack_i8(words: &[u32], rows: usize, cols: usize) -> Vec<i8> {
    unpack(words, rows, cols, Elem::I8, |w| w as u8 as i8)
}

fn check_len(op: &'static str, len: usize, rows: usize, cols: usize) -> Result<()> {
    if len != rows * cols {
        return Err(shape(
            op,
            format!(
                "slice has {len} elements, [{rows}, {cols}] needs {}",
                rows * cols
            ),
        ));
    }
    Ok(())
}

impl GpuContext {
    fn upload_words(
        &self,
        words: &[u32],
        rows: usize,
        cols: usize,
        elem: Elem,
        what: &str,
    ) -> Result<GpuMatrix> {
        let mut job = Job::new(self)?;
        let buf = job.upload(words, what)?;
        job.finish()?;
        Ok(GpuMatrix {
            buf,
            rows,
            cols,
            elem,
        })
    }

    /// Uploads a row-major `[rows, cols]` matrix of u32 values (token ids, positions) as
    /// [`Elem::I32`] words.
    pub fn upload_u32(&self, data: &[u32], rows: usize, cols: usize) -> Result<GpuMatrix> {
        check_len("upload_u32", data.len(), rows, cols)?;
        let words = pack(data, rows, cols, Elem::I32, |v| v);
        self.upload_words(&words, rows, cols, Elem::I32, "u32 matrix")
    }

    /// Uploads a row-major `[rows, cols]` f32 matrix (e.g. weights `[n, k]`) to device memory.
    pub fn upload_f32(&self, data: &[f32], rows: usize, cols: usize) -> Result<GpuMatrix> {
        check_len("upload_f32", data.len(), rows, cols)?;
        self.upload_words(
            &pack_f32(data, rows, cols),
            rows,
            cols,
            Elem::F32,
            "f32 matrix",
        )
    }

    /// Uploads a row-major `[rows, cols]` f16 matrix.
    pub fn upload_f16(&self, data: &[f16], rows: usize, cols: usize) -> Result<GpuMatrix> {
        check_len("upload_f16", data.len(), rows, cols)?;
        self.upload_words(
            &pack_f16(data, rows, cols),
            rows,
            cols,
            Elem::F16,
            "f16 matrix",
        )
    }

    /// Uploads a row-major `[rows, cols]` f32 matrix as f16, each value rounded to nearest
    /// (f32 weights for the f16 kernels, without the caller depending on `half`).
    pub fn upload_f32_as_f16(&self, data: &[f32], rows: usize, cols: usize) -> Result<GpuMatrix> {
        let halves: Vec<f16> = data.iter().map(|&v| f16::from_f32(v)).collect();
        self.upload_f16(&halves, rows, cols)
    }

    /// Uploads a row-major `[rows, cols]` i8 matrix (quantized weights or activations).
    pub fn upload_i8(&self, data: &[i8], rows: usize, cols: usize) -> Result<GpuMatrix> {
        check_len("upload_i8", data.len(), rows, cols)?;
        self.upload_words(
            &pack_i8(data, rows, cols),
            rows,
            cols,
            Elem::I8,
            "i8 matrix",
        )
    }

    /// A zero-filled device matrix, for kernel outputs.
    pub fn alloc_matrix(&self, rows: usize, cols: usize, elem: Elem) -> Result<GpuMatrix> {
        let words = rows * elem.ld(cols) / elem.per_word();
        let buf = self.alloc_words(words as u64, "output matrix")?;
        // Device memory starts undefined; the padding must be zero for chained GEMMs.
        let mut job = Job::new(self)?;
        job.fill_zero(&buf)?;
        job.finish()?;
        Ok(GpuMatrix {
            buf,
            rows,
            cols,
            elem,
        })
    }

    /// A zero-filled device buffer of `bytes` that matrices share at planned offsets
    /// ([`GpuArena::matrix`]): one allocation for values whose lifetimes never overlap where
    /// their bytes do. [`GpuError::BufferTooLarge`](crate::GpuError::BufferTooLarge) past one binding's range.
    pub fn alloc_arena(&self, bytes: u64) -> Result<GpuArena> {
        let buf = self.alloc_words(bytes.div_ceil(4), "arena")?;
        let mut job = Job::new(self)?;
        job.fill_zero(&buf)?;
        job.finish()?;
        Ok(GpuArena {
            buf,
            alignment: self.info.storage_offset_alignment.max(4),
        })
    }

    pub(crate) fn matrix_from(
        buf: Subbuffer<[u32]>,
        rows: usize,
        cols: usize,
        elem: Elem,
    ) -> GpuMatrix {
        GpuMatrix {
            buf,
            rows,
            cols,
            elem,
        }
    }

    fn download_words(&self, m: &GpuMatrix) -> Result<Vec<u32>> {
        let mut job = Job::new(self)?;
        let i = job.download(&m.buf);
        Ok(job.finish()?.downloads.swap_remove(i))
    }

    /// Reads an f32 matrix back as a dense row-major `Vec`.
    pub fn download_f32(&self, m: &GpuMatrix) -> Result<Vec<f32>> {
        if m.elem != Elem::F32 {
            return Err(shape("download_f32", format!("matrix holds {:?}", m.elem)));
        }
        Ok(unpack_f32(&self.download_words(m)?, m.rows, m.cols))
    }

    /// Reads an i32 matrix back as a dense row-major `Vec`.
    pub fn download_i32(&self, m: &GpuMatrix) -> Result<Vec<i32>> {
        if m.elem != Elem::I32 {
            return Err(shape("download_i32", format!("matrix holds {:?}", m.elem)));
        }
        Ok(unpack_i32(&self.download_words(m)?, m.rows, m.cols))
    }

    /// Reads an i8 matrix back as a dense row-major `Vec`.
    pub fn download_i8(&self, m: &GpuMatrix) -> Result<Vec<i8>> {
        if m.elem != Elem::I8 {
            return Err(shape("download_i8", format!("matrix holds {:?}", m.elem)));
        }
        Ok(unpack_i8(&self.download_words(m)?, m.rows, m.cols))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_unpack_roundtrip_with_padding() {
        let data: Vec<i8> = (0..3 * 5).map(|i| (i as i8) * 9 - 60).collect();
        let words = pack_i8(&data, 3, 5);
        assert_eq!(words.len(), 3 * 4); // 5 columns pad to 16 bytes = 4 words per row
        assert_eq!(unpack_i8(&words, 3, 5), data);
        let f: Vec<f32> = (0..7).map(|i| i as f32 * 0.5 - 1.0).collect();
        assert_eq!(unpack_f32(&pack_f32(&f, 1, 7), 1, 7), f);
        assert_eq!(Elem::F16.ld(9), 16);
        assert_eq!(Elem::F32.ld(576), 576);
    }
}
