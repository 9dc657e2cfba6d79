//! How long the tokens the hub issues live, as admins set it (settings `session-ttl`,
//! `kubeconfig-token-ttl`, `api-token-max-ttl`), and the sweep that deletes tokens once they
//! have expired.

use std::{sync::Arc, time::Duration as StdDuration};

use serde_json::Value;
use time::{Duration, OffsetDateTime, format_description::well_known::Rfc3339};
use tokio_util::sync::CancellationToken;

use crate::{
    model::{Kind, expired},
    store::{LabelSelector, Op, Store, StoreError},
};

/// The label every user token carries: its user, so an admin can list and revoke one user's
/// tokens (`/v1/tokens?labelSelector=drover.io/user=NAME`).
pub const USER_LABEL: &str = "drover.io/user";

/// The settings, their defaults and what each means.
pub const SETTINGS: [(&str, &str, &str); 3] = [
    ("session-ttl", "16h", "a dashboard session"),
    (
        "kubeconfig-token-ttl",
        "90d",
        "the token in a kubeconfig the hub issues",
    ),
    (
        "api-token-max-ttl",
        "30d",
        "the longest an API token may live (a CLI login's token lives this long)",
    ),
];

/// The shortest and longest lifetimes accepted: shorter would end sessions mid-task, longer
/// is a token that outlives its reason.
const SHORTEST: Duration = Duration::minutes(5);
const LONGEST: Duration = Duration::days(366);

/// The lifetimes in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    pub session: Duration,
    pub kubeconfig: Duration,
    pub api_max: Duration,
}

/// A lifetime as the settings write it: a whole number of minutes, hours or days (`30m`,
/// `16h`, `90d`).
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let count: i64 = number.parse().map_err(|_| {
        format!("{text:?} is not a lifetime; write minutes, hours or days, as 30m, 16h or 90d")
    })?;
    let lifetime = match unit {
        "m" => Duration::minutes(count),
        "h" => Duration::hours(count),
        "d" => Duration::days(count),
        _ => {
            return Err(format!(
                "{text:?} is not a lifetime; write minutes, hours or days, as 30m, 16h or 90d"
            ));
        }
    };
    if !(SHORTEST..=LONGEST).contains(&lifetime) {
        return Err(format!(
            "{text:?} is out of range: a token lives from 5m to 366d"
        ));
    }
    Ok(lifetime)
}

/// Checks a setting's value if it is one of these; other settings pass.
pub fn validate_setting(name: &str, spec: &Value) -> Result<(), String> {
    let Some((_, _, what)) = SETTINGS.iter().find(|(n, _, _)| *n == name) else {
        return Ok(());
    };
    let value = spec
        .get("value")
        .and_then(Value::as_str)
        .unwrap_or_default();
    parse(value)
        .map(drop)
        .map_err(|e| format!("spec.value: {e} (setting {name}: how long {what} lives)"))
}

/// The lifetimes in force: each setting, or its default.
pub async fn read(store: &dyn Store) -> Result<Lifetimes, StoreError> {
    let mut found = [Duration::ZERO; 3];
    for (slot, (name, default, _)) in found.iter_mut().zip(SETTINGS) {
        let text = crate::registration::setting(store, name, default.to_owned()).await?;
        // Values are checked when written; one that is not (written before this check) is
        // reported and the default used.
        *slot = parse(&text).unwrap_or_else(|e| {
            tracing::warn!(setting = name, error = %e, "ignoring the setting; using {default}");
            parse(default).unwrap_or(Duration::hours(16))
        });
    }
    let [session, kubeconfig, api_max] = found;
    Ok(Lifetimes {
        session,
        kubeconfig,
        api_max,
    })
}

