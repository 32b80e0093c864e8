"""The consoles on the tutorial's deployment: each page's server CPU and wall time, and what load
the pages put on an owner (``make console-bench``).

docs/tutorial.md's commands up to the clinics' sketches run in a scratch directory
(:mod:`tests.console.clinics`; or ``--deployment DIR`` reuses one already deployed there); the
owners are then restarted with their metrics on (``metrics-port`` added to each owner's config),
the consumer's model store is emptied (its first answers start from nothing, as on a fresh
consumer), and one console per role starts on its own certificate (``dpmarket console --config
PARTY.toml``). Once every console's start-up work is over (its process and its children idle:
the consumer's warm-up draws the M2M designs and refits the owners' published fits), each page
is fetched as a signed-in program would (``Authorization: Bearer``): once (``first``: the
console's first answer to that question) and then ``--repeat`` times. Per fetch: the wall time
from request to last byte and the console process's CPU time (user + system, from
``/proc/PID/stat``) over it, the server's share of the page; and the RPCs the young clinic
served meanwhile, by method and status, read from its own metrics before and after (the RPCs
the pages make: one health check per fetch of an owner's or the curator's page, none for the
consumer's but what its quote asks of the owners through the curator).

An answer the console computes off the request (its page says it is computing, 202) is fetched
again every :data:`PENDING_POLL_SECONDS` until it is there: ``first_seconds`` is the wall time
to the answer, ``first_page_seconds`` to the first page shown (the same for every other page).
Prints a table page x (CPU s, wall s) for the first fetch and the median of the others, and
writes ``{"pages": {name: {"first_cpu_seconds", "first_seconds", "first_page_seconds",
"median_cpu_seconds",
"median_seconds", "max_seconds", "runs", "owner_rpcs"}}, "settled_seconds": {role: s},
"load": [low, high]}`` into ``--out`` (merged into an existing JSON file, under ``"console"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.console.clinics import SIGN_IN, deploy, environment, stop

ROLES = {"consumer": "consumer.toml", "owner": "owner-young.toml", "curator": "curator.toml"}
#: Seconds a console's start-up work (the consumer's warm-up and refits) may take.
SETTLE_SECONDS = 600.0
#: A console is idle when it and its children used less than this CPU share over
#: :data:`IDLE_WINDOW_SECONDS`.
IDLE_SHARE = 0.02
IDLE_WINDOW_SECONDS = 3.0
#: Seconds between two fetches of an answer's page that says it is computing (202).
PENDING_POLL_SECONDS = 0.1
#: The address line a console prints when it starts, and the line naming its kept token's file
#: (a console started before in the same data directory).
ADDRESS = re.compile(r"'s console: (\S+)/\s*$")
KEPT_TOKEN = re.compile(r"^sign in with the token in (\S+)\s*$")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Running:
    """A console process, its address and token."""

    process: subprocess.Popen[str]
    url: str
    token: str

    def cpu(self) -> float:
        """CPU seconds (user + system) the console process has used."""
        return _cpu_of(self.process.pid)

    def family_cpu(self) -> float:
        """CPU seconds of the process and its children (running or not yet reaped)."""
        total = 0.0
        for pid in (self.process.pid, *_children(self.process.pid)):
            try:
                total += _cpu_of(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
        return total


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(c) for c in text)
    return out


def _settle(console: Running, role: str) -> float:
    """Wait until ``console`` and its children are idle; return the seconds waited."""
    start = time.monotonic()
    before = console.family_cpu()
    while time.monotonic() - start < SETTLE_SECONDS:
        time.sleep(IDLE_WINDOW_SECONDS)
        now = console.family_cpu()
        if now - before < IDLE_SHARE * IDLE_WINDOW_SECONDS:
            return time.monotonic() - start
        before = now
    raise RuntimeError(f"the {role} console was still busy after {SETTLE_SECONDS:.0f} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(clinics: Path, role: str) -> Running:
    command = ["console", "--config", str(clinics / ROLES[role])]
    process = subprocess.Popen(
        [sys.executable, "-m", "dpmarket.deploy.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(),
    )
    assert process.stdout is not None
    url = ""
    for line in process.stdout:
        found = SIGN_IN.search(line)
        kept = KEPT_TOKEN.search(line)  # a console started before: its token is in a file
        if found or kept:  # the rest of its output is read (and dropped) so that it never blocks
            threading.Thread(target=process.stdout.read, daemon=True).start()
        if found:
            return Running(process, found.group(1), found.group(2))
        if kept:
            token = Path(kept.group(1)).read_text(encoding="utf-8").strip()
            return Running(process, url, token)
        address = ADDRESS.search(line)
        url = address.group(1) if address else url
    raise RuntimeError(f"the {role} console printed no address")


def _fetch(
    console: Running, path: str, data: bytes | None, kind: str
) -> tuple[float, float, float]:
    """Fetch ``path`` (following the redirect a POST answers with, and fetching again an
    answer's page that says it is computing, 202, until the answer is there); return (CPU s,
    wall s) to the answer and the wall seconds of the first page (the answer, or the page
    saying it is computing)."""
    cpu, start = console.cpu(), time.perf_counter()
    status = 202
    page = math.nan
    while status == 202:
        request = urllib.request.Request(console.url + path, data=data)
        request.add_header("Authorization", f"Bearer {console.token}")
        if kind:
            request.add_header("Content-Type", kind)
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        if math.isnan(page):
            page = time.perf_counter() - start
        if status == 202:
            time.sleep(PENDING_POLL_SECONDS)
    wall = time.perf_counter() - start
    if status != 200:
        raise RuntimeError(f"{path}: HTTP {status}")
    return console.cpu() - cpu, wall, page


def _multipart(fields: dict[str, str], file_field: str, path: Path) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; '
        f'filename="{path.name}"\r\nContent-Type: text/csv\r\n\r\n'
    )
    body = "".join(parts).encode() + head.encode() + path.read_bytes()
    return body + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


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


Page = tuple[str, str, bytes | None, str]


def pages(clinics: Path) -> dict[str, Page]:
    """Every page of each role, as ``name: (role, path, body or None, content type)``: the
    explore form's questions with its defaults (only the fields a question needs besides), and
    two questions with columns chosen."""
    validation = clinics.parent / "validation.csv"
    rank_body, rank_kind = _multipart({"spec": ""}, "validation", validation)
    quote_fields = {"p": "20", "method": "candidates", "min_owners": "0", "max_cost": ""}
    quote_body, quote_kind = _multipart(quote_fields, "validation", validation)
    session = next((clinics / "consumer" / "sessions").glob("*.json")).stem
    explore = {
        "mean": "query=mean",
        "moment2": "query=moment2",
        "cdf": "query=cdf",
        "count": "query=count&where=bmi>%3D30%3B+high%3D1",
        "covariance": "query=covariance",
        "logreg": "query=logreg&target=high",
        "logreg bmi, ltg": "query=logreg&column=bmi&column=ltg&target=high",
        "marginal": "query=marginal&column=bmi&column=high",
        # Questions the console does not answer ahead (it does the ones above that need no
        # field more: dpmarket.console.consumer.ANSWERED_AHEAD): their first fetch computes.
        "cdf bmi, bp at 25, 30, 35": "query=cdf&column=bmi&column=bp&points=25%2C+30%2C+35",
        "covariance bmi, bp, ltg": "query=covariance&column=bmi&column=bp&column=ltg",
        "covariance of 8 columns": "query=covariance&"
        + "&".join(f"column={c}" for c in ("age", "bmi", "bp", "tc", "ldl", "hdl", "ltg", "glu")),
        "logreg of 9 features": "query=logreg&target=high&"
        + "&".join(
            f"column={c}" for c in ("age", "bmi", "bp", "tc", "ldl", "hdl", "tch", "ltg", "glu")
        ),
        "logreg tch, bp of senior (from the RFF sketch)": (
            "query=logreg&column=tch&column=bp&target=high&owner=senior"
        ),
    }
    out: dict[str, Page] = {"consumer: catalogue and forms": ("consumer", "/consumer", None, "")}
    for name, question in explore.items():
        out[f"consumer: explore {name}"] = ("consumer", f"/consumer/explore?{question}", None, "")
    out |= {
        "consumer: rank-owners": ("consumer", "/consumer/rank", rank_body, rank_kind),
        "consumer: quote only": ("consumer", "/consumer/quote", quote_body, quote_kind),
        "consumer: a past session": ("consumer", f"/consumer/sessions/{session}", None, ""),
        "consumer: statements": ("consumer", "/consumer/statements", None, ""),
        "owner: budget, charges, sessions, sketches, policy, earnings":
            ("owner", "/owner", None, ""),
        "curator: owners, sessions, catalogue": ("curator", "/curator", None, ""),
    }  # fmt: skip
    return out


@contextmanager
def _deployment(existing: Path | None) -> Iterator[Path]:
    """The tutorial's deployment: ``existing`` (left running), or a fresh one (stopped)."""
    if existing is not None:
        yield existing
        return
    with tempfile.TemporaryDirectory(prefix="dpmarket-console-bench-") as scratch:
        clinics = deploy(Path(scratch))
        try:
            yield clinics
        finally:
            stop(clinics)


