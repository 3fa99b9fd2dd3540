"""Starts the PyPI `nostr-relay` (1.14, sqlite) on 127.0.0.1 at the port given
as the first argument, with its data and config in DIR, prints its URL on the
first line of stdout once it accepts connections, and runs until killed or
stdin closes. Used by tests/support/real.rs (`NostrRelay`); run with the
interpreter tests/pyrelays.py installed it for.

    python pypi_nostr_relay.py PORT --dir DIR [--max-limit N]

The config is the package's own format (YAML read by nostr_relay.config;
see its config.yaml), written to DIR/config.yaml:

- `max_limit` (default 100 here, 6000 in the package): the most stored
  events one REQ returns. nostr-relay runs a REQ as one SQL query (its
  filters OR-ed together), so this caps all filters of a REQ together, and
  the query's LIMIT is min(the last filter's `limit`, max_limit).
- storage validators: only `is_signed`. The package's sample config also
  has `is_recent` (events older than a year are refused), which would
  refuse the tests' fixed, backdated timestamps.
- everything else as the package ships it: 32 subscriptions per connection
  (the 33rd gets `NOTICE "rejected: too many subscriptions"`), no rate
  limits, no authentication, NIP-11 without a `limitation` object.

Served by uvicorn in one process (the package's `serve --use-uvicorn`),
after the package's alembic migrations create the database, as `serve`
does. Two quirks of its SQL worth knowing: `until` is exclusive
(`created_at < until`) and results are ordered by `created_at` only.
"""

import argparse
import os
import socket
import sys
import threading
import time

CONFIG = """\
DEBUG: false
relay_name: grasp-sync test relay
relay_description: nostr-relay 1.14 run by grasp-sync's tests
storage:
  sqlalchemy.url: sqlite+aiosqlite:///{db}
  validators:
    - nostr_relay.validators.is_signed
gunicorn:
  bind: 127.0.0.1:{port}
  workers: 1
  loglevel: warning
authentication:
  enabled: false
max_limit: {max_limit}
max_event_size: 65536
logging:
  version: 1
  disable_existing_loggers: false
  root:
    level: WARNING
"""


def watch(port, deadline):
    """Prints the URL once the port accepts, then exits when stdin closes."""
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        print("nostr-relay did not start listening", flush=True)
        os._exit(1)
    print(f"ws://127.0.0.1:{port}", flush=True)
    # Exit when the test closes our stdin (or dies), so no relay outlives it.
    sys.stdin.read()
    os._exit(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--max-limit", type=int, default=100)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    config = os.path.join(args.dir, "config.yaml")
    with open(config, "w") as f:
        f.write(
            CONFIG.format(
                db=os.path.abspath(os.path.join(args.dir, "nostr.sqlite3")),
                port=args.port,
                max_limit=args.max_limit,
            )
        )
    os.chdir(args.dir)
    threading.Thread(
        target=watch, args=(args.port, time.monotonic() + 60), daemon=True
    ).start()
    from nostr_relay.cli import main as cli

    cli(["-c", config, "serve", "--use-uvicorn"], standalone_mode=False)
    # uvicorn returned: the server stopped (or never started).
    os._exit(1)


main()