/// `now + lifetime`, to the second, as tokens store it.
pub fn expiry(lifetime: Duration) -> String {
    let now = OffsetDateTime::now_utc();
    (now + lifetime)
        .replace_nanosecond(0)
        .unwrap_or(now)
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// Checks an API token's `expiresAt` against the longest lifetime allowed; none given is the
/// longest. Returns the expiry to store.
pub fn api_token_expiry(asked: Option<&str>, max: Duration) -> Result<String, String> {
    let Some(asked) = asked else {
        return Ok(expiry(max));
    };
    let at = OffsetDateTime::parse(asked, &Rfc3339)
        .map_err(|_| format!("spec.expiresAt: {asked:?} is not an RFC 3339 time"))?;
    let latest = OffsetDateTime::now_utc() + max;
    if at > latest {
        return Err(format!(
            "spec.expiresAt: {asked} is further off than the longest API-token lifetime allows ({} days, setting api-token-max-ttl); ask for {} or sooner",
            max.whole_days(),
            expiry(max)
        ));
    }
    Ok(asked.to_owned())
}

/// How often the leader deletes expired tokens.
const SWEEP_EVERY: StdDuration = StdDuration::from_secs(600);

/// Deletes expired tokens (of users and agents alike) now and every ten minutes, until
/// `shutdown`: an expired token authenticates nothing, and keeping it only grows the store.
pub async fn run_sweeper(store: Arc<dyn Store>, shutdown: CancellationToken) {
    loop {
        match sweep(store.as_ref()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(tokens = n, "deleted expired tokens"),
            Err(e) => tracing::warn!(error = %e, "deleting expired tokens failed; retrying"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}

/// Deletes every expired token; how many it deleted.
pub async fn sweep(store: &dyn Store) -> Result<usize, StoreError> {
    let (tokens, _) = store
        .list(Kind::Token.name(), &LabelSelector::everything())
        .await?;
    let mut deleted = 0;
    for token in tokens.into_iter().filter(|t| expired(&t.spec)) {
        // Each on its own, guarded by the version read: a token renewed meanwhile stays.
        let op = Op::Delete {
            kind: Kind::Token.name().to_owned(),
            name: token.metadata.name.clone(),
            resource_version: token.metadata.resource_version.parse().ok(),
        };
        match store.transact(vec![op]).await {
            Ok(_) => deleted += 1,
            Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_are_minutes_hours_or_days_within_bounds() {
        assert_eq!(parse("16h"), Ok(Duration::hours(16)));
        assert_eq!(parse("90d"), Ok(Duration::days(90)));
        assert_eq!(parse(" 30m "), Ok(Duration::minutes(30)));
        for bad in [
            "", "h", "16", "16 hours", "1.5h", "-1h", "1m", "367d", "16H",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let refused =
            validate_setting("session-ttl", &serde_json::json!({"value": "forever"})).unwrap_err();
        assert!(
            refused.contains("spec.value")
                && refused.contains("session-ttl")
                && refused.contains("16h"),
            "{refused}"
        );
        // Other settings are not lifetimes.
        assert!(validate_setting("install-source", &serde_json::json!({"value": "x"})).is_ok());
        for (name, default, _) in SETTINGS {
            assert!(parse(default).is_ok(), "{name}");
        }
    }

    #[test]
    fn an_api_token_lives_no_longer_than_the_longest_lifetime() {
        let max = Duration::days(30);
        let soon = expiry(Duration::days(1));
        assert_eq!(api_token_expiry(Some(&soon), max), Ok(soon));
        let late = expiry(Duration::days(31));
        let refused = api_token_expiry(Some(&late), max).unwrap_err();
        assert!(
            refused.contains("api-token-max-ttl") && refused.contains("30 days"),
            "{refused}"
        );
        assert!(api_token_expiry(Some("next week"), max).is_err());
        let given = api_token_expiry(None, max).unwrap();
        let at = OffsetDateTime::parse(&given, &Rfc3339).unwrap();
        let off = at - OffsetDateTime::now_utc();
        assert!(
            off > Duration::days(29) && off <= Duration::days(30),
            "{off}"
        );
    }
}
