"""Starts rust-nostr's LocalRelay (from the nostr-sdk wheel) on 127.0.0.1 at
the port given as the first argument (the test asks the OS for a free one;
LocalRelay reports port 0 back when given 0), prints its URL on the first line of stdout, and runs until
killed or stdin closes. Used by tests/support/real.rs; limits are raised so the
relay's own defaults (60 events/min) do not throttle test setup.

`--auth read|write|both` makes the relay require NIP-42 AUTH (LocalRelay's
own `nip42` option) for REQs, EVENTs, or both; without it nothing is
required."""

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
    args = parser.parse_args()
    builder = (
        LocalRelayBuilder()
        .addr("127.0.0.1")
        .port(args.port)
        .rate_limit(RateLimit(max_reqs=5000, notes_per_minute=1_000_000))
    )
    if args.auth:
        builder = builder.nip42(LocalRelayBuilderNip42(mode=AUTH_MODES[args.auth]))
    relay = builder.build()
    await relay.run()
    print(await relay.url(), flush=True)
    loop = asyncio.get_running_loop()
    # Exit when the test closes our stdin (or dies), so no relay outlives it.
    await loop.run_in_executor(None, sys.stdin.read)
    relay.shutdown()


asyncio.run(main())
