//! `/metrics`: the gate seen from outside, in the Prometheus text format.
//!
//! Invariants:
//! - A scrape costs the same however many approvals are parked: per bridge one
//!   `ZCARD` and one `ZRANGE 0 0` of the pending index, `XLEN`/`HLEN` of its
//!   dead letters and uncertain deliveries, its heartbeat hash, and `XINFO
//!   GROUPS` per stream. Never a `SCAN`, never a record.
//! - Counters and the time-to-decision histogram are counted from the audit
//!   trails as they grow (a background tail from the moment the process
//!   started), so a scrape reads them from memory. They start at zero with the
//!   process, as Prometheus counters do.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use broker::config::Config;
use broker::{keys, Store};

type Labels = Vec<(String, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

fn decision_buckets() -> Histogram {
    Histogram::new([
        5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14_400.0, 43_200.0, 86_400.0,
    ])
}

/// What the audit tail counts.
#[derive(Clone)]
pub struct Counters {
    decisions: Family<Labels, Counter>,
    expired: Family<Labels, Counter>,
    delivered: Family<Labels, Counter>,
    failed: Family<Labels, Counter>,
    uncertain: Family<Labels, Counter>,
    ignored: Family<Labels, Counter>,
    snoozed: Family<Labels, Counter>,
    delegated: Family<Labels, Counter>,
    escalated: Family<Labels, Counter>,
    time_to_decision: Histograms,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            decisions: Family::default(),
            expired: Family::default(),
            delivered: Family::default(),
            failed: Family::default(),
            uncertain: Family::default(),
            ignored: Family::default(),
            snoozed: Family::default(),
            delegated: Family::default(),
            escalated: Family::default(),
            time_to_decision: Family::new_with_constructor(decision_buckets),
        }
    }
}

fn bridge(b: &str) -> Labels {
    vec![("bridge".into(), b.into())]
}

impl Counters {
    /// Counts one audit entry of `bridge`'s trail.
    pub fn count(&self, bridge_name: &str, fields: &HashMap<String, String>) {
        let b = bridge(bridge_name);
        match fields.get("event").map(String::as_str) {
            Some("decided") => {
                let verdict = fields.get("verdict").cloned().unwrap_or_default();
                // The surface of the (first) deciding identity: discord, email, cli, web, ...
                let surface = fields
                    .get("by")
                    .and_then(|by| by.split(':').next())
                    .unwrap_or("")
                    .to_string();
                let mut labels = b.clone();
                labels.push(("verdict".into(), verdict));
                labels.push(("surface".into(), surface));
                self.decisions.get_or_create(&labels).inc();
                if let Some(waited) = fields.get("waited").and_then(|w| w.parse::<f64>().ok()) {
                    // By the escalation step it was decided at (0: before any).
                    let mut labels = b.clone();
                    let step = fields.get("step").cloned().unwrap_or_else(|| "0".into());
                    labels.push(("step".into(), step));
                    self.time_to_decision.get_or_create(&labels).observe(waited);
                }
            }
            Some("expired") => {
                self.expired.get_or_create(&b).inc();
            }
            Some("delivered") => {
                self.delivered.get_or_create(&b).inc();
            }
            Some("failed") => {
                self.failed.get_or_create(&b).inc();
            }
            Some("uncertain") => {
                self.uncertain.get_or_create(&b).inc();
            }
            Some("ignored") => {
                self.ignored.get_or_create(&b).inc();
            }
            Some("snoozed") => {
                self.snoozed.get_or_create(&b).inc();
            }
            Some("delegated") => {
                self.delegated.get_or_create(&b).inc();
            }
            Some("escalated") => {
                self.escalated.get_or_create(&b).inc();
            }
            _ => {}
        }
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "cowboy_decisions",
            "Approvals decided, by verdict and the surface that decided",
            self.decisions.clone(),
        );
        r.register(
            "cowboy_expired",
            "Approvals that expired undecided",
            self.expired.clone(),
        );
        r.register(
            "cowboy_deliveries",
            "Approved entries delivered",
            self.delivered.clone(),
        );
        r.register(
            "cowboy_delivery_failures",
            "Approved entries that failed (not sent)",
            self.failed.clone(),
        );
        r.register(
            "cowboy_uncertain_deliveries",
            "Approved or plain deliveries whose outcome is unknown",
            self.uncertain.clone(),
        );
        r.register(
            "cowboy_answers_ignored",
            "Answers that changed nothing (not an approver, late, counted already)",
            self.ignored.clone(),
        );
        r.register(
            "cowboy_snoozes",
            "Deadlines moved by an approver's \"later\" (never a decision)",
            self.snoozed.clone(),
        );
        r.register(
            "cowboy_delegations",
            "Delegations recorded or taken back",
            self.delegated.clone(),
        );
        r.register(
            "cowboy_escalations",
            "Escalation steps taken (an approval asked on one more surface)",
            self.escalated.clone(),
        );
        r.register(
            "cowboy_time_to_decision_seconds",
            "Seconds from parking to the decision",
            self.time_to_decision.clone(),
        );
    }
}

