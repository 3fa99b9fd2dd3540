#!/usr/bin/env python3
"""Checks the container example's configuration without a docker engine.

Usage: container_config.py COMPOSE_FILE DOCKERFILE BINARY

CI has the docker client but no engine and no compose plugin, and a fresh
machine has no PyYAML, so compose.yaml is read with the small parser
below. It takes only the block subset of YAML the file needs (mappings,
sequences of scalars, plain and quoted scalars, comments) and refuses the
rest (flow collections, anchors, tags, block scalars, tabs, duplicate
keys) instead of guessing, so the file stays in what is checked here.

What is checked: compose.yaml holds the two services, grasp-sync is built
from examples/docker/Dockerfile with the repository as context, its
metrics port is published on 127.0.0.1 only and matches the image's, its
state directory is a declared named volume, and every GRASP_SYNC_*
variable that compose.yaml or the Dockerfile sets is one the binary reads
(from `BINARY --help`), so a typo cannot silently leave a setting at its
default.
"""

import json
import os
import re
import subprocess
import sys

SERVICES = {"ngit-relay", "grasp-sync"}
TOP_LEVEL = {"name", "services", "volumes", "networks"}


class YamlError(Exception):
    pass


def strip_comment(line):
    """The line without a trailing comment: `#` starts one at the line's
    start or after a space, outside a quoted scalar (one whose quote
    opens it, after a space or at the start; an apostrophe inside a plain
    scalar opens nothing)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == "\\" and quote == '"':
                quote = "escape"
            elif quote == "escape":
                quote = '"'
            elif c == quote:
                quote = None
        elif c in "\"'" and (i == 0 or line[i - 1] == " "):
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] == " "):
            return line[:i]
    return line


def scalar(text, where):
    """A plain or quoted scalar, as a string (compose reads ports and
    booleans in environment as strings anyway)."""
    text = text.strip()
    if text.startswith('"'):
        try:
            value, end = json.JSONDecoder().raw_decode(text)
        except json.JSONDecodeError as e:
            raise YamlError(f"{where}: bad double-quoted scalar: {e}") from e
        if text[end:].strip():
            raise YamlError(f"{where}: text after a quoted scalar")
        return value
    if text.startswith("'"):
        if len(text) < 2 or not text.endswith("'"):
            raise YamlError(f"{where}: unterminated single-quoted scalar")
        return text[1:-1].replace("''", "'")
    if text[:1] in set("[]{}&*!|>%@`"):
        raise YamlError(f"{where}: {text[:1]!r} (flow, anchor, tag or block scalar) is not supported")
    return text


def lines_of(text):
    """(line number, indent, content) of every line that holds something."""
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlError(f"line {number}: tab in indentation")
        line = strip_comment(raw).rstrip()
        if line.strip():
            out.append((number, len(line) - len(line.lstrip(" ")), line.strip()))
    if out and out[0][2] == "---":
        out = out[1:]
    return out


def parse_block(lines, i, indent):
    """The mapping or sequence whose entries sit at `indent`, from line i;
    returns it and the index of the first line after it."""
    is_seq = lines[i][2] == "-" or lines[i][2].startswith("- ")
    node = [] if is_seq else {}
    while i < len(lines):
        number, ind, content = lines[i]
        if ind < indent:
            break
        where = f"line {number}"
        if ind > indent:
            raise YamlError(f"{where}: unexpected indentation")
        if is_seq != (content == "-" or content.startswith("- ")):
            raise YamlError(f"{where}: sequence and mapping entries mixed")
        if is_seq:
            item = content[1:].strip()
            if not item or re.match(r"^[^\"'][^:]*:(\s|$)", item):
                raise YamlError(f"{where}: only scalars are supported in sequences")
            node.append(scalar(item, where))
            i += 1
            continue
        match = re.match(r'^("(?:[^"\\]|\\.)*"|\'[^\']*\'|[^\s"\'#][^:]*?)\s*:(?:\s+(.*))?$', content)
        if not match:
            raise YamlError(f"{where}: expected `key: value` or `key:`")
        key = scalar(match.group(1), where)
        if key in node:
            raise YamlError(f"{where}: duplicate key {key!r}")
        value = match.group(2)
        i += 1
        if value is not None and value.strip():
            node[key] = scalar(value, where)
        elif i < len(lines) and lines[i][1] > indent:
            node[key], i = parse_block(lines, i, lines[i][1])
        elif i < len(lines) and lines[i][1] == indent and lines[i][2].startswith("- "):
            # A sequence may sit at its key's own indentation.
            node[key], i = parse_block(lines, i, indent)
        else:
            node[key] = None
    return node, i


def parse_yaml(text):
    lines = lines_of(text)
    if not lines:
        raise YamlError("empty file")
    if lines[0][1] != 0:
        raise YamlError(f"line {lines[0][0]}: the document must start at column 0")
    node, i = parse_block(lines, 0, 0)
    if i != len(lines):
        raise YamlError(f"line {lines[i][0]}: unexpected indentation")
    return node


def dockerfile_env(dockerfile_text):
    """The variables the runtime stage's ENV instructions set."""
    joined = re.sub(r"\\\n", " ", dockerfile_text)
    runtime = joined.split("\nFROM ")[-1]
    env = {}
    for line in runtime.splitlines():
        if line.startswith("ENV "):
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", line):
                env[key] = value
    return env


