//! Token sampling in llama.cpp's default order: penalties, top-k, top-p, min-p, temperature,
//! then a draw. Temperature 0 means greedy (the engine takes the argmax through the backend).

use std::collections::VecDeque;

#[derive(Clone, Debug)]
pub struct SamplerParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off. Divides positive logits of recent tokens, multiplies negative ones.
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    pub seed: u64,
    /// Added to the logits of these tokens before anything else (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

/// A sampling value out of its range: `field` is the parameter's name as the caller spells it
/// (`temperature`, `top_p`...; a command line prefixes `--` and uses dashes).
#[derive(Clone, Debug, PartialEq)]
pub struct ParamError {
    pub field: &'static str,
    pub msg: String,
}

/// The accepted range of one sampling value.
pub struct Range {
    /// The parameter's name as the caller spells it.
    pub field: &'static str,
    pub get: fn(&SamplerParams) -> f32,
    pub lo: f32,
    pub hi: f32,
    /// `lo` itself is refused (top_p 0 keeps nothing).
    pub lo_open: bool,
    pub note: &'static str,
}

/// The accepted range of each sampling value, declared once: `run`, `chat`, `batch` and
/// `serve` all check through [`SamplerParams::validate`].
pub const RANGES: &[Range] = &[
    Range {
        field: "temperature",
        get: |p| p.temperature,
        lo: 0.0,
        hi: 100.0,
        lo_open: false,
        note: "0 = greedy",
    },
    Range {
        field: "top_p",
        get: |p| p.top_p,
        lo: 0.0,
        hi: 1.0,
        lo_open: true,
        note: "above 0; 1 = off",
    },
    Range {
        field: "min_p",
        get: |p| p.min_p,
        lo: 0.0,
        hi: 1.0,
        lo_open: false,
        note: "0 = off",
    },
    Range {
        field: "repeat_penalty",
        get: |p| p.repeat_penalty,
        lo: 0.001,
        hi: 100.0,
        lo_open: false,
        note: "1 = off",
    },
    Range {
        field: "presence_penalty",
        get: |p| p.presence_penalty,
        lo: -100.0,
        hi: 100.0,
        lo_open: false,
        note: "0 = off",
    },
    Range {
        field: "frequency_penalty",
        get: |p| p.frequency_penalty,
        lo: -100.0,
        hi: 100.0,
        lo_open: false,
        note: "0 = off",
    },
];

impl SamplerParams {
    /// Every value finite and in its [`RANGES`] entry. The values are checked as the sampler
    /// uses them, in f32: a penalty of 5e-324 is 0 there.
    pub fn validate(&self) -> Result<(), ParamError> {
        for r in RANGES {
            let v = (r.get)(self);
            if !v.is_finite() || v < r.lo || v > r.hi || (r.lo_open && v <= r.lo) {
                return Err(ParamError {
                    field: r.field,
                    msg: format!("{v} is outside {}..={} ({})", r.lo, r.hi, r.note),
                });
            }
        }
        Ok(())
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, and the same stream on every platform,
/// so a seed reproduces a text anywhere.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

pub struct Sampler {
    pub params: SamplerParams,
    rng: Rng,
    recent: VecDeque<u32>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Sampler {
        let rng = Rng::new(params.seed);
        Sampler {
            params,
            rng,
            recent: VecDeque::new(),
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0
    }

    /// Remembers a token for the penalties (prompt tokens included, as llama.cpp does).
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Whether picking changes the raw logits first (penalties, a logit bias).
    pub fn has_penalties(&self) -> bool {
        let p = &self.params;
        p.repeat_penalty != 1.0
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
            || !p.logit_bias.is_empty()
    }

    pub fn apply_penalties(&self, logits: &mut [f32]) {
        if !self.has_penalties() {
            return;
        }
        for &(t, b) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        let mut counts = std::collections::HashMap::<u32, u32>::new();
        for &t in &self.recent {
            *counts.entry(t).or_default() += 1;
        }
        let p = &self.params;
        for (&tok, &count) in &counts {
            let Some(l) = logits.get_mut(tok as usize) else {
                continue;
            };
            if *l <= 0.0 {
                *l *= p.repeat_penalty;
            } else {
                *l /= p.repeat_penalty;
            }
            *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Draws a token from (penalised) logits with top-k, top-p, min-p and temperature.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = self.params.clone();
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        // Most likely first, ties by id: a total order, so taking the k best first and sorting
        // only those gives the same list as sorting everything (and costs O(n), not O(n log n),
        // on a vocabulary of 10^5).
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, order);
            cand.truncate(p.top_k);
        }
        cand.sort_by(order);
        if p.top_p < 1.0 {
            let probs = softmax(&cand);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let floor = cand[0].1 + p.min_p.ln();
            let keep = cand.iter().take_while(|c| c.1 >= floor).count();
            cand.truncate(keep.max(1));
        }
        for c in cand.iter_mut() {
            c.1 /= p.temperature;
        }
        // A temperature so small that the division overflows (below ~1e-37 for logits of a
        // few units) is the greedy limit: the best candidate, not a draw over infinities.
        if !cand[0].1.is_finite() {
            return cand[0].0;
        }
        let probs = softmax(&cand);
        let r = self.rng.next_f64();
        let mut cum = 0.0;
        for (c, pr) in cand.iter().zip(&probs) {
            cum += pr;
            if r < cum {
                return c.0;
            }
        }
        cand.last().unwrap().0
    }
}

fn softmax(cand: &[(u32, f32)]) -> Vec<f64> {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = cand.iter().map(|c| (c.1 as f64 - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37) % 100) as f32 / 10.0).collect()
    }

