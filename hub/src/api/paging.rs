//! A list in pages, as Kubernetes pages its lists: `limit` items at most, and while more are
//! left, a `continue` token saying where the next page starts, with `remainingItemCount`.
//!
//! Pages are in name order. The token holds the last name given and the revision of the first
//! page; every page answers that revision, so a client that lists page by page and then
//! watches from it is sent every change made meanwhile. Unlike kube-apiserver, which reads
//! later pages from etcd at the first page's revision, a later page here reads the store as it
//! is then: an object created or removed between two pages may be in them or not, and the
//! watch brings the client level either way (docs/operating.md).

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::ApiError;

/// What a `continue` token holds.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Token {
    /// The format; another is refused rather than misread.
    v: u8,
    /// The revision of the list's first page.
    rv: u64,
    /// The last name given: the next page starts after it.
    after: String,
}

const FORMAT: u8 = 1;

/// A page of a list.
#[derive(Debug, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Where the next page starts, if any is left.
    pub next: Option<String>,
    /// How many items come after this page.
    pub remaining: usize,
    /// The revision to answer: the first page's.
    pub revision: u64,
}

/// Where a page starts: after a name, and the first page's revision (`None` for a first page).
#[derive(Debug, PartialEq)]
pub struct Start {
    pub after: Option<String>,
    pub revision: Option<u64>,
}

/// Reads a `continue` token (absent or empty: the first page).
pub fn start(token: Option<&str>) -> Result<Start, ApiError> {
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Ok(Start {
            after: None,
            revision: None,
        });
    };
    let refused = |why: &str| {
        ApiError::bad_request(format!(
            "continue: {why}; pass the token the previous page gave in metadata.continue, or none for the first page"
        ))
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| refused("not a token this hub gave (not base64url)"))?;
    let token: Token =
        serde_json::from_slice(&bytes).map_err(|_| refused("not a token this hub gave"))?;
    if token.v != FORMAT {
        return Err(refused("a token of another format"));
    }
    Ok(Start {
        after: Some(token.after),
        revision: Some(token.rv),
    })
}

/// The page of `items` (in name order, as the store lists them) that starts after `start`,
/// `limit` long (`None` or 0: the rest). `revision` is the store's as it read `items`.
pub fn page<T>(
    items: Vec<T>,
    name: impl Fn(&T) -> &str,
    limit: Option<usize>,
    start: &Start,
    revision: u64,
) -> Page<T> {
    let revision = start.revision.unwrap_or(revision);
    let mut rest: Vec<T> = match &start.after {
        Some(after) => items
            .into_iter()
            .skip_while(|item| name(item) <= after.as_str())
            .collect(),
        None => items,
    };
    let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
    if rest.len() <= limit {
        return Page {
            items: rest,
            next: None,
            remaining: 0,
            revision,
        };
    }
    let remaining = rest.len() - limit;
    rest.truncate(limit);
    let next = rest.last().map(|last| {
        let token = Token {
            v: FORMAT,
            rv: revision,
            after: name(last).to_owned(),
        };
        // A struct of a number and a string always serialises.
        let json = serde_json::to_vec(&token).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    });
    Page {
        items: rest,
        next,
        remaining,
        revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("c{i:02}")).collect()
    }

    fn walk(items: &[String], limit: usize) -> Vec<(Vec<String>, usize)> {
        let mut pages = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let from = start(token.as_deref()).unwrap();
            let page = page(items.to_vec(), |s| s.as_str(), Some(limit), &from, 7);
            assert_eq!(page.revision, 7);
            pages.push((page.items, page.remaining));
            match page.next {
                Some(next) => token = Some(next),
                None => return pages,
            }
        }
    }

    #[test]
    fn pages_cover_the_list_once_in_order() {
        let items = names(5);
        let pages = walk(&items, 2);
        let expected = vec![
            (vec!["c01".to_owned(), "c02".to_owned()], 3),
            (vec!["c03".to_owned(), "c04".to_owned()], 1),
            (vec!["c05".to_owned()], 0),
        ];
        assert_eq!(pages, expected);
    }

    #[test]
    fn no_limit_or_zero_is_the_whole_list_without_a_token() {
        for limit in [None, Some(0), Some(5), Some(9)] {
            let page = page(names(5), |s| s.as_str(), limit, &start(None).unwrap(), 3);
            assert_eq!(page.items.len(), 5);
            assert_eq!((page.next, page.remaining), (None, 0));
        }
    }

    #[test]
    fn a_later_page_keeps_the_first_pages_revision_and_skips_what_was_removed() {
        let first = page(names(4), |s| s.as_str(), Some(2), &start(None).unwrap(), 10);
        let token = first.next.unwrap();
        // c02 (the last given) and c03 are gone by the next page; the store is at 12.
        let now = vec!["c01".to_owned(), "c04".to_owned()];
        let second = page(
            now,
            |s| s.as_str(),
            Some(2),
            &start(Some(&token)).unwrap(),
            12,
        );
        assert_eq!(second.items, vec!["c04".to_owned()]);
        assert_eq!(second.revision, 10);
        assert_eq!(second.next, None);
    }

    #[test]
    fn a_token_not_given_here_is_refused_with_what_to_do() {
        let foreign = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"c01\u0000"}"#);
        for token in ["%%%", "bm90IGpzb24", foreign.as_str()] {
            let e = start(Some(token)).unwrap_err();
            assert_eq!(e.code, axum::http::StatusCode::BAD_REQUEST, "{token}");
            assert!(e.message.starts_with("continue: "), "{}", e.message);
            assert!(e.message.contains("metadata.continue"), "{}", e.message);
        }
    }
}
