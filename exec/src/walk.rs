//! The one walk over a stage's [`Step`]s: [`walk`] matches each step once and calls the
//! [`StepBackend`] method of its kind.
//!
//! A backend is whatever gives the steps a meaning: the CPU interpreter runs them on real
//! kernels (`interpret.rs`), the resident GPU runner records them into a command buffer
//! (`gpu_resident/record.rs`), and the GPU memory plan reads which chunk values each one
//! touches (`gpu_layout.rs`). The trait has one method per kind of step and no default
//! bodies, so a new step is one compile error per backend; a backend for which a step
//! means nothing says so in that step's method.
//!
//! The walk is generic over the backend (monomorphic, no dynamic dispatch per step); the
//! backend holds what a step of its stage needs (layer, chunk, the values it works on).

use hetsched_systems::op::{Block, NormSite, Projection};
use hetsched_systems::shadow::ShadowSite;

use crate::steps::{FamilyStep, Step};

/// What one backend does for each kind of [`Step`], in a stage it was built for.
pub(crate) trait StepBackend {
    /// Why a step failed.
    type Error;

    /// [`Step::Embed`].
    fn embed(&mut self) -> Result<(), Self::Error>;
    /// [`Step::Norm`].
    fn norm(&mut self, site: NormSite) -> Result<(), Self::Error>;
    /// [`Step::QuantizeNormed`].
    fn quantize_normed(&mut self, site: ShadowSite) -> Result<(), Self::Error>;
    /// [`Step::QuantizeAttention`].
    fn quantize_attention(&mut self) -> Result<(), Self::Error>;
    /// [`Step::Linear`].
    fn linear(&mut self, p: Projection) -> Result<(), Self::Error>;
    /// [`Step::DequantizeQkv`].
    fn dequantize_qkv(&mut self) -> Result<(), Self::Error>;
    /// [`Step::Rope`].
    fn rope(&mut self) -> Result<(), Self::Error>;
    /// [`Step::Attention`].
    fn attention(&mut self) -> Result<(), Self::Error>;
    /// [`Step::DequantizeO`].
    fn dequantize_o(&mut self) -> Result<(), Self::Error>;
    /// [`Step::DequantizeDown`].
    fn dequantize_down(&mut self) -> Result<(), Self::Error>;
    /// [`Step::Residual`].
    fn residual(&mut self) -> Result<(), Self::Error>;
    /// [`Step::SiluMul`].
    fn silu_mul(&mut self) -> Result<(), Self::Error>;
    /// [`Step::Shadow`].
    fn shadow(&mut self, site: ShadowSite) -> Result<(), Self::Error>;
    /// [`Step::LmHead`].
    fn lm_head(&mut self) -> Result<(), Self::Error>;
    /// [`FamilyStep::EmbedScale`].
    fn embed_scale(&mut self) -> Result<(), Self::Error>;
    /// [`FamilyStep::QkvBias`].
    fn qkv_bias(&mut self) -> Result<(), Self::Error>;
    /// [`FamilyStep::QkNorm`].
    fn qk_norm(&mut self) -> Result<(), Self::Error>;
    /// [`FamilyStep::PostNorm`].
    fn post_norm(&mut self, block: Block) -> Result<(), Self::Error>;
    /// [`FamilyStep::GeluMul`].
    fn gelu_mul(&mut self) -> Result<(), Self::Error>;
}

/// Runs `steps` in order on `backend`, stopping at the first error.
pub(crate) fn walk<B: StepBackend>(steps: &[Step], backend: &mut B) -> Result<(), B::Error> {
    for &s in steps {
        step(s, backend)?;
    }
    Ok(())
}

/// Runs one step on `b`: the one match over [`Step`]. For a backend that keeps
/// something between steps (a step's position); others call [`walk`].
pub(crate) fn step<B: StepBackend>(step: Step, b: &mut B) -> Result<(), B::Error> {
    match step {
        Step::Embed => b.embed(),
        Step::Norm(site) => b.norm(site),
        Step::QuantizeNormed(site) => b.quantize_normed(site),
        Step::QuantizeAttention => b.quantize_attention(),
        Step::Linear(p) => b.linear(p),
        Step::DequantizeQkv => b.dequantize_qkv(),
        Step::Rope => b.rope(),
        Step::Attention => b.attention(),
        Step::DequantizeO => b.dequantize_o(),
        Step::DequantizeDown => b.dequantize_down(),
        Step::Residual => b.residual(),
        Step::SiluMul => b.silu_mul(),
        Step::Shadow(site) => b.shadow(site),
        Step::LmHead => b.lm_head(),
        Step::Family(FamilyStep::EmbedScale) => b.embed_scale(),
        Step::Family(FamilyStep::QkvBias) => b.qkv_bias(),
        Step::Family(FamilyStep::QkNorm) => b.qk_norm(),
        Step::Family(FamilyStep::PostNorm(block)) => b.post_norm(block),
        Step::Family(FamilyStep::GeluMul) => b.gelu_mul(),
    }
}

