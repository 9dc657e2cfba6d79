//! Shell sessions through the proxy, recorded ([`crate::recording`]): which requests open one
//! (`exec` or `attach` into a pod, upgraded), what the recording says of it, and the splice
//! that hands a copy of each chunk to the recording as it passes.

use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{
    auth::Principal,
    recording::{Carrier, Recordings, Session, Settings, Tap},
};

/// The stream protocol a SPDY session agreed (`v4.channel.k8s.io`).
const STREAM_PROTOCOL: &str = "x-stream-protocol-version";

/// A session to record once the cluster has agreed to the upgrade.
pub(super) struct Pending {
    pub(super) recordings: Arc<Recordings>,
    pub(super) session: Session,
    pub(super) settings: Settings,
}

/// The namespace, pod and subresource of `api/v1/namespaces/{ns}/pods/{pod}/{exec|attach}`.
fn pod_stream(rest: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "pods",
            pod,
            sub @ ("exec" | "attach"),
        ] => {
            let decode = |s: &str| tunnel::percent_decode(s).unwrap_or_else(|| s.to_owned());
            Some((decode(ns), decode(pod), (*sub).to_owned()))
        }
        _ => None,
    }
}

/// The session an upgraded request to `rest?query` opens, if it is an exec or attach.
pub(super) fn session_of(
    rest: &str,
    query: &str,
    principal: &Principal,
    cluster: &str,
    audit_id: &str,
) -> Option<Session> {
    let (namespace, pod, subresource) = pod_stream(rest)?;
    let mut container = String::new();
    let mut command = Vec::new();
    for (key, value) in form_urlencoded::parse(query.trim_start_matches('?').as_bytes()) {
        match key.as_ref() {
            "container" => container = value.into_owned(),
            "command" => command.push(value.into_owned()),
            _ => {}
        }
    }
    Some(Session {
        id: crate::auth::secret::random_text::<12>(),
        user: principal.user.clone(),
        groups: principal.groups.clone(),
        cluster: cluster.to_owned(),
        namespace,
        pod,
        container,
        command,
        subresource,
        protocol: String::new(),
        audit_id: audit_id.to_owned(),
        started_at: crate::store::now_rfc3339(),
        ended_at: None,
        bytes: 0,
        input_recorded: false,
        truncated: false,
        not_recorded: String::new(),
    })
}

/// Starts recording `pending` for an upgrade the cluster agreed to with `headers`; `None` (and
/// the session noted as not recorded) when its bytes are neither WebSocket (the dashboard,
/// kubectl 1.31 and later) nor SPDY/3.1 (kubectl before, or told to).
pub(super) async fn start(pending: Pending, headers: &http::HeaderMap) -> Option<Tap> {
    let Pending {
        recordings,
        mut session,
        settings,
    } = pending;
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let upgrade = text(http::header::UPGRADE.as_str());
    let carrier = if upgrade.eq_ignore_ascii_case("websocket") {
        session.protocol = text(http::header::SEC_WEBSOCKET_PROTOCOL.as_str());
        Some(Carrier::WebSocket)
    } else if upgrade.eq_ignore_ascii_case("SPDY/3.1") {
        session.protocol = format!("{upgrade} {}", text(STREAM_PROTOCOL));
        Some(Carrier::Spdy)
    } else {
        None
    };
    let Some(carrier) = carrier else {
        session.protocol = upgrade.clone();
        session.ended_at = Some(session.started_at.clone());
        session.not_recorded = format!(
            "the session speaks {upgrade}, neither WebSocket nor SPDY/3.1: its bytes are not recorded"
        );
        if let Err(e) = recordings.note_unrecorded(&session).await {
            tracing::warn!(error = %e, "could not note an unrecorded shell session");
        }
        return None;
    };
    let id = session.id.clone();
    match recordings.start(session, carrier, settings).await {
        Ok(tap) => Some(tap),
        Err(e) => {
            tracing::warn!(recording = %id, error = %e, "could not start the shell session's recording; the session goes on unrecorded");
            None
        }
    }
}

/// Copies `from` into `to` until either ends, showing each chunk to `tap`.
async fn pipe<R, W>(mut from: R, mut to: W, tap: &Tap, from_client: bool)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
        tap.saw(from_client, &buffer[..n]);
    }
    let _ = to.shutdown().await;
}

/// Splices the client's and the agent's sides of an upgraded session, as
/// `copy_bidirectional` does, with `tap` seeing both ways.
pub(super) async fn splice(
    client: hyper::upgrade::Upgraded,
    agent: hyper::upgrade::Upgraded,
    tap: Tap,
) {
    let (client_read, client_write) = tokio::io::split(TokioIo::new(client));
    let (agent_read, agent_write) = tokio::io::split(TokioIo::new(agent));
    tokio::join!(
        pipe(client_read, agent_write, &tap, true),
        pipe(agent_read, client_write, &tap, false),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pods_exec_and_attach_open_a_session() {
        let cases = [
            (
                "api/v1/namespaces/shop/pods/web-0/exec",
                Some(("shop", "web-0", "exec")),
            ),
            (
                "api/v1/namespaces/shop/pods/web-0/attach",
                Some(("shop", "web-0", "attach")),
            ),
            ("api/v1/namespaces/shop/pods/web-0/portforward", None),
            ("api/v1/namespaces/shop/pods/web-0/log", None),
            ("api/v1/namespaces/shop/services/web/exec", None),
            ("apis/apps/v1/namespaces/shop/pods/web-0/exec", None),
        ];
        for (rest, want) in cases {
            let got = pod_stream(rest);
            let want = want.map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()));
            assert_eq!(got, want, "{rest}");
        }
    }
}
