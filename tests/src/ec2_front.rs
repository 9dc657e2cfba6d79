//! What moto does not do, in front of it: a TLS stand-in at its own loopback port that
//! forwards every EC2 call to moto untouched (the signature covers only what it forwards), and
//! besides
//!
//! - counts the calls by action, as a provider's request log would;
//! - keeps EC2's `ClientToken` promise, which moto ignores: a `RunInstances` repeating a token
//!   with the same parameters is answered with the first answer (no second instance), and one
//!   with other parameters is refused with `IdempotentParameterMismatch`, as EC2 does;
//! - on request, fails calls of one action with a 503 (a provider that cannot serve now), or
//!   loses the answer of the next `RunInstances` (made at moto, answered 503) while hiding the
//!   instance from listings for a while, as EC2's eventually consistent `DescribeInstances`
//!   can.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming};

use crate::cloud::{Moto, Upstream};

/// What the front is told to do, and what it saw.
#[derive(Debug, Default)]
struct State {
    /// Actions in the order asked, with the values of their parameters.
    calls: Vec<(String, Vec<String>)>,
    /// By client token: the parameters first asked with (the signature's aside), and the
    /// answer given.
    tokens: HashMap<String, (String, Option<(u16, Bytes)>)>,
    /// Calls of this action answered 503 while set.
    failing: Option<String>,
    /// Lose the next `RunInstances` answer, then answer this many `DescribeInstances` that
    /// name its instance's name with nothing.
    lose_next_run: Option<usize>,
    /// The name whose listings are hidden, and how many more.
    hidden: Option<(String, usize)>,
}

/// A handle on the front; it serves until dropped.
#[derive(Debug)]
pub struct Ec2Front {
    /// Where templates point (`endpoint`); moto's CA serves for it too.
    pub endpoint: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Ec2Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Ec2Front {
    /// In front of `moto`, with the serving certificate moto's start left in `dir`.
    pub async fn start(moto: &Moto, dir: &Path) -> Ec2Front {
        let state = Arc::new(Mutex::new(State::default()));
        let (endpoint, task) = crate::cloud::front(
            moto,
            dir,
            state.clone(),
            |request, upstream, state| async move { answer(request, &upstream, &state).await },
        )
        .await;
        Ec2Front {
            endpoint,
            state,
            task,
        }
    }

    /// How many calls of `action` the front has seen.
    pub fn count(&self, action: &str) -> usize {
        let state = self.state.lock().unwrap();
        state.calls.iter().filter(|(a, _)| a == action).count()
    }

    /// How many calls of `action` have had `value` as one of their parameters' values.
    pub fn count_naming(&self, action: &str, value: &str) -> usize {
        let state = self.state.lock().unwrap();
        state
            .calls
            .iter()
            .filter(|(a, values)| a == action && values.iter().any(|v| v == value))
            .count()
    }

    /// Calls of `action` are answered 503 (`None`: none are).
    pub fn fail(&self, action: Option<&str>) {
        self.state.lock().unwrap().failing = action.map(str::to_owned);
    }

    /// The next `RunInstances` is made at moto but its answer lost (a 503), and the
    /// `DescribeInstances` calls after it that name its instance's name answer nothing,
    /// `hidden` times.
    pub fn lose_next_run(&self, hidden: usize) {
        self.state.lock().unwrap().lose_next_run = Some(hidden);
    }
}

/// An EC2 error answer, as EC2 words them.
fn error(status: u16, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
         <Message>{message}</Message></Error></Errors><RequestID>front</RequestID></Response>"
    );
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

async fn answer(
    request: Request<Incoming>,
    upstream: &Upstream,
    state: &Mutex<State>,
) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let form: Vec<(String, String)> = url_pairs(&body);
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let action = field("Action");
    let mut lose = false;
    {
        let mut state = state.lock().unwrap();
        let values = form.iter().map(|(_, v)| v.clone()).collect();
        state.calls.push((action.clone(), values));
        if state.failing.as_deref() == Some(action.as_str()) {
            return error(503, "Unavailable", "the front fails this action (test)");
        }
        let names_hidden = |hidden: &Option<(String, usize)>| {
            hidden
                .as_ref()
                .is_some_and(|(name, left)| *left > 0 && form.iter().any(|(_, v)| v == name))
        };
        if action == "DescribeInstances" && names_hidden(&state.hidden) {
            if let Some((_, left)) = state.hidden.as_mut() {
                *left -= 1;
            }
            let empty = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse \
                xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>front</requestId>\
                <reservationSet/></DescribeInstancesResponse>";
            return Response::new(Full::new(Bytes::from(empty)));
        }
        if action == "RunInstances" {
            let token = field("ClientToken");
            let asked: String = form
                .iter()
                .filter(|(k, _)| k != "ClientToken")
                .map(|(k, v)| format!("{k}={v}&"))
                .collect();
            match state.tokens.get(&token) {
                Some((first, _)) if *first != asked => {
                    return error(
                        400,
                        "IdempotentParameterMismatch",
                        "The client token you have provided is associated with a request for \
                         another set of parameters",
                    );
                }
                Some((_, Some((status, answer)))) => {
                    let mut response = Response::new(Full::new(answer.clone()));
                    *response.status_mut() = hyper::StatusCode::from_u16(*status).unwrap();
                    return response;
                }
                _ => {}
            }
            state.tokens.insert(token, (asked, None));
            if let Some(hidden) = state.lose_next_run.take() {
                lose = true;
                state.hidden = Some((field_tagged(&form, drivers::ec2::NAME_TAG), hidden));
            }
        }
    }
    let (status, _, answer) = upstream.send(parts, body).await;
    if action == "RunInstances" && status.is_success() {
        let token = field("ClientToken");
        if let Some(entry) = state.lock().unwrap().tokens.get_mut(&token) {
            entry.1 = Some((status.as_u16(), answer.clone()));
        }
    }
    if lose {
        return error(503, "Unavailable", "the answer was lost (test)");
    }
    let mut response = Response::new(Full::new(answer));
    *response.status_mut() = status;
    response
}

/// The value a `RunInstances` form tags its instance with under `key`.
fn field_tagged(form: &[(String, String)], key: &str) -> String {
    let Some((at, _)) = form
        .iter()
        .find(|(k, v)| k.starts_with("TagSpecification.1.Tag.") && k.ends_with(".Key") && v == key)
    else {
        return String::new();
    };
    let value = at.replace(".Key", ".Value");
    form.iter()
        .find(|(k, _)| *k == value)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// A form body's pairs, decoded.
fn url_pairs(body: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(body);
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| {
                tunnel::percent_decode(&s.replace('+', " ")).unwrap_or_else(|| s.to_owned())
            };
            (decode(k), decode(v))
        })
        .collect()
}
