//! Chunked lists (`limit` and `continue`), as kube-apiserver pages them: objects in key order
//! (namespace, then name), a `continue` token after a full page, and `remainingItemCount`
//! when no selector made the count unknowable. One difference, said here because a test might
//! meet it: kube-apiserver serves every page of a list from the snapshot of its first page
//! (until compaction); this store keeps no snapshots, so a later page shows the objects as
//! they are when it is asked for, after the last key of the page before.

use std::{collections::BTreeMap, sync::Arc};

use axum::{http::StatusCode, response::Response};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use serde_json::{Value, json};

use super::{server::status, store::key_of};

/// What a list request asks for: at most `limit` objects, after `start` (a continue token's).
#[derive(Debug, Default)]
pub(super) struct Page {
    limit: Option<usize>,
    start: Option<(u64, String, String)>,
}

/// What a page says about the rest of the list.
#[derive(Debug)]
pub(super) struct More {
    /// The list's resourceVersion: the first page's, for every later one.
    pub(super) revision: u64,
    token: Option<String>,
    remaining: Option<usize>,
}

impl More {
    /// Writes `continue` and `remainingItemCount` into a list's `metadata`.
    pub(super) fn describe(&self, metadata: &mut Value) {
        if let Some(token) = &self.token {
            metadata["continue"] = json!(token);
        }
        if let Some(remaining) = self.remaining {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
}

impl Page {
    /// `limit=` and `continue=` of a list request; a token this server did not write is
    /// refused as kube-apiserver refuses it.
    pub(super) fn of(params: &BTreeMap<String, String>) -> Result<Self, Box<Response>> {
        let bad =
            |message: String| Box::new(status(StatusCode::BAD_REQUEST, "BadRequest", message));
        let limit = match params.get("limit").map(String::as_str) {
            None | Some("" | "0") => None,
            Some(text) => Some(
                text.parse::<usize>()
                    .map_err(|_| bad(format!("limit {text:?}: not a number")))?,
            ),
        };
        let start = match params.get("continue").filter(|t| !t.is_empty()) {
            None => None,
            Some(token) => Some(decode(token).ok_or_else(|| {
                bad("continue key is not valid: the token was not written by this server; list again without it".to_owned())
            })?),
        };
        Ok(Page { limit, start })
    }

    /// The key the list goes on after (a continue token's), if any.
    pub(super) fn after(&self) -> Option<(String, String)> {
        self.start
            .as_ref()
            .map(|(_, ns, name)| (ns.clone(), name.clone()))
    }

    /// The page of `items` (in key order, after [`Page::after`]) this request asks for.
    /// `filtered`: a selector chose the items, so how many remain is not told (as
    /// kube-apiserver does not).
    pub(super) fn cut(
        self,
        mut items: Vec<Arc<Value>>,
        revision: u64,
        filtered: bool,
    ) -> (Vec<Arc<Value>>, More) {
        let revision = self.start.as_ref().map_or(revision, |(rv, _, _)| *rv);
        let Some(limit) = self.limit.filter(|l| *l < items.len()) else {
            let more = More {
                revision,
                token: None,
                remaining: None,
            };
            return (items, more);
        };
        let remaining = items.len() - limit;
        items.truncate(limit);
        let token = items.last().map(|last| {
            let (ns, name) = key_of(last);
            encode(revision, &ns, &name)
        });
        let more = More {
            revision,
            token,
            remaining: (!filtered).then_some(remaining),
        };
        (items, more)
    }
}

fn encode(revision: u64, namespace: &str, name: &str) -> String {
    URL_SAFE_NO_PAD.encode(json!({"rv": revision, "start": [namespace, name]}).to_string())
}

fn decode(token: &str) -> Option<(u64, String, String)> {
    let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
    let value: Value = serde_json::from_slice(&bytes).ok()?;
    Some((
        value["rv"].as_u64()?,
        value["start"][0].as_str()?.to_owned(),
        value["start"][1].as_str()?.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(names: &[(&str, &str)]) -> Vec<Arc<Value>> {
        names
            .iter()
            .map(|(ns, name)| Arc::new(json!({"metadata": {"namespace": ns, "name": name}})))
            .collect()
    }

    /// What the store hands a page: the objects after the token's key.
    fn after(page: &Page, all: &[(&str, &str)]) -> Vec<Arc<Value>> {
        let start = page.after();
        pods(all)
            .into_iter()
            .filter(|o| start.as_ref().is_none_or(|s| key_of(o) > *s))
            .collect()
    }

    fn names(items: &[Arc<Value>]) -> Vec<String> {
        items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn pages_follow_each_other_until_the_list_ends() {
        let all = [
            ("a", "p1"),
            ("a", "p2"),
            ("b", "p1"),
            ("b", "p3"),
            ("c", "p0"),
        ];
        let mut params = BTreeMap::from([("limit".to_owned(), "2".to_owned())]);
        let page = Page::of(&params).unwrap();
        let items = after(&page, &all);
        let (first, more) = page.cut(items, 40, false);
        assert_eq!(names(&first), ["p1", "p2"]);
        assert_eq!(more.remaining, Some(3));
        let token = more.token.clone().unwrap();
        params.insert("continue".into(), token);
        // Later pages keep the first page's resourceVersion.
        let page = Page::of(&params).unwrap();
        let items = after(&page, &all);
        let (second, more) = page.cut(items, 45, false);
        assert_eq!(names(&second), ["p1", "p3"]);
        assert_eq!((more.revision, more.remaining), (40, Some(1)));
        params.insert("continue".into(), more.token.unwrap());
        let page = Page::of(&params).unwrap();
        let items = after(&page, &all);
        let (third, more) = page.cut(items, 46, false);
        assert_eq!(names(&third), ["p0"]);
        assert!(more.token.is_none() && more.remaining.is_none());
        let mut metadata = json!({});
        more.describe(&mut metadata);
        assert_eq!(metadata, json!({}), "the last page has no continue");
    }

    #[test]
    fn a_selected_list_does_not_count_what_remains() {
        let params = BTreeMap::from([("limit".to_owned(), "1".to_owned())]);
        let (_, more) = Page::of(&params)
            .unwrap()
            .cut(pods(&[("a", "x"), ("a", "y")]), 1, true);
        assert!(more.token.is_some());
        assert_eq!(more.remaining, None);
    }

    #[test]
    fn a_token_from_elsewhere_is_refused() {
        let params = BTreeMap::from([("continue".to_owned(), "not-a-token".to_owned())]);
        let refused = Page::of(&params).unwrap_err();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        let params = BTreeMap::from([("limit".to_owned(), "ten".to_owned())]);
        assert!(Page::of(&params).is_err());
    }
}
