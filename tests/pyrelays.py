"""Installs the Python relays the tests run, on first use, into a folder of
their own under cargo's target directory, and prints how to run them.

    python3 tests/pyrelays.py ROOT ENV

ENV is one of the environments below; ROOT is where they live
(tests/support/real.rs passes `<target>/pyrelays`). Each environment is a
virtualenv at ROOT/<env>-<hash> holding exactly the pinned packages; the
hash covers the pins and the Python version, so changing either installs
afresh beside the old one. Nothing outside ROOT is touched: no global or
user site-packages, pip's cache is ROOT/pip-cache.

Safe when several test binaries (or several `cargo test`s) start at once:
installing holds an exclusive lock on ROOT/<env>-<hash>.lock, and a
finished environment is marked by a `ready` file written last (atomically),
so a half-installed one (a killed run) is removed and installed again.

Where `python3 -m venv` is unavailable (Debian without python3-venv), the
packages go to ROOT/<env>-<hash>/site with `pip install --target` and run
with this interpreter and PYTHONPATH.

On success the last two lines of stdout are `python=<interpreter>` and
`pythonpath=<dir or empty>`. On failure (e.g. the package registry cannot
be reached) it exits 1 after one line starting with `pyrelays: error:`.
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import venv

# Pinned: rust-nostr's LocalRelay (tests/local_relay.py) and the PyPI
# nostr-relay (tests/pypi_nostr_relay.py). nostr-relay's dependencies are pinned
# too (the versions it was tested with): it predates most of them, and a
# newer uvicorn or websockets can break its monkeypatching.
ENVS = {
    "nostr-sdk": {
        "requirements": ["nostr-sdk==0.45.1"],
        "constraints": [],
    },
    "nostr-relay": {
        "requirements": ["nostr-relay==1.14"],
        "constraints": [
            "aiodns==4.0.4",
            "aiohappyeyeballs==2.7.1",
            "aiohttp==3.14.5",
            "aionostr==0.20.0",
            "aiosignal==1.4.0",
            "aiosqlite==0.22.1",
            "alembic==1.20.1",
            "annotated-types==0.8.0",
            "anyio==4.16.0",
            "attrs==26.1.0",
            "backports.zstd==1.8.0",
            "brotli==1.2.1",
            "cffi==2.1.1",
            "click==8.5.1",
            "coincurve==21.0.0",
            "cryptography==50.0.2",
            "falcon==4.4.0",
            "frozenlist==1.8.0",
            "greenlet==3.5.6",
            "gunicorn==27.0.1",
            "h11==0.16.0",
            "httptools==0.9.0",
            "idna==3.20",
            "Mako==1.4.3",
            "MarkupSafe==3.0.4",
            "multidict==7.2.1",
            "propcache==0.5.4",
            "pycares==5.2.1",
            "pycparser==3.12",
            "pydantic==2.14.4",
            "pydantic_core==2.50.5",
            "python-dotenv==1.2.4",
            "python-rapidjson==1.25",
            "PyYAML==6.0.4",
            "setproctitle==1.3.8",
            "SQLAlchemy==2.1.9",
            "typing_extensions==4.16.0",
            "typing-inspection==0.4.5",
            "uvicorn==0.54.0",
            "uvloop==0.23.0",
            "watchfiles==1.3.0",
            "websockets==17.4",
            "yarl==1.25.1",
        ],
    },
}


def fail(message):
    print(f"pyrelays: error: {message}", flush=True)
    sys.exit(1)


def key(name, spec):
    text = "\n".join(
        spec["requirements"]
        + spec["constraints"]
        + [f"python{sys.version_info.major}.{sys.version_info.minor}"]
    )
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def read_ready(home):
    try:
        with open(os.path.join(home, "ready")) as f:
            lines = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except OSError:
        return None
    python = lines.get("python", "")
    return lines if python and os.path.exists(python) else None


def pip(python, args, root, env_extra=None):
    env = dict(os.environ)
    env["PIP_CACHE_DIR"] = os.path.join(root, "pip-cache")
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(env_extra or {})
    command = [
        python,
        "-m",
        "pip",
        "install",
        "--no-input",
        "--retries",
        "2",
        "--timeout",
        "30",
    ] + args
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def install(name, spec, root, home):
    shutil.rmtree(home, ignore_errors=True)
    os.makedirs(home)
    constraints = os.path.join(home, "constraints.txt")
    with open(constraints, "w") as f:
        f.write("\n".join(spec["constraints"]) + "\n")
    packages = spec["requirements"] + ["-c", constraints]
    python = os.path.join(home, "venv", "bin", "python")
    pythonpath = ""
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(os.path.join(home, "venv"))
        code, output = pip(python, packages, root)
    except Exception as e:  # no ensurepip (Debian without python3-venv)
        print(f"pyrelays: python3 -m venv failed ({e}); using pip install --target", flush=True)
        shutil.rmtree(os.path.join(home, "venv"), ignore_errors=True)
        python = sys.executable
        pythonpath = os.path.join(home, "site")
        code, output = pip(python, ["--target", pythonpath] + packages, root)
    if code != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        print(tail, flush=True)
        fail(
            f"pip could not install {' '.join(spec['requirements'])} into {home} "
            f"(exit {code}); is the package registry (PyPI) reachable? pip said, last lines above"
        )
    ready = os.path.join(home, "ready.tmp")
    with open(ready, "w") as f:
        f.write(f"python={python}\npythonpath={pythonpath}\n")
    os.replace(ready, os.path.join(home, "ready"))


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ENVS:
        fail(f"usage: {sys.argv[0]} ROOT {{{'|'.join(ENVS)}}}")
    root = os.path.abspath(sys.argv[1])
    name = sys.argv[2]
    spec = ENVS[name]
    home = os.path.join(root, key(name, spec))
    ready = read_ready(home)
    if ready is None:
        os.makedirs(root, exist_ok=True)
        with open(home + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # Another process may have finished it while we waited.
            ready = read_ready(home)
            if ready is None:
                print(f"pyrelays: installing {' '.join(spec['requirements'])} into {home}", flush=True)
                install(name, spec, root, home)
                ready = read_ready(home)
    if ready is None:
        fail(f"{home} was installed but is not usable")
    print(f"python={ready['python']}")
    print(f"pythonpath={ready.get('pythonpath', '')}", flush=True)


main()
