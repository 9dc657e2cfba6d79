//! What a host's plan holds: the distribution's installer (its script from the internet or a
//! mirror, or its air-gap artifacts from the hub), the host's `config.yaml`, the agents'
//! manifest on the init host, the probes that say the host is ready, and how a host joins.

use proto::plan::v1::{File, Instruction, Plan, Probe, checksum};
use serde_json::Value;

use super::{MANIFEST_FILE, NODE_TOKEN};
use crate::{
    model::{Distribution, HostSpec, Status},
    registration,
    store::{Object, Store, StoreError},
};

/// Where a host comes in the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Step {
    Init,
    Etcd,
    ControlPlane,
    Worker,
}

#[derive(Debug, Clone)]
pub(super) struct Join {
    pub(super) url: String,
    pub(super) token: String,
}

impl Distribution {
    pub(super) fn name(self) -> &'static str {
        match self {
            Distribution::K3s => "k3s",
            Distribution::Rke2 => "rke2",
        }
    }

    /// K3s joins at the API server's port; RKE2 at its supervisor port.
    pub(super) fn join_port(self) -> u16 {
        match self {
            Distribution::K3s => 6443,
            Distribution::Rke2 => 9345,
        }
    }
}

/// How the distribution gets installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Installer {
    /// The distribution's own install script, from its site or a mirror (settings
    /// `k3s-install-url`, `rke2-install-url`), downloading what it needs from the internet.
    Script(String),
    /// Air-gapped (setting `install-source` = `hub`): the distribution's air-gap artifacts and
    /// its install script, served by the hub at `/v3/artifacts/<version>/`, fetched trusting
    /// the hub's CA; and the agents' images (`scripts/images`' OCI archives, which the
    /// operator puts in the hub's `artifacts/drover/`), which the distribution imports at start,
    /// so the cluster-agent starts without a registry.
    Hub { base: String },
}

/// Where the hub serves the agents' image archives from, under its artifacts.
pub(super) const AGENT_IMAGES_DIR: &str = "drover";

/// The agents' image archives of this hub's version, as `scripts/images` names them (with
/// `$arch` for the host's architecture).
fn agent_image_archives() -> [String; 2] {
    let version = env!("CARGO_PKG_VERSION");
    ["cluster-agent", "node-agent"].map(|image| format!("drover-{image}-{version}-$arch.oci.tar"))
}

#[derive(Debug, Clone, Default)]
pub(super) struct Settings {
    k3s_url: String,
    rke2_url: String,
    pub(super) from_hub: bool,
}

impl Settings {
    pub(super) async fn read(store: &dyn Store) -> Result<Settings, StoreError> {
        let source = registration::setting(store, "install-source", "internet".into()).await?;
        Ok(Settings {
            k3s_url: registration::setting(store, "k3s-install-url", "https://get.k3s.io".into())
                .await?,
            rke2_url: registration::setting(
                store,
                "rke2-install-url",
                "https://get.rke2.io".into(),
            )
            .await?,
            from_hub: source == "hub",
        })
    }

    pub(super) fn installer(&self, dist: Distribution, hub: &str, version: &str) -> Installer {
        match (self.from_hub, dist) {
            (true, _) => Installer::Hub {
                base: format!("{hub}/v3/artifacts/{}", encode_version(version)),
            },
            (false, Distribution::K3s) => Installer::Script(self.k3s_url.clone()),
            (false, Distribution::Rke2) => Installer::Script(self.rke2_url.clone()),
        }
    }
}

/// A version as one URL path segment (`+` is fine in paths; nothing else needs escaping in
/// the versions K3s and RKE2 publish, but a stray `/` must not become a path).
pub(super) fn encode_version(version: &str) -> String {
    version.replace('/', "%2F")
}

/// Where a plan keeps the hub's CA, to fetch artifacts from the hub.
pub(super) const HUB_CA: &str = "/etc/drover/hub-ca.pem";

pub(super) struct Ctx<'a> {
    pub(super) dist: Distribution,
    pub(super) version: &'a str,
    pub(super) installer: Installer,
    /// The hub's CA (PEM), for air-gapped installs.
    pub(super) ca_pem: &'a str,
    /// The authorized cluster endpoint is on: control-plane hosts' API servers ask the
    /// cluster's token authenticator on their loopback (`spec.authorizedEndpoint`).
    pub(super) endpoint: bool,
    /// The cluster's own configuration of its distribution (`spec.config`, `spec.hostConfig`).
    pub(super) config: std::collections::BTreeMap<String, serde_json::Value>,
    pub(super) host_config: Vec<crate::model::distconfig::HostConfig>,
    /// `registries.yaml` and the CA files it names (`spec.registries`), on every host.
    pub(super) registries: Vec<File>,
    /// `spec.agentEnv`: for the installer and the distribution's service (a proxy, above all).
    pub(super) env: Vec<(String, String)>,
}

