//! Shared set-up of the service's real-daemon tests: the offline test
//! images, and finding (and removing) a test's containers by label.

#![allow(dead_code)]

pub mod service;

use std::process::Command;

pub const BUSYBOX: &str = "corral-test/busybox";

pub use corral_testing::images;

/// Containers labelled `corraltest=<label>`.
pub fn remaining(label: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=corraltest={label}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Removes the label's containers when dropped, so a failed test leaks nothing.
pub struct Guard(pub &'static str);

impl Drop for Guard {
    fn drop(&mut self) {
        let ids = remaining(self.0);
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f"])
                .args(&ids)
                .output();
        }
    }
}
