//! The engine contract: one suite of cases that every backend must pass,
//! run through the runtime against a real engine (a Docker daemon, a
//! Kubernetes cluster).
//!
//! A backend's test file describes the engine under test as a [`Target`]
//! and expands [`contract_suite!`](crate::contract_suite) into one
//! `#[tokio::test]` per case, so the same assertions run against every
//! engine and cannot drift apart. The cases assert on what a user of the
//! runtime sees: commands (echo, exit codes, separate streams, stdin, a
//! terminal (an interactive shell typed into, resized, interrupted), the
//! output cap, a timeout killing the whole tree, many commands on one
//! sandbox, a missing image typed), limits (an OOM of a command and of PID
//! 1 typed), recovery (a sandbox removed out of band is `container_lost`
//! under `fail` and replaced under `recreate`), files, shells, pools,
//! snapshots and forks of sandboxes that reset in place, and usage (a
//! command's CPU time and peak memory; a sandbox's usage from the engine
//! and from its agent), and in-place reset (a reset pristine sandbox reads
//! as a new one, the agent's extra capabilities never reach a command, a
//! pristine pool, the fallback to replacement saying why).
//! After every case, failed or not, nothing of it is left: the suite
//! asserts so and sweeps what is.
//!
//! What only one engine has (Docker's pids limit and hardened mounts,
//! gVisor, Kubernetes' refusals) stays in that backend's own tests.

mod archives;
mod commands;
mod files;
mod limits;
mod pools;
mod pty;
mod recovery;
mod reset;
mod shells;
mod snapshots;
mod usage;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::{Backend, CommandSpec, Runtime, Sandbox, SandboxSpec};
use futures_util::FutureExt;

pub use archives::*;
pub use commands::*;
pub use files::*;
pub use limits::*;
pub use pools::*;
pub use pty::*;
pub use recovery::*;
pub use reset::*;
pub use shells::*;
pub use snapshots::*;
pub use usage::*;

/// The label every sandbox of a case carries (value: the case's
/// [`Case::label`]), by which its leftovers are found.
pub const TEST_LABEL: &str = "corraltest";

/// A boxed future, as [`Target`]'s methods and the cases return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The engine under test, as one backend's test file describes it.
pub trait Target: Send + Sync + 'static {
    /// The engine's name, for messages ("Docker", "Kubernetes").
    fn engine(&self) -> &'static str;

    /// A runtime over the backend under test, made for this case alone
    /// (cases read its metrics).
    fn runtime(&self) -> &Runtime;

    /// The spec every case starts from: the engine's hardened default,
    /// less what the engine cannot express, with an image that has a
    /// busybox shell and tools.
    fn base_spec(&self) -> SandboxSpec;

    /// The engine's ids (full container ids, pod names) of every sandbox
    /// still there whose [`TEST_LABEL`] is `label`, being deleted or not,
    /// found by asking the engine directly rather than through the
    /// backend under test.
    fn leftovers<'a>(&'a self, label: &'a str) -> BoxFuture<'a, Vec<String>>;

    /// Removes every sandbox whose [`TEST_LABEL`] is `label`, directly on
    /// the engine; a failed case's sandboxes go this way.
    fn sweep<'a>(&'a self, label: &'a str) -> BoxFuture<'a, ()>;

    /// How long a removed sandbox may take to disappear from
    /// [`Target::leftovers`] (deletion is asynchronous on a cluster).
    fn removal_grace(&self) -> Duration {
        Duration::ZERO
    }
}

/// One case running against one [`Target`]: the target and the case's
/// unique label.
pub struct Case {
    target: Box<dyn Target>,
    name: &'static str,
    label: String,
}

