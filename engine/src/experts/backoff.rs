//! Prefetch back-off: next-layer prefetch pays only while the disk has time to spare beside the
//! demand reads. Where the demand reads alone keep it busy (a cache of a few percent of the
//! experts, a slow disk), every wrong prediction's read (about half of them) delays a read a
//! layer waits for, and prefetching makes decoding slower (docs/src/perf/moe.md's large-model table: 1.06
//! against 1.30 t/s at 5%).
//!
//! Whether that is so depends on the disk, the cache size, the route and the hour, so it is
//! measured, not guessed: during decoding, after [`HOLD`] passes with prefetch on (the cache
//! warms up), [`PROBE`] passes run with prefetch on and then [`PROBE`] with it off; the faster
//! arm (off only when its passes are at least [`MARGIN`] faster) is kept for the next [`HOLD`]
//! passes, then probed again. Predictions are still made and scored while prefetch is off.

/// Decode passes per probe arm.
pub const PROBE: u32 = 4;
/// Passes a choice is kept before it is probed again (and the first passes, prefetch on).
pub const HOLD: u32 = 32;
/// Prefetch goes off only when the passes without it took at most this share of the time of
/// those with it (the disk's throughput drifts by 10-20% between minutes).
pub const MARGIN: f64 = 0.95;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    ProbeOn,
    ProbeOff,
    Hold,
}

#[derive(Clone, Debug)]
pub struct Backoff {
    phase: Phase,
    /// Passes left in this phase.
    left: u32,
    /// Seconds and passes of the current probe's two arms.
    on: (f64, u32),
    off: (f64, u32),
    /// Prefetch on while holding.
    choice: bool,
    /// Decode passes run, and of them without prefetch.
    pub passes: u64,
    pub passes_off: u64,
    /// Probes finished, and of them those that turned prefetch off.
    pub probes: u64,
    pub probes_off: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            phase: Phase::Hold,
            left: HOLD,
            on: (0.0, 0),
            off: (0.0, 0),
            choice: true,
            passes: 0,
            passes_off: 0,
            probes: 0,
            probes_off: 0,
        }
    }
}

impl Backoff {
    /// Whether the next decode pass prefetches.
    pub fn prefetch(&self) -> bool {
        match self.phase {
            Phase::ProbeOn => true,
            Phase::ProbeOff => false,
            Phase::Hold => self.choice,
        }
    }

    /// A decode pass that ran as [`Backoff::prefetch`] said took `secs`.
    pub fn pass_done(&mut self, secs: f64) {
        self.passes += 1;
        if !self.prefetch() {
            self.passes_off += 1;
        }
        self.left = self.left.saturating_sub(1);
        match self.phase {
            Phase::ProbeOn => {
                self.on.0 += secs;
                self.on.1 += 1;
                if self.left == 0 {
                    self.phase = Phase::ProbeOff;
                    self.left = PROBE;
                }
            }
            Phase::ProbeOff => {
                self.off.0 += secs;
                self.off.1 += 1;
                if self.left == 0 {
                    let mean = |(s, n): (f64, u32)| s / n.max(1) as f64;
                    self.choice = mean(self.off) >= MARGIN * mean(self.on);
                    self.probes += 1;
                    self.probes_off += u64::from(!self.choice);
                    self.on = (0.0, 0);
                    self.off = (0.0, 0);
                    self.phase = Phase::Hold;
                    self.left = HOLD;
                }
            }
            Phase::Hold => {
                if self.left == 0 {
                    self.phase = Phase::ProbeOn;
                    self.left = PROBE;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `n` passes, each taking `on` seconds with prefetch and `off` without; returns
    /// whether each pass prefetched.
    fn run(b: &mut Backoff, n: u32, on: f64, off: f64) -> Vec<bool> {
        (0..n)
            .map(|_| {
                let p = b.prefetch();
                b.pass_done(if p { on } else { off });
                p
            })
            .collect()
    }

    #[test]
    fn prefetch_stays_on_while_it_pays() {
        let mut b = Backoff::default();
        let got = run(&mut b, HOLD + 2 * PROBE + HOLD, 1.0, 1.3);
        // Warm-up hold, a probe (on, then off), the choice held: on.
        let off: Vec<usize> = (0..got.len()).filter(|&i| !got[i]).collect();
        let probe_off = (HOLD + PROBE) as usize..(HOLD + 2 * PROBE) as usize;
        assert_eq!(off, probe_off.collect::<Vec<_>>());
        assert_eq!((b.probes, b.probes_off), (1, 0));
        assert_eq!(b.passes_off, PROBE as u64);
    }

    #[test]
    fn prefetch_backs_off_when_passes_without_it_are_faster_and_probes_again() {
        let mut b = Backoff::default();
        let got = run(&mut b, HOLD + 2 * PROBE + HOLD + 2 * PROBE, 1.0, 0.8);
        let w = (HOLD + 2 * PROBE) as usize;
        assert!(
            got[..HOLD as usize].iter().all(|&p| p),
            "warm-up with prefetch"
        );
        assert!(
            got[w..w + HOLD as usize].iter().all(|&p| !p),
            "the choice held: off"
        );
        // Then probed again: on for PROBE passes, off for PROBE, and still off.
        let again = &got[w + HOLD as usize..];
        assert!(again[..PROBE as usize].iter().all(|&p| p));
        assert!(again[PROBE as usize..].iter().all(|&p| !p));
        assert_eq!((b.probes, b.probes_off), (2, 2));
        assert!(!b.prefetch());
    }

    #[test]
    fn a_difference_within_the_margin_keeps_prefetch_on() {
        let mut b = Backoff::default();
        run(&mut b, HOLD + 2 * PROBE, 1.0, 0.97);
        assert!(b.prefetch());
        assert_eq!(b.probes_off, 0);
        // Just past the margin it goes off.
        let mut b = Backoff::default();
        run(&mut b, HOLD + 2 * PROBE, 1.0, 0.94);
        assert!(!b.prefetch());
    }

    #[test]
    fn it_comes_back_on_when_the_disk_frees_up() {
        let mut b = Backoff::default();
        run(&mut b, HOLD + 2 * PROBE, 1.0, 0.8);
        assert!(!b.prefetch());
        // Now prefetch pays (say the other traffic on the disk stopped).
        run(&mut b, HOLD + 2 * PROBE, 0.7, 1.0);
        assert!(b.prefetch());
        assert_eq!((b.probes, b.probes_off), (2, 1));
    }
}
