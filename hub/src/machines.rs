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
    model::{
        CloudCredentialSpec, ClusterSpec, ClusterType, Kind, MachinePool, MachineTemplateSpec,
        Status, phase, update_status,
    },
    store::{LabelSelector, Object, Op, Store, StoreError},
};

mod commands;
mod decide;
mod failures;
mod instances;
mod tokens;
use commands::{host_command, uninstall_command, user_data};
use decide::{Action, View, decide};
use drivers::Driver;
use failures::{Failure, recovered};
use instances::{Instances, POOL_TAG};
use tokens::{CLIENT_KEY, TOKEN_FIELD, TOKEN_SECRET_FIELD};

/// The finalizer a Machine carries until it is released at its driver.
pub const FINALIZER: &str = crate::model::MACHINE_FINALIZER;
/// How long one SSH command may take (the install downloads the agent).
const SSH_TIMEOUT: Duration = Duration::from_secs(300);
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
    store: Arc<dyn Store>,
    server_url: String,
    ca_checksum: String,
    instances: Arc<std::sync::Mutex<Instances>>,
}

impl Controller {
    pub fn new(store: Arc<dyn Store>, server_url: String, ca_checksum: String) -> Self {
        Self {
            store,
            server_url,
            ca_checksum,
            instances: Arc::default(),
        }
    }

