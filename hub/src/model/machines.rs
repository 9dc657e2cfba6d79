//! The machine layer's objects: a driver's credentials (`CloudCredential`) and what a machine
//! is made from (`MachineTemplate`, immutable once created, as Cluster API's are: a pool
//! changes template by naming a new one).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The machine drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DriverName {
    /// Existing machines reached over SSH (docker-machine's "generic").
    Ssh,
    /// Amazon EC2, or a cloud that speaks its Query API.
    Amazonec2,
    /// Not a machine driver: a private registry's user name and password, for a custom
    /// cluster's `spec.registries`.
    Registry,
    /// Not a machine driver: how the hub reads a GitRepo's repository (HTTPS login or SSH
    /// key, and the SSH host keys it trusts).
    Git,
}

impl DriverName {
    pub fn label(self) -> &'static str {
        match self {
            DriverName::Ssh => "ssh",
            DriverName::Amazonec2 => "amazonec2",
            DriverName::Registry => "registry",
            DriverName::Git => "git",
        }
    }
}

/// A driver's credentials. The secret fields are write-only: never returned, kept when an
/// update leaves them out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudCredentialSpec {
    pub driver: DriverName,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshCredential>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amazonec2: Option<Ec2Credential>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryCredential>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitCredential>,
    /// Who besides the admins may name it (a cluster's pull credential or registry login, a
    /// machine pool's template that uses it): hub users by name, groups by name (`ops`,
    /// `corp:ops`). Naming it spends it, never shows it.
    #[serde(default, skip_serializing_if = "super::Allowed::is_empty")]
    pub allowed: super::Allowed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryCredential {
    /// A login: the user name and (write-only) password.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub password: String,
    /// A client certificate (PEM) the registry asks for, and its (write-only) key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub certificate: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
}

/// How to read a git repository: an HTTPS login (a user and a token or password), or an SSH
/// key; for SSH, the host keys to trust, pinned (no host is trusted on first use).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GitCredential {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    /// Write-only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub password: String,
    /// Write-only; OpenSSH or PEM, without a passphrase.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub private_key: String,
    /// `known_hosts` lines (`[host]:port ssh-ed25519 AAAA…`): the only host keys an SSH
    /// remote may present.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub known_hosts: String,
    /// PEM certificates: the only CAs an HTTPS remote's certificate may chain to (a private
    /// server's own CA), instead of the system's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_bundle: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SshCredential {
    /// The private key (OpenSSH or PEM), without a passphrase. Write-only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub private_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ec2Credential {
    pub access_key_id: String,
    /// Write-only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret_access_key: String,
}

/// What a pool's machines are made from. Immutable once created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineTemplateSpec {
    pub driver: DriverName,
    /// The CloudCredential (of the same driver) it uses.
    pub credential: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amazonec2: Option<Ec2Template>,
}

/// Existing machines: a pool takes its machines from `addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SshTemplate {
    /// The machines' addresses (IP or DNS name), each used by one machine at a time.
    pub addresses: Vec<String>,
    #[serde(default = "root")]
    pub user: String,
    #[serde(default = "twenty_two")]
    pub port: u16,
    /// Host keys known in advance (`TYPE BASE64`) by address; any other machine's key is
    /// recorded at first contact and pinned from then on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_keys: BTreeMap<String, String>,
    /// More flags for the host install script (e.g. `--no-systemd`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub install_flags: Vec<String>,
}

fn root() -> String {
    "root".into()
}

fn twenty_two() -> u16 {
    22
}

/// An EC2 instance's settings, as docker-machine's `amazonec2` driver takes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ec2Template {
    pub region: String,
    /// The Query API's endpoint, for clouds that speak it (default: AWS's for the region).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    pub ami: String,
    pub instance_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subnet_id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_group_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key_name: String,
    /// GiB; default 20.
    #[serde(default = "twenty")]
    pub root_size_gb: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The CA (PEM) that signs the endpoint's certificate, for a private cloud whose CA the
    /// system does not trust.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        rename = "endpointCA"
    )]
    pub endpoint_ca: String,
    /// More flags for the host install script in the user data (e.g. `--no-systemd`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub install_flags: Vec<String>,
}

fn twenty() -> u32 {
    20
}

/// The one section a driver reads must be there, and no other driver's.
fn one_section(
    driver: DriverName,
    (ssh, ec2, registry, git): (bool, bool, bool, bool),
    what: &str,
) -> Result<(), String> {
    match (driver, ssh, ec2, registry, git) {
        (DriverName::Ssh, true, false, false, false)
        | (DriverName::Amazonec2, false, true, false, false)
        | (DriverName::Registry, false, false, true, false)
        | (DriverName::Git, false, false, false, true) => Ok(()),
        (d, ..) => Err(format!(
            "spec.{0}: a {what} of driver {0:?} has spec.{0} and no other driver's section",
            d.label()
        )),
    }
}

