//! Discord's REST API under its rate limits: every call the bridge makes
//! (posts, edits, reactions, and the catch-up's reads) goes through
//! [`Rest::call`], which waits for its bucket and for the global limit before
//! asking, and notes what every answer says of them.
//!
//! serenity's own limiter is off (with `api_base` it would still call
//! discord.com), so this is the limiter in production and in the tests alike.
//!
//! Invariants:
//! - A call waits while its bucket is empty (`X-RateLimit-Remaining: 0` until
//!   `X-RateLimit-Reset-After`) or while a global 429 holds every route;
//!   waiting on one bucket holds back no other. A bucket is a route kind per
//!   channel (Discord's major parameter); kinds Discord names one bucket
//!   (`X-RateLimit-Bucket`) share it.
//! - A 429 empties its bucket (or, when `global`, every route) for its
//!   `retry_after`, so the retry and everything queued behind it wait.
//! - Refused answers (401, 403, 429) are counted over ten minutes; at
//!   [`INVALID_BUDGET`] the bridge stops asking until the window moves on:
//!   Discord bans an address for an hour at 10,000.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serenity::http::{ErrorResponse, Http, HttpError, LightMethod, Request, Route};
use tokio::time::Instant;

/// Refused requests allowed in [`INVALID_WINDOW`], per process: a tenth of
/// what makes Discord ban the address.
pub const INVALID_BUDGET: usize = 1_000;
/// The window Discord counts refused requests in.
pub const INVALID_WINDOW: Duration = Duration::from_secs(600);

/// What a call is, for its bucket: the kind of route and its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Post,
    Edit,
    React,
    Unreact,
    ReadMessages,
    ReadReactions,
    ReadChannel,
}

#[derive(Default)]
struct Limits {
    /// A kind's bucket in a channel as Discord named it, once an answer did
    /// (kept per channel: names are not promised to be the same across them).
    named: HashMap<(Kind, u64), String>,
    /// Per bucket and channel: requests left, and when it refills.
    buckets: HashMap<(String, u64), (u64, Instant)>,
    /// Every route waits until then (a global 429).
    global_until: Option<Instant>,
    /// When each refused answer came, within the window.
    refused: VecDeque<Instant>,
}

impl Limits {
    fn bucket(&self, kind: Kind, channel: u64) -> (String, u64) {
        let name = self
            .named
            .get(&(kind, channel))
            .cloned()
            .unwrap_or_else(|| format!("{kind:?}"));
        (name, channel)
    }

    /// When the call may go (None: now), taking one request from its bucket
    /// if it may.
    fn take(&mut self, kind: Kind, channel: u64, now: Instant) -> Option<Instant> {
        if let Some(at) = self.global_until.filter(|at| *at > now) {
            return Some(at);
        }
        let key = self.bucket(kind, channel);
        match self.buckets.get_mut(&key) {
            Some((0, at)) if *at > now => Some(*at),
            Some((left, at)) if *at > now => {
                *left -= 1;
                None
            }
            _ => None,
        }
    }

    fn note(&mut self, kind: Kind, channel: u64, header: impl Fn(&str) -> Option<String>) {
        if let Some(name) = header("x-ratelimit-bucket") {
            self.named.insert((kind, channel), name);
        }
        let number = |h: &str| header(h).and_then(|v| v.parse::<f64>().ok());
        if let (Some(left), Some(after)) = (
            number("x-ratelimit-remaining"),
            number("x-ratelimit-reset-after"),
        ) {
            let at = Instant::now() + Duration::from_secs_f64(after.clamp(0.0, 3600.0));
            let key = self.bucket(kind, channel);
            self.buckets.insert(key, (left.max(0.0) as u64, at));
        }
    }

    fn refused(&mut self, now: Instant) -> usize {
        while self
            .refused
            .front()
            .is_some_and(|t| now.duration_since(*t) >= INVALID_WINDOW)
        {
            self.refused.pop_front();
        }
        self.refused.len()
    }
}

/// The REST client and its limits; shared by a process's calls.
pub struct Rest {
    pub http: Arc<Http>,
    client: reqwest::Client,
    limits: Mutex<Limits>,
}

