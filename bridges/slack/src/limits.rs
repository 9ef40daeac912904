//! Slack's rate limits, obeyed before they bite: a token bucket per method
//! (Slack's tiers, per workspace) and, for `chat.postMessage`, per channel
//! (about one message a second, short bursts allowed); a 429 holds its own
//! bucket for its `Retry-After`.
//!
//! Invariant: waiting is per bucket, so a method or channel that is rate
//! limited holds back no other (slack-morphism's own rate control paces
//! `chat.postMessage` once per second per workspace, whatever the channel,
//! which is why the bridge keeps these buckets instead).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A bucket's size and how fast it refills.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub burst: f64,
    pub per_sec: f64,
}

/// Slack's published rates of the methods the bridge calls (tiers 1–4 and
/// `chat.postMessage`'s special limit), with their usual bursts.
pub fn rate(method: &str) -> Rate {
    let per_minute = |n: f64, burst: f64| Rate {
        burst,
        per_sec: n / 60.0,
    };
    match method {
        "chat.postMessage" => Rate {
            burst: 3.0,
            per_sec: 1.0,
        },
        "apps.connections.open" => per_minute(1.0, 5.0),
        "views.open" | "auth.test" => per_minute(100.0, 20.0),
        // chat.update, conversations.history / .replies, reactions.get, and
        // anything else: tier 3.
        _ => per_minute(50.0, 10.0),
    }
}

/// The bucket a call draws from: `chat.postMessage` per channel, every
/// other method as a whole.
pub fn key(method: &str, channel: &str) -> String {
    match method {
        "chat.postMessage" => format!("{method} {channel}"),
        _ => method.to_string(),
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    held_until: Option<Instant>,
}

/// Every bucket of one process.
#[derive(Debug, Default)]
pub struct Limits {
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Limits {
    /// How long a call on `key` must wait before it may go, or `None` when
    /// it may go now (a token is taken).
    fn try_take(&self, key: &str, rate: Rate) -> Option<Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: rate.burst,
            at: now,
            held_until: None,
        });
        if let Some(until) = b.held_until.filter(|u| *u > now) {
            return Some(until - now);
        }
        let refill = now.duration_since(b.at).as_secs_f64() * rate.per_sec;
        b.tokens = (b.tokens + refill).min(rate.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return None;
        }
        Some(Duration::from_secs_f64((1.0 - b.tokens) / rate.per_sec))
    }

    /// Waits until a call on `key` may go.
    pub async fn take(&self, key: &str, rate: Rate) {
        while let Some(wait) = self.try_take(key, rate) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Slack answered 429 on `key`: nothing more goes there for `wait`.
    pub fn hold(&self, key: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: 0.0,
            at: Instant::now(),
            held_until: None,
        });
        b.tokens = 0.0;
        b.held_until = Some(b.held_until.map_or(until, |u| u.max(until)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst goes at once, then one a second; another channel's bucket is
    /// full meanwhile, and a held bucket holds only itself.
    #[tokio::test(start_paused = true)]
    async fn buckets_pace_and_hold_only_themselves() {
        let limits = Limits::default();
        let post = rate("chat.postMessage");
        let (a, b) = (key("chat.postMessage", "C1"), key("chat.postMessage", "C2"));
        let start = Instant::now();
        for _ in 0..3 {
            limits.take(&a, post).await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst");
        limits.take(&a, post).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1), "then one a second");
        limits.take(&b, post).await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "another channel waits for nothing"
        );
        limits.hold(&key("chat.update", "C1"), Duration::from_secs(30));
        limits.take(&b, post).await;
        limits
            .take(
                &key("conversations.history", "C1"),
                rate("conversations.history"),
            )
            .await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "a held method holds no other"
        );
        limits
            .take(&key("chat.update", "C9"), rate("chat.update"))
            .await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(31),
            "the held one waits its Retry-After"
        );
    }
}
