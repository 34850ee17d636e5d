//! The JSON form of rules, matchers and configurations, parsed by hand from
//! a `serde_json::Value` so that every rejection names the exact field
//! (`rules[2].probability`): whoever wrote a rules file must be able to find
//! the mistake from the message alone.

use serde_json::{Map, Value};

use super::{validate_rules, validate_tracked};
use super::{Action, Config, ConfigError, Matcher, Rule};

impl Matcher {
    /// Reads the shape only, naming errors under `field`; values are
    /// checked by `validate`.
    pub(super) fn from_json(value: &Value, field: &str) -> Result<Matcher, ConfigError> {
        let object = as_object(value, field)?;
        Ok(Matcher {
            method: optional_string(object, field, "method")?,
            path: required_string(object, field, "path")?,
        })
    }
}

impl TryFrom<Value> for Matcher {
    type Error = ConfigError;

    fn try_from(value: Value) -> Result<Matcher, ConfigError> {
        let matcher = Matcher::from_json(&value, "matcher")?;
        matcher.validate("matcher")?;
        Ok(matcher)
    }
}

impl Action {
    /// Reads the shape only, naming errors under `field`; values are
    /// checked by `validate`.
    pub(super) fn from_json(value: &Value, field: &str) -> Result<Action, ConfigError> {
        const EXPECTED: &str =
            r#"expected "reset", {"delay_ms": N} or {"error": {"status": N, "message": "..."}}"#;
        if let Some(name) = value.as_str() {
            return match name {
                "reset" => Ok(Action::Reset),
                other => Err(ConfigError::new(
                    field,
                    format!("unknown action {other:?}, {EXPECTED}"),
                )),
            };
        }
        let object = as_object(value, field)?;
        let mut entries = object.iter();
        let (Some((key, inner)), None) = (entries.next(), entries.next()) else {
            return Err(ConfigError::new(
                field,
                format!("must have exactly one key, {EXPECTED}"),
            ));
        };
        let inner_field = format!("{field}.{key}");
        match key.as_str() {
            "delay_ms" => Ok(Action::DelayMs(as_u64(inner, &inner_field)?)),
            "error" => {
                let error = as_object(inner, &inner_field)?;
                reject_unknown(error, &inner_field, &["status", "message"])?;
                let status = required_u64(error, &inner_field, "status")?;
                let status = u16::try_from(status).map_err(|_| {
                    ConfigError::new(
                        format!("{inner_field}.status"),
                        format!("{status} is not an HTTP status"),
                    )
                })?;
                Ok(Action::Error {
                    status,
                    message: required_string(error, &inner_field, "message")?,
                })
            }
            "reset" => Ok(Action::Reset),
            other => Err(ConfigError::new(
                field,
                format!("unknown action {other:?}, {EXPECTED}"),
            )),
        }
    }
}

impl TryFrom<Value> for Action {
    type Error = ConfigError;

    fn try_from(value: Value) -> Result<Action, ConfigError> {
        let action = Action::from_json(&value, "action")?;
        action.validate("action")?;
        Ok(action)
    }
}

impl Rule {
    /// Reads the shape only, naming errors under `field`; values are
    /// checked by `validate`.
    pub(super) fn from_json(value: &Value, field: &str) -> Result<Rule, ConfigError> {
        let object = as_object(value, field)?;
        reject_unknown(
            object,
            field,
            &["method", "path", "action", "probability", "max_hits"],
        )?;
        let action_field = format!("{field}.action");
        let action = object
            .get("action")
            .ok_or_else(|| ConfigError::new(&action_field, "missing"))?;
        let probability = match object.get("probability") {
            None | Some(Value::Null) => 1.0,
            Some(value) => value.as_f64().ok_or_else(|| {
                ConfigError::new(
                    format!("{field}.probability"),
                    format!("{value} is not a number"),
                )
            })?,
        };
        let max_hits = match object.get("max_hits") {
            None | Some(Value::Null) => None,
            Some(value) => Some(as_u64(value, &format!("{field}.max_hits"))?),
        };
        Ok(Rule {
            matcher: Matcher::from_json(value, field)?,
            action: Action::from_json(action, &action_field)?,
            probability,
            max_hits,
        })
    }
}

impl TryFrom<Value> for Rule {
    type Error = ConfigError;

    fn try_from(value: Value) -> Result<Rule, ConfigError> {
        let rule = Rule::from_json(&value, "rule")?;
        rule.validate("rule")?;
        Ok(rule)
    }
}

