//! Handles. What a C host holds is a key into a registry of live objects, never an
//! address: keys come from a counter and are never reused, so every call looks its
//! handle up and tells apart a live handle of the right kind, a live handle of another
//! kind (`HS_ERR_WRONG_HANDLE_KIND`) and one never created or already destroyed
//! (`HS_ERR_INVALID_HANDLE`) without reading memory the host passed. A lookup clones the
//! object's `Arc`, so a destroy on one thread never frees an object a call on another
//! thread still uses: the object goes when its last call returns.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use parking_lot::RwLock;

use crate::error::CapiError;

/// A kind of object behind a handle, and the opaque C type that names it.
pub(crate) trait HandleKind: Any + Send + Sync + Sized {
    /// The kind's name in messages ("scene").
    const KIND: &'static str;
    /// The opaque C struct its handles point to.
    type C;
}

struct Entry {
    kind: &'static str,
    object: Arc<dyn Any + Send + Sync>,
}

static LIVE: LazyLock<RwLock<HashMap<usize, Entry>>> = LazyLock::new(Default::default);

/// Keys start far from small integers and step by 16, so that a handle looks like an
/// aligned pointer to tools, and a small integer passed by mistake is never live.
const FIRST_KEY: usize = 0x10_0000;
const KEY_STEP: usize = 16;
static NEXT_KEY: AtomicUsize = AtomicUsize::new(FIRST_KEY);

/// Registers `object`; the returned handle is live until [`destroy`].
pub(crate) fn register<T: HandleKind>(object: T) -> *mut T::C {
    let key = NEXT_KEY.fetch_add(KEY_STEP, Ordering::Relaxed);
    LIVE.write().insert(
        key,
        Entry {
            kind: T::KIND,
            object: Arc::new(object),
        },
    );
    // The handle is the key itself, never dereferenced (std::ptr::without_provenance).
    std::ptr::without_provenance_mut(key)
}

/// The object behind `handle`, if it is a live handle of kind `T`.
pub(crate) fn get<T: HandleKind>(
    handle: *const T::C,
    name: &'static str,
) -> Result<Arc<T>, CapiError> {
    if handle.is_null() {
        return Err(CapiError::Null(name));
    }
    let live = LIVE.read();
    let entry = live
        .get(&handle.addr())
        .ok_or(CapiError::InvalidHandle { name })?;
    if entry.kind != T::KIND {
        return Err(CapiError::WrongKind {
            name,
            expected: T::KIND,
            found: entry.kind,
        });
    }
    entry
        .object
        .clone()
        .downcast::<T>()
        .map_err(|_| CapiError::Internal(format!("handle kind {} holds another type", T::KIND)))
}

/// Ends `handle`: later calls with it fail with `HS_ERR_INVALID_HANDLE`. NULL is a no-op
/// (as `free(NULL)` is).
pub(crate) fn destroy<T: HandleKind>(
    handle: *mut T::C,
    name: &'static str,
) -> Result<(), CapiError> {
    if handle.is_null() {
        return Ok(());
    }
    // Checks the kind first: destroying a plan through `hs_scene_destroy` is an error.
    get::<T>(handle, name)?;
    LIVE.write().remove(&handle.addr());
    Ok(())
}

/// Live handles of every kind (the tests check that examples leave none).
pub(crate) fn live_count() -> usize {
    LIVE.read().len()
}