    #[test]
    fn same_seed_same_draws_and_other_seed_differs() {
        let params = SamplerParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let draw = |seed| {
            let mut s = Sampler::new(SamplerParams {
                seed,
                ..params.clone()
            });
            (0..50).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn tiny_temperatures_take_the_best_candidate() {
        let l = logits();
        let best = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
        for t in [1e-45f32, 1e-40, 1e-38, 1e-30] {
            let mut s = Sampler::new(SamplerParams {
                temperature: t,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 3,
                ..Default::default()
            });
            for _ in 0..20 {
                assert_eq!(s.sample(&l), best, "temperature {t}");
            }
        }
    }

    #[test]
    fn validation_refuses_non_finite_and_out_of_range_values() {
        assert_eq!(SamplerParams::default().validate(), Ok(()));
        let bad = |f: fn(&mut SamplerParams)| {
            let mut p = SamplerParams::default();
            f(&mut p);
            p.validate().unwrap_err().field
        };
        assert_eq!(bad(|p| p.temperature = f32::NAN), "temperature");
        assert_eq!(bad(|p| p.temperature = f32::INFINITY), "temperature");
        assert_eq!(bad(|p| p.temperature = -0.5), "temperature");
        assert_eq!(bad(|p| p.top_p = 0.0), "top_p");
        assert_eq!(bad(|p| p.top_p = 1.5), "top_p");
        assert_eq!(bad(|p| p.min_p = f32::NAN), "min_p");
        // 5e-324 as f64 is 0 in f32: the sampler would multiply logits by 0.
        assert_eq!(
            bad(|p| p.repeat_penalty = 5e-324f64 as f32),
            "repeat_penalty"
        );
        assert_eq!(bad(|p| p.repeat_penalty = 1e-40), "repeat_penalty");
        assert_eq!(
            bad(|p| p.presence_penalty = f32::NEG_INFINITY),
            "presence_penalty"
        );
        assert_eq!(bad(|p| p.frequency_penalty = 1e9), "frequency_penalty");
    }

    #[test]
    fn top_k_one_is_argmax() {
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        });
        let l = logits();
        let best = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
        for _ in 0..20 {
            assert_eq!(s.sample(&l), best);
        }
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        let mut l = vec![-10.0f32; 10];
        l[3] = 5.0;
        l[4] = 4.9;
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        for _ in 0..200 {
            let t = s.sample(&l);
            assert!(t == 3 || t == 4, "drew {t}");
        }
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.1,
            min_p: 0.0,
            ..Default::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&l), 3);
        }
    }

    #[test]
    fn penalties_push_recent_tokens_down() {
        let mut s = Sampler::new(SamplerParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 1.0,
            ..Default::default()
        });
        s.accept(1);
        s.accept(1);
        s.accept(2);
        let mut l = vec![4.0, 4.0, -4.0, 4.0];
        s.apply_penalties(&mut l);
        assert_eq!(l, vec![4.0, 4.0 / 2.0 - 1.0 - 1.0, -8.0 - 0.5 - 1.0, 4.0]);
    }
}