/// The distribution's systemd unit on a server or an agent: its service reads
/// `/etc/default/<unit>` (`EnvironmentFile=-/etc/default/%N` in K3s's and RKE2's units).
fn unit(dist: Distribution, server: bool) -> &'static str {
    match (dist, server) {
        (Distribution::K3s, true) => "k3s",
        (Distribution::K3s, false) => "k3s-agent",
        (Distribution::Rke2, true) => "rke2-server",
        (Distribution::Rke2, false) => "rke2-agent",
    }
}

/// `plan` with the removal of the distribution's environment file when the cluster has no
/// `spec.agentEnv` but `stored` (the host's plan now) wrote one or removes one: a proxy taken
/// out of the cluster's spec leaves the service's environment too, and the removal stays in
/// the host's plans so they do not change again after it.
pub(super) fn with_env_removal(mut plan: Plan, ctx: &Ctx<'_>, stored: Option<&Object>) -> Plan {
    if !ctx.env.is_empty() {
        return plan;
    }
    // Only the stored files' paths are read, from the stored JSON: this runs for every host on
    // every pass, and decoding the whole plan (its files' contents) again is not needed.
    let stored_paths = stored
        .and_then(|o| o.spec.pointer("/plan/files"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.get("path").and_then(serde_json::Value::as_str));
    let units = [unit(ctx.dist, true), unit(ctx.dist, false)].map(|u| format!("/etc/default/{u}"));
    for path in stored_paths.filter(|p| units.iter().any(|u| u == p)) {
        if !plan.files.iter().any(|f| f.path == path) {
            plan.files.push(File {
                path: path.to_owned(),
                delete: true,
                ..File::default()
            });
        }
    }
    plan
}

/// `env` as a systemd environment file: `NAME="value"`, with `"`, `\\`, `$` and `` ` `` escaped.
fn environment_file(env: &[(String, String)]) -> String {
    let mut text =
        "# spec.agentEnv of the cluster, for the distribution's service (written by Drover's planner).\n"
            .to_owned();
    for (name, value) in env {
        let mut quoted = String::with_capacity(value.len());
        for c in value.chars() {
            if matches!(c, '"' | '\\' | '$' | '`') {
                quoted.push('\\');
            }
            quoted.push(c);
        }
        text.push_str(&format!("{name}=\"{quoted}\"\n"));
    }
    text
}

/// Where the authenticator listens on each control-plane host: loopback only (host network),
/// so only that host's API server reaches it, as Rancher's `kube-api-auth` does.
pub(super) const AUTHENTICATOR_URL: &str = "http://127.0.0.1:6440/v1/authenticate";
/// How long an API server keeps an answer of the authenticator: a revoked token stops working
/// at most this long after the authenticator learns of it.
pub(super) const WEBHOOK_CACHE_TTL: &str = "10s";

/// The kubeconfig that points an API server's token webhook at the authenticator.
fn webhook_config() -> String {
    format!(
        "# The authorized cluster endpoint: this API server asks Drover's authenticator about\n\
         # bearer tokens it does not know itself (written by the Drover hub's planner).\n\
         apiVersion: v1\nkind: Config\nclusters:\n  - name: drover-kube-api-auth\n    cluster:\n      \
         server: {AUTHENTICATOR_URL}\nusers:\n  - name: kube-apiserver\n    user: {{}}\n\
         contexts:\n  - name: webhook\n    context:\n      cluster: drover-kube-api-auth\n      \
         user: kube-apiserver\ncurrent-context: webhook\n"
    )
}

/// The webhook's configuration file on a control-plane host.
pub(super) fn webhook_config_path(dist: Distribution) -> String {
    format!("/etc/rancher/{}/kube-api-authn-webhook.yaml", dist.name())
}

impl Ctx<'_> {
    /// Installs (or upgrades to) the version, as a server or an agent, and starts it.
    pub(super) fn install(&self, server: bool) -> Instruction {
        let kind = if server { "server" } else { "agent" };
        let script = match (&self.installer, self.dist) {
            // Downloaded first, then run: piped into sh, a failed download ran an empty script
            // that exited 0, and the failure showed only minutes later as a missing node token.
            // Now the step fails at once with curl's own error as its last line.
            (Installer::Script(url), dist) => {
                let start = match dist {
                    Distribution::K3s => String::new(),
                    Distribution::Rke2 => {
                        format!("systemctl enable rke2-{kind}\nsystemctl restart rke2-{kind}\n")
                    }
                };
                format!(
                    "set -e\ninstaller=$(mktemp)\ntrap 'rm -f \"$installer\"' EXIT\n\
                     curl -fsSL -o \"$installer\" {url} || {{ code=$?; echo \"downloading the installer {url} failed (curl exit $code)\" >&2; exit $code; }}\n\
                     sh \"$installer\"\n{start}"
                )
            }
            // K3s's and RKE2's documented air-gap installs, with the files from the hub.
            (Installer::Hub { base }, dist) => {
                let agents = base
                    .rsplit_once('/')
                    .map_or_else(String::new, |(artifacts, _)| {
                        format!("{artifacts}/{AGENT_IMAGES_DIR}")
                    });
                let name = dist.name();
                let images = rooted(&format!("/var/lib/rancher/{name}/agent/images"));
                let ca = rooted(HUB_CA);
                let agent_images: String = agent_image_archives()
                    .iter()
                    .map(|file| {
                        format!(
                            "curl -fsS --cacert {ca} -o {images}/{file} \"{agents}/{file}\" || \
                             {{ echo \"the hub has no {file}: build the agents' images with scripts/images and put them in the hub's artifacts/{AGENT_IMAGES_DIR}/\" >&2; exit 1; }}\n"
                        )
                    })
                    .collect();
                let fetch = format!(
                    "set -e\ncase \"$(uname -m)\" in aarch64|arm64) arch=arm64 ;; *) arch=amd64 ;; esac\n\
                     fetch() {{ curl -fsS --cacert {ca} -o \"$2\" \"{base}/$1\"; }}\n\
                     mkdir -p {images}\n{agent_images}"
                );
                match dist {
                    Distribution::K3s => {
                        let (bin, data) =
                            (rooted("/usr/local/bin"), rooted("/var/lib/rancher/k3s"));
                        format!(
                            "{fetch}mkdir -p {bin}\n\
                             fetch k3s {bin}/k3s.download && chmod 0755 {bin}/k3s.download && mv -f {bin}/k3s.download {bin}/k3s\n\
                             fetch k3s-airgap-images-$arch.tar.zst {images}/k3s-airgap-images-$arch.tar.zst\n\
                             fetch k3s-install.sh {data}/install.sh\n\
                             INSTALL_K3S_SKIP_DOWNLOAD=true sh {data}/install.sh\n"
                        )
                    }
                    Distribution::Rke2 => format!(
                        "{fetch}dir={}\nmkdir -p \"$dir\"\n\
                         for f in rke2.linux-$arch.tar.gz rke2-images.linux-$arch.tar.zst sha256sum-$arch.txt; do fetch $f \"$dir/$f\"; done\n\
                         fetch rke2-install.sh \"$dir/install.sh\"\n\
                         INSTALL_RKE2_ARTIFACT_PATH=\"$dir\" sh \"$dir/install.sh\"\n\
                         systemctl enable rke2-{kind} && systemctl restart rke2-{kind}\n",
                        rooted("/var/lib/rancher/rke2/artifacts")
                    ),
                }
            }
        };
        let (version_var, type_var) = match self.dist {
            Distribution::K3s => ("INSTALL_K3S_VERSION", "INSTALL_K3S_EXEC"),
            Distribution::Rke2 => ("INSTALL_RKE2_VERSION", "INSTALL_RKE2_TYPE"),
        };
        let mut env = vec![
            format!("{version_var}={}", self.version),
            format!("{type_var}={kind}"),
        ];
        // The installer downloads (through the proxy, if one is set) and K3s's copies the
        // proxy variables into its service's environment.
        env.extend(self.env.iter().map(|(k, v)| format!("{k}={v}")));
        Instruction {
            name: "install".into(),
            script,
            env,
            ..Instruction::default()
        }
    }

    /// The uninstall scripts the distributions' installers leave behind.
    pub(super) fn uninstall(&self, server: bool) -> Instruction {
        let script = match self.dist {
            Distribution::K3s if server => "/usr/local/bin/k3s-uninstall.sh",
            Distribution::K3s => "/usr/local/bin/k3s-agent-uninstall.sh",
            Distribution::Rke2 => "/usr/local/bin/rke2-uninstall.sh",
        };
        Instruction {
            name: "uninstall".into(),
            script: rooted(script),
            ..Instruction::default()
        }
    }
}

