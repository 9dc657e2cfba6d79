//! The machine controller (leader only, writing fenced like the planner): makes each custom
//! cluster's machine pools hold their quantity of machines. A machine is a `Machine` object
//! first (with the controller's finalizer, before anything is made for it), then:
//!
//! 1. **Provisioning**: its driver makes or picks it (SSH: the first address of the template no
//!    other machine holds, recorded before the machine is contacted; EC2: an instance tagged
//!    with its name, found again rather than made twice, whose user data is the host command);
//! 2. **Bootstrapping**: the host command for its pool's roles runs on it (SSH: over SSH with
//!    the host key pinned — the template's, or the one recorded at first contact; EC2: at
//!    first boot), with a registration token made for it and its name as the node name;
//! 3. **Running**: the Host that registered under its name is linked to it.
//!
//! Removing one (scale down, its pool gone or rolled to a new template, the cluster deleted, or
//! deleted through the API) deletes its Host (the planner drains and uninstalls it), then
//! releases it at its driver and lets the object go; an unhealthy one is destroyed first and its
//! Host removed without an uninstall. The decisions are in [`decide`]; this module carries
//! them out.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    auth::secret::{self, TokenKind},
    model::{
        CloudCredentialSpec, ClusterSpec, ClusterType, Kind, MachinePool, MachineTemplateSpec,
        Status, phase, update_status,
    },
    store::{LabelSelector, Object, Op, Store, StoreError},
};

mod decide;
use decide::{Action, View, decide};
use drivers::Driver;

/// The finalizer a Machine carries until it is released at its driver.
pub const FINALIZER: &str = crate::model::MACHINE_FINALIZER;
/// How long one SSH command may take (the install downloads the agent).
const SSH_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a machine's registration token lives: a bootstrap takes minutes.
const BOOTSTRAP_TOKEN_TTL: time::Duration = time::Duration::hours(1);
/// On a Machine's status: the name of the registration token made for its bootstrap.
const TOKEN_FIELD: &str = "registrationToken";
/// On a Machine's status: replaced as unhealthy ...
const UNHEALTHY: &str = "unhealthy";
/// ... and destroyed at its driver already.
const DESTROYED: &str = "destroyed";
/// On a Host: its machine is destroyed, so no uninstall can run (the planner removes it
/// without one).
const MACHINE_GONE: &str = crate::model::MACHINE_DESTROYED;

/// What the controller needs besides the store.
#[derive(Debug, Clone)]
pub struct Controller {
    pub store: Arc<dyn Store>,
    pub server_url: String,
    pub ca_checksum: String,
}

