//! Exponential backoff with jitter, so that a fleet of agents that lost the server together
//! does not come back together.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

/// A random fraction in [0, 1).
pub fn random_fraction() -> f64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The next delay: the current step with "equal jitter" (half fixed, half random), after
    /// which the step doubles up to the maximum.
    pub fn delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.max);
        step / 2 + step.mul_f64(random_fraction() / 2.0)
    }

    /// After a success: start again from the minimum.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut prev_cap = Duration::ZERO;
        for i in 0..8 {
            let cap = (Duration::from_millis(100) * 2u32.pow(i)).min(Duration::from_secs(2));
            let d = b.delay();
            assert!(
                d >= cap / 2 && d <= cap,
                "step {i}: {d:?} not within [{:?}, {cap:?}]",
                cap / 2
            );
            assert!(cap >= prev_cap);
            prev_cap = cap;
        }
        b.reset();
        assert!(b.delay() <= Duration::from_millis(100));
        let samples: Vec<f64> = (0..64).map(|_| random_fraction()).collect();
        assert!(samples.iter().all(|f| (0.0..1.0).contains(f)));
        assert!(samples.iter().any(|f| *f != samples[0]), "jitter varies");
    }
}
