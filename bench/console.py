"""The consoles on the tutorial's deployment: how long each page takes, what load it puts on an
owner (``make console-bench``).

docs/tutorial.md's commands up to the clinics' sketches run in a scratch directory
(:mod:`tests.console.clinics`); the owners are then restarted with their metrics on
(``metrics-port`` added to each owner's config), and one console per role starts on its own
certificate (``dpmarket console --config PARTY.toml``). Each page is fetched as a signed-in
program would (``Authorization: Bearer``), once to warm up and then ``--repeat`` times, and its
wall time from request to the last byte is recorded. The young clinic's own metrics are read
before and after: the RPCs it served while the pages were fetched, by method, against the RPCs
the pages make (one health check per owner page and per curator page; none for the consumer's).

Writes ``{"pages": {name: {"first_seconds", "median_seconds", "max_seconds", "runs"}},
"owner_rpcs": {...}, "expected_owner_rpcs": {...}}`` into ``--out`` (merged into an existing JSON
file); ``first_seconds`` is the warm-up fetch (the console's first answer to that form).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.console.clinics import SIGN_IN, deploy, environment, stop

ROLES = {"consumer": "consumer.toml", "owner": "owner-young.toml", "curator": "curator.toml"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn_console(clinics: Path, config: str) -> subprocess.Popen[str]:
    command = ["console", "--config", str(clinics / config)]
    return subprocess.Popen(
        [sys.executable, "-m", "dpmarket.deploy.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(),
    )


def _console_address(process: subprocess.Popen[str], role: str) -> tuple[str, str]:
    assert process.stdout is not None
    for line in process.stdout:
        found = SIGN_IN.search(line)
        if found:
            return found.group(1), found.group(2)
    raise RuntimeError(f"the {role} console printed no address")


def _fetch(url: str, token: str, data: bytes | None = None, kind: str = "") -> float:
    request = urllib.request.Request(url, data=data)
    request.add_header("Authorization", f"Bearer {token}")
    if kind:
        request.add_header("Content-Type", kind)
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
        assert response.status == 200, (url, response.status)
    return time.perf_counter() - start


def _multipart(fields: dict[str, str], file_field: str, path: Path) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        )
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; '
        f'filename="{path.name}"\r\nContent-Type: text/csv\r\n\r\n'
    )
    body = (
        "".join(parts).encode()
        + head.encode()
        + path.read_bytes()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def _owner_rpcs(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "dpmarket_rpc_requests_total":
                key = f"{s.labels['method']} {s.labels['code']}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def run(repeat: int) -> dict[str, Any]:
    """Deploy, start the consoles, fetch every page; return the measurements."""
    with tempfile.TemporaryDirectory(prefix="dpmarket-console-bench-") as scratch:
        root = Path(scratch)
        clinics = deploy(root)
        consoles: list[subprocess.Popen[str]] = []
        try:
            subprocess.run(
                [sys.executable, "-m", "dpmarket.deploy.cli", "down", str(clinics)],
                env=environment(), check=True, capture_output=True,
            )  # fmt: skip
            ports = {}
            for owner in ("young", "middle", "senior"):
                ports[owner] = _free_port()
                with (clinics / f"owner-{owner}.toml").open("a", encoding="utf-8") as fh:
                    fh.write(f"metrics-port = {ports[owner]}\n")
            subprocess.run(
                [sys.executable, "-m", "dpmarket.deploy.cli", "up", str(clinics)],
                env=environment(), check=True, capture_output=True,
            )  # fmt: skip
            started = {}
            spawned = {role: _spawn_console(clinics, config) for role, config in ROLES.items()}
            consoles.extend(spawned.values())
            for role, process in spawned.items():
                started[role] = _console_address(process, role)
            validation = root / "validation.csv"
            explore = b"query=mean&column=bmi&column=progression"
            count = b"query=count&where=bmi>%3D30&where=high%3D1"  # the marginals sketch's
            logreg = b"query=logreg&column=bmi&column=ltg&target=high"
            form = "application/x-www-form-urlencoded"
            rank_body, rank_kind = _multipart({"spec": ""}, "validation", validation)
            session = next((clinics / "consumer" / "sessions").glob("*.json")).stem
            pages: dict[str, tuple[str, str, bytes | None, str]] = {
                "consumer: catalogue and forms": ("consumer", "/consumer", None, ""),
                "consumer: a catalogue answer": ("consumer", "/consumer/explore", explore, form),
                "consumer: a count (marginals)": ("consumer", "/consumer/explore", count, form),
                "consumer: a logistic regression": ("consumer", "/consumer/explore", logreg, form),
                "consumer: owners ranked": ("consumer", "/consumer/rank", rank_body, rank_kind),
                "consumer: a past session": ("consumer", f"/consumer/sessions/{session}", None, ""),
                "owner: budget, charges, sketches, policy": ("owner", "/owner", None, ""),
                "curator: owners, sessions, catalogue": ("curator", "/curator", None, ""),
            }
            before = _owner_rpcs(ports["young"])
            results: dict[str, Any] = {}
            for name, (role, path, data, kind) in pages.items():
                url, token = started[role]
                first = _fetch(url + path, token, data, kind)  # warm-up
                times = [_fetch(url + path, token, data, kind) for _ in range(repeat)]
                results[name] = {
                    "first_seconds": first,
                    "median_seconds": statistics.median(times),
                    "max_seconds": max(times),
                    "runs": repeat,
                }
            after = _owner_rpcs(ports["young"])
            served = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            owner_fetches = curator_fetches = repeat + 1
            return {
                "pages": results,
                "owner_rpcs": {k: v for k, v in served.items() if v},
                "expected_owner_rpcs": {"Check OK": owner_fetches + curator_fetches},
            }
        finally:
            for process in consoles:
                process.terminate()
                process.wait(timeout=30)
            stop(clinics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/bench.json", help="JSON file (merged into)")
    parser.add_argument("--repeat", type=int, default=10, help="fetches per page after warm-up")
    args = parser.parse_args()
    measured = run(args.repeat)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    document = json.loads(out.read_text()) if out.exists() else {}
    document["console"] = measured
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    for name, row in measured["pages"].items():
        print(
            f"{name:45s} first {row['first_seconds']:.3f} s, median {row['median_seconds']:.3f} s, "
            f"max {row['max_seconds']:.3f} s"
        )
    print(f"RPCs the young clinic served: {measured['owner_rpcs']}")
    print(f"RPCs the pages make of it:    {measured['expected_owner_rpcs']}")


if __name__ == "__main__":
    main()
