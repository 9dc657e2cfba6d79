//! The fleet's lists (clusters, hosts) at any size: filtered, sorted and cut into pages here,
//! so a page costs the browser its 50 rows whether the hub holds 50 clusters or 10,000. The
//! view lives in the page's address (a plain GET form and links), so it can be bookmarked and
//! works without the script; the script asks for the same view's section again when the watch
//! names a row shown, or something comes or goes.

use std::{cmp::Ordering, collections::BTreeMap, fmt::Write as _};

use serde::Deserialize;

use kubeshape::order::natural;

use super::{Dash, escape};
use crate::{
    api::{ApiError, allow},
    auth::{Principal, Verb},
    model::{Kind, Status, derive_state},
    store::{LabelSelector, Object},
};

/// Rows in a page.
pub(super) const PER_PAGE: usize = 50;

/// A view of a fleet list, as its address gives it.
#[derive(Debug, Default, Deserialize)]
pub(super) struct FleetQuery {
    #[serde(default)]
    pub(super) part: Option<String>,
    /// Names containing this, ignoring case.
    #[serde(default)]
    pub(super) q: Option<String>,
    #[serde(default)]
    pub(super) state: Option<String>,
    #[serde(default)]
    pub(super) version: Option<String>,
    /// A label selector, as `kubectl -l` takes it.
    #[serde(default)]
    pub(super) selector: Option<String>,
    /// `name`, `state`, `version` or `age`; `-` first for the other way.
    #[serde(default)]
    pub(super) sort: Option<String>,
    /// From 1; text, so that a hand-edited address shows the first page, not an error.
    #[serde(default)]
    pub(super) page: Option<String>,
}

fn given(value: Option<&String>) -> Option<&str> {
    value.map(|v| v.trim()).filter(|v| !v.is_empty())
}

impl FleetQuery {
    pub(super) fn rows(&self) -> bool {
        self.part.as_deref() == Some("rows")
    }

    /// The label selector, or what is wrong with it.
    pub(super) fn label_selector(&self) -> Result<LabelSelector, String> {
        LabelSelector::parse(given(self.selector.as_ref()).unwrap_or(""))
            .map_err(|e| format!("Label selector: {e}"))
    }

    fn page_number(&self) -> usize {
        given(self.page.as_ref())
            .and_then(|p| p.parse().ok())
            .filter(|p| *p > 0)
            .unwrap_or(1)
    }

    fn sort_key(&self) -> (&str, bool) {
        match given(self.sort.as_ref()) {
            Some(s) => match s.strip_prefix('-') {
                Some(key) => (key, true),
                None => (s, false),
            },
            None => ("name", false),
        }
    }

    /// This view's address query (without `part`), with `page` and `sort` replaced when given.
    pub(super) fn link(&self, page: Option<usize>, sort: Option<&str>) -> String {
        let page = page.map(|p| p.to_string());
        let fields = [
            ("q", given(self.q.as_ref())),
            ("state", given(self.state.as_ref())),
            ("version", given(self.version.as_ref())),
            ("selector", given(self.selector.as_ref())),
            ("sort", sort.or(given(self.sort.as_ref()))),
            ("page", page.as_deref().or(given(self.page.as_ref()))),
        ];
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (key, value) in fields {
            if let Some(value) = value {
                out.append_pair(key, value);
            }
        }
        out.finish()
    }

    fn filtered(&self) -> bool {
        [&self.q, &self.state, &self.version, &self.selector]
            .iter()
            .any(|v| given(v.as_ref()).is_some())
    }
}

/// An object of a fleet list with what the list filters and sorts it by.
pub(super) struct Entry {
    pub(super) object: Object,
    pub(super) state: String,
    pub(super) version: String,
    /// Another name it is known by (a host's node name), matched by `q` too.
    pub(super) also: String,
}

/// The page of entries a view shows, and what the view's controls offer.
pub(super) struct Selection {
    pub(super) shown: Vec<Entry>,
    pub(super) page: usize,
    pub(super) pages: usize,
    /// Entries that pass the filters, and all there are to the caller.
    pub(super) matched: usize,
    pub(super) total: usize,
    /// Every state and version there is, with how many hold it.
    pub(super) states: BTreeMap<String, usize>,
    pub(super) versions: BTreeMap<String, usize>,
}

/// A count as people read it: `10,000`.
fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What a fleet list reads of an object besides its name and state: its version, and another
/// name it is known by.
pub(super) struct Reads {
    pub(super) version: fn(&Object) -> String,
    pub(super) also: fn(&Object) -> String,
}

