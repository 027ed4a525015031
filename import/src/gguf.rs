//! GGUF v2/v3 container: header, metadata, tensor infos, zero-copy tensor data.
//!
//! A GGUF file is (all little-endian):
//!
//! ```text
//! "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//! n_kv × (string key | u32 value_type | value)
//! n_tensors × (string name | u32 n_dims | n_dims × u64 dim | u32 ggml_type | u64 offset)
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset (offset a multiple of the alignment)
//! ```
//!
//! Strings are `u64 length | UTF-8 bytes`; an array value is
//! `u32 element_type | u64 length | elements`.
//!
//! **Dimensions are stored innermost first** (ggml's `ne[0]` is the
//! contiguous one): a `[rows, cols]` row-major matrix is stored as
//! `dims = [cols, rows]`. [`TensorInfo::dims`] keeps the stored order;
//! [`TensorInfo::shape`] gives the conventional outermost-first shape. A
//! linear layer weight with `dims = [in_features, out_features]` is thus the
//! row-major `[out_features, in_features]` matrix the kernels expect.
//!
//! [`GgufHeader::parse`] validates everything a later read could trip on (every
//! count against the bytes left, every tensor's size, alignment and bounds),
//! so that no input makes it, or [`TensorView::to_f32`], panic.

pub mod dtype;
pub mod kquant;
pub mod metadata;
mod reader;
mod view;
pub mod writer;

use std::fmt;
use std::path::Path;

use memmap2::Mmap;

pub use dtype::GgmlType;
pub use metadata::{Metadata, MetadataArray, MetadataValue, ValueType};
use reader::{RawTensorInfo, Reader};
pub use view::TensorView;

use super::error::{ImportError, Result};

/// The magic bytes at offset 0.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and tensor offsets when `general.alignment`
/// is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of array values accepted (arrays of arrays of ...).
pub const MAX_ARRAY_NESTING: usize = 8;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Where a tensor is and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions **innermost first**, as stored (`dims[0]` is contiguous).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data, relative to the start of the data section.
    pub offset: u64,
    /// Number of elements (product of `dims`; fits in `usize`).
    pub n_elements: usize,
    /// Number of bytes of the data (fits in the file).
    pub n_bytes: usize,
}

impl TensorInfo {
    /// The shape **outermost first** (`dims` reversed): a weight stored with
    /// `dims = [in, out]` has shape `[out, in]`, row-major.
    pub fn shape(&self) -> Vec<usize> {
        // Every dim is <= n_elements or the product is 0; parse checked
        // that each fits usize.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// Everything before the tensor data, parsed and validated.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Key/value metadata.
    pub metadata: Metadata,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and of tensor offsets.
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_offset: usize,
}

impl GgufHeader {
    /// Parses and validates the header of the GGUF file `bytes`.
    ///
    /// Besides syntax, checks: version 2 or 3; every count against the bytes
    /// left; unique keys and tensor names; `general.alignment` a power of two;
    /// 1 to 4 dims per tensor with a `usize` element count whose innermost
    /// dim is a multiple of the type's block size; a known ggml type; offsets
    /// aligned; every tensor's bytes inside the file.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader { bytes, pos: 0 };
        let magic = r.take(4).map_err(|_| ImportError::BadMagic {
            found: bytes[..bytes.len().min(4)].to_vec(),
        })?;
        if magic != MAGIC {
            return Err(ImportError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(ImportError::UnsupportedVersion(version));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        let metadata = r.metadata(n_kv)?;
        let alignment = alignment(&metadata)?;
        let raw = r.raw_tensor_infos(n_tensors)?;
        let header_end = r.pos as u64;
        let data_offset = header_end
            .checked_next_multiple_of(alignment)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(ImportError::BadAlignment(alignment))?;
        if !raw.is_empty() && data_offset > bytes.len() {
            return Err(ImportError::Truncated {
                offset: r.pos,
                needed: data_offset as u64 - header_end,
                len: bytes.len(),
            });
        }

        let tensors = tensor_infos(raw, alignment, data_offset, bytes.len())?;
        check_layout(
            &tensors,
            alignment,
            bytes.len() - data_offset.min(bytes.len()),
        )?;
        Ok(Self {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        })
    }
}

/// `general.alignment`, or the default: a power of two either way.
fn alignment(metadata: &Metadata) -> Result<u64> {
    Ok(match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let a = v.as_u64().ok_or_else(|| ImportError::WrongKeyType {
                key: "general.alignment".into(),
                expected: "an unsigned integer",
                found: v.describe(),
            })?;
            if !a.is_power_of_two() {
                return Err(ImportError::BadAlignment(a));
            }
            a
        }
    })
}

/// Each raw tensor info checked and sized against the data section; names must be unique.
fn tensor_infos(
    raw: Vec<RawTensorInfo>,
    alignment: u64,
    data_offset: usize,
    file_len: usize,
) -> Result<Vec<TensorInfo>> {
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(raw.len());
    let mut names = std::collections::HashSet::with_capacity(raw.len());
    for (name, dims, ty_id, offset) in raw {
        if !names.insert(name.clone()) {
            return Err(ImportError::DuplicateTensor(name));
        }
        let info = tensor_info(name, dims, ty_id, offset, alignment, data_offset, file_len)?;
        tensors.push(info);
    }
    Ok(tensors)
}