impl Rest {
    /// `http` must have been built on `client` with serenity's limiter off
    /// ([`crate::http`]).
    pub fn new(http: Arc<Http>, client: reqwest::Client) -> Rest {
        Rest {
            http,
            client,
            limits: Mutex::default(),
        }
    }

    /// The HTTP client the calls go out on.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    fn limits(&self) -> std::sync::MutexGuard<'_, Limits> {
        self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One request of `kind` in `channel`, once its bucket and the global
    /// limit allow; the answer, or serenity's error for a refusal (so
    /// [`crate::send::classify`] reads it as for any serenity call).
    pub async fn call(
        &self,
        kind: Kind,
        channel: u64,
        request: Request<'_>,
        method: LightMethod,
    ) -> serenity::Result<reqwest::Response> {
        loop {
            let now = Instant::now();
            let wait = {
                let mut limits = self.limits();
                if limits.refused(now) >= INVALID_BUDGET {
                    return Err(serenity::Error::Other(
                        "holding back: the bridge has had 1,000 refused Discord requests in ten minutes (Discord bans an address at 10,000)",
                    ));
                }
                limits.take(kind, channel, now)
            };
            match wait {
                Some(at) => tokio::time::sleep_until(at).await,
                None => break,
            }
        }
        let built = request
            .build(&self.client, self.http.token(), self.http.proxy.as_deref())?
            .build()
            .map_err(|e| serenity::Error::Http(HttpError::Request(e)))?;
        let response = self
            .client
            .execute(built)
            .await
            .map_err(|e| serenity::Error::Http(HttpError::Request(e)))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        {
            let mut limits = self.limits();
            limits.note(kind, channel, header);
            if matches!(status, 401 | 403 | 429) {
                limits.refused.push_back(Instant::now());
            }
        }
        if response.status().is_success() {
            return Ok(response);
        }
        let error = ErrorResponse::from_response(response, method.reqwest_method()).await;
        if status == 429 {
            self.rate_limited(kind, channel, &header);
        }
        Err(serenity::Error::Http(HttpError::UnsuccessfulRequest(error)))
    }

    /// A 429: its bucket, or every route when it is global, waits out its
    /// `Retry-After` (discord.com sends it on every 429; a second without it).
    fn rate_limited(&self, kind: Kind, channel: u64, header: &impl Fn(&str) -> Option<String>) {
        let retry_after = header("retry-after")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(1.0)
            .clamp(0.0, 3600.0);
        let global = header("x-ratelimit-global").is_some()
            || header("x-ratelimit-scope").as_deref() == Some("global");
        let until = Instant::now() + Duration::from_secs_f64(retry_after);
        let mut limits = self.limits();
        if global {
            limits.global_until = Some(limits.global_until.map_or(until, |t| t.max(until)));
        } else {
            let key = limits.bucket(kind, channel);
            limits.buckets.insert(key, (0, until));
        }
    }

    /// A request with a JSON body.
    pub async fn send_json<T: serde::de::DeserializeOwned>(
        &self,
        kind: Kind,
        channel: u64,
        route: Route<'_>,
        method: LightMethod,
        body: Option<Vec<u8>>,
        params: Option<Vec<(&'static str, String)>>,
    ) -> serenity::Result<T> {
        let request = Request::new(route, method).body(body).params(params);
        let response = self.call(kind, channel, request, method).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|e| serenity::Error::Http(HttpError::Request(e)))?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// The channel object Discord keeps for `channel` (its `type` tells a
    /// DM, 1, from a guild channel).
    pub async fn channel(&self, channel: u64) -> serenity::Result<serde_json::Value> {
        let route = Route::Channel {
            channel_id: channel.into(),
        };
        self.send_json(
            Kind::ReadChannel,
            channel,
            route,
            LightMethod::Get,
            None,
            None,
        )
        .await
    }

    /// A request whose answer has no body worth reading.
    pub async fn send_empty(
        &self,
        kind: Kind,
        channel: u64,
        route: Route<'_>,
        method: LightMethod,
    ) -> serenity::Result<()> {
        let request = Request::new(route, method);
        self.call(kind, channel, request, method).await?;
        Ok(())
    }
}
