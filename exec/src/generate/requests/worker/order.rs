//! What the engine runs next: its requests as a request policy sees them, and the
//! policy's choice of the request admitted next and of the turn's prefill chunk.

use std::time::Instant;

use bevy_ecs::entity::Entity;
use hetsched_systems::request_policy::{LiveRequest, pick_next};
use hetsched_systems::{RequestPhase, SloTargets};

use super::{Live, RequestId, Worker, ns_since};

impl Worker {
    /// The live request among those `eligible` that the request policy puts first now.
    pub(super) fn pick(&mut self, eligible: impl Fn(&Live) -> bool) -> Option<usize> {
        let (now_ns, mut views) = self.views(eligible);
        let first = pick_next(self.policy.as_mut(), now_ns, &mut views)?;
        self.index_of(first.id)
    }

    /// Now, and the live requests `eligible` as the request policy sees them.
    fn views(&self, eligible: impl Fn(&Live) -> bool) -> (u64, Vec<LiveRequest>) {
        let views = self.live.iter().filter(|l| eligible(l));
        let views = views.map(|l| self.view(l)).collect();
        (ns_since(self.started, Instant::now()), views)
    }

    /// Where request `id` is among the live ones.
    fn index_of(&self, id: RequestId) -> Option<usize> {
        self.live.iter().position(|l| l.id == id)
    }

    /// `live` as a request policy sees it: its prompt tokens left to prefill at the
    /// measured time per token, and its tokens left to generate at the measured time of a
    /// decode step (1 ns for what has not run yet, which keeps the ratios). Its alone
    /// bound is its whole work at those rates, from its admission. The engine's requests
    /// are no world's entities, and carry no targets.
    fn view(&self, live: &Live) -> LiveRequest {
        let prefill =
            |tokens: usize| (tokens as u64).saturating_mul(self.prefill_ns_per_token.max(1));
        let decode = |steps: usize| (steps as u64).saturating_mul(self.decode_ns_per_step.max(1));
        let max_tokens = live.options.max_tokens;
        let generated = live.samples.iter().map(|s| s.continuation.tokens.len());
        let steps_left = match live.first_token {
            None => max_tokens,
            Some(_) => generated
                .map(|g| max_tokens.saturating_sub(g))
                .max()
                .unwrap_or(0),
        };
        let total = prefill(live.prompt.len()).saturating_add(decode(max_tokens));
        LiveRequest {
            entity: Entity::PLACEHOLDER,
            id: live.id,
            priority: live.priority,
            targets: SloTargets::default(),
            arrival_ns: ns_since(self.started, live.arrival),
            phase: match (&live.session, live.prefilling()) {
                (None, _) => RequestPhase::Waiting,
                (Some(_), true) => RequestPhase::Prefill,
                (Some(_), false) => RequestPhase::Decode {
                    step: (max_tokens - steps_left) as u64,
                },
            },
            work_left_ns: prefill(live.prompt.len() - live.prefilled)
                .saturating_add(decode(steps_left)),
            work_total_ns: total,
            alone_bound_ns: total,
            armed_ns: ns_since(self.started, live.armed),
        }
    }

    /// The request whose next prefill chunk runs this turn, if any: the first request in
    /// its prefill in the request policy's order among those with work (in their prefill,
    /// or decoding), unless decoding requests ahead of it may not be delayed by its chunk
    /// ([`RequestPolicy::may_delay`]): their decode steps then have the turn alone.
    pub(super) fn turn_prefill(&mut self) -> Option<usize> {
        let (now_ns, mut order) = self.views(|l| l.prefilling() || !l.samples.is_empty());
        self.policy.order(now_ns, &mut order);
        let at = order
            .iter()
            .position(|r| r.phase == RequestPhase::Prefill)?;
        let (ahead, candidate) = (&order[..at], &order[at]);
        let i = self.index_of(candidate.id)?;
        let live = &self.live[i];
        let chunk =
            (self.options.chunk_len.max(1) as usize).min(live.prompt.len() - live.prefilled);
        let job_ns = (chunk as u64).saturating_mul(self.prefill_ns_per_token.max(1));
        (ahead.is_empty() || self.policy.may_delay(now_ns, ahead, candidate, job_ns)).then_some(i)
    }
}
