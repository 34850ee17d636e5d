//! The keys a configuration file may hold, read from [`Config`]'s own
//! serialised defaults, so that a mistyped key can be answered with the
//! closest real one (`daemon.start_limt` → `daemon.start_limit`) without a
//! second list of names to keep in step with the structs.

use yaml_serde::Value;

use super::{Config, ConfigError, TenantConfig};

/// The name standing for any entry of a map keyed by the user's names
/// (`profiles.NAME`, `server.tenants.NAME`).
const ANY: &str = "*";

/// The defaults as a YAML tree, with one entry standing for any name in
/// the maps whose keys the user chooses.
fn schema() -> Option<Value> {
    let mut config = Config::default();
    config.profiles.insert(ANY.into(), config.defaults.clone());
    config
        .server
        .tenants
        .insert(ANY.into(), TenantConfig::default());
    yaml_serde::to_value(&config).ok()
}

/// Splits a key path as `serde_path_to_error` writes it
/// (`profiles.py.tmpfs[0].size`) into mapping keys, an index being `None`.
fn segments(path: &str) -> Vec<Option<&str>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (name, rest) = part.split_once('[').unwrap_or((part, ""));
        if !name.is_empty() {
            out.push(Some(name));
        }
        out.extend(rest.split('[').filter(|i| !i.is_empty()).map(|_| None));
    }
    out
}

/// The keys the mapping at `path` accepts (empty path: the top level);
/// `None` when `path` leads to no mapping of the configuration.
pub fn known_keys(path: &str) -> Option<Vec<String>> {
    let schema = schema()?;
    let mut node = &schema;
    for segment in segments(path) {
        node = match (segment, node) {
            (Some(key), Value::Mapping(m)) => m
                .get(Value::String(key.into()))
                .or_else(|| m.get(Value::String(ANY.into())))?,
            (None, Value::Sequence(items)) => items.first()?,
            _ => return None,
        };
    }
    match node {
        Value::Mapping(m) => Some(
            m.keys()
                .filter_map(|k| k.as_str())
                .filter(|k| *k != ANY)
                .map(str::to_string)
                .collect(),
        ),
        _ => None,
    }
}

/// Edit distance (insertions, deletions, substitutions, and a swap of two
/// neighbours counted as one) between two short keys.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The known key closest to `key`, when one is close enough to be what was
/// meant (at most a third of its letters different, and at least one).
pub fn closest<'a>(key: &str, known: &'a [String]) -> Option<&'a str> {
    let limit = (key.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (distance(key, k), k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.as_str())
}

impl ConfigError {
    /// For a key the configuration does not have, the full path of the
    /// closest one it does (`daemon.start_limit` for `daemon.start_limt`);
    /// `None` for every other error, or when no key is close.
    pub fn closest_key(&self) -> Option<String> {
        let ConfigError::Parse { path, .. } = self else {
            return None;
        };
        let (parent, key) = match path.rsplit_once('.') {
            Some((parent, key)) => (parent, key),
            None => ("", path.as_str()),
        };
        if key.is_empty() || key.contains('[') {
            return None;
        }
        let known = known_keys(parent)?;
        if known.iter().any(|k| k == key) {
            // A key that exists: the error is about its value.
            return None;
        }
        let best = closest(key, &known)?;
        Some(if parent.is_empty() {
            best.to_string()
        } else {
            format!("{parent}.{best}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(text: &str) -> ConfigError {
        Config::from_yaml(text).expect_err("rejected")
    }

    #[test]
    fn known_keys_follow_the_structs_including_named_entries() {
        let top = known_keys("").expect("top level");
        assert!(top.iter().any(|k| k == "daemon") && top.iter().any(|k| k == "endpoint"));
        let daemon = known_keys("daemon").expect("daemon");
        assert!(daemon.iter().any(|k| k == "start_limit"));
        let limits = known_keys("profiles.python.limits").expect("a profile's limits");
        assert!(limits.iter().any(|k| k == "memory"));
        let tmpfs = known_keys("defaults.tmpfs[1]").expect("a tmpfs entry");
        assert!(tmpfs.iter().any(|k| k == "size"));
        assert!(known_keys("daemon.start_limit").is_none());
        assert!(known_keys("nosuch").is_none());
    }

    #[test]
    fn mistyped_keys_get_the_closest_real_one() {
        let e = parse_err("daemon:\n  start_limt: 3\n");
        assert_eq!(e.closest_key().as_deref(), Some("daemon.start_limit"));
        let e = parse_err("endpiont: tcp://x:1\n");
        assert_eq!(e.closest_key().as_deref(), Some("endpoint"));
        let e = parse_err("profiles:\n  py:\n    limits:\n      memroy: 1\n");
        assert_eq!(
            e.closest_key().as_deref(),
            Some("profiles.py.limits.memory")
        );
        // Nothing close: no guess.
        let e = parse_err("daemon:\n  zzzzzzzzzz: 3\n");
        assert_eq!(e.closest_key(), None);
        // A real key with a bad value is not a typo.
        let e = parse_err("daemon:\n  start_limit: lots\n");
        assert_eq!(e.closest_key(), None);
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("start_limt", "start_limit"), 1);
        assert_eq!(distance("endpiont", "endpoint"), 1);
        assert_eq!(distance("abc", "abc"), 0);
        assert_eq!(distance("", "ab"), 2);
    }
}
