//! The library's [`Progress`] drawn as an indicatif bar on stderr, and only when stderr is
//! a terminal: piped or redirected output stays clean.

use std::io::IsTerminal;
use std::time::Duration;

use hetsched::progress::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar on stderr counting steps of one kind ("prefills", "settings").
pub struct Bar(ProgressBar);

impl Bar {
    /// A bar counting `unit`s.
    pub fn new(unit: &str) -> Self {
        Self::styled(&format!(
            "{{bar:40}} {{pos}}/{{len}} {unit}, {{elapsed}} {{msg}}"
        ))
    }

    /// A spinner for work whose steps are few and long (`what`, e.g. loading a model),
    /// redrawn on its own so it shows the work is alive.
    pub fn spinner(what: &str) -> Self {
        let bar = Self::styled(&format!("{{spinner}} {what} {{pos}}/{{len}}, {{elapsed}}"));
        bar.0.enable_steady_tick(Duration::from_millis(120));
        bar
    }

    fn styled(template: &str) -> Self {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self(bar)
    }
}

impl Progress for Bar {
    fn set_len(&mut self, total: u64) {
        self.0.set_length(total);
    }
    fn inc(&mut self, steps: u64) {
        self.0.inc(steps);
    }
    fn set_message(&mut self, message: &str) {
        self.0.set_message(message.to_owned());
    }
    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}

impl Drop for Bar {
    /// A bar left by an error is cleared too, so the error line stands alone.
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
