//! How large a claim is: probe ramp, static chunks, dynamic chunks.

use super::*;

impl JobCore {
    /// Chunk size and phase for a claim from the class's own region.
    pub(super) fn own_size(&mut self, c: usize) -> (usize, Phase) {
        let s = &self.st[c];
        let region = &s.region;
        let w = s.workers.max(1);
        if let Some(probe) = &mut self.probe.under_way {
            let p = &mut probe[c];
            if region.in_probe() {
                return match self.plan.adm.probe {
                    Probe::Cold => {
                        let n = p.ramp.max(1);
                        let cap = (region.probe_target / w).max(self.progress.grain);
                        p.ramp = (n * 2).min(cap);
                        (n, Phase::Probe)
                    }
                    _ => ((region.probe_target.div_ceil(w)).max(1), Phase::Probe),
                };
            }
            if self.plan.adm.probe == Probe::Cold {
                // Probe quota spent before every class reported: keep going in
                // probe-sized chunks rather than commit to an unplanned split.
                return (p.ramp.max(1), Phase::Probe);
            }
        }
        if region.in_static() {
            let per = self.plan.adm.static_chunks_per_worker.max(1);
            // Fewer, larger static chunks where a chunk's fixed cost would
            // otherwise weigh (an accelerator's launch and transfer setup).
            let floor = self.latency_floor(c).unwrap_or(0.0) as usize;
            // Where the static part is the whole region, rounded up: no
            // dynamic tail takes the remainder, which would otherwise be a
            // sliver of a chunk paying a whole fixed cost.
            let chunks = w * per;
            let n = if self.plan.adm.static_fraction >= 1.0 {
                region.static_target.div_ceil(chunks)
            } else {
                region.static_target / chunks
            };
            let n = n.max(floor).min(region.static_target.div_ceil(w));
            return (n.max(1), Phase::Static);
        }
        (self.dynamic_size(c), Phase::Dynamic)
    }

    pub(super) fn dynamic_size(&self, c: usize) -> usize {
        let g = self.progress.grain;
        let left = self.progress.space.total_left() as f64;
        let n = match self.plan.adm.chunking {
            Chunking::Fixed(n) | Chunking::Eft(n) => n as f64,
            Chunking::Guided => {
                let share = match (self.st[c].speed.b(), self.total_speed()) {
                    (Some(b), Some(v)) => b / v,
                    _ => 1.0 / self.total_workers().max(1) as f64,
                };
                left * share / 2.0
            }
            Chunking::TimeGuided => match (self.st[c].speed.b(), self.total_speed()) {
                (Some(b), Some(v)) => {
                    let floor = self.latency_floor(c).unwrap_or(0.0);
                    (b * left / v / 2.0).max(floor)
                }
                _ => left / (2.0 * self.total_workers().max(1) as f64),
            },
        };
        (n.ceil() as usize)
            .max(g)
            .max(self.st[c].fill.min_chunk)
            .max(1)
    }

    /// The least items of class `c`'s chunks: `latency_chunks·a·b` (`None`
    /// without a model).
    fn latency_floor(&self, c: usize) -> Option<f64> {
        let speed = &self.st[c].speed;
        speed
            .b()
            .map(|b| self.plan.th.latency_chunks(&self.classes[c]) * speed.model.a() * b)
    }
}