impl Case {
    /// The case's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The value of [`TEST_LABEL`] on this case's sandboxes: the case's
    /// name and this process's id, so concurrent runs of the suite on a
    /// shared engine do not see each other's sandboxes. A valid
    /// Kubernetes label value (at most 63 characters).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The engine's name.
    pub fn engine(&self) -> &'static str {
        self.target.engine()
    }

    /// The runtime under test.
    pub fn runtime(&self) -> &Runtime {
        self.target.runtime()
    }

    /// The backend under test.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        self.target.runtime().backend()
    }

    /// The target's base spec, labelled for this case.
    pub fn spec(&self) -> SandboxSpec {
        let mut spec = self.target.base_spec();
        spec.labels.insert(TEST_LABEL.into(), self.label.clone());
        spec
    }

    /// A sandbox from `spec`; panics naming the engine if it cannot start.
    pub async fn create(&self, spec: &SandboxSpec) -> Sandbox {
        match self.runtime().create(spec).await {
            Ok(sb) => sb,
            Err(e) => panic!("{}: create: {e}", self.engine()),
        }
    }

    /// Removes `sb`'s container or pod behind the runtime's back, as an
    /// operator or the engine would: through [`Backend::remove`] on its
    /// placement, so the same case works on every engine. The runtime is
    /// not told; it learns from the engine.
    pub async fn remove_out_of_band(&self, sb: &Sandbox) {
        if let Err(e) = self.backend().remove(&sb.placement(), sb.id()).await {
            panic!("{}: removing {} out of band: {e}", self.engine(), sb.id());
        }
    }

    /// The engine's ids of this case's sandboxes still there.
    pub async fn leftovers(&self) -> Vec<String> {
        self.target.leftovers(&self.label).await
    }

    /// Waits (up to the target's removal grace) until nothing of this
    /// case is left; returns what still is.
    async fn settle(&self) -> Vec<String> {
        let until = Instant::now() + self.target.removal_grace();
        loop {
            let left = self.leftovers().await;
            if left.is_empty() || Instant::now() >= until {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// A case of the suite, as [`contract_suite!`](crate::contract_suite)
/// passes it to [`run`].
pub type CaseFn = for<'a> fn(&'a Case) -> BoxFuture<'a, ()>;

/// Runs case `name` against `target`, then asserts that nothing of it is
/// left. Whatever happens (a failed assertion included) its sandboxes
/// are swept before the case's failure is reported.
pub async fn run(target: Box<dyn Target>, name: &'static str, case: CaseFn) {
    let label = format!(
        "{}-{}",
        &name[..name.len().min(50)].trim_end_matches('_'),
        std::process::id()
    );
    let c = Case {
        target,
        name,
        label,
    };
    let outcome = AssertUnwindSafe(case(&c)).catch_unwind().await;
    let left = match &outcome {
        Ok(()) => c.settle().await,
        Err(_) => Vec::new(),
    };
    if outcome.is_err() || !left.is_empty() {
        c.target.sweep(&c.label).await;
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    assert!(
        left.is_empty(),
        "{}: case {name} left sandboxes behind: {left:?}",
        c.engine()
    );
}

/// A shell command with a generous timeout, so a hung case fails instead
/// of hanging the suite.
pub fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell(script).timeout(Duration::from_secs(60))
}

/// Bytes as text, for assertions and messages.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// What a shell in the sandbox prints for `script`, which must succeed.
pub async fn out(sb: &Sandbox, script: &str) -> String {
    let r = sb.run(&sh(script)).await;
    assert_eq!(r.failure, None, "{script}: {r:?}");
    text(&r.stdout)
}

/// Expands to one `#[tokio::test(flavor = "multi_thread")]` per contract
/// case, each running the case against the target that `$target` makes.
///
/// `$target` is an `async fn(case: &str) -> Option<Box<dyn Target>>`: the
/// engine under test, made fresh for each case, or `None` when it is not
/// available, after saying so on stderr (the case then passes as
/// skipped). The test crate must depend on `tokio` (with `macros`).
#[macro_export]
macro_rules! contract_suite {
    ($target:path) => {
        $crate::contract_suite!(@cases $target;
            // Commands.
            runs_commands_with_exit_codes_and_separate_streams,
            stdin_is_forwarded_and_absent_stdin_is_eof,
            output_is_capped_head_and_tail_and_binary_safe,
            timeout_kills_the_whole_process_tree,
            commands_multiplex_on_one_sandbox,
            a_fork_bomb_meets_the_pids_limit_and_the_sandbox_lives,
            a_missing_image_is_image_not_found_and_leaves_nothing,
            pty_runs_an_interactive_shell,
            // Limits.
            oom_kill_is_attributed_to_the_command,
            pid1_oom_is_reported_as_oom_killed,
            // Recovery.
            removed_out_of_band_is_container_lost_under_fail,
            removed_out_of_band_is_replaced_under_recreate,
            // Files.
            files_round_trip_every_byte_value_and_a_large_random_file,
            files_tmpfs_works_and_a_read_only_root_still_takes_tmp,
            files_too_large_is_refused_with_nothing_written,
            files_missing_paths_are_not_found_and_bad_input_is_refused,
            files_paths_cannot_escape_the_root,
            files_mode_is_honoured_and_kept,
            files_directories_list_with_types_sizes_modes_and_targets,
            files_on_a_sandbox_removed_out_of_band_fail_typed,
            archives_directory_trees_go_up_and_come_back_as_tar,
            archives_hostile_ones_are_refused_and_write_nothing,
            // Shells.
            shell_state_persists_between_commands,
            shell_timeouts_interrupt_the_command_and_keep_the_session,
            shell_named_sessions_are_independent_and_exit_ends_one,
            shell_killed_by_the_oom_killer_is_oom_killed,
            // Usage.
            usage_of_commands_counts_cpu_and_peak_memory,
            usage_of_the_sandbox_moves_with_what_it_does,
            // Pools.
            pool_same_key_same_sandbox_until_released,
            pool_warm_hands_over_started_sandboxes_and_refills,
            // Snapshots and forks.
            snapshot_forks_of_n_have_the_files_and_reset_to_the_snapshot,
            snapshot_a_fork_of_a_fork_has_both_layers,
            snapshot_fork_is_all_or_nothing,
            snapshot_a_durable_delta_outlives_its_runtime,
            // In-place reset.
            reset_in_place_is_indistinguishable_from_a_new_sandbox,
            reset_in_place_commands_get_none_of_the_agents_privileges,
            reset_in_place_clears_ipc_objects_and_dev,
            reset_in_place_undoes_writes_to_sys_and_pid1,
            reset_in_place_serves_a_pristine_pool,
            reset_replaces_what_cannot_reset_in_place_and_says_why,
        );
    };
    (@cases $target:path; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread")]
            async fn $case() {
                fn case(c: &$crate::contract::Case) -> $crate::contract::BoxFuture<'_, ()> {
                    ::std::boxed::Box::pin($crate::contract::$case(c))
                }
                let Some(target) = $target(stringify!($case)).await else {
                    return;
                };
                $crate::contract::run(target, stringify!($case), case).await;
            }
        )*
    };
}
