//! Connections for blocking group reads, one server or a cluster alike.
//!
//! On one server a blocking `XREADGROUP` names every stream a service reads.
//! On a cluster that read is refused (`CROSSSLOT`: the streams hash to
//! different slots), so [`ClusterReads`] runs one blocking read per stream,
//! each on a connection of its own, and hands back whatever any of them
//! brought: a new entry on any stream wakes the reader as fast as the single
//! read does.
//!
//! Invariants:
//! - A blocking read is never abandoned while this value lives: a read that
//!   has not answered when the caller stops waiting keeps running, and its
//!   entries are returned by a later call. (Dropping the value drops the
//!   reads, as dropping one server's connection does; what they were handed
//!   is pending and read again by the owner's recovery.)
//! - Non-blocking reads (`block` of `None`: recovery, pending lists) are made
//!   stream by stream on the value's own connection.

use std::collections::HashSet;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::store::StreamBatch;

/// A dedicated connection for blocking reads (no reply timeout).
pub enum Blocking {
    One(MultiplexedConnection),
    Cluster(Box<ClusterReads>),
}

/// One blocking read under way on a cluster: its stream, its connection
/// (back for the next read), what it brought.
type Read = (String, ClusterConnection, Result<StreamBatch>);

/// Blocking reads on a cluster, one per stream.
pub struct ClusterReads {
    client: ClusterClient,
    /// Non-blocking commands and single-stream reads.
    conn: ClusterConnection,
    reads: JoinSet<Read>,
    reading: HashSet<String>,
    idle: Vec<ClusterConnection>,
}

impl ClusterReads {
    pub(crate) fn new(client: ClusterClient, conn: ClusterConnection) -> ClusterReads {
        ClusterReads {
            client,
            conn,
            reads: JoinSet::new(),
            reading: HashSet::new(),
            idle: Vec::new(),
        }
    }

    async fn read_group(
        &mut self,
        group: &str,
        consumer: &str,
        streams: &[String],
        ids: &[&str],
        count: usize,
        block: Option<Duration>,
    ) -> Result<StreamBatch> {
        let Some(block) = block.filter(|_| streams.len() > 1 || !self.reading.is_empty()) else {
            let mut batch = StreamBatch::new();
            for (stream, id) in streams.iter().zip(ids) {
                let one = std::slice::from_ref(stream);
                batch.extend(
                    read_once(&mut self.conn, group, consumer, one, &[id], count, block).await?,
                );
            }
            return Ok(batch);
        };
        if ids.iter().any(|id| *id != ">") {
            return Err(Error::internal(
                "a blocking read on a cluster reads new entries (`>`) only",
            ));
        }
        let all = vec![">"; streams.len()];
        self.fan_out(streams, &all, block, |stream, _| {
            group_read(
                group,
                consumer,
                std::slice::from_ref(stream),
                &[">"],
                count,
                Some(block),
            )
        })
        .await
    }