def _restart_with_metrics(clinics: Path) -> dict[str, int]:
    """``down``, a metrics port per owner, ``up``; the consumer's model store emptied."""
    cli = [sys.executable, "-m", "dpmarket.deploy.cli"]
    subprocess.run([*cli, "down", str(clinics)], env=environment(), check=True, capture_output=True)
    ports = {}
    for owner in ("young", "middle", "senior"):
        config = clinics / f"owner-{owner}.toml"
        lines = [x for x in config.read_text().splitlines() if not x.startswith("metrics-port")]
        ports[owner] = _free_port()
        config.write_text("\n".join([*lines, f"metrics-port = {ports[owner]}"]) + "\n")
    subprocess.run([*cli, "up", str(clinics)], env=environment(), check=True, capture_output=True)
    shutil.rmtree(clinics / "consumer" / "explore-models", ignore_errors=True)
    return ports


def _measure(console: Running, page: Page, repeat: int, metrics: int) -> dict[str, Any]:
    """Fetch ``page`` once, then ``repeat`` times; its times and the young clinic's RPCs."""
    _, path, data, kind = page
    before = _owner_rpcs(metrics)
    first_cpu, first, first_page = _fetch(console, path, data, kind)
    runs = [_fetch(console, path, data, kind) for _ in range(repeat)]
    after = _owner_rpcs(metrics)
    served = {k: after[k] - before.get(k, 0.0) for k in after if after[k] > before.get(k, 0.0)}
    return {
        "first_cpu_seconds": first_cpu,
        "first_seconds": first,
        "first_page_seconds": first_page,
        "median_cpu_seconds": statistics.median(c for c, _, _ in runs),
        "median_seconds": statistics.median(w for _, w, _ in runs),
        "max_seconds": max(w for _, w, _ in runs),
        "runs": repeat,
        "owner_rpcs": served,
    }


