#!/bin/sh
# Installs Drover's system-agent on this host and registers the host with the hub.
# Served by the hub at /system-agent-install.sh; the hub's host command runs it as
#   curl --insecure -fsSL https://HUB/system-agent-install.sh | sudo sh -s - \
#     --server https://HUB --token drr_... --ca-checksum SHA256 [--all-roles | --etcd --controlplane --worker]
# Every flag has a DROVER_* environment equivalent (flags win). Safe to run twice: files are
# rewritten only when their content changes, and the host keeps its id.
set -eu

usage() {
    cat <<'USAGE'
system-agent-install.sh: install Drover's system-agent and register this host.

  --server URL            the hub, https://HOST[:PORT]            (DROVER_SERVER)
  --token TOKEN           the cluster's registration token        (DROVER_TOKEN)
  --ca-checksum SHA256    sha256 of the hub's /cacerts            (DROVER_CA_CHECKSUM)
  --etcd --controlplane --worker, --all-roles
                          the host's roles                        (DROVER_ETCD, DROVER_CONTROLPLANE, DROVER_WORKER=true)
  --node-name NAME        the Kubernetes node name                (DROVER_NODE_NAME; default: hostname)
  --address IP            the node's external address             (DROVER_ADDRESS)
  --internal-address IP   the node's internal address             (DROVER_INTERNAL_ADDRESS)
  --label k=v             a node label; repeatable                (DROVER_LABELS=k=v,k=v)
  --taint k=v:Effect      a node taint; repeatable                (DROVER_TAINTS=k=v:Effect,...)
  --proxy URL             reach the hub through this HTTP proxy,
                          http://[USER:PASSWORD@]HOST:PORT        (DROVER_PROXY; default: HTTPS_PROXY)
  --no-proxy LIST         hosts, domains and networks reached directly,
                          comma-separated                         (DROVER_NO_PROXY; default: NO_PROXY)
  --no-systemd            run the agent in the foreground instead of as a systemd unit
                          (containers, tests)                     (DROVER_NO_SYSTEMD=true)
  --root DIR              install under DIR instead of /, and keep the host's plans there:
                          what they write is confined to DIR (several hosts on one
                          machine, tests; needs Linux's Landlock)  (DROVER_INSTALL_ROOT)
USAGE
}

fail() {
    echo "system-agent-install.sh: $*" >&2
    exit 1
}

SERVER=${DROVER_SERVER:-}
TOKEN=${DROVER_TOKEN:-}
CA_CHECKSUM=${DROVER_CA_CHECKSUM:-}
ETCD=${DROVER_ETCD:-false}
CONTROLPLANE=${DROVER_CONTROLPLANE:-false}
WORKER=${DROVER_WORKER:-false}
NODE_NAME=${DROVER_NODE_NAME:-}
ADDRESS=${DROVER_ADDRESS:-}
INTERNAL_ADDRESS=${DROVER_INTERNAL_ADDRESS:-}
LABELS=${DROVER_LABELS:-}
TAINTS=${DROVER_TAINTS:-}
NO_SYSTEMD=${DROVER_NO_SYSTEMD:-false}
ROOT=${DROVER_INSTALL_ROOT:-}
PROXY=${DROVER_PROXY:-${HTTPS_PROXY:-${https_proxy:-}}}
NO_PROXY_LIST=${DROVER_NO_PROXY:-${NO_PROXY:-${no_proxy:-}}}

need_value() {
    [ $# -ge 2 ] || fail "$1 needs a value"
}

while [ $# -gt 0 ]; do
    case "$1" in
    --server) need_value "$@"; SERVER=$2; shift 2 ;;
    --token) need_value "$@"; TOKEN=$2; shift 2 ;;
    --ca-checksum) need_value "$@"; CA_CHECKSUM=$2; shift 2 ;;
    --etcd) ETCD=true; shift ;;
    --controlplane) CONTROLPLANE=true; shift ;;
    --worker) WORKER=true; shift ;;
    --all-roles) ETCD=true; CONTROLPLANE=true; WORKER=true; shift ;;
    --node-name) need_value "$@"; NODE_NAME=$2; shift 2 ;;
    --address) need_value "$@"; ADDRESS=$2; shift 2 ;;
    --internal-address) need_value "$@"; INTERNAL_ADDRESS=$2; shift 2 ;;
    --label)
        need_value "$@"
        case "$2" in *=*) ;; *) fail "--label $2: give key=value" ;; esac
        LABELS=${LABELS:+$LABELS,}$2; shift 2 ;;
    --taint)
        need_value "$@"
        case "$2" in *=*:NoSchedule | *=*:PreferNoSchedule | *=*:NoExecute) ;;
        *) fail "--taint $2: give key=value:Effect with Effect NoSchedule, PreferNoSchedule or NoExecute" ;; esac
        TAINTS=${TAINTS:+$TAINTS,}$2; shift 2 ;;
    --no-systemd) NO_SYSTEMD=true; shift ;;
    --root) need_value "$@"; ROOT=$2; shift 2 ;;
    --proxy) need_value "$@"; PROXY=$2; shift 2 ;;
    --no-proxy) need_value "$@"; NO_PROXY_LIST=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; fail "unknown flag $1" ;;
    esac