/// `path` in a script, under the host's root: the system-agent gives every instruction
/// `DROVER_ROOT` (empty on a host of its own, a directory on one that shares its machine), and
/// the plan's scripts put it before every path they name.
pub(super) fn rooted(path: &str) -> String {
    format!("\"$DROVER_ROOT{path}\"")
}

/// Seconds a new server is given to write its node token.
const NODE_TOKEN_WAIT: u32 = 120;

/// The plan that makes `host` a node of the cluster at the cluster's version.
pub(super) fn host_plan(
    ctx: &Ctx<'_>,
    host: &HostSpec,
    step: Step,
    join: Option<&Join>,
    manifest: Option<&str>,
) -> Plan {
    let dist = ctx.dist.name();
    let server = host.roles.etcd || host.roles.control_plane;
    let data = format!("/var/lib/rancher/{dist}");
    let endpoint = ctx.endpoint && host.roles.control_plane;
    let mut files = vec![File {
        path: format!("/etc/rancher/{dist}/config.yaml"),
        content: config_yaml(ctx, host, step, join, endpoint).into_bytes(),
        permissions: "0600".into(),
        ..File::default()
    }];
    files.extend(ctx.registries.iter().cloned());
    if !ctx.env.is_empty() {
        files.push(File {
            path: format!("/etc/default/{}", unit(ctx.dist, server)),
            content: environment_file(&ctx.env).into_bytes(),
            // It may hold a proxy's password.
            permissions: "0600".into(),
            ..File::default()
        });
    }
    if endpoint {
        files.push(File {
            path: webhook_config_path(ctx.dist),
            content: webhook_config().into_bytes(),
            permissions: "0600".into(),
            ..File::default()
        });
    }
    if matches!(ctx.installer, Installer::Hub { .. }) {
        files.push(File {
            path: HUB_CA.into(),
            content: ctx.ca_pem.as_bytes().to_vec(),
            permissions: "0644".into(),
            ..File::default()
        });
    }
    if let Some(manifest) = manifest {
        files.push(File {
            path: format!("{data}/server/manifests/{MANIFEST_FILE}"),
            content: manifest.as_bytes().to_vec(),
            permissions: "0600".into(),
            // It holds the agents' registration token, and their pull credential's password.
            secret: true,
            ..File::default()
        });
    }
    let mut instructions = vec![ctx.install(server)];
    if step == Step::Init {
        let unit = unit(ctx.dist, server);
        let log = format!("$(journalctl -u {unit} -n 5 --no-pager 2>/dev/null | tr '\\n' ' ')");
        let token = rooted(&format!("{data}/server/node-token"));
        instructions.push(Instruction {
            name: NODE_TOKEN.into(),
            // The server writes it seconds after it starts: a service that failed is said at
            // once, one that is still silent after two minutes with the end of its log.
            script: format!(
                "for i in $(seq {NODE_TOKEN_WAIT}); do\n\
                 [ -s {token} ] && exec cat {token}\n\
                 if systemctl is-failed --quiet {unit} 2>/dev/null; then echo \"the {unit} service failed before writing its node token; its log ends with: {log}\" >&2; exit 1; fi\n\
                 sleep 1\ndone\n\
                 echo \"the {unit} service has not written its node token after {NODE_TOKEN_WAIT} s; its log ends with: {log}\" >&2\nexit 1\n"
            ),
            save_output: true,
            ..Instruction::default()
        });
    }
    let mut probes = vec![Probe {
        name: "kubelet".into(),
        url: "http://127.0.0.1:10248/healthz".into(),
        period_seconds: 2,
        ..Probe::default()
    }];
    if server && host.roles.control_plane {
        let tls = format!("{data}/server/tls");
        probes.push(Probe {
            name: "kube-apiserver".into(),
            url: "https://127.0.0.1:6443/readyz".into(),
            ca_cert: format!("{tls}/server-ca.crt"),
            client_cert: format!("{tls}/client-kube-apiserver.crt"),
            client_key: format!("{tls}/client-kube-apiserver.key"),
            period_seconds: 2,
            ..Probe::default()
        });
    }
    if host.roles.etcd {
        probes.push(Probe {
            name: "etcd".into(),
            url: "http://127.0.0.1:2381/health".into(),
            period_seconds: 2,
            ..Probe::default()
        });
    }
    Plan {
        files,
        instructions,
        probes,
        ..Plan::default()
    }
}