/// Checks a credential's shape (whether its secret is present is checked on creation, once
/// a kept secret is merged in).
pub fn validate_credential(spec: &CloudCredentialSpec) -> Result<(), String> {
    one_section(
        spec.driver,
        (
            spec.ssh.is_some(),
            spec.amazonec2.is_some(),
            spec.registry.is_some(),
            spec.git.is_some(),
        ),
        "CloudCredential",
    )?;
    if let Some(git) = &spec.git {
        let key = git.private_key.trim();
        let pem = key.starts_with("-----BEGIN ") && key.contains("PRIVATE KEY-----");
        if !(key.is_empty() || pem) {
            return Err("spec.git.privateKey: give the private key's text (-----BEGIN OPENSSH PRIVATE KEY----- …), without a passphrase".into());
        }
        if !git.ca_bundle.trim().is_empty()
            && let Err(e) = tunnel::tls::roots_from_pem(git.ca_bundle.as_bytes())
        {
            return Err(format!(
                "spec.git.caBundle: {e}; give the CA's certificates as PEM (-----BEGIN CERTIFICATE----- …)"
            ));
        }
        for (i, line) in git.known_hosts.lines().enumerate() {
            let fields = line.split_whitespace().count();
            if !line.trim().is_empty() && !line.trim_start().starts_with('#') && fields < 3 {
                return Err(format!(
                    "spec.git.knownHosts: line {} is not a known_hosts line (HOST KEYTYPE KEY), as ssh-keyscan prints them",
                    i + 1
                ));
            }
        }
    }
    if let Some(registry) = &spec.registry {
        if registry.username.trim().is_empty() && registry.certificate.is_empty() {
            return Err("spec.registry: give a login (username, password), a client certificate (certificate, key), or both".into());
        }
        let pem = |text: &str, label: &str| {
            let text = text.trim();
            text.starts_with("-----BEGIN ") && text.contains(&format!("{label}-----"))
        };
        if !registry.certificate.is_empty() && !pem(&registry.certificate, "CERTIFICATE") {
            return Err("spec.registry.certificate: give the client certificate's PEM text (-----BEGIN CERTIFICATE----- …)".into());
        }
        if !registry.key.is_empty() && !pem(&registry.key, "PRIVATE KEY") {
            return Err("spec.registry.key: give the client certificate's private key as PEM (-----BEGIN PRIVATE KEY----- …)".into());
        }
    }
    if let Some(ssh) = &spec.ssh
        && !ssh.private_key.is_empty()
    {
        let key = ssh.private_key.trim();
        if !(key.starts_with("-----BEGIN ") && key.contains("PRIVATE KEY-----")) {
            return Err(
                "spec.ssh.privateKey: give the private key's text (-----BEGIN OPENSSH PRIVATE KEY----- …)"
                    .into(),
            );
        }
        if key.contains("ENCRYPTED") || key.contains("Proc-Type: 4,ENCRYPTED") {
            return Err(
                "spec.ssh.privateKey: the key has a passphrase; the hub needs one without".into(),
            );
        }
    }
    if let Some(ec2) = &spec.amazonec2
        && (ec2.access_key_id.trim().is_empty()
            || !ec2.access_key_id.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        return Err(
            "spec.amazonec2.accessKeyId: give the access key's id (letters and digits, e.g. AKIA…)"
                .into(),
        );
    }
    Ok(())
}

