//! Reading configuration from the environment through a small trait, so tests
//! pass a map instead of mutating the process environment.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

/// A source of environment variables.
pub trait Env: Send + Sync {
    /// The value of `key`, if set.
    fn get(&self, key: &str) -> Option<String>;
    /// Every `(key, value)` pair whose key starts with `prefix`, sorted by key.
    fn with_prefix(&self, prefix: &str) -> Vec<(String, String)>;
}

/// The process environment.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }

    fn with_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        let mut v: Vec<_> = std::env::vars()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect();
        v.sort();
        v
    }
}

/// A map-backed environment for tests.
#[derive(Debug, Default, Clone)]
pub struct MapEnv(pub BTreeMap<String, String>);

impl MapEnv {
    /// Builds an environment from pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }
}

impl Env for MapEnv {
    fn get(&self, key: &str) -> Option<String> {
        self.0.get(key).cloned()
    }

    fn with_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        self.0
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Collects every invalid variable so they can be reported at once.
#[derive(Default)]
pub struct Reader<'a> {
    env: Option<&'a dyn Env>,
    errors: Vec<String>,
}

impl<'a> Reader<'a> {
    /// Reads from `env`.
    pub fn new(env: &'a dyn Env) -> Self {
        Self {
            env: Some(env),
            errors: Vec::new(),
        }
    }

    /// A string variable, or `default` when unset or empty (Istio treats empty as unset).
    pub fn string(&mut self, key: &str, default: &str) -> String {
        self.opt_string(key).unwrap_or_else(|| default.to_string())
    }

    /// A string variable, `None` when unset or empty.
    pub fn opt_string(&mut self, key: &str) -> Option<String> {
        self.env?.get(key).filter(|v| !v.is_empty())
    }

    /// A boolean variable (Go's `strconv.ParseBool` spellings).
    pub fn bool(&mut self, key: &str, default: bool) -> bool {
        match self.opt_string(key) {
            None => default,
            Some(v) => match v.as_str() {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => true,
                "0" | "f" | "F" | "false" | "FALSE" | "False" => false,
                _ => {
                    self.errors
                        .push(format!("{key}={v:?} is not a boolean (use true or false)"));
                    default
                }
            },
        }
    }

    /// A Go duration variable.
    pub fn duration(&mut self, key: &str, default: Duration) -> Duration {
        match self.opt_string(key) {
            None => default,
            Some(v) => match crate::duration::parse(&v) {
                Ok(d) => d,
                Err(e) => {
                    self.errors.push(format!("{key}: {e}"));
                    default
                }
            },
        }
    }

    /// A variable parsed with `FromStr`.
    pub fn parse<T: FromStr>(&mut self, key: &str, default: T) -> T
    where
        T::Err: std::fmt::Display,
    {
        match self.opt_string(key) {
            None => default,
            Some(v) => match v.parse() {
                Ok(x) => x,
                Err(e) => {
                    self.errors.push(format!("{key}={v:?}: {e}"));
                    default
                }
            },
        }
    }

    /// Every `(suffix, value)` for variables named `<prefix><suffix>`.
    pub fn prefixed(&mut self, prefix: &str) -> Vec<(String, String)> {
        self.env
            .map(|e| e.with_prefix(prefix))
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_string(), v))
            .collect()
    }

    /// Records an error found while validating values together.
    pub fn error(&mut self, msg: impl Into<String>) {
        self.errors.push(msg.into());
    }

    /// Every error, or `Ok` when there were none.
    pub fn finish(self) -> Result<(), ConfigErrors> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(self.errors))
        }
    }
}

/// Every bad flag or variable of one reading, in the order found; shown
/// one per line, each naming its flag or variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigErrors(pub Vec<String>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_bad_value() {
        let env = MapEnv::from_pairs([("A", "maybe"), ("B", "10"), ("C", "x")]);
        let mut r = Reader::new(&env);
        r.bool("A", false);
        r.duration("B", Duration::ZERO);
        let _: u32 = r.parse("C", 1);
        let ConfigErrors(errors) = r.finish().unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        let err = errors.join("\n");
        assert!(err.contains("A=\"maybe\""));
        assert!(err.contains("B: invalid duration"));
    }

    #[test]
    fn empty_is_unset() {
        let env = MapEnv::from_pairs([("A", "")]);
        let mut r = Reader::new(&env);
        assert_eq!(r.string("A", "d"), "d");
    }
}
