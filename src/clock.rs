//! Time as the host sees it, injectable: the grant store asks this clock, so a test can move it
//! forward past a token's TTL instead of waiting (`Clock::manual` + `advance`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Clock {
    base: Instant,
    /// Nanoseconds added to real time; only a manual clock is ever advanced.
    offset: Option<Arc<AtomicU64>>,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    /// Real monotonic time.
    pub fn system() -> Clock {
        Clock {
            base: Instant::now(),
            offset: None,
        }
    }

    /// Real time plus whatever [`Clock::advance`] adds (clones share the offset).
    pub fn manual() -> Clock {
        Clock {
            base: Instant::now(),
            offset: Some(Arc::new(AtomicU64::new(0))),
        }
    }

    pub fn now(&self) -> Instant {
        let extra = self
            .offset
            .as_ref()
            .map_or(0, |o| o.load(Ordering::Acquire));
        Instant::now() + Duration::from_nanos(extra)
    }

    /// Move a manual clock forward; a system clock ignores this.
    pub fn advance(&self, by: Duration) {
        if let Some(offset) = &self.offset {
            let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            offset.fetch_add(nanos, Ordering::AcqRel);
        }
    }

    /// When this clock was made, for relative reporting.
    pub fn base(&self) -> Instant {
        self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_and_clones_share_it() {
        let clock = Clock::manual();
        let copy = clock.clone();
        let before = copy.now();
        clock.advance(Duration::from_secs(61));
        assert!(copy.now() >= before + Duration::from_secs(61));
        let system = Clock::system();
        let t = system.now();
        system.advance(Duration::from_secs(3600));
        assert!(system.now() < t + Duration::from_secs(3600));
    }
}
