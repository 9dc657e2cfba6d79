//! Which cached objects a query answers, in what order and from where: filtering, sorting by
//! any column of the API server's Table, and pages with continue tokens. Pure functions over a
//! snapshot, so every rule is tested without a cluster.

use std::{borrow::Cow, cmp::Ordering, collections::BTreeMap, ops::Bound, sync::Arc};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use kubeshape::{LabelSelector, order::natural};
use serde_json::Value;

use super::CacheError;

/// A cached object's place: namespace ("" when cluster-scoped) and name.
pub(crate) type Key = (String, String);

/// One cached object: what filters and sorts need, the API server's Table cells for it, and
/// its JSON as the server sent it (a list is written by concatenation; keeping text rather than
/// typed objects costs a tenth of the memory).
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) labels: BTreeMap<String, String>,
    /// `metadata.creationTimestamp` (RFC 3339, so text order is time order).
    pub(crate) created: String,
    pub(crate) cells: Vec<Value>,
    pub(crate) json: Box<str>,
}

/// What a query asks for.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Query {
    /// Any of these namespaces; every namespace when empty.
    pub namespaces: Vec<String>,
    pub selector: Option<LabelSelector>,
    /// Names containing this text, ignoring case.
    pub name: Option<String>,
    pub sort: Option<Sort>,
    /// At most this many objects (all when `None`).
    pub limit: Option<usize>,
    /// Where the previous page ended.
    pub after: Option<String>,
    /// Answer only once the cache has seen this revision (`resourceVersion=`).
    pub fresh_as: Option<u64>,
}

/// An order other than namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sort {
    /// A column of the Table (by name), or `Namespace`.
    pub column: String,
    pub descending: bool,
}

impl Sort {
    fn parse(text: &str) -> Self {
        match text.strip_prefix('-') {
            Some(column) => Self {
                column: column.to_owned(),
                descending: true,
            },
            None => Self {
                column: text.to_owned(),
                descending: false,
            },
        }
    }

    fn text(&self) -> String {
        format!("{}{}", if self.descending { "-" } else { "" }, self.column)
    }
}

impl Query {
    /// Parses the query string; an unknown parameter is refused, so a misspelt one is not
    /// silently ignored.
    pub fn parse(query: &str) -> Result<Self, CacheError> {
        let bad = CacheError::BadRequest;
        let mut parsed = Self::default();
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match key.as_ref() {
                "namespace" => parsed.namespaces.extend(
                    value
                        .split(',')
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned),
                ),
                "labelSelector" => {
                    parsed.selector = Some(
                        LabelSelector::parse(&value)
                            .map_err(|e| bad(format!("labelSelector {value:?}: {e}")))?,
                    );
                }
                "name" if !value.is_empty() => parsed.name = Some(value.to_lowercase()),
                "name" => {}
                "sort" if !value.is_empty() => parsed.sort = Some(Sort::parse(&value)),
                "sort" => {}
                "limit" => {
                    let limit: usize = value.parse().map_err(|_| {
                        bad(format!("limit {value:?} is not a whole number of objects"))
                    })?;
                    parsed.limit = (limit > 0).then_some(limit);
                }
                "continue" if !value.is_empty() => parsed.after = Some(value.into_owned()),
                "continue" => {}
                "resourceVersion" if !value.is_empty() && value != "0" => {
                    parsed.fresh_as = Some(value.parse().map_err(|_| {
                        bad(format!(
                            "resourceVersion {value:?} is not one this cache gave"
                        ))
                    })?);
                }
                "resourceVersion" => {}
                other => {
                    return Err(bad(format!(
                        "unknown query parameter {other:?}; use namespace=, labelSelector=, \
                         name=, sort=, limit=, continue= and resourceVersion="
                    )));
                }
            }
        }
        Ok(parsed)
    }
}

/// The objects of one page, and what follows it.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) items: Vec<(Key, Arc<Entry>)>,
    /// The token of the next page, if any.
    pub(crate) next: Option<String>,
    /// How many matching objects follow this page.
    pub(crate) remaining: usize,
}

/// A value a column sorts by: numbers as numbers, the rest as text (borrowed from the cache
/// while sorting, owned in a token).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum SortValue<'a> {
    Number(f64),
    Text(Cow<'a, str>),
}

impl<'a> SortValue<'a> {
    fn of(cell: Option<&'a Value>) -> Self {
        match cell {
            Some(Value::Number(n)) => Self::Number(n.as_f64().unwrap_or_default()),
            Some(Value::String(s)) => Self::Text(Cow::Borrowed(s)),
            None | Some(Value::Null) => Self::Text(Cow::Borrowed("")),
            Some(other) => Self::Text(Cow::Owned(other.to_string())),
        }
    }