/// The secret a credential of `spec.driver` must hold, as a field path, if it is missing.
pub fn missing_secret(spec: &CloudCredentialSpec) -> Option<&'static str> {
    match spec.driver {
        DriverName::Ssh if spec.ssh.as_ref().is_none_or(|s| s.private_key.is_empty()) => {
            Some("spec.ssh.privateKey")
        }
        DriverName::Amazonec2
            if spec
                .amazonec2
                .as_ref()
                .is_none_or(|s| s.secret_access_key.is_empty()) =>
        {
            Some("spec.amazonec2.secretAccessKey")
        }
        DriverName::Registry => {
            let registry = spec.registry.as_ref()?;
            if !registry.username.is_empty() && registry.password.is_empty() {
                Some("spec.registry.password")
            } else if !registry.certificate.is_empty() && registry.key.is_empty() {
                Some("spec.registry.key")
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Checks a template's settings.
pub fn validate_template(spec: &MachineTemplateSpec) -> Result<(), String> {
    if matches!(spec.driver, DriverName::Registry | DriverName::Git) {
        return Err(format!(
            "spec.driver: {} credentials are not for machines; a template's driver is ssh or amazonec2",
            spec.driver.label()
        ));
    }
    one_section(
        spec.driver,
        (spec.ssh.is_some(), spec.amazonec2.is_some(), false, false),
        "MachineTemplate",
    )?;
    super::validate_name(super::Kind::CloudCredential, &spec.credential)
        .map_err(|e| format!("spec.credential: {e}"))?;
    if let Some(ssh) = &spec.ssh {
        if ssh.addresses.is_empty() {
            return Err("spec.ssh.addresses: list the machines' addresses".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for address in &ssh.addresses {
            let ok = !address.is_empty()
                && address.len() <= 253
                && address
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c));
            if !ok {
                return Err(format!(
                    "spec.ssh.addresses: {address:?} is not an IP address or DNS name"
                ));
            }
            if !seen.insert(address) {
                return Err(format!("spec.ssh.addresses: {address:?} is listed twice"));
            }
        }
        if ssh.user.is_empty()
            || !ssh
                .user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(format!("spec.ssh.user: {:?} is not a user name", ssh.user));
        }
        if ssh.port == 0 {
            return Err("spec.ssh.port: 1-65535".into());
        }
        for (address, key) in &ssh.host_keys {
            if !ssh.addresses.contains(address) {
                return Err(format!(
                    "spec.ssh.hostKeys: {address:?} is not one of spec.ssh.addresses"
                ));
            }
            if drivers::ssh::host_key_of(key).is_none() {
                return Err(format!(
                    "spec.ssh.hostKeys.{address}: give the key as TYPE BASE64 (a line of the host's ssh_host_*_key.pub)"
                ));
            }
        }
        check_install_flags("spec.ssh.installFlags", &ssh.install_flags)?;
    }
    if let Some(ec2) = &spec.amazonec2 {
        for (field, value) in [
            ("region", &ec2.region),
            ("ami", &ec2.ami),
            ("instanceType", &ec2.instance_type),
        ] {
            if value.trim().is_empty() {
                return Err(format!("spec.amazonec2.{field}: required"));
            }
        }
        if !ec2.endpoint.is_empty() && !ec2.endpoint.starts_with("https://") {
            return Err(format!(
                "spec.amazonec2.endpoint: {:?} must be an https:// URL (the credentials travel only over TLS)",
                ec2.endpoint
            ));
        }
        if !ec2.endpoint_ca.is_empty() && !ec2.endpoint_ca.contains("-----BEGIN CERTIFICATE-----") {
            return Err(
                "spec.amazonec2.endpointCA: give the CA's certificate in PEM (-----BEGIN CERTIFICATE----- …)"
                    .into(),
            );
        }
        if !ec2
            .region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(format!(
                "spec.amazonec2.region: {:?} is not a region name (e.g. eu-west-1)",
                ec2.region
            ));
        }
        check_install_flags("spec.amazonec2.installFlags", &ec2.install_flags)?;
        if ec2.root_size_gb == 0 || ec2.root_size_gb > 16_384 {
            return Err("spec.amazonec2.rootSizeGb: 1 to 16384 GiB".into());
        }
    }
    Ok(())
}

fn check_install_flags(field: &str, flags: &[String]) -> Result<(), String> {
    for flag in flags {
        if !flag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=./:,".contains(c))
        {
            return Err(format!(
                "{field}: {flag:?} may hold letters, digits and - _ = . / : , only"
            ));
        }
    }
    Ok(())
}

/// One machine of a pool, made by the hub's machine controller (never through the API; it may
/// be deleted there, and is then replaced). Its status says how far it is:
/// `phase` (`Pending`, `Provisioning`, `Bootstrapping`, `Running`, `Deleting`, `Failed`),
/// `message` (the failing step), `providerId`, `addresses`, `host` (the Host it became),
/// `hostKey` (pinned).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineSpec {
    pub cluster: String,
    pub pool: String,
    /// The template it was made from (a pool that changes template rolls its machines).
    pub template: String,
}

/// The finalizer a Machine carries until its machine is released at its driver (a cloud's
/// machine destroyed): nothing else may clear it.
pub const MACHINE_FINALIZER: &str = "drover.io/machine";

/// On a Host: its machine was destroyed (replaced as unhealthy), so no uninstall can run and
/// the planner removes it without one.
pub const MACHINE_DESTROYED: &str = "drover.io/machine-destroyed";

/// On a Host: drain its node before it is uninstalled, whatever the cluster's upgrade strategy
/// says (its machine's pool has `drainBeforeDelete`).
pub const DRAIN_BEFORE_DELETE: &str = "drover.io/drain-before-delete";

/// A machine's phases.
pub mod phase {
    pub const PENDING: &str = "Pending";
    pub const PROVISIONING: &str = "Provisioning";
    pub const BOOTSTRAPPING: &str = "Bootstrapping";
    pub const RUNNING: &str = "Running";
    pub const DELETING: &str = "Deleting";
    pub const FAILED: &str = "Failed";
}