/// Follows every bridge's audit trail from now on, counting as it goes.
/// Returns when `stop` fires; reconnects after an error.
pub async fn tail(
    config: Arc<Config>,
    counters: Counters,
    stop: broker::Shutdown,
    role: crate::Role,
) {
    let names: Vec<String> = config.bridges.keys().cloned().collect();
    let streams: Vec<String> = names.iter().map(|b| keys::audit(b)).collect();
    let mut last: Vec<String> = vec!["$".into(); streams.len()];
    loop {
        let store = match Store::connect(&crate::redis_config_for(&config, role)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot connect; retrying");
                tokio::select! {
                    _ = stop.wait() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                }
            }
        };
        // Its own connection: a blocking read holds up the others on one.
        let mut reader = match store.blocking().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot connect; retrying");
                tokio::select! {
                    _ = stop.wait() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let read = tokio::select! {
                _ = stop.wait() => return,
                r = reader.tail(&streams, &last, 1000, std::time::Duration::from_secs(2)) => r,
            };
            match read {
                Ok(batches) => {
                    for (stream, entries) in batches {
                        let Some(i) = streams.iter().position(|s| *s == stream) else {
                            continue;
                        };
                        for (id, fields) in entries {
                            let fields: HashMap<String, String> = fields
                                .unwrap_or_default()
                                .into_iter()
                                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                                .collect();
                            counters.count(&names[i], &fields);
                            last[i] = id;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: reading the audit trails failed; reconnecting");
                    break;
                }
            }
        }
    }
}

fn gauge(r: &mut Registry, name: &str, help: &str, values: Vec<(Labels, f64)>) {
    let family: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    for (labels, v) in values {
        family.get_or_create(&labels).set(v);
    }
    r.register(name, help, family);
}

/// Renders the metrics: the gauges read now, the counters from the tail.
pub async fn render(
    store: &mut Store,
    config: &Config,
    counters: &Counters,
    now: f64,
) -> Result<String, String> {
    let names: Vec<&str> = config.bridges.keys().map(String::as_str).collect();
    let per = broker::gauges::read(store, &names)
        .await
        .map_err(|e| format!("metrics: {e}"))?;
    let mut r = Registry::default();
    let (mut pending, mut oldest, mut dead, mut uncertain, mut up, mut beat_age) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (b, g) in names.iter().zip(per) {
        pending.push((bridge(b), g.parked as f64));
        let age = g
            .oldest_parked_at
            .map_or(0.0, |created| (now - created).max(0.0));
        oldest.push((bridge(b), age));
        dead.push((bridge(b), g.dead as f64));
        uncertain.push((bridge(b), g.uncertain as f64));
        for service in ["ingest", "outbox", "ping"] {
            let mut labels = bridge(b);
            labels.push(("service".into(), service.into()));
            let at = g.beats.get(service).and_then(|t| t.parse::<f64>().ok());
            let alive =
                at.is_some_and(|t| now - t < (broker::timing::HEARTBEAT_EVERY * 3).as_secs_f64());
            up.push((labels.clone(), if alive { 1.0 } else { 0.0 }));
            if let Some(t) = at {
                beat_age.push((labels, (now - t).max(0.0)));
            }
        }
    }
    gauge(
        &mut r,
        "cowboy_approvals_pending",
        "Approvals parked and not yet settled",
        pending,
    );
    gauge(
        &mut r,
        "cowboy_approval_oldest_pending_age_seconds",
        "Age of the oldest parked approval (0: none)",
        oldest,
    );
    gauge(
        &mut r,
        "cowboy_dead_letters",
        "Entries in the dead letter stream",
        dead,
    );
    gauge(
        &mut r,
        "cowboy_deliveries_uncertain_open",
        "Uncertain deliveries waiting to be reconciled",
        uncertain,
    );
    gauge(
        &mut r,
        "cowboy_service_up",
        "1 while the service's heartbeat is fresh",
        up,
    );
    gauge(
        &mut r,
        "cowboy_heartbeat_age_seconds",
        "Seconds since the service's last heartbeat",
        beat_age,
    );

    let (mut lag, mut held) = (vec![], vec![]);
    for b in &names {
        for (stream, group) in broker::gauges::read_streams(config, b) {
            // A group that cannot be read (yet) has no gauge.
            let Ok(Some(g)) = broker::gauges::group(store, &stream, &group).await else {
                continue;
            };
            let labels = vec![
                ("stream".to_string(), stream.clone()),
                ("group".to_string(), group.clone()),
            ];
            if let Some(l) = g.lag {
                lag.push((labels.clone(), l as f64));
            }
            held.push((labels, g.pending as f64));
        }
    }
    gauge(
        &mut r,
        "cowboy_stream_lag",
        "Entries of the stream the group has not read yet",
        lag,
    );
    gauge(
        &mut r,
        "cowboy_stream_pending",
        "Entries the group read and has not acked (parked ones included)",
        held,
    );
    counters.register(&mut r);
    let mut out = String::new();
    encode(&mut out, &r).map_err(|e| format!("metrics: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trail's `escalated` steps are counted per bridge, and the time to
    /// a decision is kept per escalation step (0 before any; older trails,
    /// without `step`, read as 0).
    #[test]
    fn escalations_and_time_to_decision_by_step() {
        let counters = Counters::default();
        let event = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        counters.count("mail", &event(&[("event", "escalated"), ("count", "1")]));
        counters.count(
            "mail",
            &event(&[
                ("event", "decided"),
                ("verdict", "approved"),
                ("by", "console:carol"),
                ("waited", "12.5"),
                ("step", "1"),
            ]),
        );
        counters.count(
            "mail",
            &event(&[
                ("event", "decided"),
                ("verdict", "approved"),
                ("by", "console:boss"),
                ("waited", "2"),
            ]),
        );
        let mut r = Registry::default();
        counters.register(&mut r);
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        assert!(
            out.contains("cowboy_escalations_total{bridge=\"mail\"} 1"),
            "{out}"
        );
        for step in ["0", "1"] {
            let line = format!(
                "cowboy_time_to_decision_seconds_count{{bridge=\"mail\",step=\"{step}\"}} 1"
            );
            assert!(out.contains(&line), "{line} in\n{out}");
        }
    }
}