impl Config {
    /// Parses a rules file: either a JSON list of rules, or an object
    /// `{"seed": N, "rules": [...], "tracked": [...]}` (every key optional).
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ConfigError::new("(document)", format!("not valid JSON: {e}")))?;
        Config::from_value(&value)
    }

    /// [`Config::from_json`] on an already parsed document.
    pub fn from_value(value: &Value) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        match value {
            Value::Array(_) => config.rules = parse_rules(value, "rules")?,
            Value::Object(object) => {
                reject_unknown(object, "(document)", &["seed", "rules", "tracked"])?;
                if let Some(seed) = object.get("seed") {
                    config.seed = parse_seed(seed, "seed")?;
                }
                if let Some(rules) = object.get("rules") {
                    config.rules = parse_rules(rules, "rules")?;
                }
                if let Some(tracked) = object.get("tracked") {
                    config.tracked = parse_tracked(tracked, "tracked")?;
                }
            }
            other => {
                return Err(ConfigError::new(
                    "(document)",
                    format!(
                        "expected a list of rules or an object, found {}",
                        kind(other)
                    ),
                ))
            }
        }
        Ok(config)
    }
}

/// Parses and validates a JSON list of rules; errors name `field[i].x`.
pub(crate) fn parse_rules(value: &Value, field: &str) -> Result<Vec<Rule>, ConfigError> {
    let rules = as_array(value, field)?
        .iter()
        .enumerate()
        .map(|(i, rule)| Rule::from_json(rule, &format!("{field}[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    validate_rules(&rules, field)?;
    Ok(rules)
}

/// Parses and validates a JSON list of matchers; errors name `field[i].x`.
pub(crate) fn parse_tracked(value: &Value, field: &str) -> Result<Vec<Matcher>, ConfigError> {
    let tracked = as_array(value, field)?
        .iter()
        .enumerate()
        .map(|(i, matcher)| {
            let field = format!("{field}[{i}]");
            reject_unknown(as_object(matcher, &field)?, &field, &["method", "path"])?;
            Matcher::from_json(matcher, &field)
        })
        .collect::<Result<Vec<_>, _>>()?;
    validate_tracked(&tracked, field)?;
    Ok(tracked)
}

/// Parses a seed: a non-negative integer.
pub(crate) fn parse_seed(value: &Value, field: &str) -> Result<u64, ConfigError> {
    as_u64(value, field)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn as_object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    value.as_object().ok_or_else(|| {
        ConfigError::new(field, format!("expected an object, found {}", kind(value)))
    })
}

fn as_array<'a>(value: &'a Value, field: &str) -> Result<&'a Vec<Value>, ConfigError> {
    value
        .as_array()
        .ok_or_else(|| ConfigError::new(field, format!("expected a list, found {}", kind(value))))
}

fn as_u64(value: &Value, field: &str) -> Result<u64, ConfigError> {
    value
        .as_u64()
        .ok_or_else(|| ConfigError::new(field, format!("{value} is not a non-negative integer")))
}

fn required_u64(object: &Map<String, Value>, parent: &str, key: &str) -> Result<u64, ConfigError> {
    let field = format!("{parent}.{key}");
    let value = object
        .get(key)
        .ok_or_else(|| ConfigError::new(&field, "missing"))?;
    as_u64(value, &field)
}

fn required_string(
    object: &Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<String, ConfigError> {
    optional_string(object, parent, key)?
        .ok_or_else(|| ConfigError::new(format!("{parent}.{key}"), "missing"))
}

fn optional_string(
    object: &Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<Option<String>, ConfigError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ConfigError::new(
            format!("{parent}.{key}"),
            format!("expected a string, found {}", kind(other)),
        )),
    }
}

