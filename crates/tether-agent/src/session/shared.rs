//! What one session keeps across its attempts, and its way to the status owner.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tether_api::ClusterSet;
use tether_api::clusterset::MemberSpec;

use crate::status::StatusSink;
use crate::view::View;
use crate::{Context, Error};

/// What one session keeps across its attempts.
pub(super) struct Shared {
    pub(super) ctx: Arc<Context>,
    pub(super) set: Arc<ClusterSet>,
    /// Where the member ClusterSet's status goes (status.rs owns it).
    pub(super) status: StatusSink,
    /// The leader refused the stored credential: get a new one before using it again.
    pub(super) refused: AtomicBool,
    /// What this session knows of a URL the leader moved to.
    pub(super) moved: Mutex<Moved>,
    /// Failed attempts in a row on a moved-to URL.
    pub(super) moved_failures: std::sync::atomic::AtomicU32,
}

/// A URL the leader published in place of the declared one.
#[derive(Clone, Debug, Default)]
pub(super) enum Moved {
    /// Nothing learned in this process: the status an earlier session wrote says.
    #[default]
    Unknown,
    /// Use `url` while the declared URL is `replaces`.
    To { url: String, replaces: String },
    /// `url` did not answer: back on the declared URL, and `url` is not followed again.
    Abandoned { url: String },
}

/// Failed attempts in a row on a moved-to URL before the agent goes back to the declared one
/// (a leader that published an address this member cannot reach must not strand it).
pub(super) const MOVED_ATTEMPTS: u32 = 3;

pub(super) fn spec(set: &ClusterSet) -> Result<&MemberSpec, Error> {
    set.spec
        .member
        .as_ref()
        .ok_or(Error::Invariant("a Member ClusterSet without spec.member"))
}

/// Changes the view; the status owner writes the status if it changed.
pub(super) fn update(sh: &Shared, change: impl FnOnce(&mut View) + Send + 'static) {
    sh.status.update(change);
}
