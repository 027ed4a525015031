//! How a session's decode steps run, and what they read and spend.

/// How a decode step runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodePath {
    /// Each step a one-token plan through the engine and the queues (subgraph instances
    /// resolved and dispatched by the scheduler's systems).
    Scheduled,
    /// Each step one chain of the same kernels on the session's pool; a quantized
    /// model's head runs at the model's own width ([`QuantizedHead::own_width`](super::QuantizedHead::own_width): INT8
    /// for W8A8, 4-bit with its best candidates rescored for W4A8).
    #[default]
    Direct,
    /// [`DecodePath::Direct`] with the model's f32 head.
    DirectF32Head,
    /// [`DecodePath::Direct`] with an INT8 head ([`QuantizedHead::int8`](super::QuantizedHead::int8)) whatever the
    /// layers' width (f32 models keep the f32 head).
    DirectInt8Head,
}

/// Weight bytes one decode step reads: every layer's linears, and the head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WeightBytes {
    /// The decoder layers' linears (packed values and their scales).
    pub layers: u64,
    /// The LM head as the step runs it.
    pub head: u64,
}

impl WeightBytes {
    /// Layers and head.
    pub fn total(self) -> u64 {
        self.layers + self.head
    }
}

/// Time spent in decode steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeTime {
    /// Steps run.
    pub steps: u64,
    /// Wall time of the steps, ns.
    pub wall_ns: u64,
    /// Of which the stages themselves ran (scheduled steps; the rest is the scheduler's
    /// and the queues' overhead), or the kernels' parallel regions (direct steps; the rest
    /// is norms, activation quantization, RoPE and the residual adds), ns.
    pub busy_ns: u64,
}

impl DecodeTime {
    /// What was spent after `earlier` (a reading of the same session's time).
    pub fn since(self, earlier: DecodeTime) -> DecodeTime {
        DecodeTime {
            steps: self.steps.saturating_sub(earlier.steps),
            wall_ns: self.wall_ns.saturating_sub(earlier.wall_ns),
            busy_ns: self.busy_ns.saturating_sub(earlier.busy_ns),
        }
    }

    /// The share of the wall time outside the stages (0 without time).
    pub fn overhead(self) -> f64 {
        match self.wall_ns {
            0 => 0.0,
            wall => 1.0 - self.busy_ns as f64 / wall as f64,
        }
    }
}
