//! The backend's settings from corral's configuration file: the file speaks
//! in plain numbers (`_ms`) and strings, the backend in `Duration`s and paths.

use std::path::PathBuf;
use std::time::Duration;

use corral_core::config::Config;

use crate::BackendConfig;

impl From<&Config> for BackendConfig {
    fn from(config: &Config) -> Self {
        let d = &config.daemon;
        BackendConfig {
            endpoint: config.endpoint.clone(),
            retry: d.retry.clone(),
            start_limit: d.start_limit,
            exec_limit: d.exec_limit,
            shared_slots: d.shared_slots,
            slot_dir: d.slot_dir.as_ref().map(PathBuf::from),
            slot_wait_timeout: Duration::from_millis(d.slot_wait_timeout_ms),
            breaker: d.breaker.clone(),
            reap_orphans: d.reap_orphans,
            reap_interval: Duration::from_millis(d.reap_interval_ms),
            slow_start: Duration::from_millis(d.slow_start_ms),
            seal_key_file: d.seal_key_file.as_ref().map(PathBuf::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_is_the_default_backend() {
        let from = BackendConfig::from(&Config::default());
        let want = BackendConfig::default();
        // BackendConfig has no PartialEq; a destructuring makes a new field
        // a compile error here rather than an unchecked default.
        let BackendConfig {
            endpoint,
            retry,
            start_limit,
            exec_limit,
            shared_slots,
            slot_dir,
            slot_wait_timeout,
            breaker,
            reap_orphans,
            reap_interval,
            slow_start,
            seal_key_file,
        } = from;
        assert_eq!(endpoint, want.endpoint);
        assert_eq!(retry, want.retry);
        assert_eq!(start_limit, want.start_limit);
        assert_eq!(exec_limit, want.exec_limit);
        assert_eq!(shared_slots, want.shared_slots);
        assert_eq!(slot_dir, want.slot_dir);
        assert_eq!(slot_wait_timeout, want.slot_wait_timeout);
        assert_eq!(breaker, want.breaker);
        assert_eq!(reap_orphans, want.reap_orphans);
        assert_eq!(reap_interval, want.reap_interval);
        assert_eq!(slow_start, want.slow_start);
        assert_eq!(seal_key_file, want.seal_key_file);
    }

    #[test]
    fn values_carry_over_with_units() {
        let mut c = Config {
            endpoint: Some("tcp://127.0.0.1:2375".into()),
            ..Config::default()
        };
        c.daemon.slot_dir = Some("/run/corral-slots".into());
        c.daemon.slot_wait_timeout_ms = 1_500;
        c.daemon.reap_interval_ms = 0;
        c.daemon.start_limit = 2;
        let b = BackendConfig::from(&c);
        assert_eq!(b.endpoint.as_deref(), Some("tcp://127.0.0.1:2375"));
        assert_eq!(b.slot_dir, Some(PathBuf::from("/run/corral-slots")));
        assert_eq!(b.slot_wait_timeout, Duration::from_millis(1_500));
        assert_eq!(b.reap_interval, Duration::ZERO);
        assert_eq!(b.start_limit, 2);
    }
}
