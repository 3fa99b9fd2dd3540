//! The `grasp-sync` binary: flags, environment, exit codes, SIGTERM.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use support::running::wait_for;

const BIN: &str = env!("CARGO_BIN_EXE_grasp-sync");

#[test]
fn usage_errors_are_one_line_with_exit_code_2() {
    for args in [
        vec!["--bogus"],
        vec![],
        vec!["--own-relay", "http://x"],
        vec!["--own-relay", "ws://x", "--page-limit", "abc"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("GRASP_SYNC_OWN_RELAY")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line: {err}"
        );
    }
    let out = Command::new(BIN)
        .env("GRASP_SYNC_OWN_RELAY", "not a url")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("GRASP_SYNC_OWN_RELAY"));
}

#[test]
fn help_documents_every_flag_and_its_env_var() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--own-relay",
        "--domain",
        "--bootstrap",
        "--metrics",
        "--allow-private-addresses",
        "--batch-window-ms",
        "--backoff-base-secs",
        "--backoff-max-secs",
        "--quick-reconnect-secs",
        "--consolidation-threshold",
        "--consolidation-timeout-secs",
        "--disconnect-check-secs",
        "--daily-min-secs",
        "--daily-max-secs",
        "--page-limit",
    ] {
        assert!(help.contains(flag), "{flag}");
        let env = format!(
            "GRASP_SYNC_{}",
            flag.trim_start_matches('-')
                .to_uppercase()
                .replace('-', "_")
        );
        assert!(help.contains(&env), "{env}");
    }
}

#[test]
fn sigterm_exits_cleanly_within_the_deadline() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let mut child = Command::new(BIN)
        .args([
            "--own-relay",
            &own.url(),
            "--allow-private-addresses",
            "--shutdown-timeout-secs",
            "3",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for(30, || own.connection_count() >= 2),
        "self-subscription and sink connected"
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let start = Instant::now();
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "exited within the deadline"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(0));
    assert!(
        wait_for(30, || own.connection_count() == 0),
        "sockets closed"
    );
}

#[test]
fn version_prints_the_name_and_the_crate_version() {
    for flag in ["--version", "-V"] {
        let out = Command::new(BIN).arg(flag).output().unwrap();
        assert!(out.status.success(), "{flag}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("grasp-sync {}\n", env!("CARGO_PKG_VERSION")),
            "{flag}"
        );
    }
    assert_eq!(env!("CARGO_PKG_VERSION"), "0.1.0");
}

