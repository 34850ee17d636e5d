//! What ends a command whose background job writes to its output: the main
//! process's exit (the default), or the output streams' close
//! (`wait_for_output`, what `docker exec` does), bounded by the timeout.
//!
//! Each test makes its own container (removed by a guard even on failure)
//! and skips only when no Docker daemon answers.

// Each test binary uses its own part of the shared harness.
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use support::{docker_available, processes, req, Client, Opts, Sandbox};

macro_rules! need_docker {
    () => {
        if !docker_available() {
            return;
        }
    };
}

/// A foreground line, then a job that prints two seconds later and then
/// leaves a mark in the file system.
const JOB: &str = "echo fg; (sleep 2; echo bg; touch /tmp/late) &";

fn exists(c: &mut Client, path: &str) -> bool {
    c.run(&["test", "-e", path]).report().exit_code == Some(0)
}

#[test]
fn by_default_the_command_ends_with_its_main_process_and_the_job_dies_writing() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    let t0 = Instant::now();
    let o = c.sh(JOB);
    let took = t0.elapsed();
    assert_eq!(o.out(), "fg\n");
    assert_eq!(o.report().exit_code, Some(0));
    assert!(!o.report().timed_out);
    assert!(
        took < Duration::from_secs(2),
        "waited for the job: {took:?}"
    );

    // The job's `echo bg` hits the closed pipe (SIGPIPE), so its later file
    // write never happens.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!exists(&mut c, "/tmp/late"), "the job outlived its write");
}

#[test]
fn waiting_for_output_returns_the_jobs_output_and_the_main_exit_code() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    let mut r = req(&["sh", "-c", &format!("{JOB} exit 3")]);
    r.wait_for_output = true;
    let t0 = Instant::now();
    let o = c.run_req(&r);
    let took = t0.elapsed();
    assert_eq!(o.out(), "fg\nbg\n");
    let rep = o.report();
    assert_eq!(
        (rep.exit_code, rep.signal, rep.timed_out),
        (Some(3), None, false)
    );
    assert!(took >= Duration::from_secs(2), "did not wait: {took:?}");
    assert!(rep.duration_us >= 2_000_000, "{rep:?}");
    assert_eq!(rep.stdout.total_bytes, 6);

    // The job ran to its end: it is not killed once the streams closed.
    std::thread::sleep(Duration::from_millis(300));
    assert!(exists(&mut c, "/tmp/late"));
}

#[test]
fn waiting_for_output_leaves_processes_that_closed_the_streams_running() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    // Like `docker exec`: a job with its output redirected does not hold the
    // command, and is not killed when the command ends.
    let mut r = req(&[
        "sh",
        "-c",
        "(sleep 2; touch /tmp/quiet) >/dev/null 2>&1 & echo fg",
    ]);
    r.wait_for_output = true;
    let t0 = Instant::now();
    let o = c.run_req(&r);
    assert_eq!(o.out(), "fg\n");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    std::thread::sleep(Duration::from_secs(3));
    assert!(exists(&mut c, "/tmp/quiet"));
}

#[test]
fn waiting_for_output_is_bounded_by_the_timeout_which_kills_every_holder() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    // One job in the command's process group, one that escaped into a
    // session of its own (re-parented to PID 1 once `sh` exits): both hold
    // stdout, both must die at the deadline.
    let mut r = req(&[
        "sh",
        "-c",
        "echo fg; (sleep 30; echo bg) & setsid sh -c 'sleep 31; touch /tmp/never' & exit 0",
    ]);
    r.timeout_ms = Some(1500);
    r.wait_for_output = true;
    let t0 = Instant::now();
    let o = c.run_req(&r);
    let took = t0.elapsed();
    let rep = o.report();
    assert!(rep.timed_out, "{rep:?}");
    // The main process exited on its own: its status is the one reported.
    assert_eq!(rep.exit_code, Some(0), "{rep:?}");
    assert_eq!(o.out(), "fg\n");
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");

    std::thread::sleep(Duration::from_millis(300));
    let ps = processes(&mut c);
    assert!(!ps.iter().any(|(_, cmd)| cmd.contains("sleep")), "{ps:?}");
}

#[test]
fn a_timeout_before_the_main_exit_also_kills_escaped_holders() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut c = sb.client();

    let mut r = req(&["sh", "-c", "setsid sh -c 'sleep 40' & sleep 41"]);
    r.timeout_ms = Some(500);
    r.wait_for_output = true;
    let o = c.run_req(&r);
    assert!(o.report().timed_out, "{:?}", o.report());
    std::thread::sleep(Duration::from_millis(300));
    let ps = processes(&mut c);
    assert!(!ps.iter().any(|(_, cmd)| cmd.contains("sleep")), "{ps:?}");
}

#[test]
fn a_new_session_ends_a_command_still_waiting_for_output() {
    need_docker!();
    let sb = Sandbox::start(Opts::default());
    let mut old = sb.client();

    // No timeout: only the session's end can stop this wait.
    let mut r = req(&["sh", "-c", "echo fg; setsid sleep 300 &"]);
    r.timeout_ms = None;
    r.wait_for_output = true;
    let id = old.fresh_id();
    old.exec(id, &r);
    std::thread::sleep(Duration::from_millis(500));
    drop(old);

    let mut c = sb.client();
    std::thread::sleep(Duration::from_millis(500));
    let ps = processes(&mut c);
    assert!(!ps.iter().any(|(_, cmd)| cmd.contains("sleep")), "{ps:?}");
}