done

[ -n "$SERVER" ] || fail "--server is required (the hub's URL, https://HOST[:PORT])"
[ -n "$TOKEN" ] || fail "--token is required (the cluster's registration token from the hub)"
case "$SERVER" in https://*) ;; *) fail "--server $SERVER: the hub is reached over https://" ;; esac
SERVER=${SERVER%/}
command -v curl >/dev/null 2>&1 || fail "curl is required"
case "$PROXY" in
"" | http://*) ;;
*://*) fail "--proxy $PROXY: give an HTTP proxy, http://[USER:PASSWORD@]HOST:PORT" ;;
*) PROXY=http://$PROXY ;;
esac
# Single-quoted in the agent's configuration (read by systemd and by sh): a quote would end it.
case "$PROXY$NO_PROXY_LIST" in *"'"*) fail "--proxy and --no-proxy cannot hold a ' (percent-encode it: %27)" ;; esac
# The proxy as messages show it: without its password.
PROXY_SHOWN=$(printf '%s' "$PROXY" | sed 's#^\(http://[^:@/]*\):[^@/]*@#\1@#')
# curl, and the agent after it, read these.
if [ -n "$PROXY" ]; then
    HTTPS_PROXY=$PROXY https_proxy=$PROXY
    export HTTPS_PROXY https_proxy
fi
if [ -n "$NO_PROXY_LIST" ]; then
    NO_PROXY=$NO_PROXY_LIST no_proxy=$NO_PROXY_LIST
    export NO_PROXY no_proxy
fi
command -v sha256sum >/dev/null 2>&1 || fail "sha256sum is required"

ROLES=""
[ "$ETCD" = true ] && ROLES="${ROLES:+$ROLES,}etcd"
[ "$CONTROLPLANE" = true ] && ROLES="${ROLES:+$ROLES,}controlplane"
[ "$WORKER" = true ] && ROLES="${ROLES:+$ROLES,}worker"
[ -n "$ROLES" ] || fail "give the host's roles: --etcd, --controlplane, --worker or --all-roles"
[ -n "$NODE_NAME" ] || NODE_NAME=$(hostname 2>/dev/null || cat /etc/hostname)

BIN_DIR=$ROOT/usr/local/bin
BINARY=$BIN_DIR/drover-system-agent
UNINSTALL=$BIN_DIR/drover-system-agent-uninstall.sh
CONFIG_DIR=$ROOT/etc/drover
CONFIG=$CONFIG_DIR/system-agent.env
AGENT_DIR=$ROOT/var/lib/drover/system-agent
UNIT=$ROOT/etc/systemd/system/drover-system-agent.service

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Downloads $1 to $2 (curl's options after them); on failure says what to fix: a proxy's
# refusal is named as such, not left as curl's exit code.
fetch() {
    url=$1 out=$2
    shift 2
    if connect=$(curl "$@" -fsS -w '%{http_connect}' -o "$out" "$url" 2>"$WORK/curl.err"); then
        return 0
    fi
    why=$(cat "$WORK/curl.err")
    if [ -n "$PROXY" ]; then
        case "$connect" in
        # 407 is HTTP's answer; tinyproxy answers a wrong password with 401.
        401 | 407) fail "cannot fetch $url: the proxy $PROXY_SHOWN refused its credentials (HTTP $connect); check the user and password in --proxy http://USER:PASSWORD@HOST:PORT" ;;
        000 | 2??) ;;
        *) fail "cannot fetch $url: the proxy $PROXY_SHOWN would not connect to the hub (HTTP $connect)" ;;
        esac
    fi
    fail "cannot fetch $url${PROXY:+ (proxy: $PROXY_SHOWN, except for --no-proxy ${NO_PROXY_LIST:-none})}: $why"
}

# 1. The hub's CA, checked against the checksum before anything else is fetched or written.
if [ -n "$CA_CHECKSUM" ]; then
    fetch "$SERVER/cacerts" "$WORK/ca.pem" --insecure
    ACTUAL=$(sha256sum "$WORK/ca.pem" | cut -d' ' -f1)
    [ "$ACTUAL" = "$CA_CHECKSUM" ] ||
        fail "CA checksum mismatch: the hub at $SERVER serves a CA whose sha256 is $ACTUAL, but --ca-checksum is $CA_CHECKSUM; check the command the hub gave you"
    TRUST="--cacert $WORK/ca.pem"