/// `--metrics 127.0.0.1:0` lets the kernel pick the port and says which on
/// stdout, so nobody has to pick a free port and race for it; the page
/// names the shard.
#[test]
fn metrics_on_port_zero_reports_the_address_it_got() {
    use std::io::{BufRead, BufReader, Read, Write};
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let mut child = Command::new(BIN)
        .args(["--own-relay", &own.url(), "--allow-private-addresses"])
        .args(["--metrics", "127.0.0.1:0", "--shard", "1/3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: std::net::SocketAddr = line
        .strip_prefix("grasp-sync: metrics on ")
        .unwrap_or_else(|| panic!("first stdout line: {line:?}"))
        .trim()
        .parse()
        .unwrap();
    assert_ne!(addr.port(), 0);
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        page.contains("\ngrasp_sync_shard{index=\"1\",count=\"3\"} 1\n"),
        "{page}"
    );
}

/// Errors found only when the shell starts (a port in use, a CA file that
/// cannot be read) name the flag or variable to fix, like parse errors.
#[test]
fn start_up_errors_name_their_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let start = |args: &[&str], env: &[(&str, &str)]| {
        let mut child = Command::new(BIN)
            .args(["--own-relay", "ws://127.0.0.1:9"])
            .args(args)
            .env_remove("GRASP_SYNC_METRICS")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A binary that started anyway would run forever: fail instead.
        if !wait_for(60, || child.try_wait().unwrap().is_some()) {
            let _ = child.kill();
            panic!("{args:?} {env:?}: started despite the error");
        }
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = start(&["--metrics", &addr], &[]);
    assert!(
        err.starts_with(&format!("grasp-sync: --metrics: metrics on {addr}: ")),
        "{err}"
    );
    assert!(err.contains("in use"), "{err}");
    let err = start(&[], &[("GRASP_SYNC_METRICS", &addr)]);
    assert!(err.starts_with("grasp-sync: GRASP_SYNC_METRICS: "), "{err}");
    let err = start(&["--extra-ca-file=/nonexistent"], &[]);
    assert!(
        err.starts_with("grasp-sync: --extra-ca-file: tls: /nonexistent: "),
        "{err}"
    );
    drop(taken);
}

/// `demo --help` prints the demo's own flags (it used to answer "unknown
/// flag"), and an unknown demo flag points there.
#[test]
fn demo_help_lists_the_demo_flags() {
    for help in ["--help", "-h"] {
        let out = Command::new(BIN).args(["demo", help]).output().unwrap();
        assert!(out.status.success(), "{help}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("Usage:\n  grasp-sync demo"), "{text}");
        for flag in [
            "--relays <N>",
            "--repos <M>",
            "--events <K>",
            "--seed <S>",
            "--timeout-secs <SECS>",
            "--idle-secs <SECS>",
            "--tls\n",
            "--chaos\n",
            "--busy <N>",
            "--shards <N>",
            "--unfinished-kib <KIB>",
        ] {
            assert!(text.contains(&format!("  {flag}")), "{flag}: {text}");
        }
    }
    let out = Command::new(BIN)
        .args(["demo", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("see demo --help"));
}

/// SIGHUP is SIGTERM: the state is saved and the exit is clean (the
/// kernel's default for it killed the binary, exit 129, without saving).
#[test]
fn sighup_saves_state_and_exits_cleanly() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let dir = std::env::temp_dir().join(format!("grasp-ext-sighup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    let mut child = Command::new(BIN)
        .args(["--own-relay", &own.url(), "--allow-private-addresses"])
        .args(["--shutdown-timeout-secs", "3", "--state-file"])
        .arg(&state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for(30, || own.connection_count() >= 2),
        "self-subscription and sink connected"
    );
    assert!(!state.exists(), "nothing saved before the signal");
    let status = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    if !wait_for(30, || child.try_wait().unwrap().is_some()) {
        let _ = child.kill();
        panic!("still running after SIGHUP");
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let saved = std::fs::read_to_string(&state).expect("state saved on SIGHUP");
    assert!(saved.starts_with('{'), "{saved}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The log says what runs and why things fail: one start-up line with
/// the version, shard and effective settings (the AUTH key as its public
/// key only), and each failed connect with its cause.
#[test]
fn the_log_has_a_start_up_line_and_failures_with_their_cause() {
    use nostr::prelude::{Keys, ToBech32};
    use std::io::{BufRead, BufReader};
    let dir = std::env::temp_dir().join(format!("grasp-ext-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let keys = Keys::generate();
    let key_file = dir.join("key");
    std::fs::write(&key_file, keys.secret_key().to_secret_hex()).unwrap();
    // A port nobody listens on: every connect is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let own = format!("ws://127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    let mut child = Command::new(BIN)
        .args(["--own-relay", &own, "--shard", "1/3", "--auth-key-file"])
        .arg(&key_file)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let (mut start_up, mut failure) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while (start_up.is_none() || failure.is_none()) && Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        if line.contains(" starting: ") {
            start_up = Some(line);
        } else if line.contains(&format!("{own} failed: ")) {
            failure = Some(line);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    std::fs::remove_dir_all(&dir).unwrap();
    let start_up = start_up.expect("a start-up line");
    for needle in [
        format!("grasp-sync {} starting: ", env!("CARGO_PKG_VERSION")),
        "shard=1/3 ".to_owned(),
        format!("own-relay={own} "),
        format!("auth-key={} ", keys.public_key().to_bech32().unwrap()),
        "page-limit=500 ".to_owned(),
    ] {
        assert!(start_up.contains(&needle), "{needle} in {start_up}");
    }
    assert!(start_up.contains(" INFO "), "{start_up}");
    assert!(
        !start_up.contains(&keys.secret_key().to_secret_hex()),
        "no secret: {start_up}"
    );
    let failure = failure.expect("a failure line");
    assert!(failure.contains("Connection refused"), "{failure}");
    assert!(failure.contains("; retry in "), "{failure}");
}

/// A state file that cannot be written is said with the flag that names
/// it, at start (exit 2), not at the first save minutes later.
#[test]
fn a_state_file_that_cannot_be_written_names_its_flag() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let state = "/nonexistent/grasp-sync/state.json";
    let out = Command::new(BIN)
        .args(["--own-relay", &own.url(), "--allow-private-addresses"])
        .args(["--state-file", state])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains(&format!("--state-file: {state}: ")), "{log}");
    assert!(log.contains("cannot create"), "{log}");
}
