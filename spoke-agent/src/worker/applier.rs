//! The Applications the agent writes on this cluster for the hub: created
//! or updated as delivered, deleted, released, and put back after a local
//! edit. Every write is decided on who holds the Application now, and
//! carries the resourceVersion that was decided on.

use std::sync::Arc;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::owner;
use argocd_pull_proto::v1::{AckOutcome, ApplicationUpsert, ObjectKey};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::Value;

use super::{Outcome, api, applied, write_error};
use crate::apply::{self, MANAGER};
use crate::cache::Cache;
use crate::metrics::{AgentMetrics, OutcomeLabel};

/// Writes Applications for the hub and counts the outcomes of its applies
/// (`argocd_pull_agent_applies_total`). Keeps nothing: what was applied is
/// the caller's to remember.
pub struct Applier {
    client: kube::Client,
    cache: Cache,
    metrics: AgentMetrics,
}

impl Applier {
    pub fn new(client: kube::Client, cache: Cache, metrics: AgentMetrics) -> Self {
        Self {
            client,
            cache,
            metrics,
        }
    }

    /// Creates or updates the Application at `key` as `u` delivers it,
    /// unless it is someone else's (then rejected) or already as
    /// delivered. Applied: `u` is what the Application holds now.
    pub async fn upsert(&self, key: &ObjectKey, u: &ApplicationUpsert) -> Outcome {
        let api = api(&self.client, key);
        let meta = u.meta.clone().unwrap_or_default();
        let config = match apply::applied_config(key, &u.application_json, &meta.uid, &meta.version)
        {
            Ok(c) => c,
            Err(e) => return self.counted((AckOutcome::Rejected, e.to_string())),
        };
        // The cache holds only what the agent manages; anything else at this
        // key is read live, and every write carries the resourceVersion its
        // ownership was decided on.
        let mut current = self.cache.get(key).map(Arc::unwrap_or_clone);
        if current.is_none() {
            current = match api.get_opt(&key.name).await {
                Ok(c) => c,
                Err(e) => return self.counted(write_error(e)),
            };
        }
        for _ in 0..3 {
            if let Some(c) = &current {
                if c.metadata.deletion_timestamp.is_some() {
                    return self.counted((
                        AckOutcome::Retry,
                        "the Application is being deleted on the cluster; it is created again once gone".into(),
                    ));
                }
                let unchanged = apply::is_delivered_for(c, &meta.uid)
                    && !apply::is_edited(c)
                    && c.annotations().get(keys::DESIRED_VERSION) == Some(&meta.version);
                if unchanged {
                    return applied();
                }
            }
            let precondition = match self.precondition(key, &meta.uid, current.as_ref(), &config) {
                Ok(p) => p,
                Err(refused) => return refused,
            };
            match self.write(&api, key, &config, precondition).await {
                Err(Stale) => {
                    // Changed (or created) since it was read: decide again
                    // on what is there now.
                    current = match api.get_opt(&key.name).await {
                        Ok(c) => c,
                        Err(e) => return self.counted(write_error(e)),
                    };
                }
                Ok(outcome) => return self.counted(outcome),
            }
        }
        self.counted((
            AckOutcome::Retry,
            "the Application keeps changing on the cluster".into(),
        ))
    }

    /// Puts `current`, edited on the cluster, back as `u` delivered it, if
    /// it is still the copy delivered for `u`'s hub Application. Why not,
    /// when the write failed (to be tried again).
    pub async fn revert(
        &self,
        key: &ObjectKey,
        current: &Application,
        u: &ApplicationUpsert,
    ) -> Result<(), String> {
        let meta = u.meta.clone().unwrap_or_default();
        if !apply::is_delivered_for(current, &meta.uid) {
            return Ok(());
        }
        let Ok(config) = apply::applied_config(key, &u.application_json, &meta.uid, &meta.version)
        else {
            return Ok(());
        };
        let rv = current.resource_version().unwrap_or_default();
        let (outcome, message) = self
            .write(
                &api(&self.client, key),
                key,
                &config,
                Precondition::Version(rv),
            )
            .await
            .unwrap_or_else(|Stale| (AckOutcome::Retry, "changed while being reverted".into()));
        if outcome == AckOutcome::Applied {
            Ok(())
        } else {
            Err(message)
        }
    }