else
    TRUST=""
fi

# Puts $2 at $1 with mode $3 unless it is already there; prints "changed" when it wrote.
place() {
    if [ -f "$1" ] && cmp -s "$2" "$1"; then
        rm -f "$2"
        return 0
    fi
    mkdir -p "$(dirname "$1")"
    chmod "$3" "$2"
    mv -f "$2" "$1"
    echo changed
}

# 2. The agent binary for this architecture, from the hub.
case "$(uname -m)" in
x86_64 | amd64) ARCH=amd64 ;;
aarch64 | arm64) ARCH=arm64 ;;
*) fail "architecture $(uname -m) is not supported (amd64, arm64)" ;;
esac
# shellcheck disable=SC2086 # TRUST is empty or two words.
fetch "$SERVER/v3/system-agent/$ARCH" "$WORK/drover-system-agent" $TRUST
BINARY_CHANGED=$(place "$BINARY" "$WORK/drover-system-agent" 0755)

# 3. Its configuration (it holds the registration token: root only).
mkdir -p "$AGENT_DIR"
chmod 0700 "$AGENT_DIR"
cat >"$WORK/env" <<CONF
DROVER_SERVER=$SERVER
DROVER_TOKEN=$TOKEN
DROVER_CA_CHECKSUM=$CA_CHECKSUM
DROVER_DIR=$AGENT_DIR
DROVER_ROLES=$ROLES
DROVER_NODE_NAME=$NODE_NAME
DROVER_ADDRESS=$ADDRESS
DROVER_INTERNAL_ADDRESS=$INTERNAL_ADDRESS
DROVER_LABELS=$LABELS
DROVER_TAINTS=$TAINTS
DROVER_ROOT=$ROOT
HTTPS_PROXY='$PROXY'
NO_PROXY='$NO_PROXY_LIST'
CONF
CONFIG_CHANGED=$(place "$CONFIG" "$WORK/env" 0600)

# 4. The uninstall script: undoes exactly this.
cat >"$WORK/uninstall" <<UNINSTALL
#!/bin/sh
# Removes Drover's system-agent as system-agent-install.sh installed it.
set -u
if [ -f "$UNIT" ] && command -v systemctl >/dev/null 2>&1 && [ -z "$ROOT" ]; then
    systemctl disable --now drover-system-agent >/dev/null 2>&1 || true
fi
if [ -f "$AGENT_DIR/agent.pid" ]; then
    kill "\$(cat "$AGENT_DIR/agent.pid")" 2>/dev/null || true
fi
rm -f "$UNIT" "$BINARY" "$CONFIG"
rm -rf "$AGENT_DIR"
[ -z "$ROOT" ] && command -v systemctl >/dev/null 2>&1 && systemctl daemon-reload >/dev/null 2>&1
rm -f "$UNINSTALL"
for dir in "$ROOT/var/lib/drover" "$CONFIG_DIR" "$ROOT/etc/systemd/system" "$ROOT/etc/systemd" "$BIN_DIR" "$ROOT/usr/local" "$ROOT/usr" "$ROOT/var/lib" "$ROOT/var" "$ROOT/etc"; do
    [ -n "$ROOT" ] && rmdir "\$dir" 2>/dev/null
done
echo "Drover's system-agent is removed."
UNINSTALL
place "$UNINSTALL" "$WORK/uninstall" 0755 >/dev/null

# 5. Run it: a systemd unit, or in the foreground.
if [ "$NO_SYSTEMD" = true ]; then
    echo "Running drover-system-agent in the foreground (stop it with Ctrl-C or SIGTERM)."
    echo $$ >"$AGENT_DIR/agent.pid"
    set -a
    # shellcheck disable=SC1090
    . "$CONFIG"
    set +a
    rm -rf "$WORK"
    trap - EXIT
    exec "$BINARY"
fi
command -v systemctl >/dev/null 2>&1 || fail "systemd is not available here; run with --no-systemd"
cat >"$WORK/unit" <<UNITFILE
[Unit]
Description=Drover system-agent
Documentation=$SERVER
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
EnvironmentFile=$CONFIG
ExecStart=$BINARY
Restart=always
RestartSec=5
KillMode=process

[Install]
WantedBy=multi-user.target
UNITFILE
UNIT_CHANGED=$(place "$UNIT" "$WORK/unit" 0644)
systemctl daemon-reload
systemctl enable drover-system-agent >/dev/null 2>&1
if [ -n "$BINARY_CHANGED$CONFIG_CHANGED$UNIT_CHANGED" ]; then
    systemctl restart drover-system-agent
else
    systemctl start drover-system-agent
fi
echo "drover-system-agent is installed and running (systemctl status drover-system-agent)."