/// The distribution's `config.yaml` for a host; with `endpoint`, its API server also asks the
/// authorized endpoint's authenticator about tokens.
pub(super) fn config_yaml(
    ctx: &Ctx<'_>,
    host: &HostSpec,
    step: Step,
    join: Option<&Join>,
    endpoint: bool,
) -> String {
    let dist = ctx.dist;
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut lines = Vec::new();
    if !host.node_name.is_empty() {
        lines.push(format!("node-name: {}", quote(&host.node_name)));
    }
    let internal = if host.internal_address.is_empty() {
        &host.address
    } else {
        &host.internal_address
    };
    if !internal.is_empty() {
        lines.push(format!("node-ip: {}", quote(internal)));
    }
    if !host.address.is_empty() && host.address != *internal {
        lines.push(format!("node-external-ip: {}", quote(&host.address)));
    }
    if !host.node_labels.is_empty() {
        lines.push("node-label:".into());
        for (k, v) in &host.node_labels {
            lines.push(format!("  - {}", quote(&format!("{k}={v}"))));
        }
    }
    if !host.taints.is_empty() {
        lines.push("node-taint:".into());
        for t in &host.taints {
            lines.push(format!("  - {}", quote(t)));
        }
    }
    if step == Step::Init && dist == Distribution::K3s {
        lines.push("cluster-init: true".into());
    }
    if let Some(join) = join {
        lines.push(format!("server: {}", quote(&join.url)));
        lines.push(format!("token: {}", quote(&join.token)));
    }
    let server = host.roles.etcd || host.roles.control_plane;
    if server && !host.roles.etcd {
        lines.push("disable-etcd: true".into());
    }
    if host.roles.etcd && !host.roles.control_plane {
        for flag in [
            "disable-apiserver",
            "disable-controller-manager",
            "disable-scheduler",
        ] {
            lines.push(format!("{flag}: true"));
        }
    }
    // The cluster's own options (validated: none of the above), after Drover's; a list of
    // kube-apiserver arguments goes with the endpoint's.
    let mut own = crate::model::distconfig::for_host(
        dist,
        &ctx.config,
        &ctx.host_config,
        &host.roles,
        &host.node_labels,
    );
    let mut apiserver_args: Vec<String> = Vec::new();
    if endpoint {
        // kube-apiserver's own flags: a token no other authenticator knows goes to the
        // webhook (v1 TokenReview), whose answers are kept for the TTL.
        apiserver_args.extend([
            format!(
                "authentication-token-webhook-config-file={}",
                webhook_config_path(dist)
            ),
            "authentication-token-webhook-version=v1".into(),
            format!("authentication-token-webhook-cache-ttl={WEBHOOK_CACHE_TTL}"),
        ]);
    }
    if let Some(given) = own.remove("kube-apiserver-arg") {
        apiserver_args.extend(strings(&given));
    }
    if !apiserver_args.is_empty() {
        lines.push("kube-apiserver-arg:".into());
        lines.extend(apiserver_args.iter().map(|a| format!("  - {}", quote(a))));
    }
    for (key, value) in &own {
        match value {
            serde_json::Value::Array(_) => {
                lines.push(format!("{key}:"));
                lines.extend(strings(value).iter().map(|v| format!("  - {}", quote(v))));
            }
            serde_json::Value::String(text) => lines.push(format!("{key}: {}", quote(text))),
            other => lines.push(format!("{key}: {other}")),
        }
    }
    lines.join("\n") + "\n"
}

