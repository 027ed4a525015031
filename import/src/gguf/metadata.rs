//! GGUF metadata: value types, values and the key/value map with typed accessors.

use std::collections::BTreeMap;

use crate::error::{ImportError, Result};

/// Type tag of a metadata value (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// The type with GGUF id `id` (0..=12).
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Fewest bytes a value of this type occupies in a file.
    pub(super) fn min_size(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// An array metadata value: its element type and elements.
#[derive(Clone, Debug, PartialEq)]
pub struct MetadataArray {
    /// Type of every element.
    pub elem_type: ValueType,
    /// The elements, all of `elem_type`.
    pub values: Vec<MetadataValue>,
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetadataValue {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Self::U8(_) => ValueType::U8,
            Self::I8(_) => ValueType::I8,
            Self::U16(_) => ValueType::U16,
            Self::I16(_) => ValueType::I16,
            Self::U32(_) => ValueType::U32,
            Self::I32(_) => ValueType::I32,
            Self::F32(_) => ValueType::F32,
            Self::Bool(_) => ValueType::Bool,
            Self::String(_) => ValueType::String,
            Self::Array(_) => ValueType::Array,
            Self::U64(_) => ValueType::U64,
            Self::I64(_) => ValueType::I64,
            Self::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type holding a non-negative value, widened.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, widened to i64 (u64 values above `i64::MAX` give `None`).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float (or an integer), widened to f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// A bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array.
    pub fn as_array(&self) -> Option<&MetadataArray> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Short description for error messages (type and, for scalars, value).
    pub(super) fn describe(&self) -> String {
        match self {
            Self::String(s) if s.len() <= 40 => format!("string {s:?}"),
            Self::String(s) => format!("string of {} bytes", s.len()),
            Self::Array(a) => format!("array of {} {:?}", a.values.len(), a.elem_type),
            other => format!("{other:?}"),
        }
    }
}

/// The key/value metadata of a GGUF file, with typed accessors.
///
/// The `get_*` accessors return `Ok(None)` for an absent key and
/// [`ImportError::WrongKeyType`] for a present key of the wrong type; the
/// `require_*` ones turn absence into [`ImportError::MissingKey`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: BTreeMap<String, MetadataValue>,
}

impl Metadata {
    /// Inserts `key`; gives the key back (inserting nothing) if it is
    /// already present.
    pub(super) fn insert(&mut self, key: String, value: MetadataValue) -> Option<String> {
        if self.entries.contains_key(&key) {
            return Some(key);
        }
        self.entries.insert(key, value);
        None
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.entries.get(key)
    }

    /// All entries, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value under `key`, or [`ImportError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&MetadataValue> {
        self.get(key)
            .ok_or_else(|| ImportError::MissingKey(key.to_owned()))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        f: impl FnOnce(&'a MetadataValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| ImportError::WrongKeyType {
                key: key.to_owned(),
                expected,
                found: v.describe(),
            }),
        }
    }

    /// A non-negative integer of any width.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", MetadataValue::as_u64)
    }

    /// A float or integer, as f64.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", MetadataValue::as_f64)
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", MetadataValue::as_bool)
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", MetadataValue::as_str)
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.typed(key, "an array of strings", |v| {
            v.as_array()?.values.iter().map(|e| e.as_str()).collect()
        })
    }

    /// An array of integers, as i64.
    pub fn get_i64_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.typed(key, "an array of integers", |v| {
            v.as_array()?.values.iter().map(|e| e.as_i64()).collect()
        })
    }

    /// [`Self::get_u64`], required.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?
            .ok_or_else(|| ImportError::MissingKey(key.to_owned()))
    }

    /// [`Self::get_str`], required.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?
            .ok_or_else(|| ImportError::MissingKey(key.to_owned()))
    }
}
