//! The bounds-checked cursor [`GgufHeader::parse`](super::GgufHeader::parse) reads with.

use super::MAX_ARRAY_NESTING;
use super::metadata::{Metadata, MetadataArray, MetadataValue, ValueType};
use crate::error::{ImportError, Result};

/// A tensor info as stored: name, dims (innermost first), ggml type id, offset.
pub(super) type RawTensorInfo = (String, Vec<u64>, u32, u64);

/// Bounds-checked little-endian cursor; every overrun is [`ImportError::Truncated`].
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(super) fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let truncated = ImportError::Truncated {
            offset: self.pos,
            needed: n,
            len: self.bytes.len(),
        };
        let n = usize::try_from(n).map_err(|_| truncated)?;
        if n > self.remaining() {
            return Err(ImportError::Truncated {
                offset: self.pos,
                needed: n as u64,
                len: self.bytes.len(),
            });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(super) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(super) fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        let offset = self.pos;
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| ImportError::InvalidUtf8 { offset })
    }

    /// Checks that `count` items of at least `min_size` bytes each fit in the rest.
    pub(super) fn check_count(
        &self,
        what: &'static str,
        count: u64,
        min_size: usize,
    ) -> Result<usize> {
        let fits = (self.remaining() / min_size.max(1)) as u64;
        if count > fits {
            return Err(ImportError::AbsurdCount {
                what,
                count,
                offset: self.pos,
                remaining: self.remaining(),
            });
        }
        Ok(count as usize)
    }

    /// [`Self::check_count`], and `count` at most `max`: items the parser holds as
    /// larger values than their bytes (a one-byte array element becomes a whole
    /// `MetadataValue`) must be bounded before the vector holding them is reserved.
    pub(super) fn check_count_max(
        &self,
        what: &'static str,
        count: u64,
        min_size: usize,
        max: u64,
    ) -> Result<usize> {
        let count = self.check_count(what, count, min_size)?;
        crate::limits::check(what, count as u64, max)?;
        Ok(count)
    }

    pub(super) fn value_type(&mut self) -> Result<ValueType> {
        let offset = self.pos;
        let ty = self.u32()?;
        ValueType::from_id(ty).ok_or(ImportError::UnknownValueType { ty, offset })
    }

    pub(super) fn value(&mut self, ty: ValueType, depth: usize) -> Result<MetadataValue> {
        use MetadataValue as V;
        Ok(match ty {
            ValueType::U8 => V::U8(self.array::<1>()?[0]),
            ValueType::I8 => V::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => V::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => V::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => V::U32(self.u32()?),
            ValueType::I32 => V::I32(i32::from_le_bytes(self.array()?)),
            ValueType::F32 => V::F32(f32::from_le_bytes(self.array()?)),
            ValueType::U64 => V::U64(self.u64()?),
            ValueType::I64 => V::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F64 => V::F64(f64::from_le_bytes(self.array()?)),
            ValueType::Bool => {
                let offset = self.pos;
                match self.array::<1>()?[0] {
                    0 => V::Bool(false),
                    1 => V::Bool(true),
                    value => return Err(ImportError::InvalidBool { value, offset }),
                }
            }
            ValueType::String => V::String(self.string()?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(ImportError::NestingTooDeep { offset: self.pos });
                }
                let elem_type = self.value_type()?;
                let len = self.u64()?;
                let len = self.check_count_max(
                    "array length",
                    len,
                    elem_type.min_size(),
                    crate::limits::MAX_METADATA_ARRAY,
                )?;
                let mut values = Vec::with_capacity(len);
                for _ in 0..len {
                    values.push(self.value(elem_type, depth + 1)?);
                }
                V::Array(MetadataArray { elem_type, values })
            }
        })
    }

    /// The `n_kv` metadata key/value pairs; a key given twice is refused.
    pub(super) fn metadata(&mut self, n_kv: u64) -> Result<Metadata> {
        // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
        let n_kv = self.check_count_max(
            "metadata key/value count",
            n_kv,
            13,
            crate::limits::MAX_METADATA_ENTRIES,
        )?;
        let mut metadata = Metadata::default();
        for _ in 0..n_kv {
            let key = self.string()?;
            let ty = self.value_type()?;
            let value = self.value(ty, 0)?;
            if let Some(key) = metadata.insert(key, value) {
                return Err(ImportError::DuplicateKey(key));
            }
        }
        Ok(metadata)
    }

    /// The `n_tensors` tensor infos as stored, before any check of their contents.
    pub(super) fn raw_tensor_infos(&mut self, n_tensors: u64) -> Result<Vec<RawTensorInfo>> {
        // A tensor info takes at least 8 (name) + 4 + 8 (one dim) + 4 + 8 bytes.
        let n_tensors =
            self.check_count_max("tensor count", n_tensors, 32, crate::limits::MAX_TENSORS)?;
        let mut raw = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = self.string()?;
            let n_dims = self.u32()?;
            let n_dims = self.check_count("tensor dimension count", n_dims.into(), 8)?;
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(self.u64()?);
            }
            let ty = self.u32()?;
            let offset = self.u64()?;
            raw.push((name, dims, ty, offset));
        }
        Ok(raw)
    }
}
