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


def push_env():
    """Settings that turn FCM and APNs on with throwaway credentials (a
    service account's key file, an APNs .p8 key, made by openssl): push
    frames are taken and ready offers both kinds. Nothing is sent while the
    phones are connected."""
    if shutil.which("openssl") is None:
        pytest.skip("the push tests make their keys with openssl")

    def key(*args):
        return subprocess.run(["openssl", "genpkey", *args], check=True, capture_output=True, text=True).stdout

    account = {
        "type": "service_account",
        "project_id": "hermes-sdk-test",
        "private_key_id": secrets.token_hex(20),
        "private_key": key("-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"),
        "client_email": "firebase-adminsdk@hermes-sdk-test.iam.gserviceaccount.com",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    return {
        "MOBILE_PUSH_FCM_CREDENTIALS": json.dumps(account),
        "MOBILE_PUSH_APNS_KEY": key("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"),
        "MOBILE_PUSH_APNS_KEY_ID": "ABC123DEFG",
        "MOBILE_PUSH_APNS_TEAM_ID": "TEAM123456",
        "MOBILE_PUSH_APNS_TOPIC": "org.hermes.sdk.test",
        "MOBILE_PUSH_APNS_ENV": "sandbox",
    }


@pytest.fixture
def push_gateway():
    """A gateway that sends FCM and APNs notifications (push_env)."""
    gw = Gateway(push_env())
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
def owners_gateway(tmp_path):
    """A gateway with a tenants file of one owner, acme, beside its own
    MOBILE_TOKEN; owner_key is the credential of acme's app key,
    hmt_<owner>.<key id>.<secret> (docs/tenancy.md)."""
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  - id: acme\n    keys:\n      - {id: app, kind: app, secret: acme-app-secret}\n")
    gw = Gateway({"MOBILE_TENANTS_FILE": str(path)})
    gw.owner_key = "hmt_acme.app.acme-app-secret"
    yield gw
    gw.stop()


@pytest.fixture
def busy_gateway():
    """One place in the hello phase: a socket that never says hello holds it,
    and the edge refuses every other upgrade with 503 and Retry-After."""
    gw = Gateway({"MOBILE_MAX_HELLO_CONNS": "1", "MOBILE_MAX_HELLO_PER_ADDR": "1"})
    yield gw
    gw.stop()