def check(compose, dockerfile_path, env_names):
    errors = []
    fail = errors.append
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(dockerfile_path))))
    if not isinstance(compose, dict):
        return ["the file is not a mapping"]
    if set(compose) - TOP_LEVEL:
        fail(f"unexpected top-level keys {sorted(set(compose) - TOP_LEVEL)}")
    services = compose.get("services") or {}
    if set(services) != SERVICES:
        fail(f"services are {sorted(services)}, expected {sorted(SERVICES)}")
    declared = set((compose.get("volumes") or {}).keys())
    for name, service in services.items():
        if not isinstance(service, dict) or not ("image" in service or "build" in service):
            fail(f"service {name} has neither image nor build")
            continue
        for dep in service.get("depends_on") or []:
            if dep not in services:
                fail(f"service {name} depends on unknown service {dep}")
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if not source.startswith((".", "/", "~")) and source not in declared:
                fail(f"service {name} mounts volume {source}, not declared under volumes:")
    relay = services.get("ngit-relay") or {}
    if not str(relay.get("image", "")).startswith("ghcr.io/danconwaydev/ngit-relay:"):
        fail("ngit-relay does not run ngit-relay's published image")
    sync = services.get("grasp-sync") or {}
    build = sync.get("build") or {}
    compose_dir = os.path.dirname(os.path.abspath(sys.argv[1]))
    context = os.path.normpath(os.path.join(compose_dir, build.get("context") or "."))
    if context != repo:
        fail(f"grasp-sync's build context is {context}, expected the repository root {repo}")
    dockerfile = os.path.join(context, build.get("dockerfile") or "Dockerfile")
    if os.path.abspath(dockerfile) != os.path.abspath(dockerfile_path):
        fail(f"grasp-sync is built from {dockerfile}, expected {dockerfile_path}")
    with open(dockerfile_path, encoding="utf-8") as f:
        image_env = dockerfile_env(f.read())
    environment = sync.get("environment") or {}
    if not isinstance(environment, dict):
        fail("grasp-sync's environment must be a mapping")
        environment = {}
    for source, names in (("compose.yaml", environment), ("the Dockerfile's ENV", image_env)):
        for var in names:
            if var.startswith("GRASP_SYNC_") and var not in env_names:
                fail(f"{source} sets {var}, which grasp-sync does not read")
    if "GRASP_SYNC_OWN_RELAY" not in environment:
        fail("grasp-sync's environment does not set GRASP_SYNC_OWN_RELAY")
    metrics_port = image_env.get("GRASP_SYNC_METRICS", "").rsplit(":", 1)[-1]
    ports = sync.get("ports") or []
    if not ports:
        fail("grasp-sync publishes no metrics port")
    for port in ports:
        parts = str(port).split(":")
        if len(parts) != 3 or parts[0] != "127.0.0.1":
            fail(f"grasp-sync publishes {port!r}, not on 127.0.0.1 only")
        elif parts[2] != metrics_port:
            fail(f"grasp-sync publishes container port {parts[2]}, the metrics are on {metrics_port}")
    state_dir = os.path.dirname(image_env.get("GRASP_SYNC_STATE_FILE", "/nowhere/"))
    mounts = {v.split(":")[1]: v.split(":")[0] for v in sync.get("volumes") or [] if ":" in v}
    if mounts.get(state_dir) not in declared:
        fail(f"grasp-sync's state directory {state_dir} is not on a named volume")
    return errors


def main():
    compose_path, dockerfile_path, binary = sys.argv[1:4]
    help_text = subprocess.run([binary, "--help"], check=True, capture_output=True, text=True).stdout
    env_names = set(re.findall(r"GRASP_SYNC_[A-Z0-9_]+", help_text))
    if not env_names:
        sys.exit(f"ci: `{binary} --help` names no GRASP_SYNC_* variable")
    with open(compose_path, encoding="utf-8") as f:
        try:
            compose = parse_yaml(f.read())
        except YamlError as e:
            sys.exit(f"ci: {compose_path}: {e}")
    errors = check(compose, dockerfile_path, env_names)
    for e in errors:
        print(f"ci: {compose_path}: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print(f"ci: {compose_path}: services {', '.join(sorted(compose['services']))}; settings checked")


if __name__ == "__main__":
    main()
