//! What the bot may do in a channel, as the gateway last told it: so a call
//! Discord would refuse is not made. Every 403 counts toward the ban Discord
//! puts on an address at 10,000 refused requests in ten minutes, and without
//! this a stranger's reaction on a card, in a channel where the bot may not
//! manage messages, would cost one each.
//!
//! Invariants:
//! - The answer comes from serenity's cache, fed by the gateway (the guild's
//!   roles, channels and overwrites, and the bot's own member, all in
//!   GUILD_CREATE and kept current by the update events), so it changes as
//!   soon as a server's permissions do.
//! - Unknown is not refused: a DM, a channel of a guild not yet loaded, or a
//!   cache that has not started yet are asked as before (the refused-request
//!   budget of [`crate::rest`] still bounds what that can cost).

use std::sync::{Arc, OnceLock};

use serenity::all::{ChannelId, Permissions, UserId};
use serenity::cache::Cache;

/// Reading a channel's history (the catch-up's reads).
pub const READ: Permissions = Permissions::VIEW_CHANNEL.union(Permissions::READ_MESSAGE_HISTORY);
/// Removing someone else's reaction (Discord refuses everything in a channel
/// the bot may not view, whatever else it may do there).
pub const UNREACT: Permissions = READ.union(Permissions::MANAGE_MESSAGES);

/// The gateway's view of the bot's permissions, once a session has begun.
#[derive(Default)]
pub struct Permits {
    cache: OnceLock<(Arc<Cache>, UserId)>,
}

impl Permits {
    /// From the first READY on: the session's cache and the bot's id.
    pub fn start(&self, cache: Arc<Cache>, bot: UserId) {
        let _ = self.cache.set((cache, bot));
    }

    /// What of `needed` the bot lacks in `channel`, when the gateway has said
    /// (None: it has it, or nothing is known).
    pub fn lacking(&self, channel: ChannelId, needed: Permissions) -> Option<Permissions> {
        let (cache, bot) = self.cache.get()?;
        let has = cache.guilds().into_iter().find_map(|id| {
            let guild = cache.guild(id)?;
            // A thread has its parent channel's permissions.
            let parent = || {
                let thread = guild.threads.iter().find(|t| t.id == channel)?;
                guild.channels.get(&thread.parent_id?)
            };
            let in_channel = guild.channels.get(&channel).or_else(parent)?;
            let member = guild.members.get(bot)?;
            Some(guild.user_permissions_in(in_channel, member))
        })?;
        Some(needed - has).filter(|missing| !missing.is_empty())
    }
}
