//! Retry back-off and poll jitter, as pure functions of a random unit value
//! so they can be tested exactly.

use std::time::Duration;

/// Exponential back-off with "equal jitter": attempt `n` waits between half
/// and all of `min(max, initial * 2^n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The wait before retry `attempt` (0 is the first retry); `unit` is a
    /// random value in `[0, 1]`.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(30));
        let base = self.initial.saturating_mul(factor).min(self.max);
        let unit = unit.clamp(0.0, 1.0);
        base / 2 + base.mul_f64(unit / 2.0)
    }
}

/// The resync interval moved by up to `±jitter` of itself; `unit` is a
/// random value in `[0, 1]`. The jitter is clamped to `[0, 0.5]`.
pub fn jittered(interval: Duration, jitter: f64, unit: f64) -> Duration {
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 0.5)
    } else {
        0.0
    };
    let unit = unit.clamp(0.0, 1.0);
    interval.mul_f64(1.0 + jitter * (2.0 * unit - 1.0))
}

/// A random value in `[0, 1)`.
pub fn unit() -> f64 {
    rand::random::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_up_to_the_cap_with_equal_jitter() {
        let b = Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(5),
        };
        let cases = [
            (0, 0.0, 100),
            (0, 1.0, 200),
            (1, 0.0, 200),
            (1, 1.0, 400),
            (2, 0.5, 600),
            (4, 1.0, 3200),
            (5, 1.0, 5000),
            (5, 0.0, 2500),
            (40, 1.0, 5000),
        ];
        for (attempt, unit, ms) in cases {
            assert_eq!(
                b.delay(attempt, unit),
                Duration::from_millis(ms),
                "attempt {attempt} unit {unit}"
            );
        }
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let i = Duration::from_secs(60);
        assert_eq!(jittered(i, 0.1, 0.0), Duration::from_secs(54));
        assert_eq!(jittered(i, 0.1, 0.5), Duration::from_secs(60));
        assert_eq!(jittered(i, 0.1, 1.0), Duration::from_secs(66));
        assert_eq!(jittered(i, 0.0, 0.9), i);
        // Clamped: never negative, never more than half again.
        assert_eq!(jittered(i, 7.0, 0.0), Duration::from_secs(30));
        assert_eq!(jittered(i, f64::NAN, 0.0), i);
        for _ in 0..1000 {
            let d = jittered(i, 0.2, unit());
            assert!(d >= Duration::from_secs(48) && d <= Duration::from_secs(72));
        }
    }
}