    /// Deletes the copy delivered for `hub_uid`; also says whether there
    /// is none (to be reported gone once the delete is acknowledged).
    pub async fn delete(&self, key: &ObjectKey, hub_uid: &str) -> (Outcome, bool) {
        let api = api(&self.client, key);
        let current = match api.get_opt(&key.name).await {
            Ok(c) => c,
            Err(e) => return (write_error(e), false),
        };
        match current {
            // Only a copy this agent delivered for that hub Application; any
            // other Application of that name is left alone.
            Some(app) if apply::is_delivered_for(&app, hub_uid) => {
                if app.metadata.deletion_timestamp.is_none() {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: app.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match api.delete(&key.name, &dp).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                        Err(e) => return (write_error(e), false),
                    }
                    tracing::info!(namespace = %key.namespace, name = %key.name, "deleted for the hub");
                }
                // `gone` follows when the watch sees it disappear.
                (applied(), false)
            }
            // Nothing delivered for that hub Application is here.
            _ => (applied(), true),
        }
    }

    /// Leaves the copy delivered for `hub_uid` running, no longer managed
    /// for the hub.
    pub async fn release(&self, key: &ObjectKey, hub_uid: &str) -> Outcome {
        let api = api(&self.client, key);
        let current = match api.get_opt(&key.name).await {
            Ok(c) => c,
            Err(e) => return write_error(e),
        };
        if let Some(app) = current
            && apply::is_delivered_for(&app, hub_uid)
        {
            if let Err(e) = api
                .patch(
                    &key.name,
                    &PatchParams::apply(MANAGER),
                    &Patch::Merge(apply::release_patch()),
                )
                .await
            {
                return write_error(e);
            }
            tracing::info!(namespace = %key.namespace, name = %key.name, "released: left running, no longer managed for the hub");
        }
        applied()
    }

    /// What the write of `config` for hub Application `hub_uid` requires of
    /// the Application now at `key`, from who holds it: that it is still
    /// absent, or still at the version read. Refused (and counted as an
    /// owner conflict) when it is someone else's.
    fn precondition(
        &self,
        key: &ObjectKey,
        hub_uid: &str,
        current: Option<&Application>,
        config: &Value,
    ) -> Result<Precondition, Outcome> {
        Ok(match apply::ownership(current, hub_uid, config) {
            apply::Ownership::Refuse(holder) => {
                let message = owner::conflict_message(key, &holder);
                tracing::warn!(namespace = %key.namespace, name = %key.name, %hub_uid, ?holder,
                    "refused: the Application on this cluster is not this hub Application's; left alone");
                self.count("owner-conflict");
                return Err((AckOutcome::Rejected, message));
            }
            apply::Ownership::Free => Precondition::Absent,
            apply::Ownership::Ours | apply::Ownership::Adopt => Precondition::Version(
                current
                    .and_then(|c| c.resource_version())
                    .unwrap_or_default(),
            ),
        })
    }

    fn count(&self, outcome: &'static str) {
        self.metrics
            .applies
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    fn counted(&self, outcome: Outcome) -> Outcome {
        self.count(match outcome.0 {
            AckOutcome::Applied => "applied",
            AckOutcome::Rejected => "rejected",
            _ => "retry",
        });
        outcome
    }

    /// Server-side applies `config`, then takes out spec fields someone else
    /// added (server-side apply leaves fields it does not own alone), and
    /// records the hash of the spec as the API server stored it. `Stale`
    /// when the Application is no longer as it was when `precondition` was
    /// decided (nothing was written then).
    async fn write(
        &self,
        api: &Api<Application>,
        key: &ObjectKey,
        config: &Value,
        precondition: Precondition,
    ) -> Result<Outcome, Stale> {
        let (params, body) = match &precondition {
            // Not forced: a field someone else set meanwhile conflicts.
            Precondition::Absent => (PatchParams::apply(MANAGER), config.clone()),
            Precondition::Version(rv) => {
                let mut body = config.clone();
                body["metadata"]["resourceVersion"] = rv.clone().into();
                (PatchParams::apply(MANAGER).force(), body)
            }
        };
        let stored = match api.patch(&key.name, &params, &Patch::Apply(&body)).await {
            Ok(a) => a,
            Err(kube::Error::Api(s)) if s.code == 409 => return Err(Stale),
            Err(e) => return Ok(write_error(e)),
        };
        if precondition == Precondition::Absent
            && stored
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .any(|m| m.manager.as_deref() != Some(MANAGER))
        {
            // Someone else created it between the read and this write with
            // the same values (so nothing conflicted): it is not ours. Take
            // the markers back off and refuse.
            let _ = api
                .patch(
                    &key.name,
                    &PatchParams::apply(MANAGER),
                    &Patch::Merge(apply::release_patch()),
                )
                .await;
            return Err(Stale);
        }
        let stored = match take_out_others_spec_fields(api, key, config, stored).await {
            Ok(a) => a,
            Err(e) => return Ok(write_error(e)),
        };
        if let Err(e) = record_spec_hash(api, key, &stored).await {
            return Ok(write_error(e));
        }
        tracing::debug!(namespace = %key.namespace, name = %key.name, "applied");
        Ok(applied())
    }
}

/// Takes out of the `stored` Application the spec fields that are not in
/// `config` (server-side apply leaves fields it does not own alone), at the
/// version just written; the Application as stored afterwards.
async fn take_out_others_spec_fields(
    api: &Api<Application>,
    key: &ObjectKey,
    config: &Value,
    stored: Application,
) -> kube::Result<Application> {
    let wanted = config.get("spec").cloned().unwrap_or(Value::Null);
    let Some(diff) = content::merge_diff(stored.data.get("spec").unwrap_or(&Value::Null), &wanted)
    else {
        return Ok(stored);
    };
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": stored.resource_version() },
        "spec": diff,
    });
    api.patch(
        &key.name,
        &PatchParams::apply(MANAGER),
        &Patch::Merge(patch),
    )
    .await
}

/// Records the hash of the spec as the API server stored it, when the
/// annotation does not hold it already.
async fn record_spec_hash(
    api: &Api<Application>,
    key: &ObjectKey,
    stored: &Application,
) -> kube::Result<()> {
    let hash = content::hash(stored.data.get("spec").unwrap_or(&Value::Null));
    if stored.annotations().get(keys::SPEC_HASH) != Some(&hash) {
        // The API server changed the spec (a field this cluster's Argo CD
        // does not know): remember what it keeps, or the agent would
        // take its own write for a local edit forever.
        let patch = serde_json::json!({ "metadata": { "annotations": { keys::SPEC_HASH: hash } } });
        api.patch(
            &key.name,
            &PatchParams::apply(MANAGER),
            &Patch::Merge(patch),
        )
        .await?;
    }
    Ok(())
}

/// What a write was decided on: nothing there, or this resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Precondition {
    Absent,
    Version(String),
}

/// The Application changed since its ownership was decided.
struct Stale;
