"""A real gateway for the tests: services/edge built from this repository
(or MOBILE_TEST_EDGE_BIN), zero-config single node with the demo agent."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


class Gateway:
    def __init__(self, extra_env=None):
        self.dir = None
        self.bin = os.environ.get("MOBILE_TEST_EDGE_BIN")
        if not self.bin:
            self.dir = tempfile.mkdtemp(prefix="hermes-edge-")
            self.bin = os.path.join(self.dir, "edge")
            subprocess.run(["go", "build", "-o", self.bin, "./services/edge"], cwd=REPO, check=True)
        self.token = "app-" + secrets.token_hex(12)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MOBILE_", "NATS_", "REDIS_", "OTEL_")) and k != "AGENT"}
        env.update({"MOBILE_TOKEN": self.token, "MOBILE_LISTEN": "127.0.0.1:0", "MOBILE_ADMIN_LISTEN": "off",
                    "MOBILE_DRAIN_WINDOW": "1"})
        env.update(extra_env or {})
        self.proc = subprocess.Popen([self.bin], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        found = threading.Event()
        self.ws = None

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                if self.ws is None and "gateway listening" in line:
                    try:
                        self.ws = json.loads(line)["url"]
                        found.set()
                    except ValueError:
                        pass

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(20):
            self.stop()
            raise RuntimeError("no 'gateway listening' within 20 s:\n" + "".join(self.log))
        self.http = self.ws.replace("ws://", "http://", 1)[: -len("/ws")]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def gateway():
    gw = Gateway()
    yield gw
    gw.stop()


@pytest.fixture
def small_store_gateway():
    """A store of 1 MiB: every file over it gets internal_error, every time."""
    gw = Gateway({"MOBILE_MAX_BLOB_MIB": "1"})
    yield gw
    gw.stop()


@pytest.fixture
def bound_gateway():
    gw = Gateway({"MOBILE_EXTRA_TOKENS": "bound-dev=bound-token"})
    yield gw
    gw.stop()


@pytest.fixture
def busy_gateway():
    """One place in the hello phase: a socket that never says hello holds it,
    and the edge refuses every other upgrade with 503 and Retry-After."""
    gw = Gateway({"MOBILE_MAX_HELLO_CONNS": "1", "MOBILE_MAX_HELLO_PER_ADDR": "1"})
    yield gw
    gw.stop()
