//! A machine's bootstrap token: a registration token of its own, made once and used for
//! every attempt while it has a while to live, so that a retried create sends the same user
//! data under the same client token; deleted once the machine's host registers, or with the
//! machine.

use serde_json::{Value, json};

use super::Controller;
use crate::{
    auth::secret::{self, TokenKind},
    model::{Kind, Status, update_status},
    store::{Object, Op, StoreError},
};

/// How long a machine's registration token lives: a bootstrap takes minutes.
const BOOTSTRAP_TOKEN_TTL: time::Duration = time::Duration::hours(1);
/// On a Machine's status: the name of the registration token made for its bootstrap.
pub(super) const TOKEN_FIELD: &str = "registrationToken";
/// ... and its text (the API leaves it out: `model::MACHINE_TOKEN_SECRET`).
pub(super) const TOKEN_SECRET_FIELD: &str = crate::model::MACHINE_TOKEN_SECRET;
/// A recorded bootstrap token is used again only while it has this long to live: a machine
/// made with it boots and registers within minutes.
const TOKEN_REUSE_LEFT: time::Duration = time::Duration::minutes(20);

/// On a Machine's status: which client token of its bootstrap token's its creates send.
pub(super) const CLIENT_KEY: &str = "clientKey";

/// A machine's bootstrap token: its object's name and its text.
#[derive(Debug)]
pub(super) struct BootstrapToken {
    pub name: String,
    pub value: String,
}
impl Controller {
    /// A registration token for this machine alone, short-lived, recorded on the machine
    /// (its name, and its text as a secret the API never shows) before it is used, and used
    /// again on each attempt while it has a while to live: the user data made with it, and the
    /// client token named after it, stay the same, so a repeated `RunInstances` is the same
    /// request. A new one replaces the last (deleted once the machine's host has registered,
    /// or with the machine).
    pub(super) async fn bootstrap_token(
        &self,
        cluster: &str,
        name: &str,
        machine: &Object,
    ) -> Result<BootstrapToken, StoreError> {
        let status = Status::of(machine);
        let recorded = |field: &str| {
            status
                .extra
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let previous = recorded(TOKEN_FIELD);
        if let (Some(token), Some(value)) = (&previous, recorded(TOKEN_SECRET_FIELD)) {
            let lasting = match self.store.get(Kind::RegistrationToken.name(), token).await {
                Ok(object) => object
                    .spec
                    .get("expiresAt")
                    .and_then(Value::as_str)
                    .and_then(crate::model::parse_time)
                    .is_some_and(|at| at - time::OffsetDateTime::now_utc() > TOKEN_REUSE_LEFT),
                Err(StoreError::NotFound { .. }) => false,
                Err(e) => return Err(e),
            };
            if lasting {
                return Ok(BootstrapToken {
                    name: token.clone(),
                    value,
                });
            }
        }
        let token = secret::new_token(TokenKind::Registration);
        let mut object = crate::registration::token_object(cluster, &token);
        object.spec["expiresAt"] = json!(crate::auth::lifetimes::expiry(BOOTSTRAP_TOKEN_TTL));
        let mut ops = vec![Op::Create(object)];
        crate::refs::stamp_all(self.store.as_ref(), &mut ops).await?;
        self.store.transact(ops).await?;
        let (name_of_token, value) = (json!(token.name), json!(token.value));
        update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
            s.extra.insert(TOKEN_FIELD.into(), name_of_token.clone());
            s.extra.insert(TOKEN_SECRET_FIELD.into(), value.clone());
        })
        .await?;
        if let Some(previous) = previous {
            self.forget_token(&previous).await?;
        }
        Ok(BootstrapToken {
            name: token.name,
            value: token.value,
        })
    }

    /// Moves a machine to its next client token: EC2 says its current one was used with other
    /// parameters and no instance of the machine is found. The bootstrap token stays (and
    /// valid): an instance the earlier request made, found later, boots with it.
    pub(super) async fn next_client_key(&self, machine: &str) -> Result<(), StoreError> {
        update_status(self.store.as_ref(), Kind::Machine, machine, |s| {
            let key = s.extra.get(CLIENT_KEY).and_then(Value::as_u64).unwrap_or(0);
            s.extra.insert(CLIENT_KEY.into(), json!(key + 1));
        })
        .await
    }

    /// Deletes the registration token made for a machine's bootstrap, whatever step it
    /// reached: a machine released before its host registered leaves no token that works
    /// (and a destroyed instance's user data holds one).
    pub(super) async fn forget_bootstrap_token(&self, machine: &Object) -> Result<(), StoreError> {
        match Status::of(machine)
            .extra
            .get(TOKEN_FIELD)
            .and_then(Value::as_str)
        {
            Some(token) => self.forget_token(token).await,
            None => Ok(()),
        }
    }

    pub(super) async fn forget_token(&self, name: &str) -> Result<(), StoreError> {
        match self
            .store
            .delete(Kind::RegistrationToken.name(), name, None)
            .await
        {
            Err(StoreError::NotFound { .. }) => Ok(()),
            other => other.map(drop),
        }
    }
}