/// The distribution's `registries.yaml` for `registries` (the format K3s and RKE2 document:
/// `mirrors.<name>.endpoint`/`rewrite`, `configs.<host>.auth`/`tls`), with each registry's
/// CA bundle and client certificate as files of their own; `logins` are the credentials by
/// name. The file holds passwords: owner-only, as the plan that carries it, and as the client
/// certificate's key.
pub(super) fn registry_files(
    dist: Distribution,
    registries: &crate::model::registries::Registries,
    logins: &std::collections::BTreeMap<String, crate::model::RegistryCredential>,
) -> Vec<File> {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let dir = format!("/etc/rancher/{}", dist.name());
    let mut lines = Vec::new();
    let mut files = Vec::new();
    if !registries.mirrors.is_empty() {
        lines.push("mirrors:".to_owned());
        for (name, mirror) in &registries.mirrors {
            lines.push(format!("  {}:", quote(name)));
            if !mirror.endpoint.is_empty() {
                lines.push("    endpoint:".into());
                lines.extend(
                    mirror
                        .endpoint
                        .iter()
                        .map(|e| format!("      - {}", quote(e))),
                );
            }
            if !mirror.rewrite.is_empty() {
                lines.push("    rewrite:".into());
                for (pattern, replacement) in &mirror.rewrite {
                    lines.push(format!("      {}: {}", quote(pattern), quote(replacement)));
                }
            }
        }
    }
    if !registries.configs.is_empty() {
        lines.push("configs:".to_owned());
        for (host, config) in &registries.configs {
            lines.push(format!("  {}:", quote(host)));
            let login = logins.get(&config.credential);
            if let Some(login) = login.filter(|l| !l.username.is_empty()) {
                lines.push("    auth:".into());
                lines.push(format!("      username: {}", quote(&login.username)));
                lines.push(format!("      password: {}", quote(&login.password)));
            }
            let client = login.filter(|l| !l.certificate.is_empty());
            let tls = config.tls.clone().unwrap_or_default();
            if tls.ca_bundle.is_empty() && !tls.insecure_skip_verify && client.is_none() {
                continue;
            }
            lines.push("    tls:".into());
            // One directory per registry host; ':' is not welcome in every path.
            let host_dir = format!("{dir}/registries.d/{}", host.replace([':', '*'], "_"));
            let mut file = |key: &str, name: &str, content: &str, permissions: &str, secret| {
                let path = format!("{host_dir}/{name}");
                lines.push(format!("      {key}: {}", quote(&path)));
                files.push(File {
                    path,
                    content: content.as_bytes().to_vec(),
                    permissions: permissions.into(),
                    secret,
                    ..File::default()
                });
            };
            if !tls.ca_bundle.is_empty() {
                file("ca_file", "ca.crt", &tls.ca_bundle, "0644", false);
            }
            if let Some(client) = client {
                file(
                    "cert_file",
                    "client.crt",
                    &client.certificate,
                    "0644",
                    false,
                );
                file("key_file", "client.key", &client.key, "0600", true);
            }
            if tls.insecure_skip_verify {
                lines.push("      insecure_skip_verify: true".into());
            }
        }
    }
    files.insert(
        0,
        File {
            path: format!("{dir}/registries.yaml"),
            content: (lines.join("\n") + "\n").into_bytes(),
            permissions: "0600".into(),
            // It holds the registries' passwords.
            secret: true,
            ..File::default()
        },
    );
    files
}

