//! Pacing for the periodic full scans (the hub's sweep and latch-drift
//! count, the gateway's identity check, `fleet dev`'s vacuum): each waits
//! its configured interval, or longer when a pass was slow, so one scan
//! never holds more than a set share of a core however large the fleet.

use std::time::Duration;

/// The wait before the next pass after one that took `took`: `every`, or
/// `took` times `ratio` when that is longer (the scan then runs at most
/// `1 / (ratio + 1)` of the time).
pub fn pause_after(every: Duration, took: Duration, ratio: u32) -> Duration {
    took.saturating_mul(ratio).max(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_pass_waits_a_multiple_of_its_length() {
        let every = Duration::from_secs(2);
        assert_eq!(pause_after(every, Duration::from_millis(40), 10), every);
        assert_eq!(
            pause_after(every, Duration::from_millis(700), 10),
            Duration::from_secs(7)
        );
        assert_eq!(
            pause_after(every, Duration::MAX, 10),
            Duration::MAX,
            "saturates instead of overflowing"
        );
    }
}