    fn cmp(&self, other: &SortValue<'_>) -> Ordering {
        match (self, other) {
            (Self::Number(a), SortValue::Number(b)) => a.total_cmp(b),
            (a, b) => natural(&a.text(), &b.text()),
        }
    }

    fn text(&self) -> Cow<'_, str> {
        match self {
            Self::Number(n) => Cow::Owned(n.to_string()),
            Self::Text(s) => Cow::Borrowed(s),
        }
    }

    fn owned(&self) -> SortValue<'static> {
        match self {
            Self::Number(n) => SortValue::Number(*n),
            Self::Text(s) => SortValue::Text(Cow::Owned(s.clone().into_owned())),
        }
    }
}

/// What a continue token holds: the order it belongs to and the last object given.
#[derive(serde::Serialize, serde::Deserialize)]
struct Token {
    sort: String,
    value: Option<SortValue<'static>>,
    namespace: String,
    name: String,
}

/// What an object sorts by under `sort`, given the Table's column names.
fn sort_value<'a>(
    sort: &Sort,
    columns: &[String],
    key: &'a Key,
    entry: &'a Entry,
) -> SortValue<'a> {
    match sort.column.as_str() {
        "Namespace" => SortValue::Text(Cow::Borrowed(&key.0)),
        // Ages sort by creation time (reversed below: the youngest, smallest age, first).
        "Age" => SortValue::Text(Cow::Borrowed(&entry.created)),
        column => SortValue::of(
            columns
                .iter()
                .position(|c| c == column)
                .and_then(|i| entry.cells.get(i)),
        ),
    }
}

/// The objects in `namespaces` (every one when empty) after `after`, in key order: a range of
/// the map per namespace, so one namespace of a big cluster is read without the others.
fn candidates<'a>(
    objects: &'a BTreeMap<Key, Arc<Entry>>,
    namespaces: &'a [String],
    after: Option<Key>,
) -> Box<dyn Iterator<Item = (&'a Key, &'a Arc<Entry>)> + 'a> {
    let from = move |start: Key| match &after {
        Some(after) if *after >= start => Bound::Excluded(after.clone()),
        _ => Bound::Included(start),
    };
    if namespaces.is_empty() {
        return Box::new(objects.range((from((String::new(), String::new())), Bound::Unbounded)));
    }
    let mut sorted: Vec<&String> = namespaces.iter().collect();
    sorted.sort();
    sorted.dedup();
    Box::new(sorted.into_iter().flat_map(move |ns| {
        objects
            .range((from((ns.clone(), String::new())), Bound::Unbounded))
            .take_while(move |(k, _)| k.0 == *ns)
    }))
}

/// The page `query` asks for, from every cached object in namespace and name order.
pub(crate) fn select(
    objects: &BTreeMap<Key, Arc<Entry>>,
    columns: &[String],
    namespaced: bool,
    query: &Query,
) -> Result<Page, CacheError> {
    if let Some(sort) = &query.sort {
        let known =
            ["Namespace", "Age"].contains(&sort.column.as_str()) || columns.contains(&sort.column);
        if !known {
            return Err(CacheError::BadRequest(format!(
                "cannot sort by {:?}: the columns are {}",
                sort.column,
                columns.join(", ")
            )));
        }
    }
    if !query.namespaces.is_empty() && !namespaced {
        return Err(CacheError::BadRequest(
            "this kind is cluster-scoped; leave out namespace=".to_owned(),
        ));
    }
    let sort_text = query.sort.as_ref().map(Sort::text).unwrap_or_default();
    let token = match &query.after {
        Some(text) => {
            let token = decode(text)?;
            if token.sort != sort_text {
                return Err(CacheError::BadRequest(format!(
                    "the continue token is for sort={:?}, not sort={sort_text:?}; start again without it",
                    token.sort
                )));
            }
            Some(token)
        }
        None => None,
    };
    let wanted = |(key, entry): &(&Key, &Arc<Entry>)| {
        query
            .selector
            .as_ref()
            .is_none_or(|s| s.matches(&entry.labels))
            && query
                .name
                .as_ref()
                .is_none_or(|n| key.1.to_lowercase().contains(n))
    };
    let limit = query.limit.unwrap_or(usize::MAX);
    let Some(sort) = &query.sort else {
        // In the map's own order a page starts right after the last key given, and what
        // follows the page is only counted.
        let after = token.map(|t| (t.namespace, t.name));
        let mut matching = candidates(objects, &query.namespaces, after).filter(wanted);
        let items: Vec<(Key, Arc<Entry>)> = matching
            .by_ref()
            .take(limit)
            .map(|(k, e)| (k.clone(), Arc::clone(e)))
            .collect();
        let remaining = matching.count();
        let next = match items.last() {
            Some((key, _)) if remaining > 0 => Some(encode(&Token {
                sort: sort_text,
                value: None,
                namespace: key.0.clone(),
                name: key.1.clone(),
            })),
            _ => None,
        };
        return Ok(Page {
            items,
            next,
            remaining,
        });
    };
    let mut matching: Vec<(&Key, &Arc<Entry>, SortValue<'_>)> =
        candidates(objects, &query.namespaces, None)
            .filter(wanted)
            .map(|(k, e)| (k, e, sort_value(sort, columns, k, e)))
            .collect();
    let order = |a: (&SortValue<'_>, &Key), b: (&SortValue<'_>, &Key)| {
        let by_value = a.0.cmp(b.0);
        // Youngest first is newest creation time first.
        let by_value = if sort.column == "Age" {
            by_value.reverse()
        } else {
            by_value
        };
        let by_value = if sort.descending {
            by_value.reverse()
        } else {
            by_value
        };
        by_value.then_with(|| a.1.cmp(b.1))
    };
    matching.sort_by(|a, b| order((&a.2, a.0), (&b.2, b.0)));
    let start = match &token {
        Some(t) => {
            let last = (t.namespace.clone(), t.name.clone());
            let value = t
                .value
                .clone()
                .unwrap_or(SortValue::Text(Cow::Borrowed("")));
            matching.partition_point(|m| order((&m.2, m.0), (&value, &last)) != Ordering::Greater)
        }
        None => 0,
    };
    let page = &matching[start..];
    let take = limit.min(page.len());
    let remaining = page.len() - take;
    let next = match page[..take].last() {
        Some((key, _, value)) if remaining > 0 => Some(encode(&Token {
            sort: sort_text,
            value: Some(value.owned()),
            namespace: key.0.clone(),
            name: key.1.clone(),
        })),
        _ => None,
    };
    Ok(Page {
        items: page[..take]
            .iter()
            .map(|(k, e, _)| ((*k).clone(), Arc::clone(e)))
            .collect(),
        next,
        remaining,
    })
}

fn encode(token: &Token) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(token).unwrap_or_default())
}

