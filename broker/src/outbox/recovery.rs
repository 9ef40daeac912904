//! Recovery's pages of pending entries, read one page ahead of their handling.
//!
//! A restart with many parked entries is a chain per page: read the page
//! (`XREADGROUP` from an id), its delivery counts (`XPENDING`), what recovery
//! needs of its records (`HMGET` of `OutboxService::recovery_fields`) and the
//! pending index repaired from them; then handle each entry. Done in that order
//! a page at a time, Redis, the connection's reply parsing and the handling
//! take turns. A task of its own reads the next page while the service handles
//! this one, so they overlap.
//!
//! Invariants:
//! - Pages come in stream order, source after source. The reader reads a
//!   page only once the page before it was taken: it is one page ahead of
//!   the one being handled, never more, so memory holds two pages whatever
//!   the number pending. Each read counts one more delivery of its entries
//!   (poison is counted that way across crashes): when a worker keeps dying
//!   on one entry, the entries after it up to the end of the next page reach
//!   `max_deliveries` with it and are dead-lettered with it, a thousand more
//!   than without reading ahead.
//! - A record read ahead may predate a decision, or a change announced,
//!   whose wake-up the service serves between two pages. The service notes
//!   every wake-up for an approval it does not track yet while it recovers
//!   (`memory::Recovering::woken`), reads such a record whole when it
//!   reaches its entry, and has the sweep read it twice more after an
//!   announcement (the change may land after that read).
//! - After a reconnect the service still tracks what it knew, and a decision
//!   served between pages may settle, ack and close one of those before its
//!   page is handled. The records of those approvals
//!   (`memory::Recovering::known`) are neither read nor indexed by the
//!   reader, and their entries are skipped.
//! - The reader writes nothing but the pending index (the unsettled records
//!   it read put in it: a cache of the records, repaired from them) and the
//!   delivery counts every read adds. It ends with the recovery that started
//!   it: dropping [`Pages`] aborts it.
//! - A wake-up on the decisions stream may be read both by a page and by
//!   the service's read of new ones between pages; handling one twice does
//!   nothing more (settling reads the record).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::incoming::Class;
use super::source::{Kind, SourceId};
use crate::approval::{self, Approvals, IdKey, Record};
use crate::blocking::Blocking;
use crate::error::{Error, Result};
use crate::store::{RawEntry, Store};

/// Pending entries read per page: far more than a live batch, since each page
/// costs a few round trips whatever its size.
const PAGE: usize = 1000;

/// One page of a source's pending entries, with what recovery reads beside them.
pub(super) struct Page {
    pub source: SourceId,
    pub entries: Vec<RawEntry>,
    /// Delivery count of each entry, this re-read included.
    pub counts: HashMap<String, u64>,
    /// For the agent entries of a parking bridge: each approval id and its
    /// record's recovery fields (`None`: no record of this bridge).
    pub records: Vec<(String, Option<Record>)>,
}

/// What the reader reads of one source.
pub(super) struct SourcePages {
    pub source: SourceId,
    pub key: String,
    pub kind: Kind,
}

/// Everything the reader task needs, owned: it runs beside the service.
pub(super) struct PageReader {
    pub store: Store,
    pub blocking: Blocking,
    pub group: String,
    pub consumer: String,
    pub sources: Vec<SourcePages>,
    /// Whether agent entries have records to read, with the key their ids
    /// are derived with and the fields recovery reads.
    pub records: Option<(IdKey, Vec<String>)>,
    /// Approvals the service tracked when the recovery began: not read (the
    /// service skips their entries; one may be settled and its record
    /// closed before its page is handled, and must not be indexed again).
    pub known: Arc<HashSet<String>>,
}

/// The pages as the reader delivers them; dropping this stops the reader.
pub(super) struct Pages {
    rx: mpsc::Receiver<Result<Page>>,
    /// `None` once it ended and was waited for.
    task: Option<JoinHandle<()>>,
}