/// The view's page of the objects of `kind` the caller may see, and the paragraph that says
/// why nothing shows when the view's label selector cannot be read.
pub(super) async fn view(
    dash: &Dash,
    principal: &Principal,
    kind: Kind,
    query: &FleetQuery,
    reads: Reads,
) -> Result<(Selection, String), ApiError> {
    let (objects, _) = dash
        .api
        .store
        .list(kind.name(), &LabelSelector::everything())
        .await?;
    let entries = objects
        .into_iter()
        .filter(|o| allow(principal, Verb::Get, kind, o).is_ok())
        .map(|object| Entry {
            state: derive_state(kind, &object.metadata, &Status::of(&object), &object.spec).state,
            version: (reads.version)(&object),
            also: (reads.also)(&object),
            object,
        })
        .collect();
    let (selector, error) = match query.label_selector() {
        Ok(selector) => (Some(selector), String::new()),
        Err(e) => (
            None,
            format!(
                r#"<p class="error" role="alert" id="filter-error">{}</p>"#,
                escape(&e)
            ),
        ),
    };
    Ok((select(entries, query, selector.as_ref()), error))
}

/// Filters `entries` (all the caller may see) by the view and `selector` (the view's as read;
/// `None`, one that could not be read, takes nothing), sorts them and cuts out the view's page
/// (the last page if it asks for one past the end).
pub(super) fn select(
    entries: Vec<Entry>,
    query: &FleetQuery,
    selector: Option<&LabelSelector>,
) -> Selection {
    let total = entries.len();
    let mut states = BTreeMap::new();
    let mut versions = BTreeMap::new();
    for entry in &entries {
        *states.entry(entry.state.clone()).or_insert(0) += 1;
        if !entry.version.is_empty() {
            *versions.entry(entry.version.clone()).or_insert(0) += 1;
        }
    }
    let words = given(query.q.as_ref()).map(str::to_lowercase);
    let state = given(query.state.as_ref());
    let version = given(query.version.as_ref());
    let mut matched: Vec<Entry> = entries
        .into_iter()
        .filter(|e| {
            words.as_ref().is_none_or(|w| {
                e.object.metadata.name.to_lowercase().contains(w)
                    || e.also.to_lowercase().contains(w)
            })
        })
        .filter(|e| selector.is_some_and(|s| s.matches(&e.object.metadata.labels)))
        .filter(|e| state.is_none_or(|s| e.state == s))
        .filter(|e| version.is_none_or(|v| e.version == v))
        .collect();
    let (key, descending) = query.sort_key();
    let by_name = |a: &Entry, b: &Entry| natural(&a.object.metadata.name, &b.object.metadata.name);
    matched.sort_by(|a, b| {
        let order = match key {
            "state" => a.state.cmp(&b.state),
            "version" => natural(&a.version, &b.version),
            // Youngest first, as an age column grows downwards.
            "age" => b
                .object
                .metadata
                .creation_timestamp
                .cmp(&a.object.metadata.creation_timestamp),
            _ => Ordering::Equal,
        }
        .then_with(|| by_name(a, b));
        if descending { order.reverse() } else { order }
    });
    let count = matched.len();
    let pages = count.div_ceil(PER_PAGE).max(1);
    let page = query.page_number().min(pages);
    let shown = matched
        .into_iter()
        .skip((page - 1) * PER_PAGE)
        .take(PER_PAGE)
        .collect();
    Selection {
        shown,
        page,
        pages,
        matched: count,
        total,
        states,
        versions,
    }
}

fn options(
    name: &str,
    label: &str,
    chosen: Option<&str>,
    values: &BTreeMap<String, usize>,
) -> String {
    let mut out = format!(
        r#"<label>{label} <select name="{name}" id="filter-{name}"><option value="">all</option>"#
    );
    let mut values: Vec<(&String, &usize)> = values.iter().collect();
    values.sort_by(|a, b| natural(a.0, b.0));
    for (value, count_of) in values {
        let selected = if chosen == Some(value.as_str()) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<option value="{v}"{selected}>{v} ({n})</option>"#,
            v = escape(value),
            n = count(*count_of),
        );
    }
    out.push_str("</select></label>");
    out
}

