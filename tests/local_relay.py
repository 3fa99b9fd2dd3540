"""Starts rust-nostr's LocalRelay (from the nostr-sdk wheel) on 127.0.0.1 at
the port given as the first argument (the test asks the OS for a free one;
LocalRelay reports port 0 back when given 0), prints its URL on the first line of stdout, and runs until
killed or stdin closes. Used by tests/support/real.rs; limits are raised so the
relay's own defaults (60 events/min) do not throttle test setup.

`--auth read|write|both` makes the relay require NIP-42 AUTH (LocalRelay's
own `nip42` option) for REQs, EVENTs, or both; without it nothing is
required.

`--max-filter-limit N` caps the stored events LocalRelay returns per filter
at N (its own `max_filter_limit` option; its default is 500), as khatru
relays cap them at 100.

`--max-reqs N` lets a connection hold N open subscriptions (its
`RateLimit.max_reqs`; 500 by default, 5000 here otherwise); one more is
refused with `CLOSED "rate-limited: too many REQs"`.

Run with the interpreter tests/pyrelays.py installed nostr-sdk for (the
tests do; `python3` works too where nostr-sdk==0.45.1 is installed)."""

import argparse
import asyncio
import sys

from nostr_sdk import (
    LocalRelayBuilder,
    LocalRelayBuilderNip42,
    LocalRelayBuilderNip42Mode,
    RateLimit,
)

AUTH_MODES = {
    "read": LocalRelayBuilderNip42Mode.READ,
    "write": LocalRelayBuilderNip42Mode.WRITE,
    "both": LocalRelayBuilderNip42Mode.BOTH,
}


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--auth", choices=sorted(AUTH_MODES))
    parser.add_argument("--max-filter-limit", type=int)
    parser.add_argument("--default-rate-limit", action="store_true")
    parser.add_argument("--max-reqs", type=int)
    args = parser.parse_args()
    builder = LocalRelayBuilder().addr("127.0.0.1").port(args.port)
    if not args.default_rate_limit:
        builder = builder.rate_limit(RateLimit(max_reqs=args.max_reqs or 5000, notes_per_minute=1_000_000))
    if args.auth:
        builder = builder.nip42(LocalRelayBuilderNip42(mode=AUTH_MODES[args.auth]))
    if args.max_filter_limit is not None:
        builder = builder.max_filter_limit(args.max_filter_limit)
    relay = builder.build()
    try:
        await relay.run()
    except Exception as e:  # noqa: BLE001 - the test reads why, e.g. a port taken meanwhile
        print(f"error: {e}", flush=True)
        sys.exit(1)
    print(await relay.url(), flush=True)
    loop = asyncio.get_running_loop()
    # Exit when the test closes our stdin (or dies), so no relay outlives it.
    await loop.run_in_executor(None, sys.stdin.read)
    relay.shutdown()


asyncio.run(main())
