//! Every API write of the leader goes through here, and each one is refused once this replica
//! does not hold the lease: a replica that loses leadership stops writing at once, even in the
//! middle of a reconcile.

use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

use tether_api::conditions::EventReason;

use crate::provision::FIELD_MANAGER;
use crate::{Context, Error};

/// `namespace/name`, or `name` of a cluster-scoped object: how errors name an object.
pub fn object_name(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// Server-side applies an object the leader owns; returns it as the API server holds it after.
pub async fn apply<K>(ctx: &Context, api: &Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    ctx.ensure_leader()?;
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .map_err(Error::api::<K>("apply", api.namespace(), &name))
}

/// Server-side applies the fields of `status` that the leader owns, through the status subresource.
/// `status` is the kind's typed status (or a typed part of it), serialized without the fields it
/// leaves unset, so the leader owns exactly what it sets. Returns the object as the API server
/// holds it after.
pub async fn apply_status<K, S>(ctx: &Context, api: &Api<K>, name: &str, status: &S) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    ctx.ensure_leader()?;
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &tether_api::status_apply::<K, _>(status),
    )
    .await
    .map_err(Error::api::<K>("patch status", api.namespace(), name))
}

/// Deletes an object; one that is already gone is not an error.
pub async fn delete<K>(ctx: &Context, api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    ctx.ensure_leader()?;
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::api::<K>("delete", api.namespace(), name)(source)),
    }
}

/// Deletes every object of `api` carrying `selector`.
pub async fn delete_labelled<K>(ctx: &Context, api: &Api<K>, selector: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    ctx.ensure_leader()?;
    api.delete_collection(
        &DeleteParams::background(),
        &ListParams::default().labels(selector),
    )
    .await
    .map_err(Error::api::<K>("delete collection", api.namespace(), selector))?;
    Ok(())
}

/// Publishes an Event about `obj`; failing to is logged, never fatal.
pub async fn event<K>(ctx: &Context, obj: &K, type_: EventType, reason: EventReason, action: &str, note: &str)
where
    K: Resource<DynamicType = ()>,
{
    if ctx.ensure_leader().is_err() {
        return;
    }
    let ev = Event {
        type_,
        reason: reason.as_str().into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(err) = ctx
        .events
        .recorder(reason)
        .publish(&ev, &obj.object_ref(&()))
        .await
    {
        warn!(object = %obj.meta().name.as_deref().unwrap_or_default(), error = &err as &dyn std::error::Error,
              "Cannot publish event");
    }
}

/// Publishes the leader's Events. kube's recorder keeps every Event it published for six minutes
/// to count repeats into one series; that only helps an Event that can repeat on the same object
/// (a member lost and recovered, a tunnel replaced), and a registration burst of 10,000 members
/// would hold tens of MiB of one-time Events. So one-time Events go through a recorder of their
/// own, which keeps nothing.
pub struct Events {
    shared: Recorder,
    client: Client,
    reporter: Reporter,
}

impl Events {
    /// Events published as `reporter` through `client`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            shared: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        }
    }

    fn recorder(&self, reason: EventReason) -> Recorder {
        if once(reason) {
            Recorder::new(self.client.clone(), self.reporter.clone())
        } else {
            self.shared.clone()
        }
    }
}

/// Whether an Event marks a step that happens once in its object's life: it never repeats on
/// the same object, so it gains nothing from the recorder's series.
fn once(reason: EventReason) -> bool {
    matches!(
        reason,
        EventReason::RegistrationApproved
            | EventReason::MemberReady
            | EventReason::MemberLeft
            | EventReason::MemberExpired
            | EventReason::MemberRemoved
            | EventReason::Destroyed
    )
}

/// `namespace/name` of an object, the key of in-memory records.
pub fn key<K: Resource>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}