impl Drop for Pages {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Pages {
    /// The next page, `None` once every source is read to its end.
    pub async fn next(&mut self) -> Result<Option<Page>> {
        if let Some(page) = self.rx.recv().await {
            return page.map(Some);
        }
        // The reader ended: all read, or it panicked (then the pages left
        // were never read, and the recovery must not end as if they were).
        match self.task.take() {
            Some(task) => task.await.map_err(|e| {
                Error::internal(format!("the reader of recovery's pages stopped: {e}"))
            }),
            None => Ok(()),
        }
        .map(|()| None)
    }
}

impl PageReader {
    pub fn spawn(self) -> Pages {
        let (tx, rx) = mpsc::channel(1);
        let task = Some(tokio::spawn(self.run(tx)));
        Pages { rx, task }
    }

    async fn run(mut self, tx: mpsc::Sender<Result<Page>>) {
        let sources = std::mem::take(&mut self.sources);
        for source in &sources {
            let mut after = "0".to_string();
            loop {
                // A slot first, then the read: the reader is one page ahead
                // of the one being handled, never two (each read counts one
                // more delivery of its entries; see the module doc).
                let Ok(slot) = tx.reserve().await else {
                    return;
                };
                let page = self.read(source, &after).await;
                let last = match &page {
                    Ok(p) => match p.entries.last() {
                        Some((id, _)) => Some(id.clone()),
                        None => break,
                    },
                    Err(_) => None,
                };
                slot.send(page);
                match last {
                    Some(id) => after = id,
                    // An error ends the recovery that reads it.
                    None => return,
                }
            }
        }
    }

    async fn read(&mut self, source: &SourcePages, after: &str) -> Result<Page> {
        let batch = self
            .blocking
            .read_group(
                &self.group,
                &self.consumer,
                std::slice::from_ref(&source.key),
                &[after],
                PAGE,
                None,
            )
            .await?;
        let entries: Vec<RawEntry> = batch.into_iter().flat_map(|(_, e)| e).collect();
        let mut page = Page {
            source: source.source,
            entries,
            counts: HashMap::new(),
            records: Vec::new(),
        };
        let Some((first, _)) = page.entries.first() else {
            return Ok(page);
        };
        let consumer = self.consumer.clone();
        page.counts = self
            .store
            .pending(
                &source.key,
                &self.group,
                first,
                page.entries.len(),
                Some(&consumer),
                0,
            )
            .await?
            .into_iter()
            .map(|p| (p.id, p.deliveries))
            .collect();
        page.records = self.records(source, &page.entries).await?;
        Ok(page)
    }

    /// The recovery fields of the records of a page's agent entries, read in
    /// one round trip, and the unsettled ones put in the pending index in
    /// another: two round trips a page, not two an entry.
    async fn records(
        &mut self,
        source: &SourcePages,
        entries: &[RawEntry],
    ) -> Result<Vec<(String, Option<Record>)>> {
        let Some((key, fields)) = &self.records else {
            return Ok(Vec::new());
        };
        if source.kind == Kind::Decisions {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = entries
            .iter()
            .filter_map(|(entry_id, fields)| {
                let fields = fields.as_ref()?;
                (Class::of_fields(source.kind, fields) == Class::Agent)
                    .then(|| key.id_for(&source.key, entry_id))
            })
            .filter(|id| !self.known.contains(id))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
        let mut approvals = Approvals::on(&mut self.store);
        let records: Vec<Option<Record>> = approvals
            .load_fields_many(&ids, &fields)
            .await?
            .into_iter()
            .zip(&ids)
            // As a whole read does: a record naming another bridge is none.
            .map(|(r, id)| r.filter(|r| approval::is_id_of(id, r.source())))
            .collect();
        approvals
            .index(&records.iter().flatten().collect::<Vec<_>>())
            .await?;
        Ok(ids.into_iter().zip(records).collect())
    }
}
