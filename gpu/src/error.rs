//! The crate's error type.

use thiserror::Error;

/// Everything that can go wrong in the GPU layer. Messages say what was wrong and what to do.
#[derive(Debug, Error)]
pub enum GpuError {
    /// No Vulkan loader, no instance, or no physical device with a compute queue.
    #[error(
        "no Vulkan device found ({0}): install mesa-vulkan-drivers for the CPU driver \
         lavapipe, or run on a machine with a GPU"
    )]
    NoDevice(String),
    /// A shape or slice length that does not fit the operation.
    #[error("bad shape for {op}: {problem}")]
    Shape {
        /// The operation that was called.
        op: &'static str,
        /// What is wrong with the shapes.
        problem: String,
    },
    /// One buffer would exceed the device's `maxStorageBufferRange`.
    #[error(
        "{what} needs {bytes} bytes in one storage buffer, more than this device's \
         maxStorageBufferRange of {limit} bytes: split the operation into smaller calls"
    )]
    BufferTooLarge {
        /// Which operand.
        what: String,
        /// Bytes it needs.
        bytes: u64,
        /// The device limit.
        limit: u64,
    },
    /// The kernel needs a device feature this device lacks.
    #[error("{kernel} needs {feature}, which this device does not offer")]
    Unsupported {
        /// The kernel asked for.
        kernel: &'static str,
        /// The missing feature or extension.
        feature: &'static str,
    },
    /// The kernel was left out of this build (its shader compiler was missing).
    #[error("{kernel} was not compiled into this build: {reason}")]
    NotBuilt {
        /// The kernel asked for.
        kernel: &'static str,
        /// Why, and what to install.
        reason: &'static str,
    },
    /// A Vulkan call failed (out of memory, device lost, validation of our own calls).
    #[error("Vulkan error while {context}: {message}")]
    Vulkan {
        /// What we were doing.
        context: &'static str,
        /// Vulkano's description.
        message: String,
    },
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, GpuError>;

/// Wraps any displayable vulkano error with what we were doing when it happened.
pub(crate) fn vk<E: std::fmt::Display + std::fmt::Debug>(
    context: &'static str,
) -> impl FnOnce(E) -> GpuError {
    move |e| GpuError::Vulkan {
        context,
        message: describe(&e),
    }
}

/// An error's text. vulkano's `Validated` displays only "a (non-)validation error occurred";
/// the details (which feature, which VUID, which driver error) are in its Debug form.
pub(crate) fn describe<E: std::fmt::Display + std::fmt::Debug>(e: &E) -> String {
    let message = e.to_string();
    if message.contains("validation error occurred") {
        format!("{e:?}")
    } else {
        message
    }
}

/// Shape error helper.
pub(crate) fn shape(op: &'static str, problem: impl Into<String>) -> GpuError {
    GpuError::Shape {
        op,
        problem: problem.into(),
    }
}