impl Controller {
    /// Reconciles every cluster with machine pools whenever a Cluster, Machine, Host, template
    /// or credential changes (and every 10 s regardless), until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let kinds = [
            "Cluster",
            "Host",
            "Machine",
            "MachineTemplate",
            "CloudCredential",
        ];
        crate::store::on_changes(self.store.as_ref(), &kinds, &shutdown, || {
            self.reconcile_all()
        })
        .await;
    }

    async fn reconcile_all(&self) {
        if let Err(e) = self.try_reconcile_all().await {
            tracing::warn!(error = %e, "the machine controller failed a pass; retrying");
        }
    }

    async fn try_reconcile_all(&self) -> Result<(), StoreError> {
        let everything = LabelSelector::everything();
        let (machines, _) = self.store.list(Kind::Machine.name(), &everything).await?;
        let (clusters, _) = self.store.list(Kind::Cluster.name(), &everything).await?;
        let has_pools = |c: &Object| {
            serde_json::from_value::<ClusterSpec>(c.spec.clone())
                .is_ok_and(|s| s.cluster_type == ClusterType::Custom && !s.machine_pools.is_empty())
        };
        if machines.is_empty() && !clusters.iter().any(has_pools) {
            return Ok(());
        }
        let (hosts, _) = self.store.list(Kind::Host.name(), &everything).await?;
        let mut names: Vec<String> = clusters.iter().map(|c| c.metadata.name.clone()).collect();
        // Machines whose cluster is gone are released too.
        for m in &machines {
            let cluster = m
                .spec
                .get("cluster")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !names.iter().any(|n| n == cluster) {
                names.push(cluster.to_owned());
            }
        }
        for name in names {
            let cluster = clusters.iter().find(|c| c.metadata.name == name);
            let pools: Vec<MachinePool> = match cluster {
                Some(c) if c.metadata.deletion_timestamp.is_none() => {
                    serde_json::from_value::<ClusterSpec>(c.spec.clone())
                        .map(|s| s.machine_pools)
                        .unwrap_or_default()
                }
                // A cluster going (or gone) keeps no machine.
                _ => Vec::new(),
            };
            let of_cluster =
                |o: &&Object| o.spec.get("cluster").and_then(Value::as_str) == Some(name.as_str());
            let mut mine: Vec<&Object> = machines.iter().filter(of_cluster).collect();
            mine.sort_by(|a, b| {
                (&a.metadata.creation_timestamp, &a.metadata.name)
                    .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
            });
            let its_hosts: Vec<&Object> = hosts.iter().filter(of_cluster).collect();
            let init_host = cluster.and_then(|c| {
                Status::of(c)
                    .extra
                    .get("initHost")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
            let actions = decide(&View {
                pools: &pools,
                machines: &mine,
                hosts: &its_hosts,
                init_host: init_host.as_deref(),
                now: time::OffsetDateTime::now_utc(),
            });
            for action in actions {
                if let Err(e) = self.act(&name, &pools, action).await {
                    tracing::warn!(cluster = %name, error = %e, "a machine step failed; retrying");
                }
            }
        }
        Ok(())
    }

    async fn act(
        &self,
        cluster: &str,
        pools: &[MachinePool],
        action: Action,
    ) -> Result<(), StoreError> {
        match action {
            Action::Create { pool, template } => {
                let name = format!("{cluster}-{pool}-{}", suffix());
                let mut object = Object::new(
                    Kind::Machine.name(),
                    &name,
                    json!({"cluster": cluster, "pool": pool, "template": template}),
                );
                object.metadata.finalizers = vec![FINALIZER.to_owned()];
                object.status = json!({"phase": phase::PENDING});
                let mut ops = vec![Op::Create(object)];
                crate::refs::stamp_all(self.store.as_ref(), &mut ops).await?;
                self.store.transact(ops).await?;
                tracing::info!(cluster, pool, machine = %name, "a new machine");
                Ok(())
            }
            Action::Remove { machine } => {
                // Marked for deletion first: from then on nothing counts it as available.
                match self
                    .store
                    .delete(Kind::Machine.name(), &machine, None)
                    .await
                {
                    Err(StoreError::NotFound { .. }) => return Ok(()),
                    other => other.map(drop)?,
                }
                self.set(
                    &machine,
                    phase::DELETING,
                    "removing: its host is uninstalled first",
                )
                .await
            }
            Action::Provision { machine } => self.provision(cluster, pools, &machine).await,
            Action::Bootstrap { machine } => self.bootstrap(cluster, pools, &machine).await,
            Action::Link { machine, host } => {
                // The bootstrap token's name, as the write found it.
                let found = Arc::new(std::sync::Mutex::new(None));
                let token = found.clone();
                update_status(self.store.as_ref(), Kind::Machine, &machine, move |s| {
                    *token.lock().unwrap_or_else(|p| p.into_inner()) = s.extra.remove(TOKEN_FIELD);
                    s.extra.insert("host".into(), json!(host));
                    s.extra.insert("phase".into(), json!(phase::RUNNING));
                    s.extra.insert("message".into(), json!(""));
                })
                .await?;
                let token = found.lock().unwrap_or_else(|p| p.into_inner()).take();
                // Its host has its own credential now: the bootstrap token has done its job.
                match token.as_ref().and_then(Value::as_str) {
                    Some(token) => self.forget_token(token).await,
                    None => Ok(()),
                }
            }
            Action::Replace { machine, why } => {
                tracing::warn!(cluster, %machine, "replacing an unhealthy machine: {why}");
                update_status(self.store.as_ref(), Kind::Machine, &machine, move |s| {
                    s.extra.insert(UNHEALTHY.into(), json!(true));
                    s.extra.insert("phase".into(), json!(phase::DELETING));
                    s.extra
                        .insert("message".into(), json!(format!("replacing: {why}")));
                })
                .await?;
                match self
                    .store
                    .delete(Kind::Machine.name(), &machine, None)
                    .await
                {
                    Err(StoreError::NotFound { .. }) => Ok(()),
                    other => other.map(drop),
                }
            }
            Action::Release { machine, host } => {
                let object = match self.store.get(Kind::Machine.name(), &machine).await {
                    Ok(m) => m,
                    Err(StoreError::NotFound { .. }) => return Ok(()),
                    Err(e) => return Err(e),
                };
                let status = Status::of(&object);
                let flag = |field: &str| status.extra.get(field) == Some(&json!(true));
                // An unhealthy machine cannot uninstall its host: it is destroyed first, and
                // its host then goes without waiting for an uninstall that cannot run.
                if flag(UNHEALTHY) && !flag(DESTROYED) {
                    return self.release(&machine, false).await;
                }
                if let Some(host) = host {
                    if flag(DESTROYED) {
                        self.annotate(&host, MACHINE_GONE).await?;
                    } else if pools
                        .iter()
                        .any(|p| p.drain_before_delete && p.name == decide::text(&object, "/pool"))
                    {
                        self.annotate(&host, crate::model::DRAIN_BEFORE_DELETE)
                            .await?;
                    }
                    // The planner drains (as the cluster's upgrade strategy says) and uninstalls
                    // the host, then lets it go.
                    self.set(
                        &machine,
                        phase::DELETING,
                        &format!("waiting for host {host} to be removed"),
                    )
                    .await?;
                    return match self.store.delete(Kind::Host.name(), &host, None).await {
                        Err(StoreError::NotFound { .. }) => Ok(()),
                        other => other.map(drop),
                    };
                }
                if flag(DESTROYED) {
                    return self.let_go(&machine).await;
                }
                self.release(&machine, true).await
            }
        }
    }

    /// Puts annotation `key` on a host before it is deleted: its machine was destroyed (the
    /// planner removes it without waiting for an uninstall), or its pool drains before delete.
    async fn annotate(&self, host: &str, key: &str) -> Result<(), StoreError> {
        for _ in 0..10 {
            let mut object = match self.store.get(Kind::Host.name(), host).await {
                Ok(h) => h,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            if object.metadata.annotations.contains_key(key) {
                return Ok(());
            }
            object
                .metadata
                .annotations
                .insert(key.into(), "true".into());
            match self.store.update(object).await {
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                other => return other.map(drop),
            }
        }
        Ok(())
    }

    async fn forget_token(&self, name: &str) -> Result<(), StoreError> {
        match self
            .store
            .delete(Kind::RegistrationToken.name(), name, None)
            .await
        {
            Err(StoreError::NotFound { .. }) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Sets a machine's phase and message.
    async fn set(&self, machine: &str, to: &str, message: &str) -> Result<(), StoreError> {
        let (to, message) = (json!(to), json!(message));
        update_status(self.store.as_ref(), Kind::Machine, machine, move |s| {
            s.extra.insert("phase".into(), to.clone());
            s.extra.insert("message".into(), message.clone());
        })
        .await
    }

    async fn template_of(
        &self,
        machine: &Object,
    ) -> Result<(MachineTemplateSpec, CloudCredentialSpec), String> {
        let name = machine
            .spec
            .get("template")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let template = match self.store.get(Kind::MachineTemplate.name(), name).await {
            Ok(t) => {
                serde_json::from_value::<MachineTemplateSpec>(t.spec).map_err(|e| e.to_string())?
            }
            Err(StoreError::NotFound { .. }) => {
                return Err(format!("template {name:?} does not exist; create it"));
            }
            Err(e) => return Err(e.to_string()),
        };
        let credential = match self
            .store
            .get(Kind::CloudCredential.name(), &template.credential)
            .await
        {
            Ok(c) => {
                serde_json::from_value::<CloudCredentialSpec>(c.spec).map_err(|e| e.to_string())?
            }
            Err(StoreError::NotFound { .. }) => {
                return Err(format!(
                    "credential {:?} of template {name:?} does not exist",
                    template.credential
                ));
            }
            Err(e) => return Err(e.to_string()),
        };
        Ok((template, credential))
    }

    /// The driver of a machine's template. An SSH pool learns which addresses other machines
    /// hold (read now, not at the start of the pass: an address taken earlier in this pass
    /// counts).
    async fn driver_for(
        &self,
        name: &str,
        template: &MachineTemplateSpec,
        credential: &CloudCredentialSpec,
    ) -> Result<Result<Box<dyn Driver>, String>, StoreError> {
        if let Some(ssh) = &template.ssh {
            let (all_machines, _) = self
                .store
                .list(Kind::Machine.name(), &LabelSelector::everything())
                .await?;
            let held = all_machines
                .iter()
                .filter(|m| m.metadata.name != name)
                .filter_map(|m| first_address(&Status::of(m)))
                .collect();
            return Ok(Ok(Box::new(drivers::ssh::Pool {
                addresses: ssh.addresses.clone(),
                user: ssh.user.clone(),
                port: ssh.port,
                held,
            })));
        }
        if let (Some(ec2), Some(key)) = (&template.amazonec2, &credential.amazonec2) {
            let settings = drivers::ec2::Settings {
                ami: ec2.ami.clone(),
                instance_type: ec2.instance_type.clone(),
                subnet_id: ec2.subnet_id.clone(),
                security_group_ids: ec2.security_group_ids.clone(),
                key_name: ec2.key_name.clone(),
                root_size_gb: ec2.root_size_gb,
                tags: ec2.tags.clone(),
            };
            let credentials = drivers::aws::Credentials {
                access_key_id: key.access_key_id.clone(),
                secret_access_key: key.secret_access_key.clone(),
            };
            let ca = (!ec2.endpoint_ca.is_empty()).then_some(ec2.endpoint_ca.as_str());
            return Ok(drivers::ec2::Ec2::new(
                &ec2.endpoint,
                &ec2.region,
                credentials,
                ca,
                settings,
            )
            .map(|d| Box::new(d) as Box<dyn Driver>)
            .map_err(|e| e.to_string()));
        }
        Ok(Err(format!(
            "the template's credential has no {} section",
            template.driver.label()
        )))
    }

    /// Pending → Provisioning (SSH: the first address of the template no other machine holds,
    /// recorded before anything contacts it), or → Bootstrapping for a driver whose machines
    /// boot their user data (EC2: an instance tagged with the machine's name, its user data the
    /// host command). An instance already made under the name (a hub that crashed before
    /// recording it) is taken as it is, never made twice.
    async fn provision(
        &self,
        cluster: &str,
        pools: &[MachinePool],
        name: &str,
    ) -> Result<(), StoreError> {
        let machine = self.store.get(Kind::Machine.name(), name).await?;
        let failed = async |why: String| {
            self.set(name, phase::PENDING, &format!("provision: {why}"))
                .await
        };
        let (template, credential) = match self.template_of(&machine).await {
            Ok(found) => found,
            Err(why) => return failed(why).await,
        };
        let driver = match self.driver_for(name, &template, &credential).await? {
            Ok(driver) => driver,
            Err(why) => return failed(why).await,
        };
        if !driver.boots_user_data() {
            let request = drivers::CreateRequest {
                name,
                tags: &BTreeMap::new(),
                user_data: "",
            };
            return match driver.create(&request).await {
                Ok(made) => {
                    update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
                        s.extra.insert("addresses".into(), json!(made.addresses));
                        s.extra.insert("providerId".into(), json!(made.id));
                        s.extra.insert("phase".into(), json!(phase::PROVISIONING));
                        s.extra.insert("message".into(), json!(""));
                    })
                    .await
                }
                Err(e) => failed(e.to_string()).await,
            };
        }
        let pool_name = decide::text(&machine, "/pool");
        let Some(pool) = pools.iter().find(|p| p.name == pool_name) else {
            return Ok(());
        };
        let found = match driver.list(drivers::ec2::NAME_TAG, name).await {
            Ok(found) => found,
            Err(e) => return failed(e.to_string()).await,
        };
        let made = match found.into_iter().next() {
            Some(made) => made,
            None => {
                let token = self.bootstrap_token(cluster, name, &machine).await?;
                let install_flags = template
                    .amazonec2
                    .as_ref()
                    .map(|e| e.install_flags.clone())
                    .unwrap_or_default();
                let user_data = user_data(&host_command(
                    &self.server_url,
                    &token,
                    &self.ca_checksum,
                    pool,
                    name,
                    None,
                    &install_flags,
                ));
                let tags = BTreeMap::from([
                    ("drover.io/cluster".to_owned(), cluster.to_owned()),
                    ("drover.io/pool".to_owned(), pool.name.clone()),
                ]);
                let request = drivers::CreateRequest {
                    name,
                    tags: &tags,
                    user_data: &user_data,
                };
                match driver.create_unlisted(&request).await {
                    Ok(made) => made,
                    Err(e) => return failed(e.to_string()).await,
                }
            }
        };
        tracing::info!(cluster, machine = %name, id = %made.id, "machine made");
        update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
            s.extra.insert("addresses".into(), json!(made.addresses));
            s.extra.insert("providerId".into(), json!(made.id));
            s.extra.insert("phase".into(), json!(phase::BOOTSTRAPPING));
            s.extra.insert(
                "message".into(),
                json!("made; its user data installs the system-agent at first boot"),
            );
        })
        .await
    }

    /// A registration token for this machine alone, short-lived, recorded on the machine
    /// before it is used and replacing an earlier attempt's (deleted once the machine's host
    /// has registered). Returns the token's text.
    async fn bootstrap_token(
        &self,
        cluster: &str,
        name: &str,
        machine: &Object,
    ) -> Result<String, StoreError> {
        let token = secret::new_token(TokenKind::Registration);
        let mut object = crate::registration::token_object(cluster, &token);
        object.spec["expiresAt"] = json!(crate::auth::lifetimes::expiry(BOOTSTRAP_TOKEN_TTL));
        let mut ops = vec![Op::Create(object)];
        crate::refs::stamp_all(self.store.as_ref(), &mut ops).await?;
        self.store.transact(ops).await?;
        let previous = Status::of(machine)
            .extra
            .get(TOKEN_FIELD)
            .and_then(Value::as_str)
            .map(str::to_owned);
        let name_of_token = json!(token.name);
        update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
            s.extra.insert(TOKEN_FIELD.into(), name_of_token.clone());
        })
        .await?;
        if let Some(previous) = previous {
            self.forget_token(&previous).await?;
        }
        Ok(token.value)
    }

    /// Provisioning → Bootstrapping: the host command over SSH, the host key pinned.
    async fn bootstrap(
        &self,
        cluster: &str,
        pools: &[MachinePool],
        name: &str,
    ) -> Result<(), StoreError> {
        let machine = self.store.get(Kind::Machine.name(), name).await?;
        let (template, credential) = match self.template_of(&machine).await {
            Ok(found) => found,
            Err(why) => {
                return self
                    .set(name, phase::PROVISIONING, &format!("bootstrap: {why}"))
                    .await;
            }
        };
        let (Some(ssh), Some(key)) = (
            &template.ssh,
            credential.ssh.as_ref().map(|c| c.private_key.clone()),
        ) else {
            return self
                .set(
                    name,
                    phase::PROVISIONING,
                    "bootstrap: the template's credential has no SSH key",
                )
                .await;
        };
        let pool_name = decide::text(&machine, "/pool");
        let Some(pool) = pools.iter().find(|p| p.name == pool_name) else {
            return Ok(());
        };
        let status = Status::of(&machine);
        let Some(address) = first_address(&status) else {
            return Ok(());
        };
        let pinned = ssh.host_keys.get(&address).cloned().or_else(|| {
            status
                .extra
                .get("hostKey")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        let token = self.bootstrap_token(cluster, name, &machine).await?;
        let command = host_command(
            &self.server_url,
            &token,
            &self.ca_checksum,
            pool,
            name,
            Some(&address),
            &ssh.install_flags,
        );
        self.set(
            name,
            phase::PROVISIONING,
            &format!("bootstrap: installing over SSH at {address}"),
        )
        .await?;
        let target = drivers::ssh::Target {
            address: address.clone(),
            port: ssh.port,
            user: ssh.user.clone(),
        };
        let ran = drivers::ssh::run(
            &target,
            &drivers::ssh::PrivateKey::new(key),
            pinned.as_deref(),
            &command,
            b"",
            SSH_TIMEOUT,
        )
        .await;
        match ran {
            Ok(outcome) if outcome.exit_code == 0 => {
                let host_key = json!(outcome.host_key);
                update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
                    s.extra.insert("hostKey".into(), host_key.clone());
                    s.extra.insert("phase".into(), json!(phase::BOOTSTRAPPING));
                    s.extra.insert(
                        "message".into(),
                        json!("installed; waiting for its host to register"),
                    );
                })
                .await
            }
            Ok(outcome) => {
                let tail: String = outcome
                    .stderr
                    .lines()
                    .rev()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" | ");
                // The key is recorded even so: the machine answered with it.
                let host_key = json!(outcome.host_key);
                let message = json!(format!(
                    "bootstrap: the host command exited with {}: {tail}",
                    outcome.exit_code
                ));
                update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
                    s.extra.insert("hostKey".into(), host_key.clone());
                    s.extra.insert("message".into(), message.clone());
                })
                .await
            }
            Err(e @ drivers::ssh::SshError::HostKeyChanged { .. }) => {
                self.set(name, phase::FAILED, &format!("bootstrap: {e}"))
                    .await
            }
            Err(e) => {
                self.set(name, phase::PROVISIONING, &format!("bootstrap: {e}"))
                    .await
            }
        }
    }

    /// A removed machine's host is gone: give it back to its driver and let the object go.
    /// An SSH machine gets the system-agent's uninstall run on it (its agent stopped, its
    /// credential and identity removed), so the machine is as it was and a new machine on its
    /// address registers afresh; one that cannot be reached is released all the same. A cloud
    /// machine is destroyed — every instance tagged with its name, so one whose making was
    /// never recorded goes too — and the object stays until the cloud has accepted that.
    async fn release(&self, name: &str, then_let_go: bool) -> Result<(), StoreError> {
        let machine = match self.store.get(Kind::Machine.name(), name).await {
            Ok(m) => m,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let status = Status::of(&machine);
        let (template, credential) = match self.template_of(&machine).await {
            Ok(found) => found,
            Err(why) => {
                // Nothing can be reached without them; nothing was made without them either,
                // unless the template went after the machine was made (templates in use
                // cannot be deleted).
                tracing::warn!(machine = %name, %why, "releasing a machine without its template");
                return self.released(name, then_let_go).await;
            }
        };
        let driver = match self.driver_for(name, &template, &credential).await? {
            Ok(driver) => driver,
            Err(why) => {
                return self
                    .set(name, phase::DELETING, &format!("release: {why}"))
                    .await;
            }
        };
        if driver.boots_user_data() {
            let mut ids: Vec<String> = match driver.list(drivers::ec2::NAME_TAG, name).await {
                Ok(found) => found.into_iter().map(|m| m.id).collect(),
                Err(e) => {
                    return self
                        .set(name, phase::DELETING, &format!("release: {e}"))
                        .await;
                }
            };
            let recorded = status
                .extra
                .get("providerId")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !recorded.is_empty() && !ids.iter().any(|id| id == recorded) {
                ids.push(recorded.to_owned());
            }
            for id in &ids {
                if let Err(e) = driver.delete(id).await {
                    // Kept (with its finalizer) until the cloud takes the request: never leaked.
                    return self
                        .set(
                            name,
                            phase::DELETING,
                            &format!("release: destroying {id}: {e}"),
                        )
                        .await;
                }
                tracing::info!(machine = %name, %id, "machine destroyed");
            }
            return self.released(name, then_let_go).await;
        }
        let address = first_address(&status);
        let bootstrapped = status.extra.contains_key("hostKey");
        if let (Some(address), true, Some(ssh), Some(key)) =
            (address, bootstrapped, &template.ssh, &credential.ssh)
        {
            let target = drivers::ssh::Target {
                address: address.clone(),
                port: ssh.port,
                user: ssh.user.clone(),
            };
            let pinned = status.extra.get("hostKey").and_then(Value::as_str);
            let command = uninstall_command(&ssh.install_flags);
            match drivers::ssh::run(
                &target,
                &drivers::ssh::PrivateKey::new(key.private_key.clone()),
                pinned,
                &command,
                b"",
                SSH_TIMEOUT,
            )
            .await
            {
                Ok(outcome) if outcome.exit_code == 0 => {}
                Ok(outcome) => {
                    tracing::warn!(machine = %name, %address, code = outcome.exit_code, stderr = %outcome.stderr.trim(), "the system-agent's uninstall failed; releasing the machine anyway");
                }
                Err(e) => {
                    tracing::warn!(machine = %name, %address, error = %e, "cannot reach the machine to uninstall the system-agent; releasing it anyway");
                }
            }
        }
        self.released(name, then_let_go).await
    }

    /// After a release: the object goes, or (a machine replaced while its host remains) it
    /// records that it is destroyed and waits for its host to go.
    async fn released(&self, name: &str, then_let_go: bool) -> Result<(), StoreError> {
        if then_let_go {
            return self.let_go(name).await;
        }
        update_status(self.store.as_ref(), Kind::Machine, name, |s| {
            s.extra.insert(DESTROYED.into(), json!(true));
        })
        .await
    }

    /// Drops the controller's finalizer: the object goes.
    async fn let_go(&self, name: &str) -> Result<(), StoreError> {
        for _ in 0..10 {
            let mut machine = match self.store.get(Kind::Machine.name(), name).await {
                Ok(m) => m,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            machine.metadata.finalizers.retain(|f| f != FINALIZER);
            match self.store.update(machine).await {
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                other => {
                    tracing::info!(machine = %name, "machine released");
                    return other.map(drop);
                }
            }
        }
        Ok(())
    }
}

/// A machine's first recorded address.
fn first_address(status: &Status) -> Option<String> {
    status
        .extra
        .get("addresses")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// User data that cloud-init runs as a script at first boot.
fn user_data(command: &str) -> String {
    format!("#!/bin/sh\n# Drover: install the system-agent and register with the hub.\n{command}\n")
}

/// Five lowercase letters and digits: a machine's name within its pool.
fn suffix() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    secret::random_text::<8>()
        .bytes()
        .take(5)
        .map(|b| ALPHABET[usize::from(b) % ALPHABET.len()] as char)
        .collect()
}

/// Runs the system-agent's uninstall script where the install put it (under `--root DIR`
/// when the template's flags give one), if it is there.
fn uninstall_command(install_flags: &[String]) -> String {
    let root = install_flags
        .iter()
        .position(|f| f == "--root")
        .and_then(|i| install_flags.get(i + 1))
        .map_or("", String::as_str);
    let script = format!("{root}/usr/local/bin/drover-system-agent-uninstall.sh");
    format!("if [ -x {0} ]; then {0}; fi", quote(&script))
}

/// `text` as one word for `sh`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The host command for a machine of `pool`: the hub's install script with the pool's roles,
/// labels and taints, the machine's name as the node name and its address. With
/// `--no-systemd` among the template's flags the agent runs in the foreground, so the command
/// starts it detached (its output in `/var/log/drover-bootstrap.log`).
fn host_command(
    server: &str,
    token: &str,
    ca_checksum: &str,
    pool: &MachinePool,
    machine: &str,
    address: Option<&str>,
    install_flags: &[String],
) -> String {
    let mut flags = vec![
        "--server".to_owned(),
        quote(server),
        "--token".to_owned(),
        quote(token),
        "--ca-checksum".to_owned(),
        quote(ca_checksum),
    ];
    for (on, flag) in [
        (pool.roles.etcd, "--etcd"),
        (pool.roles.control_plane, "--controlplane"),
        (pool.roles.worker, "--worker"),
    ] {
        if on {
            flags.push(flag.to_owned());
        }
    }
    flags.extend([
        "--node-name".to_owned(),
        quote(machine),
        "--address".to_owned(),
    ]);
    // A machine whose address is not known when the command is written (a cloud's, booting
    // its user data) takes the one it reaches the network from.
    flags.push(address.map_or_else(
        || r#""$(ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')""#.to_owned(),
        quote,
    ));
    for (k, v) in &pool.labels {
        flags.extend(["--label".to_owned(), quote(&format!("{k}={v}"))]);
    }
    for taint in &pool.taints {
        flags.extend(["--taint".to_owned(), quote(taint)]);
    }
    flags.extend(install_flags.iter().map(|f| quote(f)));
    let install = format!(
        "curl --insecure -fsSL {}/system-agent-install.sh | sh -s - {}",
        quote(server.trim_end_matches('/')),
        flags.join(" ")
    );
    if install_flags.iter().any(|f| f == "--no-systemd") {
        format!(
            "setsid sh -c {} </dev/null >/var/log/drover-bootstrap.log 2>&1 &",
            quote(&install)
        )
    } else {
        install
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_host_command_carries_the_pools_roles_and_quotes_every_value() {
        let pool: MachinePool = serde_json::from_value(json!({"name": "w", "quantity": 1,
            "roles": {"etcd": true, "worker": true}, "template": "t",
            "labels": {"rack": "r'1"}, "taints": ["gpu=yes:NoSchedule"]}))
        .unwrap();
        let command = host_command(
            "https://hub:8443",
            "drr_tabc.s3cret",
            "ab12",
            &pool,
            "edge-w-x1y2z",
            Some("10.0.0.5"),
            &[],
        );
        assert_eq!(
            command,
            "curl --insecure -fsSL 'https://hub:8443'/system-agent-install.sh | sh -s - --server 'https://hub:8443' --token 'drr_tabc.s3cret' --ca-checksum 'ab12' --etcd --worker --node-name 'edge-w-x1y2z' --address '10.0.0.5' --label 'rack=r'\\''1' --taint 'gpu=yes:NoSchedule'"
        );
        let detached = host_command(
            "https://hub",
            "t",
            "c",
            &pool,
            "m",
            None,
            &["--no-systemd".into()],
        );
        assert!(detached.starts_with("setsid sh -c 'curl"), "{detached}");
        // No address given: the machine's own, from its route out, in the command's shell.
        assert!(
            detached.contains(r#"--address "$(ip -4 route get 1.1.1.1 |"#),
            "{detached}"
        );
        assert!(
            detached.ends_with(">/var/log/drover-bootstrap.log 2>&1 &"),
            "{detached}"
        );
    }
}
