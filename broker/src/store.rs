//! Connections to Redis and the few stream primitives every service uses.
//!
//! Two kinds of connection: the store's own for ordinary commands (it reconnects
//! by itself and times out slow replies), and [`Store::blocking`] for `XREADGROUP
//! BLOCK`, which must not share a pipeline with other commands nor time out
//! before the server answers.
//!
//! The store's connection is the broker's own: bridges, the page and the MCP
//! server reach Redis through typed calls (these, the ingest context, the
//! approval repository), so every key they touch is named in [`crate::keys`]
//! and every command is one the ACL of `crate::acl::rules` grants. That
//! holds by convention beyond the store: [`Conn`] and [`Blocking`] are
//! public (the tests' raw connection is one).
//!
//! Stream entries are kept as raw bytes ([`Entry`]): whether a value is valid
//! UTF-8 is a validation question for the caller, not a parse failure here.

use std::collections::HashMap;
use std::time::Duration;

use redis::{AsyncCommands, Value};

pub use crate::blocking::Blocking;
use crate::config::RedisConfig;
use crate::error::{Error, Result};
pub use crate::topology::Conn;

/// One stream entry: its id and its fields in the order they were written.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: String,
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    /// The raw value of a field.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// A field as text, when present and valid UTF-8.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// What one `XREADGROUP`/`XREAD` returned: entries per stream. An entry whose
/// body was deleted while pending comes back with `fields = None`.
pub type StreamBatch = Vec<(String, Vec<RawEntry>)>;

/// A stream id (`MS-SEQ`) as the pair Redis orders ids by; an id Redis did
/// not write sorts first.
pub fn id_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// One entry as read: its id, and its fields unless its body was deleted.
pub type RawEntry = (String, Option<Vec<(String, Vec<u8>)>>);

/// One consumer of a group, as `XINFO CONSUMERS` reports it.
#[derive(Debug, Clone)]
pub struct Consumer {
    pub name: String,
    /// Entries delivered to it and not yet acked.
    pub pending: u64,
}

/// One consumer group of a stream, as `XINFO GROUPS` reports it.
#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    /// Entries handed out and not yet acked.
    pub pending: u64,
    /// The last entry handed to any consumer of the group.
    pub last_delivered: String,
    /// How many entries the group has been handed in all (`entries-read`).
    pub entries_read: u64,
    /// Entries of the stream the group has not been handed yet (`lag`); none
    /// when Redis cannot tell (after deletions in the unread part; before
    /// Redis 7, which does not report it).
    pub lag: Option<u64>,
}

/// One entry of a group's pending list.
#[derive(Debug, Clone)]
pub struct Pending {
    pub id: String,
    pub consumer: String,
    pub idle_ms: u64,
    /// How many times it was handed to a consumer (reads, re-reads, claims).
    pub deliveries: u64,
}

/// A handle on Redis for one service.
#[derive(Clone)]
pub struct Store {
    /// The general-purpose connection (multiplexed, reconnecting, following
    /// a failover; see [`crate::topology`]).
    pub(crate) conn: Conn,
}

impl Store {
    /// Connects using `[redis]`, reading the password from its file.
    pub async fn connect(config: &RedisConfig) -> Result<Store> {
        Ok(Store {
            conn: Conn::connect(config).await?,
        })
    }

    /// A dedicated connection for blocking reads (no response timeout; see
    /// [`crate::blocking`]).
    pub async fn blocking(&self) -> Result<Blocking> {
        self.conn.blocking().await
    }