#[cfg(test)]
mod tests {
    use hetsched_systems::graph::build_stages;
    use hetsched_systems::testing::tiny_model;

    use super::*;

    /// Writes down the step each method stands for, failing at `fail_at`.
    struct Echo {
        seen: Vec<Step>,
        fail_at: Option<usize>,
    }

    impl Echo {
        fn saw(&mut self, step: Step) -> Result<(), usize> {
            if self.fail_at == Some(self.seen.len()) {
                return Err(self.seen.len());
            }
            self.seen.push(step);
            Ok(())
        }
    }

    impl StepBackend for Echo {
        type Error = usize;
        fn embed(&mut self) -> Result<(), usize> {
            self.saw(Step::Embed)
        }
        fn norm(&mut self, site: NormSite) -> Result<(), usize> {
            self.saw(Step::Norm(site))
        }
        fn quantize_normed(&mut self, site: ShadowSite) -> Result<(), usize> {
            self.saw(Step::QuantizeNormed(site))
        }
        fn quantize_attention(&mut self) -> Result<(), usize> {
            self.saw(Step::QuantizeAttention)
        }
        fn linear(&mut self, p: Projection) -> Result<(), usize> {
            self.saw(Step::Linear(p))
        }
        fn dequantize_qkv(&mut self) -> Result<(), usize> {
            self.saw(Step::DequantizeQkv)
        }
        fn rope(&mut self) -> Result<(), usize> {
            self.saw(Step::Rope)
        }
        fn attention(&mut self) -> Result<(), usize> {
            self.saw(Step::Attention)
        }
        fn dequantize_o(&mut self) -> Result<(), usize> {
            self.saw(Step::DequantizeO)
        }
        fn dequantize_down(&mut self) -> Result<(), usize> {
            self.saw(Step::DequantizeDown)
        }
        fn residual(&mut self) -> Result<(), usize> {
            self.saw(Step::Residual)
        }
        fn silu_mul(&mut self) -> Result<(), usize> {
            self.saw(Step::SiluMul)
        }
        fn shadow(&mut self, site: ShadowSite) -> Result<(), usize> {
            self.saw(Step::Shadow(site))
        }
        fn lm_head(&mut self) -> Result<(), usize> {
            self.saw(Step::LmHead)
        }
        fn embed_scale(&mut self) -> Result<(), usize> {
            self.saw(Step::Family(FamilyStep::EmbedScale))
        }
        fn qkv_bias(&mut self) -> Result<(), usize> {
            self.saw(Step::Family(FamilyStep::QkvBias))
        }
        fn qk_norm(&mut self) -> Result<(), usize> {
            self.saw(Step::Family(FamilyStep::QkNorm))
        }
        fn post_norm(&mut self, block: Block) -> Result<(), usize> {
            self.saw(Step::Family(FamilyStep::PostNorm(block)))
        }
        fn gelu_mul(&mut self) -> Result<(), usize> {
            self.saw(Step::Family(FamilyStep::GeluMul))
        }
    }

    fn every_step() -> Vec<Step> {
        let mut steps = vec![
            Step::Embed,
            Step::QuantizeAttention,
            Step::DequantizeQkv,
            Step::Rope,
            Step::Attention,
            Step::DequantizeO,
            Step::DequantizeDown,
            Step::Residual,
            Step::SiluMul,
            Step::LmHead,
            Step::Family(FamilyStep::EmbedScale),
            Step::Family(FamilyStep::QkvBias),
            Step::Family(FamilyStep::QkNorm),
            Step::Family(FamilyStep::GeluMul),
        ];
        for site in [NormSite::Attention, NormSite::Ffn, NormSite::Final] {
            steps.push(Step::Norm(site));
        }
        for site in ShadowSite::ALL {
            steps.extend([Step::QuantizeNormed(site), Step::Shadow(site)]);
        }
        steps.extend(Projection::ALL.map(Step::Linear));
        steps.extend(
            [Block::Attention, Block::FeedForward].map(|b| Step::Family(FamilyStep::PostNorm(b))),
        );
        steps
    }

    #[test]
    fn every_step_reaches_the_method_of_its_kind_in_order() {
        let mut steps = every_step();
        for stage in build_stages(&tiny_model(2)).expect("a valid model") {
            let compiled: Vec<Step> = stage
                .ops
                .iter()
                .map(|op| Step::compile(&stage, op).expect("a llama step"))
                .collect();
            steps.extend(compiled);
        }
        let mut echo = Echo {
            seen: Vec::new(),
            fail_at: None,
        };
        walk(&steps, &mut echo).unwrap();
        assert_eq!(echo.seen, steps);
    }

    #[test]
    fn the_walk_stops_at_the_first_failing_step() {
        let steps = every_step();
        let mut echo = Echo {
            seen: Vec::new(),
            fail_at: Some(3),
        };
        assert_eq!(walk(&steps, &mut echo), Err(3));
        assert_eq!(echo.seen, steps[..3]);
    }
}