/// A config value as a list of strings (a lone string is a list of one).
fn strings(value: &serde_json::Value) -> Vec<String> {
    match value {
        serde_json::Value::Array(items) => items
            .iter()
            .filter_map(|i| i.as_str().map(str::to_owned))
            .collect(),
        serde_json::Value::String(text) => vec![text.clone()],
        other => vec![other.to_string()],
    }
}

/// The checksum of the plan a Plan object holds.
pub(super) fn stored_checksum(plan: &Object) -> Option<String> {
    crate::model::parse_plan(plan.spec.get("plan")?)
        .ok()
        .map(|p| checksum(&p))
}

/// The agents' manifest already in the init host's plan, if any.
pub(super) fn existing_manifest(plan: Option<&Object>, dist: Distribution) -> Option<String> {
    let parsed = crate::model::parse_plan(plan?.spec.get("plan")?).ok()?;
    let path = format!(
        "/var/lib/rancher/{}/server/manifests/{MANIFEST_FILE}",
        dist.name()
    );
    parsed
        .files
        .into_iter()
        .find(|f| f.path == path)
        .and_then(|f| String::from_utf8(f.content).ok())
}

/// The init host's join token: kept on its Plan once seen, else from its plan's output.
pub(super) fn join_token(plan: Option<&Object>) -> Option<String> {
    let status = Status::of(plan?);
    if let Some(token) = status.extra.get("joinToken").and_then(Value::as_str) {
        return Some(token.to_owned());
    }
    status
        .extra
        .get("results")?
        .as_array()?
        .iter()
        .find(|r| r["name"] == NODE_TOKEN && r["exitCode"].as_i64().unwrap_or(0) == 0)
        .and_then(|r| r["stdout"].as_str())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}
