//! `grasp-sync status` against the running binary: the table with the
//! first sync and the own relay on top and problems first, the one log
//! line of a short first sync, and a clear error naming the address when
//! nothing, or something else, answers.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use support::real::{GraspSync, free_port};
use support::running::wait_for;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_grasp-sync");

fn status(args: &[&str], env: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("status")
        .args(args)
        .env_remove("GRASP_SYNC_METRICS");
    if let Some(addr) = env {
        cmd.env("GRASP_SYNC_METRICS", addr);
    }
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn status_prints_the_running_engines_relays_problems_first() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    // A relay that closes every connection unanswered. Its listener stays
    // bound for the whole test: a port given back was taken by a server
    // of the other test in this binary, and the "dead" relay answered.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("ws://127.0.0.1:{}", l.local_addr().unwrap().port());
        std::thread::spawn(move || l.incoming().for_each(drop));
        url
    };
    let owner = keys(1);
    own.publish(announcement(
        &owner,
        "repo",
        &[&a.url(), &dead, &own.url()],
        T0,
    ));
    let issue = root(&keys(2), 1621, &[&coord(&owner, "repo")], T0 + 1, "issue");
    a.publish(issue.clone());
    let addr = format!("127.0.0.1:{}", free_port());
    let info = [("RUST_LOG", "info")];
    let engine = GraspSync::start_logged(&own.url(), &["--metrics", &addr], &info);

    let mut out = String::new();
    assert!(
        wait_for(60, || {
            let o = status(&[], Some(&addr));
            out = text(&o.stdout);
            let done = out.lines().nth(1).is_some_and(|l| l.contains(", done "));
            o.status.success() && done && own.has(&issue.id)
        }),
        "the first sync completes: {out}"
    );
    let flag = status(&["--metrics", &addr], Some("127.0.0.1:1"));
    assert!(flag.status.success(), "the flag beats the variable");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("grasp-sync 0.1.0, shard 0/1, up "),
        "{out}"
    );
    assert!(
        lines[1].starts_with("first sync: 1/2 relays done (1 failing), 1 events stored, "),
        "{out}"
    );
    assert!(
        lines[2].starts_with(&format!("own relay {}: write open, read open; ", own.url())),
        "{out}"
    );
    let header = lines
        .iter()
        .position(|l| l.starts_with("STATE  "))
        .expect("a table");
    assert!(
        lines[header - 1].ends_with("2 relays, 1 with problems"),
        "{out}"
    );
    let (problem, healthy) = (lines[header + 1], lines[header + 2]);
    assert!(
        problem.contains(&dead) && problem.contains("in a row"),
        "{out}"
    );
    assert!(
        healthy.starts_with("live ") && healthy.contains(&a.url()),
        "{out}"
    );
    let log = engine.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("first sync")).collect();
    assert_eq!(lines.len(), 1, "one line, at the end: {lines:?}");
    let want = ": 1/2 relays (1 failing), 1 events stored";
    assert!(
        lines[0].contains(" INFO ") && lines[0].contains(want),
        "{}",
        lines[0]
    );
    engine.stop();
}

#[test]
fn status_names_the_address_when_nothing_or_something_else_answers() {
    let nothing = format!("127.0.0.1:{}", free_port());
    let o = status(&["--metrics", &nothing], None);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("no grasp-sync answers at {nothing}")),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = other.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = other.accept().unwrap();
        let _ = s.read(&mut [0u8; 1024]);
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"hello\": true}")
            .unwrap();
    });
    let o = status(&[], Some(&addr));
    server.join().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("{addr} answered, but not as grasp-sync's status")),
        "{err}"
    );

    let o = status(&["--metrics"], None);
    assert_eq!(o.status.code(), Some(2), "a usage error");
    let help = Command::new(BIN).arg("--help").output().unwrap();
    assert!(text(&help.stdout).contains("grasp-sync status [--metrics <ip:port>]"));
}
