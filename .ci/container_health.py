#!/usr/bin/env python3
"""Runs the Dockerfile's HEALTHCHECK command against the binary.

Usage: container_health.py DOCKERFILE BINARY

The image has no curl, so its health check is a bash one-liner over
/dev/tcp that CI cannot run inside the image (no docker engine); this runs
that exact argv (parsed from the Dockerfile) on this machine, where the
binary built for the image runs, with bash as the image has it. It must
say healthy while /healthz answers 200, unhealthy while it answers 503 and
when nothing listens, and finish well within the check's --timeout.

The own relays are two listeners on 127.0.0.1 with OS-picked ports: one
that never answers (a link not up yet and not failed: healthy) and one
that closes every connection at once (failures in a row: unhealthy).
Every wait is bounded, and the engines and listeners are stopped at the
end, also on failure.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

# Generous: CI's machine is a loaded two-core one.
DEADLINE_SECS = 60


def healthcheck(dockerfile_text):
    """The HEALTHCHECK's exec-form command and its --timeout in seconds."""
    joined = re.sub(r"\\\n", " ", dockerfile_text)
    match = re.search(r"^HEALTHCHECK\s+(.*?)\bCMD\s+(\[.*\])\s*$", joined, re.M)
    if not match:
        sys.exit("ci: the Dockerfile has no exec-form HEALTHCHECK ... CMD [...]")
    timeout = re.search(r"--timeout=(\d+)s", match.group(1))
    return json.loads(match.group(2)), int(timeout.group(1)) if timeout else 30


def status(addr):
    """The status code /healthz answers, or None if nothing answers."""
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return int(s.makefile("rb").readline().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


def close_everything(sock, stop):
    """Accepts and closes every connection: a relay that always fails."""
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
            conn.close()
        except OSError:
            pass


def start_engine(binary, own_relay_port, extra_env):
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GRASP_SYNC_OWN_RELAY": f"ws://127.0.0.1:{own_relay_port}",
        "GRASP_SYNC_DOMAIN": "git.example.com",
        "GRASP_SYNC_METRICS": "127.0.0.1:0",
        "GRASP_SYNC_SHUTDOWN_TIMEOUT_SECS": "2",
        "RUST_LOG": "error",
        **extra_env,
    }
    engine = subprocess.Popen([binary], env=env, stdout=subprocess.PIPE, text=True)
    line = engine.stdout.readline()
    match = re.match(r"grasp-sync: metrics on (\S+)", line)
    if not match:
        engine.kill()
        sys.exit(f"ci: the engine printed {line!r}, expected its metrics address")
    return engine, match.group(1)


def probe(command, timeout, addr):
    """Runs the health check as the image would; True if it says healthy."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GRASP_SYNC_METRICS": addr}
    started = time.monotonic()
    try:
        done = subprocess.run(command, env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        sys.exit(f"ci: the health check took longer than its --timeout of {timeout} s")
    return done.returncode == 0, time.monotonic() - started, done.stderr.strip()


def wait_for(addr, wanted):
    deadline = time.monotonic() + DEADLINE_SECS
    while status(addr) != wanted:
        if time.monotonic() > deadline:
            sys.exit(f"ci: /healthz on {addr} never answered {wanted} in {DEADLINE_SECS} s")
        time.sleep(0.2)


def expect(command, timeout, addr, healthy, what):
    said, took, stderr = probe(command, timeout, addr)
    if said != healthy:
        sys.exit(f"ci: the health check said {'healthy' if said else 'unhealthy'} {what}: {stderr}")
    print(f"ci: health check {'healthy' if said else 'unhealthy'} {what} ({took:.2f} s)")


def stop(engine):
    """SIGTERM, the image's STOPSIGNAL: the engine must exit 0 by itself."""
    engine.send_signal(signal.SIGTERM)
    try:
        code = engine.wait(timeout=DEADLINE_SECS)
    except subprocess.TimeoutExpired:
        sys.exit("ci: the engine did not stop on SIGTERM")
    if code != 0:
        sys.exit(f"ci: the engine exited {code} on SIGTERM, expected 0")


def main():
    dockerfile, binary = sys.argv[1:3]
    with open(dockerfile, encoding="utf-8") as f:
        command, timeout = healthcheck(f.read())
    silent, rude, stopping = listener(), listener(), threading.Event()
    threading.Thread(target=close_everything, args=(rude, stopping), daemon=True).start()
    engines = []
    try:
        quiet, quiet_addr = start_engine(binary, silent.getsockname()[1], {})
        engines.append(quiet)
        failing, failing_addr = start_engine(
            binary, rude.getsockname()[1], {"GRASP_SYNC_BACKOFF_BASE_SECS": "1"}
        )
        engines.append(failing)
        wait_for(quiet_addr, 200)
        expect(command, timeout, quiet_addr, True, "while /healthz answers 200")
        wait_for(failing_addr, 503)
        expect(command, timeout, failing_addr, False, "while /healthz answers 503")
        stop(quiet)
        expect(command, timeout, quiet_addr, False, "with nothing listening")
    finally:
        for engine in engines:
            if engine.poll() is None:
                engine.kill()
                engine.wait()
        stopping.set()
        silent.close()
        rude.close()


if __name__ == "__main__":
    main()
