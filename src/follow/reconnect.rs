//! The follower's reconnect policy: exponential backoff with jitter between attempts, reset
//! once a connection has proved itself by staying up.
//!
//! Without the reset, a follower that rode out one host restart carried its grown delay into
//! the next, so each restart took longer to notice (1.2 s, 2.7 s, 4.7 s, …) although every
//! connection in between was healthy. Pure: the caller measures how long a connection stayed
//! up and sleeps the delay itself.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// A connection up at least this long counts as good: the next loss starts the backoff from
/// the bottom again. Shorter than any delay a user would notice, longer than a host that
/// accepts and at once drops connections (which must not make the follower spin).
pub const STABLE_AFTER: Duration = Duration::from_secs(2);

/// The first delay (before jitter, which adds up to as much again).
pub const MIN_DELAY: Duration = Duration::from_millis(50);

/// The longest delay (before jitter).
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// Delays between connection attempts.
#[derive(Debug)]
pub struct Reconnect {
    backoff: ExponentialBackoff,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect { backoff: fresh() }
    }
}

fn fresh() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(MIN_DELAY)
        .with_max_delay(MAX_DELAY)
        .with_jitter()
        .without_max_times()
        .build()
}

impl Reconnect {
    /// The delay before the next attempt, after a connection that stayed up `up_for` (`None`:
    /// the attempt failed before the connection was greeted).
    pub fn delay_after(&mut self, up_for: Option<Duration>) -> Duration {
        if up_for.is_some_and(|up| up >= STABLE_AFTER) {
            self.reset();
        }
        self.backoff.next().unwrap_or(MAX_DELAY)
    }

    /// Start from the bottom again (events flowed: the connection was good).
    pub fn reset(&mut self) {
        self.backoff = fresh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_grows_while_attempts_fail_and_resets_after_a_good_connection() {
        let mut r = Reconnect::default();
        let failing: Vec<Duration> = (0..6).map(|_| r.delay_after(None)).collect();
        // Jitter adds at most the delay itself: attempt n waits in [50 ms·2ⁿ, 100 ms·2ⁿ].
        assert!(failing[5] >= Duration::from_millis(1600), "{failing:?}");
        // A connection that dropped at once does not count as good: still growing.
        let short = r.delay_after(Some(Duration::from_millis(10)));
        assert!(short >= Duration::from_millis(3200), "{short:?}");
        // One that stayed up: the next delay is back at the bottom, and so on each time.
        for _ in 0..3 {
            let after_good = r.delay_after(Some(STABLE_AFTER));
            assert!(after_good <= MIN_DELAY * 2, "{after_good:?}");
            for _ in 0..4 {
                r.delay_after(None);
            }
        }
        // Never beyond the cap (plus its jitter), however long it fails.
        let capped = (0..40)
            .map(|_| r.delay_after(None))
            .max()
            .unwrap_or_default();
        assert!(capped <= MAX_DELAY * 2, "{capped:?}");
    }
}
