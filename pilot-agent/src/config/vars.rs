//! Reads variables for the part parsers and collects every invalid value in
//! one list, typed, so `from_env` reports them all at once.

use std::str::FromStr;
use std::time::Duration;

use common::env::Env;

use super::error::ConfigError;

/// The environment and the errors found so far, shared by the part parsers.
pub(super) struct Vars<'a> {
    env: &'a dyn Env,
    errors: Vec<ConfigError>,
}

impl<'a> Vars<'a> {
    pub(super) fn new(env: &'a dyn Env) -> Self {
        Self {
            env,
            errors: Vec::new(),
        }
    }

    /// The raw value, empty included (the node metadata keeps empty values).
    pub(super) fn raw(&self, key: &str) -> Option<String> {
        self.env.get(key)
    }

    /// `None` when unset or empty: Istio treats empty as unset.
    pub(super) fn opt_string(&self, key: &str) -> Option<String> {
        self.env.get(key).filter(|v| !v.is_empty())
    }

    /// The value, or `default` when unset or empty.
    pub(super) fn string(&self, key: &str, default: &str) -> String {
        self.opt_string(key).unwrap_or_else(|| default.to_string())
    }

    /// A boolean in Go's `strconv.ParseBool` spellings.
    pub(super) fn bool(&mut self, var: &'static str, default: bool) -> bool {
        let Some(value) = self.opt_string(var) else {
            return default;
        };
        match common::cli::parse_go_bool(&value) {
            Ok(b) => b,
            Err(_) => {
                self.error(ConfigError::NotBool { var, value });
                default
            }
        }
    }

    /// A Go duration.
    pub(super) fn duration(&mut self, var: &'static str, default: Duration) -> Duration {
        let Some(value) = self.opt_string(var) else {
            return default;
        };
        match common::duration::parse(&value) {
            Ok(d) => d,
            Err(source) => {
                self.error(ConfigError::Duration { var, source });
                default
            }
        }
    }

    /// A number (or any `FromStr` value).
    pub(super) fn parse<T: FromStr>(&mut self, var: &'static str, default: T) -> T
    where
        T::Err: std::fmt::Display,
    {
        let Some(value) = self.opt_string(var) else {
            return default;
        };
        match value.parse() {
            Ok(x) => x,
            Err(e) => {
                self.error(ConfigError::NotNumber {
                    var,
                    value,
                    reason: e.to_string(),
                });
                default
            }
        }
    }

    /// Every `(suffix, value)` for variables named `<prefix><suffix>`.
    pub(super) fn prefixed(&self, prefix: &str) -> Vec<(String, String)> {
        self.env
            .with_prefix(prefix)
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_string(), v))
            .collect()
    }

    /// Records an error found while validating values together.
    pub(super) fn error(&mut self, e: impl Into<ConfigError>) {
        self.errors.push(e.into());
    }

    /// The errors found, in the order they were found.
    pub(super) fn into_errors(self) -> Vec<ConfigError> {
        self.errors
    }
}