/// Checks that the tensors tile the data section: no two share bytes, and each one's size
/// (its type × shape) fills the space up to the next tensor, or the end of the file,
/// but for padding. A tensor retyped to a type of another size, or offsets edited to
/// overlap, fail here instead of decoding another tensor's bytes.
fn check_layout(tensors: &[TensorInfo], alignment: u64, data_len: usize) -> Result<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| (t.offset, t.n_bytes));
    for (i, t) in order.iter().enumerate() {
        let end = t.offset + t.n_bytes as u64;
        let (next_start, next) = match order.get(i + 1) {
            Some(n) => (n.offset, Some(n)),
            None => (data_len as u64, None),
        };
        if end > next_start {
            let other = next.map_or_else(String::new, |n| n.name.clone());
            return Err(ImportError::TensorsOverlap {
                first: t.name.clone(),
                second: other,
                end,
                start: next_start,
            });
        }
        if next_start - end >= alignment.max(1) {
            return Err(ImportError::TensorSizeMismatch {
                name: t.name.clone(),
                ty: t.ty,
                size: t.n_bytes as u64,
                space: next_start - t.offset,
            });
        }
    }
    Ok(())
}

fn tensor_info(
    name: String,
    dims: Vec<u64>,
    ty_id: u32,
    offset: u64,
    alignment: u64,
    data_offset: usize,
    len: usize,
) -> Result<TensorInfo> {
    let bad =
        |name: String, dims: Vec<u64>, reason| ImportError::BadTensorDims { name, dims, reason };
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(bad(name, dims, "a tensor has 1 to 4 dimensions"));
    }
    let Some(ty) = GgmlType::from_id(ty_id) else {
        return Err(ImportError::UnknownTensorType { name, ty: ty_id });
    };
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| {
            usize::try_from(n).is_ok() && dims.iter().all(|&d| usize::try_from(d).is_ok())
        });
    let Some(n_elements) = n_elements else {
        return Err(bad(name, dims, "the element count overflows"));
    };
    if !dims[0].is_multiple_of(ty.block_size()) {
        return Err(bad(
            name,
            dims,
            "the innermost dim is not a multiple of the type's block size",
        ));
    }
    let Some(n_bytes) = ty.bytes_for(n_elements) else {
        return Err(bad(name, dims, "the byte size overflows"));
    };
    if !offset.is_multiple_of(alignment) {
        return Err(ImportError::MisalignedOffset {
            name,
            offset,
            alignment,
        });
    }
    let start = (data_offset as u64).checked_add(offset);
    let end = start.and_then(|s| s.checked_add(n_bytes));
    match (start, end) {
        (Some(_), Some(end)) if end <= len as u64 => {}
        _ => {
            return Err(ImportError::TensorOutOfBounds {
                name,
                start: (data_offset as u64).saturating_add(offset),
                size: n_bytes,
                len,
            });
        }
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_elements: n_elements as usize,
        n_bytes: n_bytes as usize,
    })
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

/// A GGUF file: the bytes (memory-mapped or owned) and their parsed header.
///
/// Tensor data is never copied: [`TensorView::data`] borrows from the map.
pub struct GgufFile {
    bytes: Bytes,
    header: GgufHeader,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("len", &self.bytes().len())
            .field("version", &self.header.version)
            .field("metadata_keys", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

/// Maps `file` read-only.
#[allow(unsafe_code)]
pub(crate) fn map_read_only(file: &std::fs::File) -> std::io::Result<Mmap> {
    // SAFETY: the file was opened read-only by `GgufFile::open` and this
    // program never writes to it while the map lives. Model files are not
    // expected to be modified by other processes while loaded; if one were
    // truncated under us, reads of the map could fault (the usual caveat of
    // memory-mapped I/O), which is accepted for read-only model weights.
    unsafe { Mmap::map(file) }
}

impl GgufFile {
    /// Memory-maps and parses the GGUF file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| ImportError::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let map = map_read_only(&file).map_err(io)?;
        let header = GgufHeader::parse(&map)?;
        Ok(Self {
            bytes: Bytes::Mapped(map),
            header,
        })
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let header = GgufHeader::parse(&bytes)?;
        Ok(Self {
            bytes: Bytes::Owned(bytes),
            header,
        })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The key/value metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Tensor infos in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.header.tensors.iter().map(|info| self.view(info))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        let start = self.header.data_offset + info.offset as usize;
        TensorView {
            info,
            // In bounds: checked by `GgufHeader::parse`.
            data: &self.bytes()[start..start + info.n_bytes],
        }
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.header
            .tensors
            .iter()
            .find(|t| t.name == name)
            .map(|info| self.view(info))
    }

    /// The tensor named `name`, or [`ImportError::MissingTensor`].
    pub fn require_tensor(&self, name: &str) -> Result<TensorView<'_>> {
        self.tensor(name)
            .ok_or_else(|| ImportError::MissingTensor(name.to_owned()))
    }
}