    /// Reconciles every cluster with machine pools whenever a Cluster, Host, template or
    /// credential changes, or a Machine does other than in its status (and every 10 s
    /// regardless), until `shutdown`. The controller's own status writes start no pass: a
    /// failed step would otherwise be retried at once, each failure's write the next try's
    /// trigger; its retries come when its backoff says.
    pub async fn run(self, shutdown: CancellationToken) {
        let kinds = ["Cluster", "Host", "MachineTemplate", "CloudCredential"];
        let mut machines = crate::store::SpecChanges::default();
        let relevant = |e: &crate::store::WatchEvent| {
            if e.object.kind == Kind::Machine.name() {
                machines.relevant(e)
            } else {
                kinds.contains(&e.object.kind.as_str())
            }
        };
        crate::store::on_changes_where(
            "the machine controller",
            self.store.as_ref(),
            relevant,
            &shutdown,
            || self.reconcile_all(),
        )
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
        let versions = self.versions().await?;
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
            let gone = self.gone_instances(&name, &pools, &mine).await?;
            let view = View {
                pools: &pools,
                machines: &mine,
                hosts: &its_hosts,
                init_host: init_host.as_deref(),
                versions: &versions,
                gone: &gone,
                now: time::OffsetDateTime::now_utc(),
            };
            for action in decide(&view) {
                // What a failure of this step is recorded against.
                let fingerprint = action
                    .machine()
                    .and_then(|m| mine.iter().find(|o| o.metadata.name == m))
                    .map(|m| decide::fingerprint(m, &view))
                    .unwrap_or_default();
                if let Err(e) = self.act(&name, &pools, action, &fingerprint).await {
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
        fingerprint: &str,
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
            Action::Provision { machine } => {
                // An SSH machine is installed as soon as its address is recorded (the pass
                // its status write would have made is not made: see `run`).
                if self
                    .provision(cluster, pools, &machine, fingerprint)
                    .await?
                {
                    self.bootstrap(cluster, pools, &machine, fingerprint)
                        .await?;
                }
                Ok(())
            }
            Action::Bootstrap { machine } => {
                self.bootstrap(cluster, pools, &machine, fingerprint).await
            }
            Action::Link { machine, host } => {
                // The bootstrap token's name, as the write found it.
                let found = Arc::new(std::sync::Mutex::new(None));
                let token = found.clone();
                update_status(self.store.as_ref(), Kind::Machine, &machine, move |s| {
                    *token.lock().unwrap_or_else(|p| p.into_inner()) = s.extra.remove(TOKEN_FIELD);
                    s.extra.remove(TOKEN_SECRET_FIELD);
                    recovered(s);
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
                    return self.release(&machine, false, fingerprint).await;
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
                self.release(&machine, true, fingerprint).await
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
        fingerprint: &str,
    ) -> Result<bool, StoreError> {
        let machine = self.store.get(Kind::Machine.name(), name).await?;
        let failed = async |failure: Failure| {
            self.failed(name, phase::PENDING, "provision", failure, fingerprint)
                .await
                .map(|()| false)
        };
        let (template, credential) = match self.template_of(&machine).await {
            Ok(found) => found,
            Err(why) => return failed(Failure::settings(why)).await,
        };
        let driver = match self.driver_for(name, &template, &credential).await? {
            Ok(driver) => driver,
            Err(why) => return failed(Failure::settings(why)).await,
        };
        if !driver.boots_user_data() {
            let request = drivers::CreateRequest {
                name,
                tags: &BTreeMap::new(),
                user_data: "",
                client_token: "",
            };
            return match driver.create(&request).await {
                Ok(made) => update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
                    recovered(s);
                    s.extra.insert("addresses".into(), json!(made.addresses));
                    s.extra.insert("providerId".into(), json!(made.id));
                    s.extra.insert("phase".into(), json!(phase::PROVISIONING));
                    s.extra.insert("message".into(), json!(""));
                })
                .await
                .map(|()| true),
                Err(e) => failed(e.into()).await,
            };
        }
        let pool_name = decide::text(&machine, "/pool");
        let Some(pool) = pools.iter().find(|p| p.name == pool_name) else {
            return Ok(false);
        };
        let found = match driver.list(drivers::ec2::NAME_TAG, name).await {
            Ok(found) => found,
            Err(e) => return failed(e.into()).await,
        };
        let made = match found.into_iter().next() {
            Some(made) => made,
            None => {
                let token = self.bootstrap_token(cluster, name, &machine).await?;
                let key = Status::of(&machine)
                    .extra
                    .get(CLIENT_KEY)
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                let client_token = format!("drover-{}-{key}", token.name);
                let install_flags = template
                    .amazonec2
                    .as_ref()
                    .map(|e| e.install_flags.clone())
                    .unwrap_or_default();
                let user_data = user_data(&host_command(
                    &self.server_url,
                    &token.value,
                    &self.ca_checksum,
                    pool,
                    name,
                    None,
                    &install_flags,
                ));
                let tags = BTreeMap::from([
                    ("drover.io/cluster".to_owned(), cluster.to_owned()),
                    (POOL_TAG.to_owned(), pool.name.clone()),
                ]);
                let request = drivers::CreateRequest {
                    name,
                    tags: &tags,
                    user_data: &user_data,
                    client_token: &client_token,
                };
                match driver.create_unlisted(&request).await {
                    Ok(made) => made,
                    Err(e) => {
                        if matches!(e, drivers::DriverError::KeySpent(_)) {
                            self.next_client_key(name).await?;
                        }
                        return failed(e.into()).await;
                    }
                }
            }
        };
        tracing::info!(cluster, machine = %name, id = %made.id, "machine made");
        // A listing from before the making does not show it: the next check lists afresh.
        self.instances
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget_listing(cluster, &pool.name);
        update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
            recovered(s);
            s.extra.insert("addresses".into(), json!(made.addresses));
            s.extra.insert("providerId".into(), json!(made.id));
            s.extra.insert("phase".into(), json!(phase::BOOTSTRAPPING));
            s.extra.insert(
                "message".into(),
                json!("made; its user data installs the system-agent at first boot"),
            );
        })
        .await
        .map(|()| false)
    }

    /// Provisioning → Bootstrapping: the host command over SSH, the host key pinned.
    async fn bootstrap(
        &self,
        cluster: &str,
        pools: &[MachinePool],
        name: &str,
        fingerprint: &str,
    ) -> Result<(), StoreError> {
        let machine = self.store.get(Kind::Machine.name(), name).await?;
        let failed = async |failure: Failure| {
            self.failed(name, phase::PROVISIONING, "bootstrap", failure, fingerprint)
                .await
        };
        let (template, credential) = match self.template_of(&machine).await {
            Ok(found) => found,
            Err(why) => return failed(Failure::settings(why)).await,
        };
        let (Some(ssh), Some(key)) = (
            &template.ssh,
            credential.ssh.as_ref().map(|c| c.private_key.clone()),
        ) else {
            return failed(Failure::settings(
                "the template's credential has no SSH key".into(),
            ))
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
            &token.value,
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
                    recovered(s);
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
                update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
                    s.extra.insert("hostKey".into(), host_key.clone());
                })
                .await?;
                failed(Failure {
                    why: format!("the host command exited with {}: {tail}", outcome.exit_code),
                    refused: false,
                })
                .await
            }
            Err(e @ drivers::ssh::SshError::HostKeyChanged { .. }) => {
                self.set(name, phase::FAILED, &format!("bootstrap: {e}"))
                    .await
            }
            Err(e) => {
                let refused = matches!(e, drivers::ssh::SshError::AuthRefused(_));
                failed(Failure {
                    why: e.to_string(),
                    refused,
                })
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
    async fn release(
        &self,
        name: &str,
        then_let_go: bool,
        fingerprint: &str,
    ) -> Result<(), StoreError> {
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
        let failed = async |failure: Failure| {
            self.failed(name, phase::DELETING, "release", failure, fingerprint)
                .await
        };
        let driver = match self.driver_for(name, &template, &credential).await? {
            Ok(driver) => driver,
            Err(why) => return failed(Failure::settings(why)).await,
        };
        if driver.boots_user_data() {
            let mut ids: Vec<String> = match driver.list(drivers::ec2::NAME_TAG, name).await {
                Ok(found) => found.into_iter().map(|m| m.id).collect(),
                Err(e) => return failed(e.into()).await,
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
                    let mut failure = Failure::from(e);
                    failure.why = format!("destroying {id}: {}", failure.why);
                    return failed(failure).await;
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
        // Destroyed: its bootstrap token (in the instance's user data) goes with it.
        if let Ok(machine) = self.store.get(Kind::Machine.name(), name).await {
            self.forget_bootstrap_token(&machine).await?;
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
            self.forget_bootstrap_token(&machine).await?;
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

/// Five lowercase letters and digits: a machine's name within its pool.
fn suffix() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    crate::auth::secret::random_text::<8>()
        .bytes()
        .take(5)
        .map(|b| ALPHABET[usize::from(b) % ALPHABET.len()] as char)
        .collect()
}
