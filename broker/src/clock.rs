//! The clock every decision about time reads: deadlines, expiry, retry and
//! settling stamps.
//!
//! Invariants:
//! - Deadlines are unix seconds shared by every process, so a service reads
//!   the wall clock ([`Clock::system`]); only tests start one elsewhere.
//! - A clock started with [`Clock::starting_at`] moves with tokio's clock, so
//!   under `tokio::time::pause` it stands still until the test advances it:
//!   expiry and retry tests need no sleeps.

/// Unix time, from the wall clock or from a chosen start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    /// `None`: the wall clock. Otherwise unix seconds at a tokio instant.
    origin: Option<(f64, tokio::time::Instant)>,
}

impl Clock {
    /// The wall clock.
    pub fn system() -> Clock {
        Clock { origin: None }
    }

    /// A clock that reads `unix_secs` now and then moves with tokio's clock.
    pub fn starting_at(unix_secs: f64) -> Clock {
        Clock {
            origin: Some((unix_secs, tokio::time::Instant::now())),
        }
    }

    /// Unix time in fractional seconds (deadline comparisons).
    pub fn now_secs_f64(&self) -> f64 {
        match self.origin {
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            Some((start, at)) => start + at.elapsed().as_secs_f64(),
        }
    }

    /// Unix time in whole seconds.
    pub fn now_secs(&self) -> u64 {
        self.now_secs_f64() as u64
    }

    /// Unix time in milliseconds (stream ids are millisecond timestamps).
    pub fn now_millis(&self) -> u64 {
        (self.now_secs_f64() * 1000.0) as u64
    }
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC), for the audit trail and lists.
pub fn utc(unix_secs: f64) -> String {
    let secs = unix_secs.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (proleptic Gregorian), by eras of 400 years.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Time since the machine booted, suspends included (`CLOCK_BOOTTIME`): how
/// long ago something happened by this process's own reckoning, however long
/// the process was stopped or the machine asleep in between. Fences that
/// must not be outlived by a pause read it ([`crate::outbox`]'s runs).
pub fn since_boot() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on
    // every Linux this runs on, and on failure `ts` stays zero.
    unsafe {
        libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts);
    }
    std::time::Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_are_civil() {
        assert_eq!(utc(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400.0), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_151_028.9), "2026-12-01T18:50:28Z");
    }
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_started_clock_moves_only_with_tokio_time() {
        let clock = Clock::starting_at(1_000.0);
        assert_eq!(clock.now_secs_f64(), 1_000.0);
        tokio::time::advance(Duration::from_millis(2_500)).await;
        assert_eq!(clock.now_secs_f64(), 1_002.5);
        assert_eq!(clock.now_secs(), 1_002);
        assert_eq!(clock.now_millis(), 1_002_500);
    }
}
