//! Ctrl-C in the commands that run long: the first SIGINT sets a [`CancelFlag`] that the
//! command checks at its safe points (the engine between subgraphs, generation between
//! tokens), so it stops within a subgraph's time, prints what finished and exits with
//! the conventional status 130; a second SIGINT exits at once. A command that installs
//! nothing keeps the default: the first SIGINT ends it at once.

use std::sync::OnceLock;

use hetsched::cancel::CancelFlag;
use signal_hook::consts::SIGINT;

use crate::CliError;

/// The exit status of a command ended by SIGINT (128 + the signal's number).
pub const INTERRUPTED_STATUS: u8 = 130;

/// The process's Ctrl-C flag, once installed.
static FLAG: OnceLock<CancelFlag> = OnceLock::new();

/// Installs the Ctrl-C handling (once per process) and returns its flag.
pub fn on_ctrl_c() -> Result<CancelFlag, CliError> {
    if let Some(flag) = FLAG.get() {
        return Ok(flag.clone());
    }
    let flag = CancelFlag::new();
    let installed = |error: std::io::Error| CliError::Signal { error };
    // Registered first, so it sees the flag as the previous SIGINT left it: a second
    // SIGINT exits at once.
    signal_hook::flag::register_conditional_shutdown(
        SIGINT,
        i32::from(INTERRUPTED_STATUS),
        flag.shared().clone(),
    )
    .map_err(installed)?;
    signal_hook::flag::register(SIGINT, flag.shared().clone()).map_err(installed)?;
    Ok(FLAG.get_or_init(|| flag).clone())
}

/// Whether Ctrl-C was pressed since [`on_ctrl_c`] was installed.
pub fn interrupted() -> bool {
    FLAG.get().is_some_and(CancelFlag::is_cancelled)
}
