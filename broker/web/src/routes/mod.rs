//! The page's handlers, one file per part of the page.

mod approval;
mod login;
mod queue;

pub(crate) use approval::*;
pub(crate) use login::*;
pub(crate) use queue::*;