/// The filters of a fleet list at `path`: a GET form, so the view is the page's address.
/// `names` labels the name filter, `version` the version filter (a cluster's Kubernetes, a
/// host's agent).
pub(super) fn filters(
    path: &str,
    query: &FleetQuery,
    selection: &Selection,
    (names, version): (&str, &str),
) -> String {
    let value = |v: &Option<String>| escape(given(v.as_ref()).unwrap_or(""));
    let sort = given(query.sort.as_ref()).map_or_else(String::new, |s| {
        format!(r#"<input type="hidden" name="sort" value="{}">"#, escape(s))
    });
    format!(
        r#"<form class="filters" id="filters" method="get" action="{path}" role="search">
<label>{names} <input id="filter" name="q" type="search" value="{q}" autocomplete="off"></label>
{states}
{versions}
<label>Labels <input id="filter-selector" name="selector" type="search" value="{selector}" placeholder="env=prod,tier!=db" autocomplete="off"></label>
{sort}<button type="submit">Apply</button>
</form>"#,
        q = value(&query.q),
        states = options(
            "state",
            "State",
            given(query.state.as_ref()),
            &selection.states
        ),
        versions = options(
            "version",
            version,
            given(query.version.as_ref()),
            &selection.versions
        ),
        selector = value(&query.selector),
    )
}

/// A column heading that sorts the list by `key` (the other way when it already does).
pub(super) fn heading(query: &FleetQuery, key: &str, label: &str) -> String {
    let (current, descending) = query.sort_key();
    let (aria, next) = match (current == key, descending) {
        (true, false) => (r#" aria-sort="ascending""#, format!("-{key}")),
        (true, true) => (r#" aria-sort="descending""#, key.to_owned()),
        (false, _) => ("", key.to_owned()),
    };
    format!(
        r#"<th scope="col"{aria}><a class="sort view" href="?{href}">{label}</a></th>"#,
        href = escape(&query.link(Some(1), Some(&next))),
    )
}

/// What the list shows of how many, and the way to the pages around.
pub(super) fn pager(query: &FleetQuery, selection: &Selection, noun: &str) -> String {
    let first = (selection.page - 1) * PER_PAGE + 1;
    let last = first + selection.shown.len().saturating_sub(1);
    let (first, last) = (count(first), count(last));
    let (matched, total) = (count(selection.matched), count(selection.total));
    let summary = if selection.matched == 0 {
        format!("0 of {total} {noun}")
    } else if selection.matched == selection.total {
        format!("{first}–{last} of {total} {noun}")
    } else {
        format!("{first}–{last} of {matched} matching, {total} {noun} in all")
    };
    let link = |page: usize, rel: &str, label: &str| {
        format!(
            r#"<a class="button view" rel="{rel}" href="?{}">{label}</a>"#,
            escape(&query.link(Some(page), None))
        )
    };
    let previous = if selection.page > 1 {
        link(selection.page - 1, "prev", "Previous page")
    } else {
        String::new()
    };
    let next = if selection.page < selection.pages {
        link(selection.page + 1, "next", "Next page")
    } else {
        String::new()
    };
    format!(
        r#"<nav class="pager" aria-label="Pages"><span id="page-summary">{summary}</span> <span class="page-number">page {} of {}</span> {previous} {next}</nav>"#,
        selection.page, selection.pages
    )
}

/// What an empty list says: nothing yet, or nothing that matches (with the way back).
pub(super) fn empty(
    path: &str,
    query: &FleetQuery,
    selection: &Selection,
    none_yet: &str,
) -> String {
    if !selection.shown.is_empty() {
        return String::new();
    }
    if query.filtered() && selection.total > 0 {
        format!(
            r#"<p class="empty" id="no-rows">Nothing matches these filters. <a href="{path}">Show all</a></p>"#
        )
    } else {
        format!(r#"<p class="empty" id="no-rows">{none_yet}</p>"#)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ObjectMeta;

    fn entry(name: &str, state: &str, version: &str, created: &str) -> Entry {
        Entry {
            object: Object {
                kind: "Cluster".into(),
                metadata: ObjectMeta {
                    name: name.into(),
                    creation_timestamp: created.into(),
                    ..Default::default()
                },
                spec: serde_json::Value::Null,
                status: serde_json::Value::Null,
            },
            state: state.into(),
            version: version.into(),
            also: String::new(),
        }
    }

    fn names(selection: &Selection) -> Vec<&str> {
        selection
            .shown
            .iter()
            .map(|e| e.object.metadata.name.as_str())
            .collect()
    }

    fn query(pairs: &str) -> FleetQuery {
        serde_urlencoded_like(pairs)
    }

    /// A query as axum would read it from the address.
    fn serde_urlencoded_like(pairs: &str) -> FleetQuery {
        let uri: axum::http::Uri = format!("/clusters?{pairs}").parse().unwrap();
        axum::extract::Query::<FleetQuery>::try_from_uri(&uri)
            .unwrap()
            .0
    }

    #[test]
    fn counts_read_with_thousands_marked() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (10000, "10,000"),
            (1234567, "1,234,567"),
        ];
        for (n, shown) in cases {
            assert_eq!(count(n), shown);
        }
    }

    #[test]
    fn a_view_filters_sorts_and_pages_on_the_server() {
        let fleet = || {
            (1..=120)
                .map(|i| {
                    let state = if i % 10 == 0 {
                        "disconnected"
                    } else {
                        "active"
                    };
                    let version = if i <= 60 { "v1.32.1" } else { "v1.33.4" };
                    // Later clusters are younger.
                    let created = format!("2026-01-01T00:{:02}:{:02}Z", i / 60, i % 60);
                    entry(&format!("c-{i}"), state, version, &created)
                })
                .collect::<Vec<_>>()
        };
        let cases: [(&str, &[&str], usize, usize); 7] = [
            // query, first names shown, matched, pages
            ("", &["c-1", "c-2", "c-3"], 120, 3),
            ("page=3", &["c-101", "c-102"], 120, 3),
            ("page=9", &["c-101"], 120, 3),
            ("q=C-11", &["c-11", "c-110", "c-111"], 11, 1),
            ("state=disconnected&sort=-name", &["c-120", "c-110"], 12, 1),
            ("version=v1.33.4&sort=age", &["c-120", "c-119"], 60, 2),
            ("sort=state&page=abc", &["c-1", "c-2"], 120, 3),
        ];
        for (q, first, matched, pages) in cases {
            let selection = select(fleet(), &query(q), Some(&LabelSelector::everything()));
            assert_eq!(&names(&selection)[..first.len()], first, "{q}");
            assert_eq!(
                (selection.matched, selection.pages),
                (matched, pages),
                "{q}"
            );
            assert_eq!(selection.total, 120, "{q}");
            assert!(selection.shown.len() <= PER_PAGE, "{q}");
        }
        let selection = select(fleet(), &query(""), Some(&LabelSelector::everything()));
        assert_eq!(selection.states["disconnected"], 12);
        assert_eq!(selection.versions["v1.32.1"], 60);
    }

    #[test]
    fn links_keep_the_view_and_change_only_page_or_sort() {
        let q = query("q=web&state=active&sort=-age&page=2&part=rows");
        assert_eq!(q.link(Some(3), None), "q=web&state=active&sort=-age&page=3");
        assert_eq!(
            q.link(Some(1), Some("name")),
            "q=web&state=active&sort=name&page=1"
        );
        let selection = select(
            vec![entry("web", "active", "", "2026-01-01T00:00:00Z")],
            &q,
            Some(&LabelSelector::everything()),
        );
        let heading = heading(&q, "age", "Age");
        assert!(heading.contains(r#"aria-sort="descending""#), "{heading}");
        assert!(heading.contains("sort=age"), "{heading}");
        assert_eq!(selection.page, 1);
    }

    #[test]
    fn a_label_selector_narrows_what_matches_not_what_there_is() {
        let fleet = || {
            (1..=4)
                .map(|i| {
                    let mut e = entry(&format!("c{i}"), "active", "", "2026-01-01T00:00:00Z");
                    let env = if i % 2 == 0 { "prod" } else { "dev" };
                    e.object.metadata.labels.insert("env".into(), env.into());
                    e
                })
                .collect::<Vec<_>>()
        };
        let prod = LabelSelector::parse("env=prod").unwrap();
        let selection = select(fleet(), &query(""), Some(&prod));
        assert_eq!(names(&selection), ["c2", "c4"]);
        assert_eq!((selection.matched, selection.total), (2, 4));
        let unreadable = select(fleet(), &query(""), None);
        assert_eq!((unreadable.matched, unreadable.total), (0, 4));
    }

    #[test]
    fn a_bad_label_selector_says_what_is_wrong() {
        let e = query("selector=env%3D%3D%3Dprod")
            .label_selector()
            .unwrap_err();
        assert!(e.starts_with("Label selector: "), "{e}");
    }
}