    /// Creates a consumer group (and its stream) unless it exists. New groups start
    /// at the beginning, so entries written before the first start are not skipped.
    pub async fn ensure_group(&mut self, stream: &str, group: &str) -> Result<()> {
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn)
            .await;
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(Error::from_redis(
                &format!("XGROUP CREATE {stream} {group}"),
                e,
            )),
        }
    }

    /// Appends an entry and returns its id.
    pub async fn xadd(&mut self, stream: &str, fields: &[(&str, &[u8])]) -> Result<String> {
        self.conn
            .xadd(stream, "*", fields)
            .await
            .map_err(|e| Error::from_redis(&format!("XADD {stream}"), e))
    }

    /// Acknowledges entries of one stream.
    pub async fn ack(&mut self, stream: &str, group: &str, ids: &[&str]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let _: i64 = self
            .conn
            .xack(stream, group, ids)
            .await
            .map_err(|e| Error::from_redis(&format!("XACK {stream}"), e))?;
        Ok(())
    }

    /// Reads one entry by id, if it still exists.
    pub async fn entry(&mut self, stream: &str, id: &str) -> Result<Option<Entry>> {
        let v: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(id)
            .arg(id)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XRANGE {stream}"), e))?;
        Ok(parse_entries(v)
            .into_iter()
            .find_map(|(eid, f)| f.map(|fields| Entry { id: eid, fields })))
    }

    /// Entries of a stream between two ids (inclusive), at most `count`.
    pub async fn range(
        &mut self,
        stream: &str,
        start: &str,
        end: &str,
        count: usize,
    ) -> Result<Vec<Entry>> {
        let v: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(start)
            .arg(end)
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XRANGE {stream}"), e))?;
        Ok(parse_entries(v)
            .into_iter()
            .filter_map(|(id, f)| f.map(|fields| Entry { id, fields }))
            .collect())
    }

    /// At most `count` entries of a stream from `end` back, newest first.
    pub async fn newest(&mut self, stream: &str, end: &str, count: usize) -> Result<Vec<RawEntry>> {
        let v: Value = redis::cmd("XREVRANGE")
            .arg(stream)
            .arg(end)
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XREVRANGE {stream}"), e))?;
        Ok(parse_entries(v))
    }

    /// The length of a stream (`XLEN`; 0 when it does not exist).
    pub async fn len(&mut self, stream: &str) -> Result<u64> {
        self.conn
            .xlen(stream)
            .await
            .map_err(|e| Error::from_redis(&format!("XLEN {stream}"), e))
    }

    /// The consumers of a group on one stream (`XINFO CONSUMERS`).
    pub async fn consumers(&mut self, stream: &str, group: &str) -> Result<Vec<Consumer>> {
        let v: Vec<HashMap<String, Value>> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(stream)
            .arg(group)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XINFO CONSUMERS {stream}"), e))?;
        let int = |m: &HashMap<String, Value>, k: &str| match m.get(k) {
            Some(Value::Int(i)) => (*i).max(0) as u64,
            _ => 0,
        };
        Ok(v.iter()
            .filter_map(|m| {
                Some(Consumer {
                    name: m.get("name").and_then(text)?,
                    pending: int(m, "pending"),
                })
            })
            .collect())
    }

    /// The groups of a stream (`XINFO GROUPS`); none when the stream does not exist.
    pub async fn groups(&mut self, stream: &str) -> Result<Vec<Group>> {
        let r: redis::RedisResult<Vec<HashMap<String, Value>>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(stream)
            .query_async(&mut self.conn)
            .await;
        let v = match r {
            Ok(v) => v,
            Err(e) if e.to_string().contains("no such key") => return Ok(Vec::new()),
            Err(e) => return Err(Error::from_redis(&format!("XINFO GROUPS {stream}"), e)),
        };
        let int = |m: &HashMap<String, Value>, k: &str| match m.get(k) {
            Some(Value::Int(i)) => (*i).max(0) as u64,
            _ => 0,
        };
        Ok(v.iter()
            .filter_map(|m| {
                Some(Group {
                    name: m.get("name").and_then(text)?,
                    pending: int(m, "pending"),
                    last_delivered: m.get("last-delivered-id").and_then(text)?,
                    entries_read: int(m, "entries-read"),
                    lag: match m.get("lag") {
                        Some(Value::Int(i)) => Some((*i).max(0) as u64),
                        _ => None,
                    },
                })
            })
            .collect())
    }

    /// The smallest id pending in a group (summary `XPENDING`).
    pub async fn oldest_pending(&mut self, stream: &str, group: &str) -> Result<Option<String>> {
        let v: Value = redis::cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XPENDING {stream}"), e))?;
        Ok(match v {
            Value::Array(items) => items.get(1).and_then(text),
            _ => None,
        })
    }

    /// A page of a group's pending list (extended `XPENDING`): entries from
    /// `start` on, at most `count`, optionally of one consumer and idle at least
    /// `min_idle_ms`.
    pub async fn pending(
        &mut self,
        stream: &str,
        group: &str,
        start: &str,
        count: usize,
        consumer: Option<&str>,
        min_idle_ms: u64,
    ) -> Result<Vec<Pending>> {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(stream).arg(group);
        if min_idle_ms > 0 {
            cmd.arg("IDLE").arg(min_idle_ms);
        }
        cmd.arg(start).arg("+").arg(count);
        if let Some(c) = consumer {
            cmd.arg(c);
        }
        let v: Vec<(String, String, u64, u64)> = cmd
            .query_async(&mut self.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XPENDING {stream}"), e))?;
        Ok(v.into_iter()
            .map(|(id, consumer, idle_ms, deliveries)| Pending {
                id,
                consumer,
                idle_ms,
                deliveries,
            })
            .collect())
    }

    /// Takes entries idle at least `min_idle_ms` over to `consumer` (`XCLAIM`,
    /// which counts a delivery). Entries no longer in the stream are dropped from
    /// the pending list by Redis and not returned.
    pub async fn claim(
        &mut self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
        ids: &[&str],
    ) -> Result<Vec<Entry>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let v: Value = redis::cmd("XCLAIM")
            .arg(stream)
            .arg(group)
            .arg(consumer)
            .arg(min_idle_ms)
            .arg(ids)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XCLAIM {stream}"), e))?;
        Ok(parse_entries(v)
            .into_iter()
            .filter_map(|(id, f)| f.map(|fields| Entry { id, fields }))
            .collect())
    }

    /// Marks a service alive in the bridge's heartbeat hash for `ttl`, with
    /// the time of `clock` (the service's own, so a paused test's beats move
    /// with its time).
    pub async fn heartbeat(
        &mut self,
        bridge: &str,
        service: &str,
        ttl: Duration,
        clock: &crate::Clock,
    ) -> Result<()> {
        let key = crate::keys::heartbeat(bridge);
        let _: () = redis::pipe()
            .hset(&key, service, clock.now_secs())
            .ignore()
            .expire(&key, ttl.as_secs() as i64)
            .ignore()
            .query_async(&mut self.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("HSET {key}"), e))?;
        Ok(())
    }

    /// The bridge's heartbeats: each service's last beat (unix seconds, as
    /// text), as [`Store::heartbeat`] wrote them and not yet expired.
    pub async fn heartbeats(&mut self, bridge: &str) -> Result<HashMap<String, String>> {
        let key = crate::keys::heartbeat(bridge);
        self.conn
            .hgetall(&key)
            .await
            .map_err(|e| Error::from_redis(&format!("HGETALL {key}"), e))
    }
}

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn parse_fields(v: Value) -> Option<Vec<(String, Vec<u8>)>> {
    let items = match v {
        Value::Array(items) => items,
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return None,
    };
    let mut fields = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        let key = match k {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            other => text(&other)?,
        };
        let value = match v {
            Value::BulkString(b) => b,
            Value::SimpleString(s) => s.into_bytes(),
            Value::Int(i) => i.to_string().into_bytes(),
            _ => return None,
        };
        fields.push((key, value));
    }
    Some(fields)
}

/// Parses an XRANGE-style list of `[id, fields]`.
#[allow(clippy::type_complexity)]
pub fn parse_entries(v: Value) -> Vec<(String, Option<Vec<(String, Vec<u8>)>>)> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(mut pair) = item else {
                return None;
            };
            if pair.is_empty() {
                return None;
            }
            let fields = if pair.len() > 1 {
                parse_fields(pair.remove(1))
            } else {
                None
            };
            Some((text(&pair[0])?, fields))
        })
        .collect()
}

pub(crate) fn parse_read(v: Value) -> StreamBatch {
    let streams: Vec<(Value, Value)> = match v {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut kv) if kv.len() == 2 => {
                    let entries = kv.pop()?;
                    Some((kv.pop()?, entries))
                }
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs,
        _ => Vec::new(),
    };
    streams
        .into_iter()
        .filter_map(|(k, entries)| Some((text(&k)?, parse_entries(entries))))
        .collect()
}
