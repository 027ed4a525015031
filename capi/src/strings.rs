//! UTF-8 strings in and out. Strings in are NUL-terminated UTF-8 the caller owns and the
//! library only reads during the call. Strings out are allocated by the library and
//! belong to the caller, who frees each with `hs_string_free` (never `free`): the library
//! keeps the set of strings it handed out, so a double free or a foreign pointer is a
//! status, not heap corruption.

use std::collections::HashSet;
use std::ffi::{CStr, CString, c_char};
use std::sync::LazyLock;

use parking_lot::Mutex;

use crate::error::{CapiError, guarded, hs_status};

static HANDED_OUT: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(Default::default);

/// Reads the NUL-terminated UTF-8 string `ptr`.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string valid for the call.
pub(crate) unsafe fn str_arg<'a>(
    ptr: *const c_char,
    name: &'static str,
) -> Result<&'a str, CapiError> {
    if ptr.is_null() {
        return Err(CapiError::Null(name));
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string alive for the call.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str()
        .map_err(|source| CapiError::Utf8 { name, source })
}

/// Like [`str_arg`], but NULL reads as `None`.
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn optional_str_arg<'a>(
    ptr: *const c_char,
    name: &'static str,
) -> Result<Option<&'a str>, CapiError> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: as this function's contract.
    unsafe { str_arg(ptr, name) }.map(Some)
}

/// Checks an out-pointer for NULL and gives it back as a reference.
///
/// # Safety
/// `ptr` is NULL or valid for writes of a `T` for the call.
pub(crate) unsafe fn out_arg<'a, T>(
    ptr: *mut T,
    name: &'static str,
) -> Result<&'a mut T, CapiError> {
    // SAFETY: the caller promises a NULL or a pointer valid for writes; a `T` of the
    // types used here (pointers, integers) has no invalid bit patterns to read.
    unsafe { ptr.as_mut() }.ok_or(CapiError::Null(name))
}

/// Hands `text` to the caller as a NUL-terminated string it frees with `hs_string_free`
/// (an interior NUL, which C cannot carry, is written as U+FFFD).
pub(crate) fn string_out(text: String) -> *mut c_char {
    let text = CString::new(text.replace('\0', "\u{fffd}")).unwrap_or_default();
    let ptr = text.into_raw();
    HANDED_OUT.lock().insert(ptr.addr());
    ptr
}

/// Frees a string the library returned. NULL is a no-op; a pointer the library did not
/// hand out, or one already freed, is `HS_ERR_INVALID_ARGUMENT` and left alone.
///
/// # Safety
/// None beyond C's: the pointer is only compared with the library's own until found there.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_string_free(text: *mut c_char) -> hs_status {
    guarded(|| {
        if text.is_null() {
            return Ok(());
        }
        if !HANDED_OUT.lock().remove(&text.addr()) {
            return Err(CapiError::InvalidArgument(
                "hs_string_free: not a string from this library, or already freed".into(),
            ));
        }
        // SAFETY: `text` came from `CString::into_raw` in `string_out` and was in the set
        // of strings handed out, which it has just left: freed exactly once.
        drop(unsafe { CString::from_raw(text) });
        Ok(())
    })
}