def run(
    repeat: int, existing: Path | None = None, roles: tuple[str, ...] = tuple(ROLES)
) -> dict[str, Any]:
    """Deploy (or reuse ``existing``), start the consoles of ``roles`` (every role's by
    default), fetch their pages; return the measurements."""
    with _deployment(existing) as clinics:
        ports = _restart_with_metrics(clinics)
        consoles: dict[str, Running] = {}
        try:
            for role in roles:
                consoles[role] = _start(clinics, role)
            settled = {role: _settle(c, role) for role, c in consoles.items()}
            load = [os.getloadavg()[0]]
            results: dict[str, Any] = {}
            for name, page in pages(clinics).items():
                if page[0] not in consoles:
                    continue
                results[name] = _measure(consoles[page[0]], page, repeat, ports["young"])
                load.append(os.getloadavg()[0])
        finally:
            for console in consoles.values():
                console.process.terminate()
                console.process.wait(timeout=30)
    return {"pages": results, "settled_seconds": settled, "load": [min(load), max(load)]}


def table(measured: dict[str, Any]) -> str:
    """The measurements as a Markdown table: page x (CPU s, wall s), first, median and worst."""
    lines = [
        "| page | first: CPU s | first: wall s (its first page) | then, median: CPU s | "
        "then, median: wall s | then, worst: wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in measured["pages"].items():
        page = row.get("first_page_seconds", math.nan)
        shown = f" ({page:.2f})" if page < row["first_seconds"] - 0.005 else ""
        lines.append(
            f"| {name} | {row['first_cpu_seconds']:.2f} | {row['first_seconds']:.2f}{shown} | "
            f"{row['median_cpu_seconds']:.2f} | {row['median_seconds']:.2f} | "
            f"{row['max_seconds']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/bench.json", help="JSON file (merged into)")
    parser.add_argument("--repeat", type=int, default=5, help="fetches per page after the first")
    parser.add_argument(
        "--deployment",
        type=Path,
        default=None,
        help="a tutorial deployment's folder to reuse (its owners are restarted, then left up)",
    )
    parser.add_argument(
        "--roles",
        nargs="+",
        choices=sorted(ROLES),
        default=list(ROLES),
        help="the consoles to start and measure (default: every role's)",
    )
    args = parser.parse_args()
    measured = run(args.repeat, args.deployment, tuple(args.roles))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    document = json.loads(out.read_text()) if out.exists() else {}
    document["console"] = measured
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(table(measured))
    low, high = measured["load"]
    print(f"load average (1 min) while fetching: {low:.1f}-{high:.1f}")
    print("RPCs the young clinic served while each page was fetched (1 + --repeat times):")
    for name, row in measured["pages"].items():
        print(f"  {name}: {row['owner_rpcs'] or 'none'}")


if __name__ == "__main__":
    main()
