//! Label selectors in Kubernetes' syntax: `env=prod`, `tier!=db`, `zone in (a,b)`,
//! `zone notin (c)`, `gpu` (key present), `!legacy` (key absent); requirements joined by commas.

use std::{collections::BTreeMap, fmt};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// Every requirement must hold. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// A selector that does not parse; the message points at the part to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    selector: String,
    reason: String,
}

impl LabelSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    /// Whether this selector matches every object (it has no requirement).
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let fail = |reason: String| SelectorError {
            selector: text.to_owned(),
            reason,
        };
        let mut requirements = Vec::new();
        for part in split_top_level(text).map_err(fail)? {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(part).map_err(fail)?);
        }
        Ok(Self { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, values) => labels.get(k).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(k, values) => labels.get(k).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::In(k, v) if v.len() == 1 => format!("{k}={}", v[0]),
                Requirement::In(k, v) => format!("{k} in ({})", v.join(",")),
                Requirement::NotIn(k, v) if v.len() == 1 => format!("{k}!={}", v[0]),
                Requirement::NotIn(k, v) => format!("{k} notin ({})", v.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("a ')' without its '('".into());
                }
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '(' without its ')'".into());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim())?));
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = part.split_once(op) {
            let (key, value) = (key_of(k.trim())?, value_of(v.trim())?);
            return Ok(if negate {
                Requirement::NotIn(key, vec![value])
            } else {
                Requirement::In(key, vec![value])
            });
        }
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words[..] {
        let rest = rest.trim();
        let (negate, list) = if let Some(list) = rest.strip_prefix("notin") {
            (true, list)
        } else if let Some(list) = rest.strip_prefix("in") {
            (false, list)
        } else {
            return Err(format!("expected `in` or `notin` after {key:?}"));
        };
        let list = list
            .trim()
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| format!("the values of {key:?} must be in parentheses"))?;
        let values = list
            .split(',')
            .map(|v| value_of(v.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let key = key_of(key)?;
        return Ok(if negate {
            Requirement::NotIn(key, values)
        } else {
            Requirement::In(key, values)
        });
    }
    Ok(Requirement::Exists(key_of(part)?))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of letters, digits,
/// `-`, `_` and `.` beginning and ending with a letter or digit, at most 63 characters.
pub fn key_of(key: &str) -> Result<String, String> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty()
                || prefix.len() > 253
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                return Err(format!("label key {key:?} has an invalid prefix"));
            }
            name
        }
        None => key,
    };
    if !valid_label_text(name) || name.is_empty() {
        return Err(format!(
            "label key {key:?} is not a valid name (letters, digits, '-', '_', '.'; at most 63)"
        ));
    }
    Ok(key.to_owned())
}

/// A label value: empty, or like a key's name part.
pub fn value_of(value: &str) -> Result<String, String> {
    if !valid_label_text(value) {
        return Err(format!(
            "label value {value:?} is not valid (letters, digits, '-', '_', '.'; at most 63)"
        ));
    }
    Ok(value.to_owned())
}

fn valid_label_text(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_operator_matches_as_kubernetes_defines_it() {
        let l = labels(&[("env", "prod"), ("zone", "a"), ("gpu", "")]);
        let cases = [
            ("", true),
            ("env=prod", true),
            ("env==prod", true),
            ("env!=prod", false),
            ("env!=dev", true),
            ("missing!=x", true),
            ("zone in (a,b)", true),
            ("zone in (b, c)", false),
            ("zone notin (b,c)", true),
            ("gpu", true),
            ("!gpu", false),
            ("!legacy", true),
            ("env=prod,zone in (a),!legacy", true),
            ("env=prod,zone=b", false),
        ];
        for (text, expected) in cases {
            let selector = LabelSelector::parse(text).unwrap();
            assert_eq!(selector.matches(&l), expected, "{text}");
        }
    }

    #[test]
    fn bad_selectors_say_what_is_wrong() {
        for (text, expect) in [
            ("zone in a,b", "parentheses"),
            ("zone in (a", "without its ')'"),
            ("zone maybe (a)", "`in` or `notin`"),
            ("-bad=1", "not a valid name"),
            ("env=no way", "not valid"),
        ] {
            let err = LabelSelector::parse(text).unwrap_err().to_string();
            assert!(err.contains(expect), "{text}: {err}");
        }
    }

    #[test]
    fn display_round_trips() {
        let text = "env=prod,zone in (a,b),tier!=db,gpu,!legacy";
        assert_eq!(LabelSelector::parse(text).unwrap().to_string(), text);
    }
}
