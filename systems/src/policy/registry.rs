//! Policies by name: the built-in ones, and any a user registers.

use std::fmt;

use thiserror::Error;

use super::{Balance, CriticalPathFirst, Heft, InOrder, Layerwise, Lookahead, Peer, Policy, Stall};

/// The policy scenes and the CLI use when none is named.
pub const DEFAULT_POLICY: &str = "balance";

/// Makes a fresh policy (its state is per run).
pub type PolicyFactory = Box<dyn Fn() -> Box<dyn Policy> + Send + Sync>;

/// A name no registered policy has.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("unknown policy `{name}`; choose one of: {known}")]
pub struct UnknownPolicy {
    /// The name asked for.
    pub name: String,
    /// The registered names, comma-separated.
    pub known: String,
}

struct Entry {
    name: String,
    summary: String,
    make: PolicyFactory,
}

/// Policies by name, in the order reports list them.
pub struct PolicyRegistry {
    entries: Vec<Entry>,
}

impl PolicyRegistry {
    /// An empty registry.
    pub fn empty() -> Self {
        PolicyRegistry {
            entries: Vec::new(),
        }
    }

    /// The built-in policies (docs/policies.md), `balance` (the default) last.
    pub fn builtin() -> Self {
        let mut r = Self::empty();
        r.register(
            "stall",
            "seed 000's NPU-stall contribution (Eq. 6), exactly",
            || Box::new(Stall),
        );
        r.register(
            "inorder",
            "each processor in (chunk, stage) order, no skipping",
            || Box::new(InOrder::default()),
        );
        r.register(
            "layerwise",
            "one job at a time, every chunk through a layer before the next",
            || Box::new(Layerwise::default()),
        );
        r.register(
            "peer",
            "the peer's fixed two-chunk pipeline with barriers",
            || Box::new(Peer::default()),
        );
        r.register("heft", "HEFT list scheduling by upward rank", || {
            Box::new(Heft)
        });
        r.register("cpf", "critical-path-first", || Box::new(CriticalPathFirst));
        r.register(
            "lookahead",
            "ours: Eq. 6 feeding an idle CPU, ties by rank",
            || Box::new(Lookahead),
        );
        r.register(
            "balance",
            "ours, the default: lookahead with load balance",
            || Box::new(Balance::default()),
        );
        r
    }

    /// Adds (or replaces) the policy called `name`. `make` builds a fresh one per run.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        summary: impl Into<String>,
        make: impl Fn() -> Box<dyn Policy> + Send + Sync + 'static,
    ) -> &mut Self {
        let entry = Entry {
            name: name.into(),
            summary: summary.into(),
            make: Box::new(make),
        };
        match self.entries.iter_mut().find(|e| e.name == entry.name) {
            Some(existing) => *existing = entry,
            None => self.entries.push(entry),
        }
        self
    }

    /// A fresh policy by name.
    ///
    /// # Errors
    /// [`UnknownPolicy`], listing the registered names.
    pub fn create(&self, name: &str) -> Result<Box<dyn Policy>, UnknownPolicy> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .map(|e| (e.make)())
            .ok_or_else(|| self.unknown(name))
    }

    /// Whether a policy of that name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.name == name)
    }

    /// Checks a name without building the policy (for parsing scenes and command lines).
    ///
    /// # Errors
    /// [`UnknownPolicy`], listing the registered names.
    pub fn check(&self, name: &str) -> Result<(), UnknownPolicy> {
        if self.contains(name) {
            Ok(())
        } else {
            Err(self.unknown(name))
        }
    }

    fn unknown(&self, name: &str) -> UnknownPolicy {
        UnknownPolicy {
            name: name.to_string(),
            known: self.names().collect::<Vec<_>>().join(", "),
        }
    }

    /// The registered names, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    /// (name, one-line summary) of every registered policy.
    pub fn summaries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries
            .iter()
            .map(|e| (e.name.as_str(), e.summary.as_str()))
    }
}

impl Default for PolicyRegistry {
    fn default() -> Self {
        Self::builtin()
    }
}

impl fmt::Debug for PolicyRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}
