//! The streams one outbox worker reads, and the typed handle each entry
//! carries of the stream it came from.
//!
//! Invariant: the list is fixed when the service is built (the flat outbox,
//! each configured agent's outbox in config order, the worker's wake-up
//! stream last), so a [`SourceId`] stays valid for the service's lifetime;
//! only the wake-up stream's key changes, once, with the worker's name.

use std::ops::Index;

use crate::config::Config;
use crate::keys;

/// What kind of stream a source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `{bridge}:outbox`: agents' entries, and the notify side's cards and outcomes.
    Flat,
    /// `{agent}:{bridge}:outbox`.
    Agent,
    /// The worker's wake-up stream.
    Decisions,
}

#[derive(Debug, Clone)]
pub(super) struct Source {
    pub key: String,
    /// The agent of a per-agent stream.
    pub agent: Option<String>,
    pub kind: Kind,
}

/// One of the service's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct SourceId(usize);

/// The streams of one worker, by [`SourceId`].
#[derive(Debug, Clone)]
pub(super) struct Sources(Vec<Source>);

impl Sources {
    /// The streams of bridge `name` for the default worker.
    pub fn new(config: &Config, name: &str) -> Sources {
        let mut sources = vec![Source {
            key: keys::outbox(name),
            agent: None,
            kind: Kind::Flat,
        }];
        for agent in config.agent_names() {
            sources.push(Source {
                key: keys::agent_outbox(agent, name),
                agent: Some(agent.to_string()),
                kind: Kind::Agent,
            });
        }
        sources.push(Source {
            key: keys::decisions(name),
            agent: None,
            kind: Kind::Decisions,
        });
        Sources(sources)
    }

    /// Worker `worker` reads its own wake-up stream.
    pub fn set_worker(&mut self, name: &str, worker: &str) {
        let wake = self.decisions();
        self.0[wake.0].key = keys::decisions_for(name, worker);
    }

    pub fn ids(&self) -> impl Iterator<Item = SourceId> {
        (0..self.0.len()).map(SourceId)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Source> {
        self.0.iter()
    }

    /// The source whose stream is `key`.
    pub fn by_key(&self, key: &str) -> Option<SourceId> {
        self.0.iter().position(|s| s.key == key).map(SourceId)
    }

    /// The wake-up stream (always the last).
    pub fn decisions(&self) -> SourceId {
        SourceId(self.0.len() - 1)
    }
}

impl Index<SourceId> for Sources {
    type Output = Source;

    fn index(&self, id: SourceId) -> &Source {
        &self.0[id.0]
    }
}