/// Typos such as `max_hit` would otherwise silently change a test's meaning.
fn reject_unknown(
    object: &Map<String, Value>,
    parent: &str,
    known: &[&str],
) -> Result<(), ConfigError> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(ConfigError::new(
            format!("{parent}.{key}"),
            format!("unknown field (expected one of {})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::rule::{DEFAULT_SEED, MAX_DELAY_MS};
    use serde_json::json;

    fn rules(value: Value) -> Result<Vec<Rule>, ConfigError> {
        parse_rules(&value, "rules")
    }

    #[test]
    fn parses_every_action_form() -> Result<(), ConfigError> {
        let parsed = rules(json!([
            {"method": "POST", "path": "/containers/*/start",
             "action": {"error": {"status": 500, "message": "database is locked"}},
             "max_hits": 1},
            {"path": "/_ping", "action": "reset", "probability": 0.5},
            {"method": "GET", "path": "/events", "action": {"delay_ms": 300}},
        ]))?;
        assert_eq!(
            parsed,
            vec![
                Rule::new(
                    Matcher::new("POST", "/containers/*/start"),
                    Action::error(500, "database is locked")
                )
                .with_max_hits(1),
                Rule::new(Matcher::any_method("/_ping"), Action::Reset).with_probability(0.5),
                Rule::new(
                    Matcher::new("GET", "/events"),
                    Action::delay(Duration::from_millis(300))
                ),
            ]
        );
        Ok(())
    }

    #[test]
    fn json_round_trips_through_serde() -> Result<(), serde_json::Error> {
        let rule = Rule::new(
            Matcher::new("POST", "/containers/*/start"),
            Action::error(500, "database is locked"),
        )
        .with_max_hits(2);
        let text = serde_json::to_value(&rule)?;
        assert_eq!(
            text,
            json!({"method": "POST", "path": "/containers/*/start",
                   "action": {"error": {"status": 500, "message": "database is locked"}},
                   "probability": 1.0, "max_hits": 2})
        );
        assert_eq!(serde_json::from_value::<Rule>(text)?, rule);
        for action in [Action::Reset, Action::DelayMs(5)] {
            let value = serde_json::to_value(&action)?;
            assert_eq!(serde_json::from_value::<Action>(value)?, action);
        }
        Ok(())
    }

    fn field_of(result: Result<Vec<Rule>, ConfigError>) -> String {
        match result {
            Ok(rules) => format!("accepted {rules:?}"),
            Err(e) => e.field,
        }
    }

    #[test]
    fn errors_name_the_field() {
        let ok_action = json!("reset");
        let cases = [
            (json!({"rules": []}), "rules"),
            (json!([42]), "rules[0]"),
            (json!([{"action": ok_action}]), "rules[0].path"),
            (json!([{"path": "/x"}]), "rules[0].action"),
            (json!([{"path": 7, "action": ok_action}]), "rules[0].path"),
            (json!([{"path": "x", "action": ok_action}]), "rules[0].path"),
            (
                json!([{"path": "/x", "method": "GE T", "action": ok_action}]),
                "rules[0].method",
            ),
            (
                json!([{"path": "/x", "action": "explode"}]),
                "rules[0].action",
            ),
            (
                json!([{"path": "/x", "action": {"a": 1, "b": 2}}]),
                "rules[0].action",
            ),
            (
                json!([{"path": "/x", "action": {"delay_ms": -1}}]),
                "rules[0].action.delay_ms",
            ),
            (
                json!([{"path": "/x", "action": {"delay_ms": MAX_DELAY_MS + 1}}]),
                "rules[0].action.delay_ms",
            ),
            (
                json!([{"path": "/x", "action": {"error": {"message": "m"}}}]),
                "rules[0].action.error.status",
            ),
            (
                json!([{"path": "/x", "action": {"error": {"status": 200, "message": "m"}}}]),
                "rules[0].action.error.status",
            ),
            (
                json!([{"path": "/x", "action": {"error": {"status": 70000, "message": "m"}}}]),
                "rules[0].action.error.status",
            ),
            (
                json!([{"path": "/x", "action": {"error": {"status": 500}}}]),
                "rules[0].action.error.message",
            ),
            (
                json!([{"path": "/x", "action": {"error": {"status": 500, "message": "m", "x": 1}}}]),
                "rules[0].action.error.x",
            ),
            (
                json!([{"path": "/x", "action": ok_action, "probability": 1.5}]),
                "rules[0].probability",
            ),
            (
                json!([{"path": "/x", "action": ok_action, "probability": "half"}]),
                "rules[0].probability",
            ),
            (
                json!([{"path": "/x", "action": ok_action, "max_hits": 1.5}]),
                "rules[0].max_hits",
            ),
            (
                json!([{"path": "/x", "action": ok_action, "max_hit": 1}]),
                "rules[0].max_hit",
            ),
            (
                json!([{"path": "/x", "action": ok_action}, {"path": "/y"}]),
                "rules[1].action",
            ),
        ];
        for (value, field) in cases {
            assert_eq!(field_of(rules(value.clone())), field, "for {value}");
        }
    }

    #[test]
    fn config_accepts_a_list_or_an_object() -> Result<(), ConfigError> {
        let list = Config::from_json(r#"[{"path": "/_ping", "action": "reset"}]"#)?;
        assert_eq!(list.seed, DEFAULT_SEED);
        assert_eq!(list.rules.len(), 1);
        let object = Config::from_json(
            r#"{"seed": 7, "tracked": [{"method": "POST", "path": "/containers/*/start"}]}"#,
        )?;
        assert_eq!(object.seed, 7);
        assert!(object.rules.is_empty());
        assert_eq!(
            object.tracked,
            vec![Matcher::new("POST", "/containers/*/start")]
        );
        let bad = Config::from_json(r#"{"tracked": [{"path": "/x", "methd": "GET"}]}"#);
        assert_eq!(bad.map_err(|e| e.field), Err("tracked[0].methd".to_owned()));
        let bad = Config::from_json(r#"{"seed": -3}"#);
        assert_eq!(bad.map_err(|e| e.field), Err("seed".to_owned()));
        let bad = Config::from_json("[");
        assert_eq!(bad.map_err(|e| e.field), Err("(document)".to_owned()));
        Ok(())
    }
}
