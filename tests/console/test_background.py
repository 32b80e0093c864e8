"""Answers computed off the request: a slow explore answer is not waited for; its page says it
is computing and reloads itself until the answer (or its error) is there."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from dpmarket.console.app import create_app
from dpmarket.console.auth import ConsoleToken
from dpmarket.console.background import Background, GiveWay
from dpmarket.console.consumer import ConsumerConsole, UserError
from dpmarket.consumer.client import CuratorClient
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity


def test_a_computation_runs_once_per_key_and_its_result_is_read_once() -> None:
    """While it runs, asking again for its key returns None and starts nothing new; once done
    its result is returned, once; an exception is raised to the one that reads it."""
    background: Background[int] = Background("test")
    release = threading.Event()
    runs: list[int] = []

    def slow() -> int:
        runs.append(1)
        release.wait(30)
        return 42

    assert background.result("q", slow, 0.0)[0] is None
    assert background.result("q", slow, 0.0)[0] is None and len(background) == 1
    release.set()
    assert background.result("q", slow, 30.0)[0] == 42 and runs == [1]
    assert len(background) == 0  # read: forgotten

    def failing() -> int:
        raise ValueError("no such column")

    with pytest.raises(ValueError, match="no such column"):
        background.result("bad", failing, 30.0)
    assert len(background) == 0
    background.shutdown()


def test_work_ahead_gives_way_to_a_page_s_computation() -> None:
    """While a page's computation runs (:meth:`GiveWay.asked`), the work ahead's next step
    waits in :meth:`GiveWay.pause` and runs only once it is over; with none running (the
    control) it goes on at once. A limit bounds the wait (a stream of questions cannot hold
    the work ahead for ever)."""
    give_way = GiveWay()
    order: list[str] = []
    give_way.pause()  # the control: nothing asked, no wait
    order.append("ahead, nothing asked")
    inside, release = threading.Event(), threading.Event()

    def page() -> None:
        with give_way.asked():
            inside.set()
            release.wait(30)
            order.append("page done")

    asking = threading.Thread(target=page)
    asking.start()
    assert inside.wait(30)

    def ahead() -> None:
        give_way.pause()
        order.append("ahead's next step")

    step = threading.Thread(target=ahead)
    step.start()
    step.join(0.2)
    assert step.is_alive() and order == ["ahead, nothing asked"]  # waiting for the page
    release.set()
    asking.join(30)
    step.join(30)
    assert order == ["ahead, nothing asked", "page done", "ahead's next step"]
    bounded = GiveWay(limit=0.05)
    with bounded.asked():
        bounded.pause()  # returns after its limit though a page's computation runs


_PARENT = """
import multiprocessing, sys, time
from dpmarket.console.consumer import end_with

def child(parent, watch):
    if watch:
        end_with(parent)
    time.sleep(120)

if __name__ == "__main__":
    import os
    p = multiprocessing.get_context("spawn").Process(
        target=child, args=(os.getpid(), sys.argv[1] == "watch"), daemon=True
    )
    p.start()
    print(p.pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("watch", [True, False])
def test_a_refitting_process_ends_with_its_console(tmp_path: Path, watch: bool) -> None:
    """A console killed by a signal runs no exit handler, so its refitting process (spawned,
    daemonic) would live on (a stranger found refits running a minute and more beside the
    next console's): :func:`end_with` ends it once the parent has gone. The control (no
    :func:`end_with`): the child outlives its killed parent."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), "watch" if watch else "plain"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert parent.stdout is not None
    with parent.stdout:
        child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(30)

    def alive() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{child}/stat") as stat:  # a zombie has ended
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"

    for _ in range(100 if watch else 20):  # 10 s for it to end; the control: still there at 2 s
        if not alive():
            break
        time.sleep(0.1)
    try:
        assert alive() is not watch
    finally:
        if alive():
            os.kill(child, signal.SIGKILL)


def test_an_answer_that_takes_long_is_computed_off_the_request(tmp_path: Path) -> None:
    """A curator that takes the connection and never answers (a listening socket nobody
    accepts on; the client's deadline 1.5 s): the explore page does not wait for the catalogue's
    read. It answers 202 with a page that says it is computing and reloads itself; a reload
    once the read has failed shows the failure as the form's error (400). The control: the
    same question waited on (as the page did before) is answered in the request, the error
    raised there."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    client = CuratorClient(
        f"127.0.0.1:{port}", TransportSecurity.plaintext(), timeout=1.5, connect_timeout=None
    )
    party = ConsumerConsole(client, tmp_path, None)
    token = ConsoleToken.load_or_create(tmp_path)
    app = create_app(party, Identity("consumer", "alice"), token, port=8474)
    web = TestClient(app, follow_redirects=False)
    bearer = {"Authorization": f"Bearer {token.value}"}
    address = f"{token.prefix}/consumer/explore?query=mean&column=bmi"
    try:
        first = web.get(address, headers=bearer)
        assert first.status_code == 202, first.text
        assert '<meta http-equiv="refresh" content="0">' in first.text
        assert "Computing the mean" in first.text and 'id="computing-bar"' in first.text
        for _ in range(120):
            again = web.get(address, headers=bearer)
            if again.status_code != 202:
                break
        assert again.status_code == 400, again.text
        assert "refresh" not in again.text and "curator" in again.text
        question = {"query": "mean", "spec": "", "owners": [], "columns": ["bmi"],
                    "points": [], "where": [], "target": ""}  # fmt: skip
        with pytest.raises(UserError):
            party.explore_soon(question, 60.0)
    finally:
        listener.close()
