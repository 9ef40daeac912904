//! Waiting before trying again: the one back-off every loop uses (Redis
//! reconnects, platform calls), and the outbox's policy for deliveries that
//! fail transiently.

use std::time::Duration;

/// Exponential backoff from 200 ms, capped at 30 s.
pub fn backoff(attempt: u32) -> Duration {
    let ms = 200u64.saturating_mul(1u64 << attempt.min(8));
    Duration::from_millis(ms.min(30_000))
}

/// How long to wait before retrying a transient failure, and when to give up.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub max_retry: Duration,
}

impl RetryPolicy {
    /// The wait before the next attempt after `attempts` failures over `elapsed`,
    /// or `None` to give up: exponential from 200 ms, capped at 30 s.
    pub fn next(&self, attempts: u32, elapsed: Duration) -> Option<Duration> {
        if attempts >= self.max_attempts || elapsed >= self.max_retry {
            return None;
        }
        Some(backoff(attempts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy backs off exponentially to its cap and gives up after its
    /// attempts or its time, whichever comes first.
    #[test]
    fn the_retry_policy_gives_up_on_attempts_or_time() {
        let p = RetryPolicy {
            max_attempts: 5,
            max_retry: Duration::from_secs(60),
        };
        assert_eq!(p.next(1, Duration::ZERO), Some(Duration::from_millis(400)));
        assert_eq!(p.next(2, Duration::ZERO), Some(Duration::from_millis(800)));
        assert_eq!(p.next(5, Duration::ZERO), None, "attempts used up");
        assert_eq!(p.next(1, Duration::from_secs(60)), None, "time used up");
        let long = RetryPolicy {
            max_attempts: 100,
            max_retry: Duration::from_secs(3600),
        };
        assert_eq!(long.next(20, Duration::ZERO), Some(Duration::from_secs(30)));
    }
}
