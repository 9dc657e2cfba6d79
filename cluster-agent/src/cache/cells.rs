//! Cells that say how long ago something happened ("5m") are true only when printed: the API
//! server computes them per answer. The cache prints them again at each answer, from the times
//! on the object, by the same rules (apimachinery's `HumanDuration`); every other cell is the
//! server's own, as of the object's last change.

use serde_json::Value;
use time::{OffsetDateTime, format_description::well_known::Rfc3339};

/// `cells` with their "how long ago" columns printed for `now`.
pub(crate) fn refresh(
    columns: &[String],
    cells: &[Value],
    object: &Value,
    now: OffsetDateTime,
) -> Vec<Value> {
    let mut cells = cells.to_vec();
    for (i, column) in columns.iter().enumerate() {
        let since = match column.as_str() {
            "Age" => since(object, &["/metadata/creationTimestamp"]),
            // An event's, as kubectl prints them: a series' last observation, else the last
            // time, else the first, else the event time.
            "Last Seen" => since(
                object,
                &[
                    "/series/lastObservedTime",
                    "/lastTimestamp",
                    "/firstTimestamp",
                    "/eventTime",
                ],
            ),
            "First Seen" => since(object, &["/firstTimestamp", "/eventTime"]),
            _ => continue,
        };
        if let Some(cell) = cells.get_mut(i) {
            *cell = since
                .map_or_else(
                    || "<unknown>".to_owned(),
                    |t| kubeshape::duration::human((now - t).whole_seconds()),
                )
                .into();
        }
    }
    cells
}

/// The first of `pointers` that holds a time.
fn since(object: &Value, pointers: &[&str]) -> Option<OffsetDateTime> {
    pointers.iter().find_map(|p| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use time::macros::datetime;

    use super::*;

    #[test]
    fn ages_are_printed_for_the_moment_of_the_answer() {
        let columns = ["Name", "Status", "Age"].map(str::to_owned);
        // Cached when the pod was 5 seconds old.
        let cells = [json!("web-0"), json!("Running"), json!("5s")];
        let pod =
            json!({"metadata": {"name": "web-0", "creationTimestamp": "2026-11-26T10:00:00Z"}});
        let now = datetime!(2026-11-26 12:03:10 UTC);
        assert_eq!(
            refresh(&columns, &cells, &pod, now),
            [json!("web-0"), json!("Running"), json!("123m")]
        );
        let unknown = json!({"metadata": {"name": "web-0"}});
        assert_eq!(refresh(&columns, &cells, &unknown, now)[2], "<unknown>");
    }

    #[test]
    fn an_events_last_seen_is_its_latest_time() {
        let columns = ["Last Seen", "Type", "First Seen"].map(str::to_owned);
        let cells = [json!("1s"), json!("Normal"), json!("1s")];
        let now = datetime!(2026-11-26 12:00:00 UTC);
        let event = json!({"firstTimestamp": "2026-11-26T11:00:00Z", "lastTimestamp": "2026-11-26T11:58:00Z"});
        assert_eq!(
            refresh(&columns, &cells, &event, now),
            [json!("2m"), json!("Normal"), json!("60m")]
        );
        let series = json!({"eventTime": "2026-11-26T11:00:00.000000Z",
            "series": {"count": 4, "lastObservedTime": "2026-11-26T11:59:30.000000Z"}});
        assert_eq!(
            refresh(&columns, &cells, &series, now),
            [json!("30s"), json!("Normal"), json!("60m")]
        );
    }
}