    /// Starts a blocking read (`read(stream, id)`) on each stream that has
    /// none under way, and returns what those that answer within `block`
    /// brought (the others go on, for the next call).
    async fn fan_out(
        &mut self,
        streams: &[String],
        ids: &[&str],
        block: Duration,
        read: impl Fn(&String, &str) -> Cmd,
    ) -> Result<StreamBatch> {
        for (stream, id) in streams.iter().zip(ids) {
            if self.reading.contains(stream) {
                continue;
            }
            let mut conn = match self.idle.pop() {
                Some(conn) => conn,
                None => crate::cluster::dedicated(&self.client).await?,
            };
            let cmd = read(stream, id);
            let stream = stream.clone();
            self.reading.insert(stream.clone());
            self.reads.spawn(async move {
                let read = query_read(&mut conn, &cmd, &stream).await;
                (stream, conn, read)
            });
        }
        let mut batch = StreamBatch::new();
        // Cancel-safe: a read still under way when this wait is dropped or
        // times out stays in the set for the next call.
        let first = match tokio::time::timeout(block, self.reads.join_next()).await {
            Ok(Some(done)) => done,
            Ok(None) | Err(_) => return Ok(batch),
        };
        let mut done = vec![first];
        while let Some(more) = self.reads.try_join_next() {
            done.push(more);
        }
        let mut failed = None;
        for joined in done {
            let (stream, conn, read) =
                joined.map_err(|e| Error::internal(format!("a blocking read ended: {e}")))?;
            self.reading.remove(&stream);
            self.idle.push(conn);
            match read {
                Ok(got) => batch.extend(got.into_iter().filter(|(_, e)| !e.is_empty())),
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            // What other reads brought is pending for this consumer: the
            // owner's recovery after the error reads it again.
            Some(e) => Err(e),
            None => Ok(batch),
        }
    }
}

impl Blocking {
    /// Follows `streams` from the ids in `last` without a group (the page's
    /// and the exporter's view of the audit trails): what is newer, as soon
    /// as any stream has some, or nothing after `block`.
    pub async fn tail(
        &mut self,
        streams: &[String],
        last: &[String],
        count: usize,
        block: Duration,
    ) -> Result<StreamBatch> {
        let last: Vec<&str> = last.iter().map(String::as_str).collect();
        match self {
            Blocking::One(conn) => {
                let cmd = tail_read(streams, &last, count, block);
                query_read(conn, &cmd, &streams.join(" ")).await
            }
            Blocking::Cluster(reads) => {
                reads
                    .fan_out(streams, &last, block, |stream, id| {
                        tail_read(std::slice::from_ref(stream), &[id], count, block)
                    })
                    .await
            }
        }
    }

    /// Reads a group's entries: `ids` is `>` for new ones or `0` for this
    /// consumer's pending list. `block` of `None` returns at once.
    pub async fn read_group(
        &mut self,
        group: &str,
        consumer: &str,
        streams: &[String],
        ids: &[&str],
        count: usize,
        block: Option<Duration>,
    ) -> Result<StreamBatch> {
        match self {
            Blocking::One(conn) => {
                read_once(conn, group, consumer, streams, ids, count, block).await
            }
            Blocking::Cluster(reads) => {
                reads
                    .read_group(group, consumer, streams, ids, count, block)
                    .await
            }
        }
    }
}

/// One `XREADGROUP` (all `streams` must share a slot on a cluster).
async fn read_once(
    conn: &mut impl ConnectionLike,
    group: &str,
    consumer: &str,
    streams: &[String],
    ids: &[&str],
    count: usize,
    block: Option<Duration>,
) -> Result<StreamBatch> {
    let cmd = group_read(group, consumer, streams, ids, count, block);
    query_read(conn, &cmd, &streams.join(" ")).await
}

fn group_read(
    group: &str,
    consumer: &str,
    streams: &[String],
    ids: &[&str],
    count: usize,
    block: Option<Duration>,
) -> Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count);
    if let Some(block) = block {
        cmd.arg("BLOCK").arg(block.as_millis().max(1) as u64);
    }
    cmd.arg("STREAMS").arg(streams).arg(ids);
    cmd
}

/// `XREAD` from `last` (no group: nothing is handed out, so nothing is lost
/// when a read is dropped).
fn tail_read(streams: &[String], last: &[&str], count: usize, block: Duration) -> Cmd {
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(block.as_millis().max(1) as u64)
        .arg("STREAMS")
        .arg(streams)
        .arg(last);
    cmd
}

async fn query_read(conn: &mut impl ConnectionLike, cmd: &Cmd, what: &str) -> Result<StreamBatch> {
    let v: Value = cmd
        .query_async(conn)
        .await
        .map_err(|e| Error::from_redis(&format!("stream read of {what}"), e))?;
    Ok(crate::store::parse_read(v))
}

impl ConnectionLike for Blocking {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Blocking::One(conn) => conn.req_packed_command(cmd),
            Blocking::Cluster(reads) => reads.conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Blocking::One(conn) => conn.req_packed_commands(pipeline, offset, count),
            Blocking::Cluster(reads) => reads.conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Blocking::One(conn) => conn.get_db(),
            Blocking::Cluster(_) => 0,
        }
    }
}