fn decode(text: &str) -> Result<Token, CacheError> {
    URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| {
            CacheError::BadRequest(
                "the continue token is not one this cache gave; start again without it".to_owned(),
            )
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn entry(labels: &[(&str, &str)], created: &str, cells: Value) -> Arc<Entry> {
        Arc::new(Entry {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            created: created.to_owned(),
            cells: cells.as_array().cloned().unwrap_or_default(),
            json: "{}".into(),
        })
    }

    /// Pods as `kubectl get pods -A` would show them: Name, Ready, Status, Restarts, Age.
    fn pods() -> (BTreeMap<Key, Arc<Entry>>, Vec<String>) {
        let columns = ["Name", "Ready", "Status", "Restarts", "Age"]
            .map(str::to_owned)
            .to_vec();
        let rows = [
            (
                "shop",
                "web-10",
                "app=web",
                "2026-01-01T00:00:03Z",
                "Running",
                0,
            ),
            (
                "shop",
                "web-2",
                "app=web",
                "2026-01-01T00:00:01Z",
                "Pending",
                12,
            ),
            (
                "shop",
                "db-0",
                "app=db",
                "2026-01-01T00:00:05Z",
                "Running",
                3,
            ),
            (
                "bank",
                "web-1",
                "app=web",
                "2026-01-01T00:00:02Z",
                "Failed",
                3,
            ),
            (
                "bank",
                "API-0",
                "app=api",
                "2026-01-01T00:00:04Z",
                "Running",
                1,
            ),
        ];
        let objects = rows
            .into_iter()
            .map(|(ns, name, label, created, status, restarts)| {
                let (k, v) = label.split_once('=').unwrap();
                (
                    (ns.to_owned(), name.to_owned()),
                    entry(
                        &[(k, v)],
                        created,
                        json!([name, "1/1", status, restarts, "5m"]),
                    ),
                )
            })
            .collect();
        (objects, columns)
    }

    fn names(page: &Page) -> Vec<String> {
        page.items
            .iter()
            .map(|(k, _)| format!("{}/{}", k.0, k.1))
            .collect()
    }

    fn ask(query: &str) -> Result<Page, CacheError> {
        let (objects, columns) = pods();
        select(&objects, &columns, true, &Query::parse(query)?)
    }

    #[test]
    fn without_a_sort_objects_come_in_namespace_and_name_order() {
        let page = ask("").unwrap();
        assert_eq!(
            names(&page),
            [
                "bank/API-0",
                "bank/web-1",
                "shop/db-0",
                "shop/web-10",
                "shop/web-2"
            ]
        );
        assert_eq!((page.remaining, page.next), (0, None));
    }

    #[test]
    fn filters_combine_namespaces_labels_and_name_text() {
        assert_eq!(
            names(&ask("namespace=shop&labelSelector=app%3Dweb").unwrap()),
            ["shop/web-10", "shop/web-2"]
        );
        assert_eq!(
            names(&ask("namespace=bank,shop&name=API").unwrap()),
            ["bank/API-0"]
        );
        assert_eq!(
            names(&ask("namespace=bank&namespace=shop&name=web-1").unwrap()),
            ["bank/web-1", "shop/web-10"]
        );
        assert!(names(&ask("namespace=none").unwrap()).is_empty());
    }

    #[test]
    fn pages_follow_each_other_in_any_order_until_the_list_ends() {
        let (objects, columns) = pods();
        for (sort, all) in [
            (
                "",
                vec![
                    "bank/API-0",
                    "bank/web-1",
                    "shop/db-0",
                    "shop/web-10",
                    "shop/web-2",
                ],
            ),
            // Numbers by value, ties by namespace and name.
            (
                "Restarts",
                vec![
                    "shop/web-10",
                    "bank/API-0",
                    "bank/web-1",
                    "shop/db-0",
                    "shop/web-2",
                ],
            ),
            (
                "-Restarts",
                vec![
                    "shop/web-2",
                    "bank/web-1",
                    "shop/db-0",
                    "bank/API-0",
                    "shop/web-10",
                ],
            ),
            // Text with numbers in it by the numbers' value.
            (
                "Name",
                vec![
                    "bank/API-0",
                    "shop/db-0",
                    "bank/web-1",
                    "shop/web-2",
                    "shop/web-10",
                ],
            ),
            // The youngest first.
            (
                "Age",
                vec![
                    "shop/db-0",
                    "bank/API-0",
                    "shop/web-10",
                    "bank/web-1",
                    "shop/web-2",
                ],
            ),
            (
                "-Namespace",
                vec![
                    "shop/db-0",
                    "shop/web-10",
                    "shop/web-2",
                    "bank/API-0",
                    "bank/web-1",
                ],
            ),
        ] {
            let mut seen = Vec::new();
            let mut query = Query::parse(&format!("limit=2&sort={sort}")).unwrap();
            let mut remaining = Vec::new();
            loop {
                let page = select(&objects, &columns, true, &query).unwrap();
                seen.extend(names(&page));
                remaining.push(page.remaining);
                match page.next {
                    Some(token) => query.after = Some(token),
                    None => break,
                }
            }
            assert_eq!(seen, all, "sort={sort}");
            assert_eq!(remaining, [3, 1, 0], "sort={sort}");
        }
    }

    #[test]
    fn a_page_resumes_after_its_last_object_though_objects_came_and_went() {
        let (mut objects, columns) = pods();
        let first = select(&objects, &columns, true, &Query::parse("limit=2").unwrap()).unwrap();
        assert_eq!(names(&first), ["bank/API-0", "bank/web-1"]);
        // The last object given is deleted and one sorting before it is added.
        objects.remove(&("bank".to_owned(), "web-1".to_owned()));
        objects.insert(
            ("bank".to_owned(), "a".to_owned()),
            entry(&[], "", json!([])),
        );
        let mut query = Query::parse("limit=2").unwrap();
        query.after = first.next;
        let second = select(&objects, &columns, true, &query).unwrap();
        assert_eq!(names(&second), ["shop/db-0", "shop/web-10"]);
    }

    #[test]
    fn pages_of_chosen_namespaces_follow_each_other_across_them() {
        let (objects, columns) = pods();
        let mut query =
            Query::parse("namespace=shop,bank&labelSelector=app%3Dweb&limit=1").unwrap();
        let mut seen = Vec::new();
        loop {
            let page = select(&objects, &columns, true, &query).unwrap();
            seen.extend(names(&page));
            match page.next {
                Some(token) => query.after = Some(token),
                None => break,
            }
        }
        assert_eq!(seen, ["bank/web-1", "shop/web-10", "shop/web-2"]);
    }

    #[test]
    fn bad_queries_say_what_to_fix() {
        let message = |query: &str| ask(query).unwrap_err().to_string();
        assert!(message("labelSelectr=app").contains("labelSelectr"));
        assert!(message("labelSelector=a%3D%3D%3Db").contains("labelSelector"));
        assert!(message("limit=ten").contains("limit"));
        let unknown = message("sort=Colour");
        assert!(
            unknown.contains("Colour") && unknown.contains("Restarts"),
            "{unknown}"
        );
        assert!(message("continue=not-a-token").contains("continue token"));
        // A token from one order does not page another.
        let token = ask("limit=1&sort=Restarts").unwrap().next.unwrap();
        let mixed = message(&format!("limit=1&sort=Name&continue={token}"));
        assert!(mixed.contains("sort=\"Restarts\""), "{mixed}");
        let (objects, columns) = pods();
        let scoped = select(
            &objects,
            &columns,
            false,
            &Query::parse("namespace=shop").unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(scoped.contains("cluster-scoped"), "{scoped}");
    }
}
